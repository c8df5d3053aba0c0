//! Header-only indexing of a WebDataset tar shard: which byte ranges are samples.
//!
//! A sample is a run of consecutive members sharing a key (the member path up to the first `.`
//! of its last component). Because the members of a sample are consecutive records, a sample is
//! one contiguous byte range: from the end of the previous record (so that any PAX or GNU
//! long-name extension records in front of its first header are included) to the end of its last
//! member's padded data. That range moves verbatim.

use std::fs::File;
use std::io::{self, BufReader, Read, Seek, SeekFrom};

pub use crate::tar_headers::read_up_to;
use crate::tar_headers::{EntryKind, Forward, Member, Seekable, Source, Walk};
use std::path::Path;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

/// One sample of a shard: a contiguous byte range of the shard file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sample {
    /// Byte offset of the sample's first record (extension records included).
    pub start: u64,
    /// Length in bytes: every record of the sample, padding included (a multiple of 512).
    pub len: u64,
}

/// Entries that belong to no sample. They are left out of the output and reported.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Skipped {
    /// Directory entries (`dir/`).
    pub directories: u64,
    /// Regular files with no key: no `.` in the last path component, or only a leading one.
    pub keyless_files: u64,
    /// Symlinks and hard links (outside any sample), devices, FIFOs, GNU volume labels and other
    /// non-regular entries.
    pub other_entries: u64,
    /// PAX global extended headers (`g` records); their attributes are not carried over.
    pub global_headers: u64,
}

impl Skipped {
    /// The counts as an array, in field order, for summing across ranks.
    pub fn to_array(self) -> [u64; 4] {
        [
            self.directories,
            self.keyless_files,
            self.other_entries,
            self.global_headers,
        ]
    }

    /// Inverse of [`Skipped::to_array`].
    pub fn from_array(a: [u64; 4]) -> Self {
        Skipped {
            directories: a[0],
            keyless_files: a[1],
            other_entries: a[2],
            global_headers: a[3],
        }
    }

    /// Total number of skipped entries.
    pub fn total(self) -> u64 {
        self.to_array().iter().sum()
    }
}

/// `--on-incomplete`: what to do with a sample that lacks a `--require-ext` member.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum OnIncomplete {
    /// Fail, naming the file, the key and what is missing.
    #[default]
    Abort,
    /// Keep the sample, with a warning.
    Warn,
    /// Leave the sample out (counted).
    Exclude,
}

/// `--on-duplicate`: what to do with a repeated extension in one sample, a sample whose members
/// are not adjacent, or one key in two samples.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum OnDuplicate {
    /// Fail, naming the key and where it occurs.
    Abort,
    /// Keep everything, with a warning.
    Warn,
    /// Keep everything silently (the default of the library API; the CLI defaults to abort).
    #[default]
    Keep,
}

/// Sample hygiene rules applied while indexing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rules {
    /// Extensions every sample must have (`--require-ext jpg,cls`).
    pub require_ext: Vec<String>,
    pub on_incomplete: OnIncomplete,
    pub on_duplicate: OnDuplicate,
    /// Keep every sample's key ([`ShardIndex::keys`]): for ordering or routing by key.
    pub keep_keys: bool,
    /// Read the content of each sample's member with this extension, refusing members larger
    /// than the limit ([`ShardIndex::contents`]): labels for ordering and stratifying.
    pub read_member: Option<(String, u64)>,
}

impl Rules {
    /// Whether duplicate keys are looked for (and so key hashes kept).
    pub fn checks_duplicates(&self) -> bool {
        self.on_duplicate != OnDuplicate::Keep
    }
}

/// What the hygiene rules found (and kept or left out).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hygiene {
    /// Samples missing a required extension (kept with --on-incomplete warn).
    pub incomplete: u64,
    /// Samples left out by --on-incomplete exclude.
    pub excluded: u64,
    /// Repeated extensions, non-adjacent members and keys in two samples (kept with warn/keep).
    pub duplicates: u64,
}

impl Hygiene {
    pub fn to_array(self) -> [u64; 3] {
        [self.incomplete, self.excluded, self.duplicates]
    }

    pub fn from_array(a: [u64; 3]) -> Self {
        Hygiene {
            incomplete: a[0],
            excluded: a[1],
            duplicates: a[2],
        }
    }
}

