//! An independent verifier of reshard's output. It walks tar files 512-byte block by block
//! (its own header parsing: checksums summed over unsigned or signed bytes, octal and base-256
//! sizes, ustar prefixes, GNU long names, PAX records including `size` and the GNU sparse names,
//! old GNU sparse members with their extension blocks, volume labels), splits input and output
//! into samples as raw byte ranges, and checks the output against the input and against
//! `index.json`.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::path::{Path, PathBuf};

use md5::{Digest, Md5};
use serde_json::Value;

const BLOCK: usize = 512;

/// What a record is, as far as samples are concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A regular file (type `0`, NUL or `7`), or an old GNU sparse file (`S`).
    File,
    Directory,
    /// A PAX global header (`g`): a record of its own.
    GlobalHeader,
    /// Links, devices, FIFOs, GNU volume labels (`V`) and anything else.
    Other,
}

/// One tar record: a member with any extension headers (PAX `x`, GNU `L`/`K`) in front of it.
#[derive(Debug, Clone)]
pub struct Record {
    /// Offset of the first block of the record (its first extension header, if any).
    pub start: usize,
    /// Offset of the member's own header (after its extension headers).
    pub header: usize,
    /// Offset of the member's data (after any sparse extension blocks).
    pub data: usize,
    /// The member's stored size (its data runs from `data` to `data + size`).
    pub size: usize,
    /// Offset just past the member's padded data.
    pub end: usize,
    pub kind: Kind,
    /// The full member path: PAX `GNU.sparse.name` (the real name of a PAX sparse file whose
    /// header holds a `GNUSparseFile.N/...` placeholder), else PAX `path`, else a GNU long name,
    /// else ustar prefix + name.
    pub path: Vec<u8>,
    /// The type flags of the record's headers, in order (`b"Lx0"`, `b"0"`, ...).
    pub types: Vec<u8>,
}

/// A tar file split into records.
#[derive(Debug)]
pub struct Walk {
    pub bytes: Vec<u8>,
    pub records: Vec<Record>,
    /// Offset of the end-of-archive marker (the first zero block), or the file length when the
    /// file ends at a block boundary without one.
    pub end: usize,
}

fn octal(field: &[u8]) -> Result<u64, String> {
    let text: Vec<u8> = field
        .iter()
        .copied()
        .skip_while(|&b| b == b' ')
        .take_while(|&b| b != 0 && b != b' ')
        .collect();
    if text.is_empty() {
        return Ok(0);
    }
    let s = std::str::from_utf8(&text).map_err(|_| format!("bad octal field {field:?}"))?;
    u64::from_str_radix(s, 8).map_err(|e| format!("bad octal field {s:?}: {e}"))
}

fn numeric(field: &[u8]) -> Result<u64, String> {
    if field[0] & 0x80 != 0 {
        // Base-256: the remaining bits, big-endian.
        let mut v: u64 = u64::from(field[0] & 0x7f);
        for &b in &field[1..] {
            v = v
                .checked_mul(256)
                .and_then(|v| v.checked_add(u64::from(b)))
                .ok_or("base-256 size overflows")?;
        }
        Ok(v)
    } else {
        octal(field)
    }
}

fn cstr(field: &[u8]) -> &[u8] {
    let n = field.iter().position(|&b| b == 0).unwrap_or(field.len());
    &field[..n]
}

/// What a PAX extended header (`x`) says about the member after it.
#[derive(Debug, Default)]
struct Pax {
    path: Option<Vec<u8>>,
    /// `GNU.sparse.name`: the real name of a sparse file (formats 0.1 and 1.0).
    sparse_name: Option<Vec<u8>>,
    /// `size`: the member's stored size, overriding the header's size field.
    size: Option<u64>,
}

