//! Grouping a shard's members into samples, and the sample hygiene rules applied on the way:
//! what a shard's index holds, what is skipped, and the one policy for incomplete samples and
//! duplicates.
//!
//! A sample is a run of consecutive members sharing a key (see [`crate::tar::key`]). The index
//! types live here, with the grouper that builds them, so that `index` (which feeds the grouper)
//! depends on this module and not the other way round.

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};

use crate::tar::headers::{EntryKind, Member};
use crate::tar::key::{extension, key_hash, sample_key, LoaderNames};

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
    pub(crate) fn to_array(self) -> [u64; 4] {
        [
            self.directories,
            self.keyless_files,
            self.other_entries,
            self.global_headers,
        ]
    }

    /// Inverse of [`Skipped::to_array`].
    pub(crate) fn from_array(a: [u64; 4]) -> Self {
        Skipped {
            directories: a[0],
            keyless_files: a[1],
            other_entries: a[2],
            global_headers: a[3],
        }
    }

    /// Total number of skipped entries.
    pub(crate) fn total(self) -> u64 {
        self.to_array().iter().sum()
    }
}

/// `--on-incomplete`: what to do with a sample that lacks a `--require-ext` member.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub(crate) enum OnIncomplete {
    /// Fail, naming the file, the key and what is missing.
    #[default]
    Abort,
    /// Keep the sample, with a warning.
    Warn,
    /// Leave the sample out (counted).
    Exclude,
}

impl OnIncomplete {
    /// The flag's value, as `--on-incomplete` takes it.
    pub(crate) fn flag(self) -> &'static str {
        match self {
            OnIncomplete::Abort => "abort",
            OnIncomplete::Warn => "warn",
            OnIncomplete::Exclude => "exclude",
        }
    }
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
    /// Keep everything silently.
    #[default]
    Keep,
    /// Fail: the output's loader index (`--energon`) requires unique keys. Not a flag value:
    /// `--energon` sets it whatever `--on-duplicate` says.
    #[value(skip)]
    Unique,
}

impl OnDuplicate {
    /// The flag's value, as `--on-duplicate` takes it; `unique` is what `--energon` asks for.
    pub(crate) fn flag(self) -> &'static str {
        match self {
            OnDuplicate::Abort => "abort",
            OnDuplicate::Warn => "warn",
            OnDuplicate::Keep => "keep",
            OnDuplicate::Unique => "unique (--energon)",
        }
    }

    /// Applies the policy to one duplicate that `what` describes (file, byte offset, key): an
    /// error with the flag's advice for [`OnDuplicate::Abort`], a warning for
    /// [`OnDuplicate::Warn`], nothing for [`OnDuplicate::Keep`]. Every duplicate message of the
    /// tool goes through here, whether found while grouping a shard or across shards; the caller
    /// counts what is kept.
    ///
    /// # Errors
    /// [`OnDuplicate::Abort`]: `what`, with the flags that would accept it.
    pub(crate) fn apply(self, what: &str, warnings: &mut Warnings) -> Result<()> {
        match self {
            OnDuplicate::Abort => bail!("{what} (--on-duplicate abort; warn or keep accept it)"),
            OnDuplicate::Warn => warnings.warn(what),
            OnDuplicate::Keep => {}
            OnDuplicate::Unique => bail!(
                "{what} (--energon: energon requires unique sample keys, whatever --on-duplicate says)"
            ),
        }
        Ok(())
    }
}

/// Warnings about the input: each one counted, only the first [`Warnings::SHOWN`] printed (a
/// dataset with a systematic problem would otherwise print one line per sample).
#[derive(Debug, Default)]
pub(crate) struct Warnings {
    count: u64,
}

impl Warnings {
    /// How many warnings are printed.
    pub(crate) const SHOWN: u64 = 5;

    /// Counts a warning, and prints it to stderr while fewer than [`Warnings::SHOWN`] were.
    pub(crate) fn warn(&mut self, what: &str) {
        if self.count_one() {
            crate::errln!("reshard: warning: {what}");
        }
    }

    /// Counts a warning; whether it is among the first [`Warnings::SHOWN`] (and so printed).
    fn count_one(&mut self) -> bool {
        self.count += 1;
        self.count <= Self::SHOWN
    }
}