/// The samples of one shard, in file order, and what was skipped.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShardIndex {
    pub samples: Vec<Sample>,
    pub skipped: Skipped,
    /// The keys of the first and last samples (to catch a sample split across two shards);
    /// `None` when unknown (an index saved without keys) or when the shard has no samples.
    pub edge_keys: Option<(String, String)>,
    pub hygiene: Hygiene,
    /// A 64-bit hash of each sample's key (only when duplicate keys are looked for across
    /// shards), for [`key_hash`] comparisons; equal hashes are confirmed by reading the keys.
    pub key_hashes: Vec<u64>,
    /// Each sample's key, when [`Rules::keep_keys`].
    pub keys: Vec<Vec<u8>>,
    /// Each sample's [`Rules::read_member`] content (`None`: no such member), when asked for.
    pub contents: Vec<Option<Vec<u8>>>,
}

/// A 64-bit hash of a sample key (FNV-1a, then a finalizer).
pub fn key_hash(key: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in key {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    // Never 0: that stands for "no hash" (a shard read through its saved index).
    (h ^ (h >> 33)).max(1)
}

/// The extension of a member path: what follows the first `.` of its last component.
fn extension(path: &[u8]) -> &[u8] {
    let base_start = path.iter().rposition(|&b| b == b'/').map_or(0, |i| i + 1);
    let base = &path[base_start..];
    base.iter()
        .position(|&b| b == b'.')
        .map_or(&[][..], |d| &base[d + 1..])
}

/// How a shard's bytes are stored, told by its first bytes (never by its name).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Codec {
    /// A plain tar: samples are byte ranges of the file itself.
    #[default]
    Plain,
    /// gzip (`.tar.gz`, `.tgz`): byte ranges of the decompressed stream.
    Gzip,
    /// zstd (`.tar.zst`): byte ranges of the decompressed stream.
    Zstd,
}

impl Codec {
    /// The codec whose magic bytes start `head`.
    pub fn from_magic(head: &[u8]) -> Codec {
        match head {
            [0x1f, 0x8b, ..] => Codec::Gzip,
            [0x28, 0xb5, 0x2f, 0xfd, ..] => Codec::Zstd,
            _ => Codec::Plain,
        }
    }

    /// Reads the first bytes of the file at `path` to tell its codec.
    ///
    /// # Errors
    /// The file cannot be read.
    pub fn sniff(path: &Path) -> Result<Codec> {
        let mut f = File::open(path).with_context(|| format!("{}: cannot open", path.display()))?;
        let mut head = [0u8; 4];
        let n = read_up_to(&mut f, &mut head)
            .with_context(|| format!("{}: cannot read", path.display()))?;
        Ok(Codec::from_magic(&head[..n]))
    }

    /// A reader of the decompressed stream of `file` (buffered).
    ///
    /// # Errors
    /// The decoder cannot start (zstd's context allocation).
    pub fn decoder(self, file: File) -> io::Result<Box<dyn Read + Send>> {
        let buffered = BufReader::with_capacity(1 << 20, file);
        Ok(match self {
            Codec::Plain => Box::new(buffered),
            Codec::Gzip => Box::new(flate2::bufread::MultiGzDecoder::new(buffered)),
            Codec::Zstd => Box::new(zstd::stream::read::Decoder::with_buffer(buffered)?),
        })
    }
}

/// The key of a member path: everything up to the first `.` of the last path component, or
/// `None` when the last component has no `.` or starts with one (webdataset skips those).
pub fn sample_key(path: &[u8]) -> Option<&[u8]> {
    let base_start = path.iter().rposition(|&b| b == b'/').map_or(0, |i| i + 1);
    let dot = path[base_start..].iter().position(|&b| b == b'.')?;
    if dot == 0 {
        return None;
    }
    Some(&path[..base_start + dot])
}

/// Indexes the shard file at `path`, reading only its headers.
///
/// # Errors
/// The file cannot be read, is not a tar, is truncated, has a header with a bad checksum, or
/// has a member without a key between two members of one sample. Every message names the file
/// and the byte offset of the offending record.
pub fn index_file(path: &Path) -> Result<ShardIndex> {
    index_file_with(path, &Rules::default())
}

/// [`index_file`] with sample hygiene rules.
///
/// # Errors
/// As [`index_file`], plus the violations the rules say to abort on.
pub fn index_file_with(path: &Path, rules: &Rules) -> Result<ShardIndex> {
    let codec = Codec::sniff(path)?;
    let file = File::open(path).with_context(|| format!("{}: cannot open", path.display()))?;
    if codec != Codec::Plain {
        // No seeking in a compressed stream: the whole shard is decompressed once, and offsets
        // are those of the decompressed stream.
        let stream = codec
            .decoder(file)
            .with_context(|| format!("{}: cannot start decompressing", path.display()))?;
        return index_walk(Walk::new(Forward(stream), None), rules).with_context(|| {
            format!(
                "{} ({codec:?}-compressed; offsets in the decompressed stream)",
                path.display()
            )
        });
    }
    let len = file
        .metadata()
        .with_context(|| format!("{}: cannot stat", path.display()))?
        .len();
    // Headers are small reads spread over the file: readahead would pull in the data between
    // them (most of the shard for ~100 KiB samples), so ask for none.
    advise_random(&file);
    index_reader_with(HeaderReader::new(file), len, rules)
        .with_context(|| path.display().to_string())
}