/// Parses the records of a PAX extended header.
fn pax_records(data: &[u8]) -> Result<Pax, String> {
    let mut pax = Pax::default();
    let mut rest = data;
    while !rest.is_empty() && rest[0] != 0 {
        let sp = rest
            .iter()
            .position(|&b| b == b' ')
            .ok_or("PAX record without a length")?;
        let len: usize = std::str::from_utf8(&rest[..sp])
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or("PAX record with a bad length")?;
        if len <= sp + 1 || len > rest.len() || rest[len - 1] != b'\n' {
            return Err(format!("PAX record of bad length {len}"));
        }
        let rec = &rest[sp + 1..len - 1];
        let eq = rec
            .iter()
            .position(|&b| b == b'=')
            .ok_or("PAX record without '='")?;
        let value = &rec[eq + 1..];
        match &rec[..eq] {
            b"path" => pax.path = Some(value.to_vec()),
            b"GNU.sparse.name" => pax.sparse_name = Some(value.to_vec()),
            b"size" => {
                let s = std::str::from_utf8(value)
                    .ok()
                    .and_then(|s| s.parse().ok())
                    .ok_or_else(|| {
                        format!(
                            "PAX size {:?} is not a number",
                            String::from_utf8_lossy(value)
                        )
                    })?;
                pax.size = Some(s);
            }
            _ => {}
        }
        rest = &rest[len..];
    }
    Ok(pax)
}

/// The checksums a header may carry: its bytes summed as unsigned and as signed values, with
/// the checksum field counted as spaces (POSIX says unsigned; old writers summed signed chars).
fn header_sums(h: &[u8]) -> (i64, i64) {
    let mut unsigned = 0i64;
    let mut signed = 0i64;
    for (i, &b) in h.iter().enumerate() {
        let b = if (148..156).contains(&i) { b' ' } else { b };
        unsigned += i64::from(b);
        signed += i64::from(b as i8);
    }
    (unsigned, signed)
}

/// Walks the records of a tar file held in memory.
///
/// # Errors
/// A header with a bad checksum, a size that runs past the end of the file, a file that ends
/// inside a block, or extension headers with no member after them.
pub fn walk(bytes: Vec<u8>) -> Result<Walk, String> {
    let mut records = Vec::new();
    let mut off = 0usize;
    let mut record_start = 0usize;
    let mut long_name: Option<Vec<u8>> = None;
    let mut pax_name: Option<Vec<u8>> = None;
    let mut pax_size: Option<u64> = None;
    let mut types = Vec::new();
    let end = loop {
        if off == bytes.len() {
            if !types.is_empty() {
                return Err(format!("byte {off}: the file ends after extension headers"));
            }
            break off;
        }
        if off + BLOCK > bytes.len() {
            return Err(format!("byte {off}: the file ends inside a header block"));
        }
        let h = &bytes[off..off + BLOCK];
        if h.iter().all(|&b| b == 0) {
            if !types.is_empty() {
                return Err(format!("byte {off}: a zero block after extension headers"));
            }
            break off;
        }
        check_sum(h, off)?;
        let typeflag = h[156];
        // The stored size: the header's field, unless a PAX `size` record overrides it (for
        // the member the PAX header describes, not for other extension headers). For a GNU
        // sparse member (`S`) it is the size of the data regions as stored, not the file's.
        let size = match pax_size {
            Some(s) if !matches!(typeflag, b'x' | b'g' | b'L' | b'K') => {
                pax_size = None;
                s
            }
            _ => numeric(&h[124..136]).map_err(|e| format!("byte {off}: size: {e}"))?,
        };
        let size = usize::try_from(size).map_err(|_| format!("byte {off}: size too large"))?;
        let data = data_start(&bytes, off)?;
        let next = data + size.div_ceil(BLOCK) * BLOCK;
        if next > bytes.len() {
            return Err(format!(
                "byte {off}: member of {size} bytes runs past the end of the file ({} bytes)",
                bytes.len()
            ));
        }
        types.push(if typeflag == 0 { b'0' } else { typeflag });
        let payload = &bytes[data..data + size];
        match typeflag {
            b'L' => long_name = Some(cstr(payload).to_vec()),
            b'K' => {}
            b'x' => {
                let pax = pax_records(payload).map_err(|e| format!("byte {off}: {e}"))?;
                if let Some(p) = pax.sparse_name.or(pax.path) {
                    pax_name = Some(p);
                }
                if let Some(s) = pax.size {
                    pax_size = Some(s);
                }
            }
            _ => {
                let path = if let Some(p) = pax_name.take() {
                    long_name = None;
                    p
                } else if let Some(p) = long_name.take() {
                    p
                } else {
                    header_name(h)
                };
                let kind = kind_of(typeflag);
                records.push(Record {
                    start: record_start,
                    header: off,
                    data,
                    size,
                    end: next,
                    kind,
                    path,
                    types: std::mem::take(&mut types),
                });
                record_start = next;
            }
        }
        off = next;
    };
    Ok(Walk {
        bytes,
        records,
        end,
    })
}