/// Sample hygiene rules applied while indexing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Rules {
    /// Extensions every sample must have (`--require-ext jpg,cls`).
    pub(crate) require_ext: Vec<String>,
    pub(crate) on_incomplete: OnIncomplete,
    pub(crate) on_duplicate: OnDuplicate,
    /// Keep every sample's key ([`ShardIndex::keys`]): for ordering or routing by key.
    pub(crate) keep_keys: bool,
    /// Read the content of each sample's member with this extension, refusing members larger
    /// than the limit ([`ShardIndex::contents`]): labels for ordering and stratifying.
    pub(crate) read_member: Option<(String, u64)>,
    /// Member names must read the same to these loaders (`--energon`, `--dali-index`).
    pub(crate) loader_names: LoaderNames,
    /// Read past zero blocks (`--ignore-zeros`): concatenated archives, lone zero blocks.
    /// Without it, data after the first zero block is an error.
    pub(crate) ignore_zeros: bool,
}

impl Rules {
    /// The flags that set these rules, as a user types them (`--require-ext jpg,cls
    /// --on-incomplete abort --on-duplicate abort`), and the loader indexes whose name checks
    /// apply: for what `--resume` records.
    pub(crate) fn flags(&self) -> String {
        let mut s = String::new();
        if !self.require_ext.is_empty() {
            s += &format!("--require-ext {} ", self.require_ext.join(","));
        }
        s += &format!(
            "--on-incomplete {} --on-duplicate {}",
            self.on_incomplete.flag(),
            self.on_duplicate.flag()
        );
        if self.loader_names.energon {
            s += " --energon";
        }
        if self.loader_names.dali {
            s += " --dali-index";
        }
        s
    }

    /// Whether duplicate keys are looked for (and so key hashes kept).
    pub(crate) fn checks_duplicates(&self) -> bool {
        self.on_duplicate != OnDuplicate::Keep
    }
}

/// What the hygiene rules found (and kept or left out).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Hygiene {
    /// Samples missing a required extension (kept with --on-incomplete warn).
    pub(crate) incomplete: u64,
    /// Samples left out by --on-incomplete exclude.
    pub(crate) excluded: u64,
    /// Repeated extensions, non-adjacent members and keys in two samples (kept with warn/keep).
    pub(crate) duplicates: u64,
}

impl Hygiene {
    pub(crate) fn to_array(self) -> [u64; 3] {
        [self.incomplete, self.excluded, self.duplicates]
    }

    pub(crate) fn from_array(a: [u64; 3]) -> Self {
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
    pub(crate) edge_keys: Option<(String, String)>,
    pub(crate) hygiene: Hygiene,
    /// A 64-bit hash of each sample's key (only when duplicate keys are looked for across
    /// shards), for [`key_hash`] comparisons; equal hashes are confirmed by reading the keys.
    pub(crate) key_hashes: Vec<u64>,
    /// Each sample's key, when [`Rules::keep_keys`].
    pub(crate) keys: Vec<Vec<u8>>,
    /// Each sample's [`Rules::read_member`] content (`None`: no such member), when asked for.
    pub(crate) contents: Vec<Option<Vec<u8>>>,
    /// Runs of zero blocks read past inside the shard ([`Rules::ignore_zeros`]).
    pub(crate) zero_runs: u64,
    /// Read from a saved index, not from the shard: its bytes were not read.
    pub(crate) saved: bool,
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

/// What a user can do about another entry that is not a regular file inside a sample.
const OTHER_ADVICE: &str = ": a sample's members must be regular files (webdataset reads only those); rename it so that its key is no sample's, or leave it out of the shard";

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

/// Groups consecutive members by key into samples, applying the hygiene [`Rules`]. Feed it
/// every member of a header walk in order ([`Grouper::push`]), then take the index
/// ([`Grouper::finish`]).
pub(crate) struct Grouper<'r> {
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
    warnings: Warnings,
}

impl<'r> Grouper<'r> {
    pub(crate) fn new(rules: &'r Rules) -> Self {
        Grouper {
            rules,
            index: ShardIndex::default(),
            open: None,
            open_end: 0,
            open_exts: Vec::new(),
            open_content: None,
            after_skip: None,
            warnings: Warnings::default(),
        }
    }