/// Tells the kernel that `file` is read at scattered offsets (no readahead). Only a hint: where
/// it is not supported, nothing changes.
fn advise_random(file: &File) {
    use std::os::fd::AsRawFd;
    // SAFETY: a valid open descriptor; the call reads no memory of ours.
    unsafe {
        libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM);
    }
}

/// The key of the sample whose records start at `start` of the shard at `path` (its first
/// member's path, long names and PAX paths included); for a compressed shard, `start` is an
/// offset of the decompressed stream.
///
/// # Errors
/// The file cannot be read there, or holds no keyed member there.
pub fn key_at(path: &Path, start: u64, len: u64) -> Result<String> {
    Ok(keys_at(path, &[(start, len)])?.remove(0))
}

/// [`key_at`] for several samples `(start, len)` of one shard, in ascending order of `start`:
/// the file is opened once, and a compressed shard is decompressed once, not once per sample.
///
/// # Errors
/// As [`key_at`], for the first sample that fails; `samples` out of order.
pub fn keys_at(path: &Path, samples: &[(u64, u64)]) -> Result<Vec<String>> {
    let codec = Codec::sniff(path)?;
    let file = File::open(path).with_context(|| format!("{}: cannot open", path.display()))?;
    // A plain shard seeks to each sample; a compressed one is one forward stream.
    let (mut plain, mut stream) = if codec == Codec::Plain {
        (Some(file), None)
    } else {
        let decoder = codec
            .decoder(file)
            .with_context(|| format!("{}: cannot start decompressing", path.display()))?;
        (None, Some(decoder))
    };
    // Where the decompressed stream is.
    let mut pos = 0u64;
    let mut keys = Vec::with_capacity(samples.len());
    for &(start, len) in samples {
        let what = || {
            format!(
                "{}: byte offset {start}: expected a sample's first header",
                path.display()
            )
        };
        if let Some(file) = plain.as_mut() {
            file.seek(SeekFrom::Start(start)).with_context(|| {
                format!("{}: cannot seek to byte offset {start}", path.display())
            })?;
            keys.push(first_key(Read::take(file, len)).with_context(what)?);
            continue;
        }
        let stream = stream.as_mut().expect("plain or compressed");
        if start < pos {
            bail!(
                "internal error: keys_at({}): offsets out of order",
                path.display()
            );
        }
        let skip = start - pos;
        let skipped = io::copy(&mut stream.take(skip), &mut io::sink()).with_context(|| {
            format!(
                "{}: decompressing up to byte offset {start}",
                path.display()
            )
        })?;
        if skipped < skip {
            bail!(
                "{}: the decompressed stream ends at byte {}, before byte offset {start}",
                path.display(),
                pos + skipped
            );
        }
        let mut counted = Counted {
            inner: stream.take(len),
            read: 0,
        };
        keys.push(first_key(&mut counted).with_context(what)?);
        pos = start + counted.read;
    }
    Ok(keys)
}

/// The sample key of the first member of a tar stream (its real name: PAX and GNU sparse names
/// included).
fn first_key(reader: impl Read) -> Result<String> {
    let member = Walk::new(Forward(reader), None)
        .next_member()?
        .context("the archive ends here")?;
    let key = sample_key(&member.path).with_context(|| {
        format!(
            "the member {:?} ({}) has no sample key",
            member.name(),
            member.kind.describe()
        )
    })?;
    Ok(String::from_utf8_lossy(key).into_owned())
}

/// A reader that counts the bytes it returned.
struct Counted<R> {
    inner: R,
    read: u64,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read += n as u64;
        Ok(n)
    }
}

/// Indexes a tar stream of `file_len` bytes. Errors carry the byte offset but not the name; the
/// caller adds it.
///
/// # Errors
/// See [`index_file`].
pub fn index_reader<R: Read + Seek>(reader: R, file_len: u64) -> Result<ShardIndex> {
    index_reader_with(reader, file_len, &Rules::default())
}

/// [`index_reader`] with sample hygiene rules.
///
/// # Errors
/// See [`index_file_with`].
pub fn index_reader_with<R: Read + Seek>(
    reader: R,
    file_len: u64,
    rules: &Rules,
) -> Result<ShardIndex> {
    index_walk(Walk::new(Seekable(reader), Some(file_len)), rules)
}