/// Checks the checksum of the header `h` at byte `off`.
fn check_sum(h: &[u8], off: usize) -> Result<(), String> {
    let stored = octal(&h[148..156]).map_err(|e| format!("byte {off}: checksum: {e}"))?;
    let (unsigned, signed) = header_sums(h);
    if i64::try_from(stored).ok() != Some(unsigned) && i64::try_from(stored).ok() != Some(signed) {
        return Err(format!(
            "byte {off}: header checksum {stored} but the header sums to {unsigned} \
             (unsigned bytes) or {signed} (signed bytes)"
        ));
    }
    Ok(())
}

/// Where the data of the member whose header is at `off` starts. An old GNU sparse header whose
/// `isextended` flag (byte 482) is set is followed by sparse extension blocks, each with its own
/// flag at byte 504, before the data.
fn data_start(bytes: &[u8], off: usize) -> Result<usize, String> {
    let h = &bytes[off..off + BLOCK];
    let mut data = off + BLOCK;
    if h[156] == b'S' && h[482] != 0 {
        loop {
            if data + BLOCK > bytes.len() {
                return Err(format!(
                    "byte {off}: the file ends inside the sparse extension blocks"
                ));
            }
            let extended = bytes[data + 504] != 0;
            data += BLOCK;
            if !extended {
                break;
            }
        }
    }
    Ok(data)
}

/// The name a header itself holds: ustar's prefix and name, or the name alone.
fn header_name(h: &[u8]) -> Vec<u8> {
    let name = cstr(&h[..100]);
    let prefix = cstr(&h[345..500]);
    if &h[257..263] == b"ustar\0" && !prefix.is_empty() {
        [prefix, b"/", name].concat()
    } else {
        name.to_vec()
    }
}

/// What a member of `typeflag` is to the verifier.
fn kind_of(typeflag: u8) -> Kind {
    match typeflag {
        0 | b'0' | b'7' | b'S' => Kind::File,
        b'5' => Kind::Directory,
        b'g' => Kind::GlobalHeader,
        _ => Kind::Other,
    }
}