    /// Adds the next member of the walk; `content` is its data when it is the
    /// [`Rules::read_member`] member.
    ///
    /// # Errors
    /// A member that would split a sample (after a skipped entry that closed it), a link inside
    /// a sample, or a hygiene violation the rules say to abort on. Messages start with the byte
    /// offset; the caller adds the file.
    pub(crate) fn push(&mut self, member: &Member, content: Option<Vec<u8>>) -> Result<()> {
        match classify(member) {
            Kind::Member(key) => self.push_keyed(member, key, content),
            kind => self.push_skipped(member, kind),
        }
    }

    /// A member with a sample key: it continues the open sample or starts the next one.
    fn push_keyed(&mut self, member: &Member, key: &[u8], content: Option<Vec<u8>>) -> Result<()> {
        let (start, end) = (member.start, member.end);
        if let Some(problem) = self.rules.loader_names.problem(&member.path, key) {
            bail!(
                "byte offset {}: member {:?}: {problem}",
                member.header,
                member.name()
            );
        }
        if member.sparse && self.rules.loader_names != LoaderNames::default() {
            bail!(
                "byte offset {}: member {:?} is stored sparse (with holes): a loader reading its bytes at an offset would not get the file; a loader index needs plain members",
                member.header,
                member.name()
            );
        }
        let ext = extension(&member.path).to_vec();
        if self.open.is_some() && start != self.open_end {
            // Zero blocks read past (`--ignore-zeros`) end a sample: its range must not hold
            // them.
            self.close()?;
        }
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
                    self.rules.on_duplicate.apply(&what, &mut self.warnings)?;
                    self.index.hygiene.duplicates += 1;
                }
                self.open_exts.push(ext);
                return Ok(());
            }
        }
        if let Some(skip) = self.after_skip.take() {
            if skip.closed.as_deref() == Some(key) || skip.own.as_deref() == Some(key) {
                bail!(
                    "{} but sits among the members of sample {:?}{}",
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
        Ok(())
    }

    /// An entry that belongs to no sample: counted, and it closes the open sample.
    fn push_skipped(&mut self, member: &Member, kind: Kind<'_>) -> Result<()> {
        let skipped = &mut self.index.skipped;
        match kind {
            Kind::Directory => skipped.directories += 1,
            Kind::Keyless => skipped.keyless_files += 1,
            Kind::GlobalHeader => skipped.global_headers += 1,
            Kind::Other | Kind::Member(_) => skipped.other_entries += 1,
        }
        let link = matches!(member.kind, EntryKind::HardLink | EntryKind::Symlink);
        // An entry named like a sample's members (a link, a device, a directory, an unknown
        // type) belongs to that sample, whether it comes first, last or between its files:
        // leaving it out would silently change the sample, so it is refused wherever it sits.
        let own = sample_key(&member.path).map(<[u8]>::to_vec);
        if let (Some(own), Some((open_key, _))) = (&own, &self.open) {
            if own == open_key {
                let (what, advice) = skip_message(member, &kind, link);
                bail!(
                    "{what} in sample {:?}{advice}",
                    String::from_utf8_lossy(own)
                );
            }
        }
        let closed = self.close()?;
        if closed.is_some() || own.is_some() {
            // Only kept while a member of the closed sample (or the link's) may still follow.
            let (what, advice) = skip_message(member, &kind, link);
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
                    self.warnings.warn(&what);
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

    /// Closes the last sample and returns the shard's index.
    ///
    /// # Errors
    /// The last sample violates a rule the rules say to abort on.
    pub(crate) fn finish(mut self) -> Result<ShardIndex> {
        self.close()?;
        Ok(self.index)
    }
}

/// How a message names a skipped entry (`link`: a hard or symbolic link), and what a user can
/// do about it should it sit inside a sample.
fn skip_message(member: &Member, kind: &Kind<'_>, link: bool) -> (String, &'static str) {
    let name = member.name();
    if link {
        return (
            format!(
                "byte offset {}: member {name:?} is {} (to {:?})",
                member.header,
                member.kind.describe(),
                String::from_utf8_lossy(&member.link)
            ),
            LINK_ADVICE,
        );
    }
    let start = member.start;
    if matches!(kind, Kind::Keyless) {
        return (
            format!("byte offset {start}: member {name:?} has no sample key (expected a '.' in its last path component)"),
            "",
        );
    }
    (
        format!(
            "byte offset {start}: member {name:?} is {}",
            member.kind.describe()
        ),
        OTHER_ADVICE,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A member of `kind` named `path` whose records span `start..end` (one header block, then
    /// its data).
    fn member(path: &str, kind: EntryKind, start: u64, end: u64) -> Member {
        Member {
            start,
            header: start,
            data: start + 512,
            stored: end - start - 512,
            end,
            kind,
            path: path.as_bytes().to_vec(),
            link: Vec::new(),
            sparse: false,
        }
    }

    /// Regular files, one block of data each, back to back from offset 0.
    fn files(paths: &[&str]) -> Vec<Member> {
        let mut at = 0;
        let mut v = Vec::new();
        for p in paths {
            v.push(member(p, EntryKind::Regular, at, at + 1024));
            at += 1024;
        }
        v
    }

    /// The samples as (start, len).
    fn ranges(idx: &ShardIndex) -> Vec<(u64, u64)> {
        idx.samples.iter().map(|s| (s.start, s.len)).collect()
    }

    fn group(rules: &Rules, members: &[Member]) -> Result<ShardIndex> {
        let mut g = Grouper::new(rules);
        for m in members {
            g.push(m, None)?;
        }
        g.finish()
    }

    fn duplicates(on_duplicate: OnDuplicate) -> Rules {
        Rules {
            on_duplicate,
            ..Rules::default()
        }
    }

    fn required(on_incomplete: OnIncomplete) -> Rules {
        Rules {
            require_ext: vec!["jpg".into(), "cls".into()],
            on_incomplete,
            ..Rules::default()
        }
    }

    #[test]
    fn the_rules_read_back_as_the_flags_that_set_them() {
        // `--resume` compares this text with the interrupted run's: were two policies to read
        // the same, a resume could switch policy halfway through an output.
        let rules = Rules {
            require_ext: vec!["jpg".into(), "cls".into()],
            on_incomplete: OnIncomplete::Exclude,
            on_duplicate: OnDuplicate::Warn,
            loader_names: LoaderNames {
                energon: true,
                dali: true,
            },
            ..Rules::default()
        };
        assert_eq!(
            rules.flags(),
            "--require-ext jpg,cls --on-incomplete exclude --on-duplicate warn --energon --dali-index"
        );
        let incomplete = [
            OnIncomplete::Abort,
            OnIncomplete::Warn,
            OnIncomplete::Exclude,
        ];
        let flags: Vec<_> = incomplete.iter().map(|o| o.flag()).collect();
        assert_eq!(flags, ["abort", "warn", "exclude"]);
        let duplicate = [
            OnDuplicate::Abort,
            OnDuplicate::Warn,
            OnDuplicate::Keep,
            OnDuplicate::Unique,
        ];
        let flags: Vec<_> = duplicate.iter().map(|o| o.flag()).collect();
        assert_eq!(flags, ["abort", "warn", "keep", "unique (--energon)"]);
    }

    #[test]
    fn counters_travel_as_arrays_in_field_order() {
        // The ranks sum these arrays field by field: a swapped or dropped field would move a
        // count into another's column of the summary.
        let s = Skipped {
            directories: 1,
            keyless_files: 2,
            other_entries: 3,
            global_headers: 4,
        };
        assert_eq!(s.to_array(), [1, 2, 3, 4]);
        assert_eq!(Skipped::from_array([1, 2, 3, 4]), s);
        assert_eq!(s.total(), 10);
        let h = Hygiene {
            incomplete: 5,
            excluded: 6,
            duplicates: 7,
        };
        assert_eq!(h.to_array(), [5, 6, 7]);
        assert_eq!(Hygiene::from_array([5, 6, 7]), h);
    }

    #[test]
    fn skipped_entries_are_counted_by_kind_and_end_the_sample() {
        let dir = |p, at| member(p, EntryKind::Directory, at, at + 512);
        let entries = vec![
            member("a.jpg", EntryKind::Regular, 0, 1024),
            dir("d/", 1024),
            dir("e/", 1536),
            member("README", EntryKind::Regular, 2048, 3072),
            member("pax", EntryKind::GlobalHeader, 3072, 4096),
            member("pax", EntryKind::GlobalHeader, 4096, 5120),
            member("pax", EntryKind::GlobalHeader, 5120, 6144),
            member("vol", EntryKind::Label, 6144, 6656),
            member("fifo.x", EntryKind::Other(b'6'), 6656, 7168),
            member("b.jpg", EntryKind::Regular, 7168, 8192),
        ];
        let idx = group(&Rules::default(), &entries).unwrap();
        assert_eq!(
            idx.skipped,
            Skipped {
                directories: 2,
                keyless_files: 1,
                other_entries: 2,
                global_headers: 3,
            }
        );
        assert_eq!(ranges(&idx), [(0, 1024), (7168, 1024)]);
        assert_eq!(idx.edge_keys, Some(("a".into(), "b".into())));
    }

    #[test]
    fn a_link_named_like_the_open_sample_is_refused_and_others_are_skipped() {
        let mut entries = files(&["a.jpg", "a.lnk", "b.jpg"]);
        entries[1].kind = EntryKind::Symlink;
        entries[1].link = b"a.jpg".to_vec();
        let err = format!("{:#}", group(&Rules::default(), &entries).unwrap_err());
        assert!(
            err.contains("byte offset 1024: member \"a.lnk\" is a symbolic link")
                && err.contains("in sample \"a\"")
                && err.contains("--dereference"),
            "{err}"
        );
        // A link with a key of its own, which no member shares, is left out like any other
        // non-regular entry.
        entries[1].path = b"z.lnk".to_vec();
        let idx = group(&Rules::default(), &entries).unwrap();
        assert_eq!(idx.samples.len(), 2);
        assert_eq!(idx.skipped.other_entries, 1);
    }

    #[test]
    fn an_entry_named_like_a_sample_is_refused_first_last_or_between_its_files() {
        // Once only between a sample's files: first or last it was left out, changing the
        // sample silently.
        let kinds = [
            EntryKind::Other(b'6'),
            EntryKind::Other(b'Z'),
            EntryKind::Directory,
            EntryKind::Label,
            EntryKind::Symlink,
        ];
        for kind in kinds {
            for (names, at) in [
                (["a.fifo", "a.jpg", "a.cls", "b.jpg"], 0),
                (["a.jpg", "a.fifo", "a.cls", "b.jpg"], 1024),
                (["a.jpg", "a.cls", "a.fifo", "b.jpg"], 2048),
            ] {
                let mut entries = files(&names);
                let i = names.iter().position(|n| *n == "a.fifo").unwrap();
                entries[i].kind = kind;
                let err = format!("{:#}", group(&Rules::default(), &entries).unwrap_err());
                let want = format!("byte offset {at}: member \"a.fifo\" is {}", kind.describe());
                assert!(
                    err.contains(&want) && err.contains("sample \"a\""),
                    "{kind:?} at {at}: {err}"
                );
            }
            // With a key no sample has, it is left out and counted.
            let mut entries = files(&["a.jpg", "z.fifo", "b.jpg"]);
            entries[1].kind = kind;
            let idx = group(&Rules::default(), &entries).unwrap();
            assert_eq!(ranges(&idx), [(0, 1024), (2048, 1024)], "{kind:?}");
            assert_eq!(idx.skipped.total(), 1);
        }
    }

    #[test]
    fn members_of_one_key_form_one_sample_unless_zero_blocks_separate_them() {
        let idx = group(&Rules::default(), &files(&["a.jpg", "a.cls", "b.jpg"])).unwrap();
        assert_eq!(ranges(&idx), [(0, 2048), (2048, 1024)]);
        // A zero block read past (--ignore-zeros) between two members of "a": the sample's range
        // must not hold it, so the members become two samples.
        let gap = [
            member("a.jpg", EntryKind::Regular, 0, 1024),
            member("a.cls", EntryKind::Regular, 1536, 2560),
        ];
        let idx = group(&Rules::default(), &gap).unwrap();
        assert_eq!(ranges(&idx), [(0, 1024), (1536, 1024)]);
    }

    #[test]
    fn a_sparse_member_is_refused_only_where_a_loader_index_reads_it() {
        let mut entries = files(&["a.jpg", "a.cls"]);
        entries[1].sparse = true;
        let idx = group(&Rules::default(), &entries).unwrap();
        assert_eq!(ranges(&idx), [(0, 2048)], "moved verbatim, holes and all");
        let dali = Rules {
            loader_names: LoaderNames {
                energon: false,
                dali: true,
            },
            ..Rules::default()
        };
        let err = group(&dali, &entries).unwrap_err().to_string();
        assert!(
            err.starts_with("byte offset 1024: member \"a.cls\" is stored sparse"),
            "{err}"
        );
        entries[1].sparse = false;
        assert_eq!(ranges(&group(&dali, &entries).unwrap()), [(0, 2048)]);
    }

    #[test]
    fn the_duplicate_policy_errs_warns_or_keeps() {
        let mut w = Warnings::default();
        let err = OnDuplicate::Abort.apply("dup", &mut w).unwrap_err();
        assert_eq!(
            err.to_string(),
            "dup (--on-duplicate abort; warn or keep accept it)"
        );
        let err = OnDuplicate::Unique.apply("dup", &mut w).unwrap_err();
        assert!(err.to_string().contains("energon requires unique"), "{err}");
        assert_eq!(w.count, 0, "an error is not also a warning");
        OnDuplicate::Keep.apply("dup", &mut w).unwrap();
        assert_eq!(w.count, 0, "keep is silent");
        OnDuplicate::Warn.apply("dup", &mut w).unwrap();
        assert_eq!(w.count, 1);
    }

    #[test]
    fn every_warning_is_counted_and_the_first_five_shown() {
        let mut w = Warnings::default();
        let shown: Vec<bool> = (0..7).map(|_| w.count_one()).collect();
        assert_eq!(shown, [true, true, true, true, true, false, false]);
        let mut w = Warnings::default();
        for _ in 0..3 {
            w.warn("test warning");
        }
        assert_eq!(w.count, 3);
    }

    #[test]
    fn a_repeated_extension_is_a_duplicate_unless_duplicates_are_kept() {
        let entries = files(&["a.jpg", "a.cls", "a.jpg", "b.jpg"]);
        let err = group(&duplicates(OnDuplicate::Abort), &entries).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("byte offset 2048: sample \"a\" has a second .jpg member"),
            "{err}"
        );
        let idx = group(&duplicates(OnDuplicate::Warn), &entries).unwrap();
        assert_eq!(idx.hygiene.duplicates, 1);
        assert_eq!(idx.samples.len(), 2, "the member stays in its sample");
        // Keys are hashed, for the check across samples, only when duplicates are looked for.
        assert_eq!(idx.key_hashes, [key_hash(b"a"), key_hash(b"b")]);
        let idx = group(&duplicates(OnDuplicate::Keep), &entries).unwrap();
        assert_eq!(idx.hygiene, Hygiene::default());
        assert!(idx.key_hashes.is_empty());
        assert!(!duplicates(OnDuplicate::Keep).checks_duplicates());
        assert!(duplicates(OnDuplicate::Unique).checks_duplicates());
        // Distinct extensions are no duplicate, whatever the policy.
        let idx = group(&duplicates(OnDuplicate::Abort), &files(&["a.jpg", "a.cls"])).unwrap();
        assert_eq!(idx.hygiene.duplicates, 0);
    }

    #[test]
    fn an_incomplete_sample_aborts_is_kept_with_a_warning_or_left_out() {
        let entries = files(&["a.jpg", "a.cls", "b.jpg", "c.cls", "c.jpg", "d.cls"]);
        let err = group(&required(OnIncomplete::Abort), &entries).unwrap_err();
        assert_eq!(
            err.to_string(),
            "byte offset 2048: sample \"b\" lacks .cls (has .jpg) (--require-ext; --on-incomplete warn or exclude accept it)"
        );
        let idx = group(&required(OnIncomplete::Warn), &entries).unwrap();
        assert_eq!(idx.samples.len(), 4);
        assert_eq!(
            idx.hygiene,
            Hygiene {
                incomplete: 2,
                excluded: 0,
                duplicates: 0
            }
        );
        let idx = group(&required(OnIncomplete::Exclude), &entries).unwrap();
        assert_eq!(
            ranges(&idx),
            [(0, 2048), (3072, 2048)],
            "a and c, complete, stay"
        );
        assert_eq!(
            idx.hygiene,
            Hygiene {
                incomplete: 0,
                excluded: 2,
                duplicates: 0
            }
        );
        assert_eq!(idx.edge_keys, Some(("a".into(), "c".into())));
    }
}