/// Groups the members of a header walk into samples.
fn index_walk<S: Source>(mut walk: Walk<S>, rules: &Rules) -> Result<ShardIndex> {
    let mut grouper = Grouper::new(rules);
    while let Some(member) = walk.next_member()? {
        let content = read_member(&mut walk, &member, rules)?;
        grouper.push(&member, content)?;
    }
    grouper.finish()
}

/// The data of `member` when it is the member [`Rules::read_member`] asks for.
fn read_member<S: Source>(
    walk: &mut Walk<S>,
    member: &Member,
    rules: &Rules,
) -> Result<Option<Vec<u8>>> {
    let Some((ext, limit)) = &rules.read_member else {
        return Ok(None);
    };
    if !member.kind.is_file() || extension(&member.path) != ext.as_bytes() {
        return Ok(None);
    }
    let (name, at, size) = (member.name(), member.header, member.stored);
    if member.sparse {
        bail!("byte offset {at}: member {name:?} is stored sparse (with holes); labels are read from plain members only");
    }
    if size > *limit {
        bail!(
            "byte offset {at}: member {name:?} is {size} bytes, more than the --label-limit of {limit} (labels are read from small members only)"
        );
    }
    walk.read_data(member).map(Some)
}

enum Kind<'a> {
    Member(&'a [u8]),
    Directory,
    Keyless,
    Other,
    GlobalHeader,
}

fn classify(member: &Member) -> Kind<'_> {
    match member.kind {
        EntryKind::Regular | EntryKind::Sparse => match sample_key(&member.path) {
            Some(k) => Kind::Member(k),
            None => Kind::Keyless,
        },
        EntryKind::Directory => Kind::Directory,
        EntryKind::GlobalHeader => Kind::GlobalHeader,
        _ => Kind::Other,
    }
}

/// What a user can do about a link inside a sample.
const LINK_ADVICE: &str = ": a sample's members must be regular files; create the shards with links dereferenced (GNU tar --dereference --hard-dereference, bsdtar -L)";

/// A skipped entry that ended a sample, or a link named like a sample: a member with that key
/// after it would split the sample.
struct AfterSkip {
    /// The key of the sample it closed.
    closed: Option<Vec<u8>>,
    /// The key its own name carries (links only).
    own: Option<Vec<u8>>,
    /// What it is, for the message.
    what: String,
    advice: &'static str,
}

/// Groups consecutive members by key into samples.
struct Grouper<'r> {
    rules: &'r Rules,
    index: ShardIndex,
    /// The open sample: its key, start, and the extensions of its members so far.
    open: Option<(Vec<u8>, u64)>,
    open_end: u64,
    open_exts: Vec<Vec<u8>>,
    /// The open sample's [`Rules::read_member`] content, if seen yet.
    open_content: Option<Vec<u8>>,
    /// A skipped entry that closed a sample, with that sample's key: a member with the same key
    /// after it would split the sample.
    after_skip: Option<AfterSkip>,
    warnings: u32,
}

impl<'r> Grouper<'r> {
    fn new(rules: &'r Rules) -> Self {
        Grouper {
            rules,
            index: ShardIndex::default(),
            open: None,
            open_end: 0,
            open_exts: Vec::new(),
            open_content: None,
            after_skip: None,
            warnings: 0,
        }
    }

    /// A duplicate: abort, or count (and warn).
    fn duplicate(&mut self, what: String) -> Result<()> {
        match self.rules.on_duplicate {
            OnDuplicate::Abort => bail!("{what} (--on-duplicate abort; warn or keep accept it)"),
            OnDuplicate::Warn => self.warn(&what),
            OnDuplicate::Keep => {}
        }
        self.index.hygiene.duplicates += 1;
        Ok(())
    }

    fn warn(&mut self, what: &str) {
        self.warnings += 1;
        if self.warnings <= 5 {
            eprintln!("reshard: warning: {what}");
        }
    }