/// Reads and walks a tar file, panicking with the file name on error.
pub fn walk_file(path: &Path) -> Walk {
    let bytes = fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    walk(bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The sample key of a member path (webdataset's rule): the path up to the first `.` of its last
/// component; `None` when that component has no `.`, or only a leading one.
pub fn key_of(path: &[u8]) -> Option<&[u8]> {
    let base = path.iter().rposition(|&b| b == b'/').map_or(0, |i| i + 1);
    match path[base..].iter().position(|&b| b == b'.') {
        None | Some(0) => None,
        Some(dot) => Some(&path[..base + dot]),
    }
}

/// One sample of a tar file: a byte range made of consecutive records sharing a key.
#[derive(Debug, Clone)]
pub struct Sample {
    pub key: String,
    pub start: usize,
    pub end: usize,
    /// Member paths in order.
    pub members: Vec<String>,
}

/// Entries of an input that belong to no sample, as index.json's `reshard.skipped` counts them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Skipped {
    pub directories: u64,
    pub keyless_files: u64,
    pub other_entries: u64,
    pub global_headers: u64,
}

/// An input shard split into samples.
#[derive(Debug)]
pub struct InputShard {
    pub walk: Walk,
    pub samples: Vec<Sample>,
    pub skipped: Skipped,
}

impl InputShard {
    pub fn sample_bytes(&self, s: &Sample) -> &[u8] {
        &self.walk.bytes[s.start..s.end]
    }
}

/// Splits an input shard into samples: maximal runs of consecutive regular files with one key.
/// Other entries end the open sample and are counted as skipped.
pub fn input_samples(path: &Path) -> InputShard {
    let walk = walk_file(path);
    let mut samples: Vec<Sample> = Vec::new();
    let mut skipped = Skipped::default();
    let mut open = false;
    for r in &walk.records {
        let key = match (r.kind, key_of(&r.path)) {
            (Kind::File, Some(k)) => String::from_utf8_lossy(k).into_owned(),
            (kind, _) => {
                match kind {
                    Kind::Directory => skipped.directories += 1,
                    Kind::File => skipped.keyless_files += 1,
                    Kind::GlobalHeader => skipped.global_headers += 1,
                    Kind::Other => skipped.other_entries += 1,
                }
                open = false;
                continue;
            }
        };
        let member = String::from_utf8_lossy(&r.path).into_owned();
        match samples.last_mut() {
            Some(s) if open && s.key == key => {
                s.end = r.end;
                s.members.push(member);
            }
            _ => {
                samples.push(Sample {
                    key,
                    start: r.start,
                    end: r.end,
                    members: vec![member],
                });
                open = true;
            }
        }
    }
    InputShard {
        walk,
        samples,
        skipped,
    }
}

/// What the caller expects of a run.
#[derive(Debug, Clone)]
pub struct Expected {
    /// The input shards in canonical order.
    pub inputs: Vec<PathBuf>,
    /// The directory the command ran in (relative input paths in index.json resolve there).
    pub cwd: PathBuf,
    pub shards: usize,
    pub seed: u64,
    pub epoch: u64,
    pub prefix: String,
    /// Rank count recorded in index.json.
    pub ranks: usize,
}

impl Expected {
    pub fn new(cwd: &Path, inputs: &[PathBuf], shards: usize, seed: u64, ranks: usize) -> Self {
        Expected {
            inputs: inputs.to_vec(),
            cwd: cwd.to_path_buf(),
            shards,
            seed,
            epoch: 0,
            prefix: "shard".to_string(),
            ranks,
        }
    }
}

/// What the verifier found in an accepted output.
#[derive(Debug, Clone)]
pub struct Verified {
    /// Sample keys in output order (shard 0 first).
    pub order: Vec<String>,
    /// Samples per output shard.
    pub counts: Vec<usize>,
    /// Member paths per output shard, in order.
    pub members: Vec<Vec<String>>,
    /// Sample keys in input order.
    pub input_order: Vec<String>,
    pub skipped: Skipped,
    pub index: Value,
}

/// Checks `out` against the inputs and returns what it found; panics with a description of the
/// first violation.
///
/// Every input sample must appear exactly once, byte for byte (headers, extension records, data
/// and padding); each output shard must be a concatenation of whole samples followed by exactly
/// two zero blocks; shard sample counts must differ by at most one; and `index.json` must
/// describe the files.
pub fn verify(exp: &Expected, out: &Path) -> Verified {
    let fail = |msg: String| -> ! { fail_at(out, msg) };
    let InputPool {
        mut remaining,
        input_order,
        skipped,
        sample_bytes,
        input_samples_total,
        input_bytes,
    } = input_pool(exp);
    let names: Vec<String> = (0..exp.shards)
        .map(|i| format!("{}-{i:06}.tar", exp.prefix))
        .collect();
    check_files(out, &names);

    let mut order = Vec::new();
    let mut counts = Vec::new();
    let mut members = Vec::new();
    let mut sizes = Vec::new();
    for name in &names {
        let (count, names_here, size) = read_shard(out, name, &mut remaining, &mut order);
        sizes.push(size);
        counts.push(count);
        members.push(names_here);
    }
    let missing: Vec<&String> = remaining
        .iter()
        .filter(|(_, pool)| pool.values().any(|&n| n > 0))
        .map(|(k, _)| k)
        .take(10)
        .collect();
    if !missing.is_empty() {
        fail(format!(
            "input samples missing from the output, e.g. {missing:?}"
        ));
    }
    if order.len() != input_samples_total {
        fail(format!(
            "{} samples in, {} out",
            input_samples_total,
            order.len()
        ));
    }
    let (lo, hi) = (
        counts.iter().min().copied().unwrap_or(0),
        counts.iter().max().copied().unwrap_or(0),
    );
    if hi - lo > 1 || lo == 0 {
        fail(format!(
            "shard sample counts are not balanced within one (each at least 1): {counts:?}"
        ));
    }

    let index = check_index(
        exp,
        out,
        &names,
        &counts,
        &sizes,
        sample_bytes,
        input_bytes,
        skipped,
        input_samples_total,
    )
    .unwrap_or_else(|e| fail(format!("index.json: {e}")));
    Verified {
        order,
        counts,
        members,
        input_order,
        skipped,
        index,
    }
}

/// `verify`'s failure: panics naming the output directory.
fn fail_at(out: &Path, msg: String) -> ! {
    panic!("verify {}: {msg}", out.display())
}

/// The input: a multiset of sample byte strings, grouped by key, and what the manifest must say
/// about it.
#[derive(Default)]
struct InputPool {
    remaining: HashMap<String, HashMap<Vec<u8>, usize>>,
    input_order: Vec<String>,
    skipped: Skipped,
    sample_bytes: u64,
    input_samples_total: usize,
    input_bytes: u64,
}

fn input_pool(exp: &Expected) -> InputPool {
    let mut p = InputPool::default();
    for path in &exp.inputs {
        let shard = input_samples(path);
        p.input_bytes += shard.walk.bytes.len() as u64;
        p.skipped.directories += shard.skipped.directories;
        p.skipped.keyless_files += shard.skipped.keyless_files;
        p.skipped.other_entries += shard.skipped.other_entries;
        p.skipped.global_headers += shard.skipped.global_headers;
        for s in &shard.samples {
            *p.remaining
                .entry(s.key.clone())
                .or_default()
                .entry(shard.sample_bytes(s).to_vec())
                .or_default() += 1;
            p.input_order.push(s.key.clone());
            p.sample_bytes += (s.end - s.start) as u64;
            p.input_samples_total += 1;
        }
    }
    p
}

/// The output directory holds the shards `names`, index.json and the saved index, nothing else,
/// and no staging directory is left beside it.
fn check_files(out: &Path, names: &[String]) {
    let fail = |msg: String| -> ! { fail_at(out, msg) };
    let mut present: Vec<String> = fs::read_dir(out)
        .unwrap_or_else(|e| fail(format!("cannot list: {e}")))
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    present.sort();
    let mut wanted: Vec<String> = names.to_vec();
    wanted.push("index.json".to_string());
    wanted.push(".reshard".to_string());
    wanted.sort();
    if present != wanted {
        fail(format!("expected files {wanted:?}, found {present:?}"));
    }
    // The saved index: one NAME.reshard-layout per shard, nothing else.
    let mut idx: Vec<String> = fs::read_dir(out.join(".reshard"))
        .unwrap_or_else(|e| fail(format!("cannot list .reshard: {e}")))
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    idx.sort();
    let mut want_idx: Vec<String> = names
        .iter()
        .map(|n| format!("{n}.reshard-layout"))
        .collect();
    want_idx.sort();
    if idx != want_idx {
        fail(format!(
            "expected saved indexes {want_idx:?}, found {idx:?}"
        ));
    }
    // The staging pointer `.OUT.reshard-tmp` and the run directories `.OUT.reshard-tmp.TOKEN`.
    let staging = format!(
        ".{}.reshard-tmp",
        out.file_name().unwrap().to_string_lossy()
    );
    let parent = out.parent().filter(|p| !p.as_os_str().is_empty());
    let parent = parent.unwrap_or(Path::new("."));
    for e in fs::read_dir(parent).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name == staging || name.starts_with(&format!("{staging}.")) {
            fail(format!(
                "staging directory {} left behind",
                parent.join(name).display()
            ));
        }
    }
}

/// Reads the output shard `name` back into input samples, taking them out of `remaining` and
/// appending their keys to `order`: its sample count, member names and size.
fn read_shard(
    out: &Path,
    name: &str,
    remaining: &mut HashMap<String, HashMap<Vec<u8>, usize>>,
    order: &mut Vec<String>,
) -> (usize, Vec<String>, u64) {
    let fail = |msg: String| -> ! { fail_at(out, msg) };
    let path = out.join(name);
    let w = walk_file(&path);
    let len = w.bytes.len();
    if w.end + 2 * BLOCK != len || w.bytes[w.end..].iter().any(|&b| b != 0) {
        fail(format!(
            "{name}: expected the last sample to end at byte {} followed by exactly two zero blocks, but the file has {len} bytes",
            w.end
        ));
    }
    let mut names_here = Vec::new();
    let mut count = 0usize;
    // Runs of records sharing a key; a run may hold several input samples with one key
    // (inputs can repeat keys across shards), so it is split into input samples by content.
    let mut i = 0;
    while i < w.records.len() {
        let r = &w.records[i];
        let key = match (r.kind, key_of(&r.path)) {
            (Kind::File, Some(k)) => String::from_utf8_lossy(k).into_owned(),
            _ => fail(format!(
                "{name}: byte {}: record {:?} (types {:?}) belongs to no sample",
                r.start,
                String::from_utf8_lossy(&r.path),
                String::from_utf8_lossy(&r.types)
            )),
        };
        let mut j = i + 1;
        while j < w.records.len()
            && w.records[j].kind == Kind::File
            && key_of(&w.records[j].path).map(|k| String::from_utf8_lossy(k).into_owned())
                == Some(key.clone())
        {
            j += 1;
        }
        let run = &w.records[i..j];
        let pool = remaining.entry(key.clone()).or_default();
        let Some(cuts) = partition(&w.bytes, run, pool) else {
            fail(format!(
                "{name}: bytes {}..{} (key {key:?}, members {:?}) are not a sequence of input samples: a sample was changed, split, duplicated or invented",
                run[0].start,
                run[run.len() - 1].end,
                run.iter()
                    .map(|r| String::from_utf8_lossy(&r.path).into_owned())
                    .collect::<Vec<_>>()
            ));
        };
        for _ in &cuts {
            order.push(key.clone());
        }
        count += cuts.len();
        names_here.extend(
            run.iter()
                .map(|r| String::from_utf8_lossy(&r.path).into_owned()),
        );
        i = j;
    }
    (count, names_here, len as u64)
}

/// Splits the records `run` into consecutive pieces that are each one of the samples in `pool`,
/// taking them out of it; `None` (and `pool` unchanged) when no such split exists.
fn partition(
    bytes: &[u8],
    run: &[Record],
    pool: &mut HashMap<Vec<u8>, usize>,
) -> Option<Vec<usize>> {
    if run.is_empty() {
        return Some(Vec::new());
    }
    for j in 1..=run.len() {
        let piece = &bytes[run[0].start..run[j - 1].end];
        let n = pool.get_mut(piece).filter(|n| **n > 0);
        if let Some(n) = n {
            *n -= 1;
            if let Some(mut rest) = partition(bytes, &run[j..], pool) {
                rest.insert(0, j);
                return Some(rest);
            }
            *pool.get_mut(piece).unwrap() += 1;
        }
    }
    None
}

#[allow(clippy::too_many_arguments)]
fn check_index(
    exp: &Expected,
    out: &Path,
    names: &[String],
    counts: &[usize],
    sizes: &[u64],
    sample_bytes: u64,
    input_bytes: u64,
    skipped: Skipped,
    samples: usize,
) -> Result<Value, String> {
    let text = fs::read_to_string(out.join("index.json")).map_err(|e| e.to_string())?;
    let v: Value = serde_json::from_str(&text).map_err(|e| format!("not JSON: {e}"))?;
    eq("__kind__", &v["__kind__"], "wids-shard-index-v1".into())?;
    eq("wids_version", &v["wids_version"], 1.into())?;
    check_shardlist(&v, names, counts, sizes)?;
    let r = &v["reshard"];
    if !r.is_object() {
        return Err("no `reshard` object".into());
    }
    if !r["version"].is_string() {
        return Err(format!(
            "reshard.version: expected a string, found {}",
            r["version"]
        ));
    }
    eq("reshard.seed", &r["seed"], exp.seed.into())?;
    eq("reshard.epoch", &r["epoch"], exp.epoch.into())?;
    eq("reshard.shards", &r["shards"], exp.shards.into())?;
    eq("reshard.samples", &r["samples"], samples.into())?;
    eq(
        "reshard.sample_bytes",
        &r["sample_bytes"],
        sample_bytes.into(),
    )?;
    eq(
        "reshard.output_bytes",
        &r["output_bytes"],
        sizes.iter().sum::<u64>().into(),
    )?;
    eq("reshard.input_bytes", &r["input_bytes"], input_bytes.into())?;
    eq("reshard.ranks", &r["ranks"], exp.ranks.into())?;
    let sk = &r["skipped"];
    eq(
        "reshard.skipped.directories",
        &sk["directories"],
        skipped.directories.into(),
    )?;
    eq(
        "reshard.skipped.keyless_files",
        &sk["keyless_files"],
        skipped.keyless_files.into(),
    )?;
    eq(
        "reshard.skipped.other_entries",
        &sk["other_entries"],
        skipped.other_entries.into(),
    )?;
    eq(
        "reshard.skipped.global_headers",
        &sk["global_headers"],
        skipped.global_headers.into(),
    )?;
    check_inputs(r, exp)?;
    Ok(v)
}

/// A value of index.json: `got` must be `want`.
fn eq(what: &str, got: &Value, want: Value) -> Result<(), String> {
    if *got != want {
        return Err(format!("{what}: expected {want}, found {got}"));
    }
    Ok(())
}

/// index.json's shardlist: one entry per shard, with its name, sample count and size.
fn check_shardlist(
    v: &Value,
    names: &[String],
    counts: &[usize],
    sizes: &[u64],
) -> Result<(), String> {
    let list = v["shardlist"]
        .as_array()
        .ok_or("shardlist is not an array")?;
    if list.len() != names.len() {
        return Err(format!(
            "shardlist has {} entries for {} shards",
            list.len(),
            names.len()
        ));
    }
    for (i, e) in list.iter().enumerate() {
        eq(
            &format!("shardlist[{i}].url"),
            &e["url"],
            names[i].as_str().into(),
        )?;
        eq(
            &format!("shardlist[{i}].nsamples"),
            &e["nsamples"],
            counts[i].into(),
        )?;
        eq(
            &format!("shardlist[{i}].filesize"),
            &e["filesize"],
            sizes[i].into(),
        )?;
    }
    Ok(())
}

/// `reshard.inputs`: the inputs, in order, as paths relative to the directory reshard ran in.
fn check_inputs(r: &Value, exp: &Expected) -> Result<(), String> {
    let inputs = r["inputs"]
        .as_array()
        .ok_or("reshard.inputs is not an array")?;
    let canon = |p: &Path| fs::canonicalize(p).map_err(|e| format!("{}: {e}", p.display()));
    if inputs.len() != exp.inputs.len() {
        return Err(format!(
            "reshard.inputs has {} entries for {} inputs",
            inputs.len(),
            exp.inputs.len()
        ));
    }
    for (i, (got, want)) in inputs.iter().zip(&exp.inputs).enumerate() {
        let got = got.as_str().ok_or("reshard.inputs holds a non-string")?;
        if canon(&exp.cwd.join(got))? != canon(want)? {
            return Err(format!(
                "reshard.inputs[{i}] is {got:?}, expected {}",
                want.display()
            ));
        }
    }
    Ok(())
}

/// Requires two output directories to be byte-identical: the same files, every shard equal
/// byte for byte, and index.json equal except for the keys named in `ignore` (under `reshard`).
pub fn assert_same_output(a: &Path, b: &Path, ignore: &[&str]) {
    let files = |d: &Path| -> BTreeMap<String, PathBuf> {
        fs::read_dir(d)
            .unwrap_or_else(|e| panic!("list {}: {e}", d.display()))
            .map(|e| {
                let e = e.unwrap();
                (e.file_name().to_string_lossy().into_owned(), e.path())
            })
            .collect()
    };
    let (fa, fb) = (files(a), files(b));
    assert_eq!(
        fa.keys().collect::<Vec<_>>(),
        fb.keys().collect::<Vec<_>>(),
        "{} and {} hold different files",
        a.display(),
        b.display()
    );
    for (name, pa) in &fa {
        if name == ".reshard" {
            // Saved indexes record modification times: compared through the shards they index.
            continue;
        }
        if pa.is_dir() {
            // A `--split` output's splits, and energon's .nv-meta/: every file byte for byte.
            assert_same_output(pa, &fb[name], ignore);
            continue;
        }
        let (x, y) = (fs::read(pa).unwrap(), fs::read(&fb[name]).unwrap());
        if name == "index.json" {
            let strip = |bytes: &[u8]| {
                let mut v: Value = serde_json::from_slice(bytes).unwrap();
                for k in ignore {
                    v["reshard"].as_object_mut().unwrap().remove(*k);
                }
                v
            };
            assert_eq!(
                strip(&x),
                strip(&y),
                "index.json differs between {} and {} (ignoring {ignore:?})",
                a.display(),
                b.display()
            );
        } else if x != y {
            let at = x
                .iter()
                .zip(&y)
                .position(|(p, q)| p != q)
                .unwrap_or(x.len().min(y.len()));
            panic!(
                "{name} differs between {} and {}: {} vs {} bytes, first difference at byte {at}",
                a.display(),
                b.display(),
                x.len(),
                y.len()
            );
        }
    }
}

/// Cross-checks the crate's own indexer against this verifier's reading of an input shard: both
/// must find the same sample byte ranges and the same skipped entries.
pub fn assert_indexer_agrees(path: &Path) {
    let ours = input_samples(path);
    let theirs = reshard::tar::index_file(path)
        .unwrap_or_else(|e| panic!("reshard's indexer rejects {}: {e:#}", path.display()));
    let ours_ranges: Vec<(u64, u64)> = ours
        .samples
        .iter()
        .map(|s| (s.start as u64, (s.end - s.start) as u64))
        .collect();
    let their_ranges: Vec<(u64, u64)> = theirs.samples.iter().map(|s| (s.start, s.len)).collect();
    assert_eq!(
        ours_ranges,
        their_ranges,
        "{}: the indexer's sample ranges differ from the verifier's",
        path.display()
    );
    let k = theirs.skipped;
    assert_eq!(
        ours.skipped,
        Skipped {
            directories: k.directories,
            keyless_files: k.keyless_files,
            other_entries: k.other_entries,
            global_headers: k.global_headers,
        },
        "{}: skipped entries differ",
        path.display()
    );
}

/// Every record type letter used by the records of some input shard.
pub fn record_types(inputs: &[PathBuf]) -> Vec<u8> {
    let mut types: Vec<u8> = inputs
        .iter()
        .flat_map(|p| input_samples(p).walk.records)
        .flat_map(|r| r.types)
        .collect();
    types.sort_unstable();
    types.dedup();
    types
}

/// The length of the longest member path of the input shards.
pub fn longest_path(inputs: &[PathBuf]) -> usize {
    inputs
        .iter()
        .flat_map(|p| input_samples(p).walk.records)
        .map(|r| r.path.len())
        .max()
        .unwrap_or(0)
}

/// The golden digest of an output: MD5 over every file of the output directory (not the saved
/// index under `.reshard/`, which records input mtimes), by name: its name, its length and its
/// bytes; index.json without its rank count.
pub fn output_digest(out: &Path) -> String {
    let mut names: Vec<String> = fs::read_dir(out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with('.'))
        .collect();
    names.sort();
    let mut md5 = Md5::new();
    for name in names {
        let mut bytes = fs::read(out.join(&name)).unwrap();
        if name == "index.json" {
            let mut v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
            v["reshard"]
                .as_object_mut()
                .expect("index.json has a reshard object")
                .remove("ranks");
            bytes = serde_json::to_vec(&v).unwrap();
        }
        md5.update(name.as_bytes());
        md5.update((bytes.len() as u64).to_le_bytes());
        md5.update(&bytes);
    }
    md5.finalize().iter().map(|b| format!("{b:02x}")).collect()
}