    fn push(&mut self, member: &Member, content: Option<Vec<u8>>) -> Result<()> {
        let (start, end) = (member.start, member.end);
        let kind = classify(member);
        if let Kind::Member(key) = kind {
            let ext = extension(&member.path).to_vec();
            if let Some((open_key, _)) = &self.open {
                if open_key.as_slice() == key {
                    self.open_end = end;
                    if self.open_content.is_none() {
                        self.open_content = content;
                    }
                    if self.open_exts.contains(&ext) && self.rules.checks_duplicates() {
                        let what = format!(
                            "byte offset {start}: sample {:?} has a second .{} member",
                            String::from_utf8_lossy(key),
                            String::from_utf8_lossy(&ext)
                        );
                        self.duplicate(what)?;
                    }
                    self.open_exts.push(ext);
                    return Ok(());
                }
            }
            if let Some(skip) = self.after_skip.take() {
                if skip.closed.as_deref() == Some(key) || skip.own.as_deref() == Some(key) {
                    bail!(
                        "{} but sits between members of sample {:?}{}",
                        skip.what,
                        String::from_utf8_lossy(key),
                        skip.advice
                    );
                }
            }
            // A key seen again in a later sample (of this shard or another) is found after
            // indexing, from the key hashes: see `key_hashes`.
            self.close()?;
            self.open = Some((key.to_vec(), start));
            self.open_end = end;
            self.open_exts = vec![ext];
            self.open_content = content;
            return Ok(());
        }
        let skipped = &mut self.index.skipped;
        match kind {
            Kind::Directory => skipped.directories += 1,
            Kind::Keyless => skipped.keyless_files += 1,
            Kind::GlobalHeader => skipped.global_headers += 1,
            Kind::Other | Kind::Member(_) => skipped.other_entries += 1,
        }
        let name = member.name();
        let link = matches!(member.kind, EntryKind::HardLink | EntryKind::Symlink);
        let (what, advice) = if link {
            (
                format!(
                    "byte offset {}: member {name:?} is {} (to {:?})",
                    member.header,
                    member.kind.describe(),
                    String::from_utf8_lossy(&member.link)
                ),
                LINK_ADVICE,
            )
        } else if matches!(kind, Kind::Keyless) {
            (
                format!("byte offset {start}: member {name:?} has no sample key (expected a '.' in its last path component)"),
                "",
            )
        } else {
            (
                format!(
                    "byte offset {start}: member {name:?} is {}",
                    member.kind.describe()
                ),
                "",
            )
        };
        // A link named like a sample's members belongs to that sample: leaving it out would
        // silently change the sample.
        let own = if link {
            sample_key(&member.path).map(<[u8]>::to_vec)
        } else {
            None
        };
        if let (Some(own), Some((open_key, _))) = (&own, &self.open) {
            if own == open_key {
                bail!(
                    "{what} in sample {:?}{advice}",
                    String::from_utf8_lossy(own)
                );
            }
        }
        let closed = self.close()?;
        if closed.is_some() || own.is_some() {
            let closed = closed.or_else(|| self.after_skip.take().and_then(|s| s.closed));
            self.after_skip = Some(AfterSkip {
                closed,
                own,
                what,
                advice,
            });
        }
        Ok(())
    }

    /// Ends the open sample (checking its required extensions), returning its key.
    fn close(&mut self) -> Result<Option<Vec<u8>>> {
        let Some((key, start)) = self.open.take() else {
            return Ok(None);
        };
        let missing: Vec<&String> = self
            .rules
            .require_ext
            .iter()
            .filter(|e| !self.open_exts.iter().any(|x| x == e.as_bytes()))
            .collect();
        let mut keep = true;
        if !missing.is_empty() {
            let has: Vec<String> = self
                .open_exts
                .iter()
                .map(|e| format!(".{}", String::from_utf8_lossy(e)))
                .collect();
            let what = format!(
                "byte offset {start}: sample {:?} lacks {} (has {})",
                String::from_utf8_lossy(&key),
                missing
                    .iter()
                    .map(|e| format!(".{e}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                has.join(", ")
            );
            match self.rules.on_incomplete {
                OnIncomplete::Abort => {
                    bail!("{what} (--require-ext; --on-incomplete warn or exclude accept it)")
                }
                OnIncomplete::Warn => {
                    self.warn(&what);
                    self.index.hygiene.incomplete += 1;
                }
                OnIncomplete::Exclude => {
                    self.index.hygiene.excluded += 1;
                    keep = false;
                }
            }
        }
        if keep {
            self.index.samples.push(Sample {
                start,
                len: self.open_end - start,
            });
            if self.rules.checks_duplicates() {
                self.index.key_hashes.push(key_hash(&key));
            }
            if self.rules.read_member.is_some() {
                self.index.contents.push(self.open_content.take());
            }
            if self.rules.keep_keys {
                self.index.keys.push(key.clone());
            }
            let text = String::from_utf8_lossy(&key).into_owned();
            match &mut self.index.edge_keys {
                None => self.index.edge_keys = Some((text.clone(), text)),
                Some((_, last)) => *last = text,
            }
        }
        Ok(Some(key))
    }

    fn finish(mut self) -> Result<ShardIndex> {
        self.close()?;
        Ok(self.index)
    }
}

/// Read size where the walk jumps far: one page holds a sample's small members and the next
/// header.
const PAGE: usize = 4096;
/// Read size where headers are close together: one request reads through many small members.
const THROUGH: usize = 128 << 10;
/// A jump longer than this is cheaper as a request of its own than read through (on this
/// project's disk a request costs ~20 µs at 32 in flight, the time to read ~30 KiB).
const FAR: u64 = 32 << 10;
/// The walk counts as jumping far until this many short jumps follow a long one: a sample's
/// small members sit between the long jumps over its large ones.
const RECENT: u8 = 8;

/// A reader for walking tar headers with the kernel's readahead off (see [`index_file_with`]).
/// It decides the read sizes itself: one page where the walk jumps far (large members' data
/// skipped), 128 KiB where headers follow each other closely (small members, read through).
/// Seeks inside the buffer cost no system call, so the storage sees about one request per large
/// member, or per 128 KiB of small ones.
pub struct HeaderReader<R> {
    inner: R,
    buf: Vec<u8>,
    /// File offset of `buf[0]`, and how many bytes of `buf` hold data.
    start: u64,
    filled: usize,
    /// The logical position, and where `inner`'s cursor is.
    pos: u64,
    inner_pos: u64,
    /// Short jumps left before the walk no longer counts as jumping far.
    far: u8,
}

impl<R: Read + Seek> HeaderReader<R> {
    /// Reads `inner` from offset 0, where it must be positioned.
    pub fn new(inner: R) -> Self {
        HeaderReader {
            inner,
            buf: vec![0; THROUGH],
            start: 0,
            filled: 0,
            pos: 0,
            inner_pos: 0,
            far: RECENT,
        }
    }

    fn buffered(&self) -> std::ops::Range<u64> {
        self.start..self.start + self.filled as u64
    }
}

impl<R: Read + Seek> Read for HeaderReader<R> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if !self.buffered().contains(&self.pos) {
            if self.inner_pos != self.pos {
                self.inner.seek(SeekFrom::Start(self.pos))?;
                self.inner_pos = self.pos;
            }
            let want = if self.far > 0 { PAGE } else { THROUGH };
            if out.len() >= want {
                let n = self.inner.read(out)?;
                self.inner_pos += n as u64;
                self.pos += n as u64;
                return Ok(n);
            }
            // Invalid until the read succeeds: a failed read may have written into it.
            self.filled = 0;
            let n = self.inner.read(&mut self.buf[..want])?;
            self.inner_pos += n as u64;
            (self.start, self.filled) = (self.pos, n);
            if n == 0 {
                return Ok(0);
            }
        }
        let from = (self.pos - self.start) as usize;
        let n = out.len().min(self.filled - from);
        out[..n].copy_from_slice(&self.buf[from..from + n]);
        self.pos += n as u64;
        Ok(n)
    }
}

impl<R: Read + Seek> Seek for HeaderReader<R> {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        let target = match to {
            SeekFrom::Start(p) => p,
            SeekFrom::Current(d) => self.pos.checked_add_signed(d).ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "seek before the start of the file",
                )
            })?,
            SeekFrom::End(_) => {
                self.pos = self.inner.seek(to)?;
                self.inner_pos = self.pos;
                self.far = RECENT;
                return Ok(self.pos);
            }
        };
        if target < self.pos || target - self.pos >= FAR {
            self.far = RECENT;
        } else {
            self.far = self.far.saturating_sub(1);
        }
        self.pos = target;
        Ok(target)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    fn tar_of(members: &[(&str, &[u8])]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (name, data) in members {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            h.set_entry_type(tar::EntryType::Regular);
            b.append_data(&mut h, name, *data).unwrap();
        }
        b.into_inner().unwrap()
    }

    fn index(bytes: &[u8]) -> Result<ShardIndex> {
        index_reader(HeaderReader::new(Cursor::new(bytes)), bytes.len() as u64)
    }

    /// Counts the reads that reach the underlying reader, and the bytes they return.
    struct Counting<R> {
        inner: R,
        reads: usize,
        bytes: usize,
    }

    impl<R: Read> Read for Counting<R> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = self.inner.read(buf)?;
            self.reads += 1;
            self.bytes += n;
            Ok(n)
        }
    }

    impl<R: Seek> Seek for Counting<R> {
        fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
            self.inner.seek(to)
        }
    }

    /// Indexes `members` through a counting reader: (samples, reads, bytes read, archive size).
    fn reads_to_index(members: &[(String, Vec<u8>)]) -> (usize, usize, usize, usize) {
        let refs: Vec<(&str, &[u8])> = members
            .iter()
            .map(|(n, d)| (n.as_str(), d.as_slice()))
            .collect();
        let bytes = tar_of(&refs);
        let mut counting = Counting {
            inner: Cursor::new(&bytes),
            reads: 0,
            bytes: 0,
        };
        let idx = index_reader(HeaderReader::new(&mut counting), bytes.len() as u64).unwrap();
        (
            idx.samples.len(),
            counting.reads,
            counting.bytes,
            bytes.len(),
        )
    }

    #[test]
    fn header_reader_reads_a_page_per_large_member_and_through_small_ones() {
        // Large members: one page-sized read each, not the data.
        let members: Vec<(String, Vec<u8>)> = (0..200)
            .flat_map(|i| {
                [
                    (format!("s{i:04}.jpg"), vec![7u8; 100 << 10]),
                    (format!("s{i:04}.cls"), b"3".to_vec()),
                ]
            })
            .collect();
        let (samples, reads, bytes, size) = reads_to_index(&members);
        assert_eq!(samples, 200);
        assert!(
            reads <= 202 && bytes <= 202 * PAGE,
            "{reads} reads, {bytes} of {size} B"
        );
        // Small members: read through in large requests, not one per member or per page.
        let members: Vec<(String, Vec<u8>)> = (0..5000)
            .flat_map(|i| {
                [
                    (format!("s{i:05}.txt"), vec![1u8; 100]),
                    (format!("s{i:05}.cls"), b"3".to_vec()),
                ]
            })
            .collect();
        let (samples, reads, bytes, size) = reads_to_index(&members);
        assert_eq!(samples, 5000);
        assert!(
            reads <= size / THROUGH + 3 && bytes <= size,
            "{reads} reads, {bytes} of {size} B"
        );
    }

    #[test]
    fn header_reader_returns_the_bytes_at_every_position() {
        let data: Vec<u8> = (0..600_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
        let mut r = HeaderReader::new(Cursor::new(&data));
        let mut state = 12345u64;
        let mut next = |m: u64| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 33) % m
        };
        let mut pos = 0u64;
        for _ in 0..2000 {
            match next(4) {
                0 => pos = r.seek(SeekFrom::Start(next(data.len() as u64))).unwrap(),
                1 => {
                    let d = next(300_000) as i64 - 100_000;
                    if let Some(to) = pos.checked_add_signed(d) {
                        pos = r.seek(SeekFrom::Current(d)).unwrap();
                        assert_eq!(pos, to);
                    }
                }
                _ => {
                    let mut out = vec![0u8; next(200_000) as usize + 1];
                    let n = r.read(&mut out).unwrap();
                    let at = (pos as usize).min(data.len());
                    assert_eq!(&out[..n], &data[at..at + n], "at {pos}");
                    assert!(n > 0 || pos as usize >= data.len());
                    pos += n as u64;
                }
            }
        }
    }

    #[test]
    fn keys_follow_webdataset() {
        assert_eq!(sample_key(b"n0144/000123.jpg"), Some(&b"n0144/000123"[..]));
        assert_eq!(sample_key(b"a/b.c/x.seg.png"), Some(&b"a/b.c/x"[..]));
        assert_eq!(sample_key(b"x.txt.gz"), Some(&b"x"[..]));
        assert_eq!(sample_key(b"dir/README"), None);
        assert_eq!(sample_key(b"dir/.hidden"), None);
        assert_eq!(sample_key(b"dir/"), None);
    }

    #[test]
    fn groups_consecutive_members_into_contiguous_ranges() {
        let long = format!("{}/k.jpg", "d".repeat(120));
        let long_cls = format!("{}/k.cls", "d".repeat(120));
        let bytes = tar_of(&[
            ("a.jpg", b"12345"),
            ("a.cls", b"1"),
            ("b.jpg", &[7u8; 700]),
            (&long, b"x"),
            (&long_cls, b"y"),
        ]);
        let idx = index(&bytes).unwrap();
        assert_eq!(idx.samples.len(), 3);
        assert_eq!(
            idx.samples[0],
            Sample {
                start: 0,
                len: 2048
            }
        );
        assert_eq!(
            idx.samples[1],
            Sample {
                start: 2048,
                len: 512 + 1024
            }
        );
        // The long-name sample starts at its first 'L' record.
        let s = idx.samples[2];
        assert_eq!(s.start, 2048 + 1536);
        assert_eq!(
            s.start + s.len,
            bytes.len() as u64 - 1024,
            "ends before the end-of-archive blocks"
        );
        let mut a = tar::Archive::new(&bytes[s.start as usize..(s.start + s.len) as usize]);
        let names: Vec<String> = a
            .entries()
            .unwrap()
            .map(|e| e.unwrap().path().unwrap().display().to_string())
            .collect();
        assert_eq!(names, [long, long_cls]);
    }

    #[test]
    fn skipped_entries_are_counted_and_split_samples_rejected() {
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Directory);
        h.set_size(0);
        b.append_data(&mut h, "dir/", &b""[..]).unwrap();
        let bytes = [
            b.into_inner().unwrap(),
            tar_of(&[("dir/a.x", b"1"), ("dir/README", b"2"), ("dir/b.x", b"3")]),
        ]
        .concat();
        // Two archives glued: the first's end blocks stop the reader, as GNU tar would.
        let idx = index(&bytes).unwrap();
        assert_eq!(idx.samples.len(), 0);
        assert_eq!(idx.skipped.directories, 1);

        let bytes = tar_of(&[("dir/a.x", b"1"), ("dir/README", b"2"), ("dir/b.x", b"3")]);
        let idx = index(&bytes).unwrap();
        assert_eq!(idx.samples.len(), 2);
        assert_eq!(idx.skipped.keyless_files, 1);

        let bytes = tar_of(&[("a.x", b"1"), ("README", b"2"), ("a.y", b"3")]);
        let err = format!("{:#}", index(&bytes).unwrap_err());
        assert!(
            err.contains("byte offset 1024") && err.contains("README") && err.contains("\"a\""),
            "{err}"
        );
    }

    #[test]
    fn bad_input_names_the_offset() {
        let err = format!("{:#}", index(&[b'x'; 4096]).unwrap_err());
        assert!(
            err.contains("byte offset 0") && err.contains("expected a tar archive"),
            "{err}"
        );

        let mut bytes = tar_of(&[("a.x", b"1"), ("b.x", b"2")]);
        bytes[512 * 2 + 10] ^= 0x55; // corrupt the second header's name
        let err = format!("{:#}", index(&bytes).unwrap_err());
        assert!(
            err.contains("byte offset 1024") && err.contains("checksum"),
            "{err}"
        );

        let bytes = tar_of(&[("a.x", &[1u8; 3000]), ("b.x", b"2")]);
        let err = format!("{:#}", index(&bytes[..2000]).unwrap_err());
        assert!(err.contains("truncated") && err.contains("a.x"), "{err}");
        // b.x's header is at 3584: cut inside its data, then inside the header itself.
        let err = format!("{:#}", index(&bytes[..4096 + 100]).unwrap_err());
        assert!(
            err.contains("byte offset 3584") && err.contains("truncated"),
            "{err}"
        );
        let err = format!("{:#}", index(&bytes[..3584 + 100]).unwrap_err());
        assert!(
            err.contains("byte offset 3584") && err.contains("expected a tar header"),
            "{err}"
        );

        let err = format!("{:#}", index(&[0x1f, 0x8b, 8, 0, 0, 0]).unwrap_err());
        assert!(err.contains("gzip"), "{err}");
    }

    #[test]
    fn key_at_reads_plain_and_compressed_shards() {
        let dir = tempfile::tempdir().unwrap();
        let long = format!("{}/long.jpg", "d".repeat(120));
        let bytes = tar_of(&[("a.jpg", b"1"), (&long, b"2")]);
        let plain = dir.path().join("s.tar");
        std::fs::write(&plain, &bytes).unwrap();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        io::Write::write_all(&mut gz, &bytes).unwrap();
        let packed = dir.path().join("s.tgz");
        std::fs::write(&packed, gz.finish().unwrap()).unwrap();
        for path in [&plain, &packed] {
            let idx = index_file(path).unwrap();
            assert_eq!(
                key_at(path, idx.samples[0].start, idx.samples[0].len).unwrap(),
                "a"
            );
            let want = format!("{}/long", "d".repeat(120));
            assert_eq!(
                key_at(path, idx.samples[1].start, idx.samples[1].len).unwrap(),
                want
            );
            assert_eq!(idx.edge_keys, Some(("a".to_string(), want.clone())));
            let both: Vec<(u64, u64)> = idx.samples.iter().map(|s| (s.start, s.len)).collect();
            assert_eq!(keys_at(path, &both).unwrap(), ["a".to_string(), want]);
        }
    }

    #[test]
    fn empty_archive_has_no_samples() {
        assert_eq!(index(&[0u8; 1024]).unwrap().samples.len(), 0);
        assert_eq!(index(&[]).unwrap().samples.len(), 0);
    }
}
