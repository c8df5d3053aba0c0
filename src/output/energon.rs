//! `--energon`: the metadata Megatron-Energon reads, as `energon prepare` (7.x) writes it, so
//! that a reshard output is an energon dataset with no preparation pass over the data.
//!
//! Beside each shard `NAME.tar`, its writer puts `NAME.tar.idx`: for each sample the byte offset
//! of its first record, then the end of the last sample (where the end-of-archive blocks start),
//! each a little-endian u64. In `.nv-meta/`, rank 0 writes once every shard is finished:
//! - `.info.json`: `energon_version` and `shard_counts` (shard name -> samples, in shard order);
//! - `split.yaml`: the split parts ([`split_yaml`]);
//! - `dataset.yaml`: the sample type ([`EnergonDataset`]);
//! - `index.sqlite`: the tables `samples` (tar_file_id, sample_key, sample_index, byte_offset,
//!   byte_size) and `sample_parts` (tar_file_id, sample_index, part_name, content_byte_offset,
//!   content_byte_size), with energon's schema and indexes;
//! - `index.uuid`: an identifier of this index. Energon writes a random UUID; reshard derives
//!   it from the index's content (an MD5 of `.info.json` and every sample row, shaped as a
//!   version-8 UUID), so that equal outputs carry equal identifiers at any rank count.
//!
//! `index.sqlite` is built in two steps so that most of the work falls with the ranks: each
//! writer puts its shards' rows into a small SQLite file per shard in the staging directory (in
//! parallel with the other writers, no index, one transaction), and rank 0 copies them into
//! `index.sqlite` in shard order, one `ATTACH` and `INSERT … SELECT` per shard (rows move inside
//! SQLite: nothing is decoded or bound row by row), then creates energon's indexes. Rank 0 never
//! holds any rows. `--energon-no-sqlite` leaves the file out: energon's training reader needs only
//! `.tar.idx`, `.info.json` and `split.yaml`; looking samples up by key needs it (see
//! docs/performance.md).

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use md5::Digest;

use crate::comm::wire::u64_at;
use crate::comm::{agree, gather, Comm};
use crate::config::EnergonDataset;
use crate::output::members::SampleParts;
use crate::storage;

/// Energon's metadata directory.
pub(crate) const META_DIR: &str = ".nv-meta";
/// The suffix of a shard's sample offsets file.
pub(crate) const TAR_IDX_SUFFIX: &str = ".tar.idx";
/// The energon release whose formats these files follow (`.info.json`'s `energon_version`).
pub(crate) const FORMAT_VERSION: &str = "7.4.1";
/// Where the writers leave each shard's rows and digest for rank 0, inside the staging
/// directory.
const ROWS_DIR: &str = ".reshard-energon-rows";
/// A shard's rows: its samples in order (`rowid` 1, 2, …) and their parts in order.
const SHARD_SCHEMA: &str = "
CREATE TABLE samples (sample_key TEXT NOT NULL, byte_offset INTEGER, byte_size INTEGER);
CREATE TABLE sample_parts (sample_index INTEGER, part_name TEXT, content_byte_offset INTEGER, content_byte_size INTEGER);";

/// What makes an output shard name unusable for energon, if anything.
pub(crate) fn shard_name_problem(name: &str) -> Option<String> {
    if !name.ends_with(".tar") {
        return Some(format!("energon reads shards named *.tar, not {name:?}"));
    }
    if name.contains(['{', '}', '\n']) {
        return Some(format!(
            "energon brace-expands the shard names in split.yaml: {name:?} would not name itself"
        ));
    }
    None
}

/// Where the offsets of the shard at `shard` go: `NAME.tar.idx`.
pub(crate) fn tar_idx_path(shard: &Path) -> PathBuf {
    let name = shard.file_name().unwrap_or_default().to_string_lossy();
    let stem = name.strip_suffix(".tar").unwrap_or(&name);
    shard.with_file_name(format!("{stem}{TAR_IDX_SUFFIX}"))
}

/// The `.tar.idx` bytes of a shard: each sample's start, then the end of the data.
pub(crate) fn tar_idx_bytes(samples: &[SampleParts]) -> Vec<u8> {
    let end = samples.last().map_or(0, |s| s.start + s.len);
    samples
        .iter()
        .map(|s| s.start)
        .chain([end])
        .flat_map(u64::to_le_bytes)
        .collect()
}

fn rows_path(staging: &Path, shard: u64) -> PathBuf {
    staging.join(ROWS_DIR).join(format!("{shard:09}.sqlite"))
}

fn digest_path(staging: &Path, shard: u64) -> PathBuf {
    staging.join(ROWS_DIR).join(format!("{shard:09}.md5"))
}

/// The MD5 of one shard's rows (key, offsets and parts of every sample, in order), which
/// `index.uuid` is derived from.
fn rows_digest(samples: &[SampleParts]) -> [u8; 16] {
    let mut digest = md5::Md5::new();
    for s in samples {
        digest.update(s.key.as_bytes());
        digest.update([0]);
        digest.update(s.start.to_le_bytes());
        digest.update(s.len.to_le_bytes());
        for p in &s.parts {
            digest.update(p.ext.as_bytes());
            digest.update([0]);
            digest.update(p.data.to_le_bytes());
            digest.update(p.size.to_le_bytes());
        }
        digest.update([1]);
    }
    digest.finalize().into()
}

/// Writes shard `shard`'s `.tar.idx` beside it and the digest of its rows for [`write_meta`];
/// with `key_index`, also its rows for `index.sqlite`.
///
/// # Errors
/// A file cannot be written.
pub fn write_shard(
    staging: &Path,
    shard_path: &Path,
    shard: u64,
    samples: &[SampleParts],
    key_index: bool,
) -> Result<()> {
    let idx = tar_idx_path(shard_path);
    storage::write_unsynced(&idx, &tar_idx_bytes(samples))
        .with_context(|| format!("{}: cannot write", idx.display()))?;
    let dir = staging.join(ROWS_DIR);
    storage::sink(&dir)
        .create_dir_all(&dir)
        .with_context(|| format!("{}: cannot create", dir.display()))?;
    let digest = digest_path(staging, shard);
    storage::write_unsynced(&digest, &rows_digest(samples))
        .with_context(|| format!("{}: cannot write", digest.display()))?;
    if key_index {
        write_rows(&rows_path(staging, shard), samples)?;
    }
    Ok(())
}

/// One shard's rows in a SQLite file of their own, in one transaction. A staging file: no
/// journal, no sync (rank 0 reads it after the agreement that follows the finish phase).
fn write_rows(path: &Path, samples: &[SampleParts]) -> Result<()> {
    let shown = path.display().to_string();
    let _ = storage::sink(path).remove_file(path);
    let db = rusqlite::Connection::open(path).with_context(|| format!("{shown}: cannot create"))?;
    db.execute_batch("PRAGMA journal_mode = OFF; PRAGMA synchronous = OFF;")
        .and_then(|()| db.execute_batch(SHARD_SCHEMA))
        .and_then(|()| db.execute_batch("BEGIN"))
        .with_context(|| format!("{shown}: cannot create the tables"))?;
    {
        let mut rows = db.prepare(
            "INSERT INTO samples (sample_key, byte_offset, byte_size) VALUES (?1, ?2, ?3)",
        )?;
        let mut parts = db.prepare(
            "INSERT INTO sample_parts (sample_index, part_name, content_byte_offset, content_byte_size) VALUES (?1, ?2, ?3, ?4)",
        )?;
        for (i, s) in samples.iter().enumerate() {
            rows.execute(rusqlite::params![s.key, s.start as i64, s.len as i64])
                .with_context(|| format!("{shown}: cannot insert"))?;
            for p in &s.parts {
                parts
                    .execute(rusqlite::params![
                        i as i64,
                        p.ext,
                        p.data as i64,
                        p.size as i64
                    ])
                    .with_context(|| format!("{shown}: cannot insert"))?;
            }
        }
    }
    db.execute_batch("COMMIT")
        .with_context(|| format!("{shown}: cannot finish"))?;
    db.close()
        .map_err(|(_, e)| e)
        .with_context(|| format!("{shown}: cannot close"))
}

/// The most bytes of one shard's rows a rank sends rank 0 in one round of [`rows_to_lead`].
const ROWS_ROUND: u64 = 1 << 20;
/// The most bytes rank 0 receives in one round of [`rows_to_lead`], from all ranks: each sends
/// at most this over the rank count (at most [`ROWS_ROUND`], at least 4 KiB). A sixteenth of
/// the default `--mem-limit`.
const ROWS_RECEIVED: u64 = 64 << 20;

/// Staging per node ([`crate::job::destination::scratch`]): the rows and digests of the shards
/// `own` that this rank wrote ([`write_shard`]) go to rank 0 over the communicator, which puts
/// them where its own node's writers left theirs, so that [`write_meta`] reads the same files
/// as on a shared scratch. Only ranks that `send` (those not on rank 0's node) send anything.
/// Streamed a shard at a time, each in rounds of at most [`ROWS_RECEIVED`] bytes in all (rank
/// 0 holds no more at a time): the writer's rows file and 16-byte digest of each shard, about
/// 82 bytes a sample with two parts and 20-byte keys (`a_writers_rows_take_under_100_bytes_a_
/// sample`), every byte once over the network. Collective.
///
/// # Errors
/// A file cannot be read (on its writer) or written (on rank 0), agreed on every rank.
pub(crate) fn rows_to_lead(
    comm: &impl Comm,
    staging: &Path,
    own: &[u64],
    send: bool,
    key_index: bool,
) -> Result<()> {
    let own = if send { own } else { &[] };
    let dir = staging.join(ROWS_DIR);
    let mut result = if comm.rank() == 0 {
        storage::sink(&dir)
            .create_dir_all(&dir)
            .with_context(|| format!("{}: cannot create", dir.display()))
    } else {
        Ok(())
    };
    let turns = comm.all_max(&[own.len() as u64])[0];
    let round = (ROWS_RECEIVED / comm.size() as u64).clamp(4096, ROWS_ROUND);
    for k in 0..turns as usize {
        let turn = rows_turn(comm, (staging, round), own.get(k).copied(), key_index);
        result = result.and(turn);
    }
    agree(comm, result)
}

/// One turn of [`rows_to_lead`]: each rank's next shard, if any (its number, digest and rows'
/// length, then the rows in rounds). A rank that failed sends nothing more and goes on, so that
/// every rank makes the same calls; the first failure is returned.
fn rows_turn(
    comm: &impl Comm,
    (staging, round): (&Path, u64),
    shard: Option<u64>,
    key_index: bool,
) -> Result<()> {
    let mut failed = Ok(());
    let opened = shard.map(|s| open_rows(staging, s, key_index)).transpose();
    let (head, rows) = first(&mut failed, opened).flatten().unwrap_or_default();
    let heads = gather(comm, 0, &head);
    // On rank 0: the rows file of each rank that sent a shard, in rank order.
    let mut sinks = Vec::new();
    for head in heads.iter().filter(|h| h.len() == HEAD) {
        let made = receive_head(staging, head);
        sinks.push(first(&mut failed, made).flatten());
    }
    let len = if head.len() == HEAD {
        u64_at(&head, 24)
    } else {
        0
    };
    let rounds = comm.all_max(&[len.div_ceil(round)])[0];
    for j in 0..rounds {
        let chunk = rows.as_ref().map_or(Ok(Vec::new()), |(path, input)| {
            read_chunk(path, input.as_ref(), (j * round, round), len)
        });
        let chunk = first(&mut failed, chunk).unwrap_or_default();
        let got = gather(comm, 0, &chunk);
        let sent = got.iter().zip(&heads).filter(|(_, h)| h.len() == HEAD);
        for ((bytes, _), sink) in sent.zip(&mut sinks) {
            if let Some(sink) = sink {
                let wrote = sink
                    .write_all(bytes)
                    .context("writing a shard's rows from its writer");
                first(&mut failed, wrote);
            }
        }
    }
    for sink in sinks.into_iter().flatten() {
        let finished = sink
            .finish()
            .context("writing a shard's rows from its writer");
        first(&mut failed, finished);
    }
    failed
}

/// The length of a shard's head in [`rows_to_lead`]: its number, digest and rows' length.
const HEAD: usize = 32;

/// `r`'s value, or none with its error kept in `failed` if that holds none yet.
fn first<T>(failed: &mut Result<()>, r: Result<T>) -> Option<T> {
    match r {
        Ok(v) => Some(v),
        Err(e) => {
            if failed.is_ok() {
                *failed = Err(e);
            }
            None
        }
    }
}

/// Rank 0, given a shard's head: its digest written, and its rows file made if it has rows.
fn receive_head(staging: &Path, head: &[u8]) -> Result<Option<Box<dyn storage::Writer>>> {
    let shard = u64_at(head, 0);
    let digest = digest_path(staging, shard);
    storage::sink(&digest)
        .write(&digest, &head[8..24])
        .with_context(|| format!("{}: cannot write", digest.display()))?;
    if u64_at(head, 24) == 0 {
        return Ok(None);
    }
    let path = rows_path(staging, shard);
    let made = storage::sink(&path).create_stream(&path);
    made.map(Some)
        .with_context(|| format!("{}: cannot create", path.display()))
}

/// A shard's rows file on its writer, open: its path (to name it in errors) and the file.
type Rows = (PathBuf, storage::OpenInput);

/// A writer's shard for [`rows_to_lead`]: its number, digest and rows' length (32 bytes), and
/// its rows file, open (none without `key_index`).
fn open_rows(staging: &Path, shard: u64, key_index: bool) -> Result<(Vec<u8>, Option<Rows>)> {
    let digest = digest_path(staging, shard);
    let sum = storage::source(&digest)
        .read(&digest)
        .with_context(|| format!("{}: cannot read", digest.display()))?;
    let mut head = shard.to_le_bytes().to_vec();
    head.extend_from_slice(&sum);
    if !key_index {
        head.extend_from_slice(&0u64.to_le_bytes());
        return Ok((head, None));
    }
    let path = rows_path(staging, shard);
    let source = storage::source(&path);
    let opened = source
        .stat(&path)
        .and_then(|s| Ok((s.stamp.size, source.open(&path)?)));
    let (len, input) = opened.with_context(|| format!("{}: cannot read", path.display()))?;
    head.extend_from_slice(&len.to_le_bytes());
    Ok((head, Some((path, input))))
}

/// The rows' bytes from `at` for one round of [`rows_to_lead`], at most `round` of them (up to
/// `len`, the file's size).
fn read_chunk(
    path: &Path,
    input: &dyn storage::Input,
    (at, round): (u64, u64),
    len: u64,
) -> Result<Vec<u8>> {
    let mut buf = vec![0; len.saturating_sub(at).min(round) as usize];
    let got = storage::read_up_to_at(input, &mut buf, at)
        .with_context(|| format!("{}: cannot read", path.display()))?;
    if got < buf.len() {
        bail!(
            "{}: ends at byte {}, before its {len} bytes",
            path.display(),
            at + got as u64
        );
    }
    Ok(buf)
}

/// The dataset-wide files, for [`write_meta`].
pub struct Meta<'a> {
    /// Every shard's name relative to the output directory, in shard order.
    pub names: &'a [String],
    /// Every shard's sample count.
    pub counts: &'a [u64],
    /// The split parts: (part name, its shards' names).
    pub parts: &'a [(String, Vec<String>)],
    pub dataset: &'a EnergonDataset,
    /// Whether to build `index.sqlite` (not with `--energon-no-sqlite`).
    pub key_index: bool,
}

/// The split parts `energon prepare --split-ratio 1,0,0` writes for an unsplit dataset: every
/// shard in `train`, `val` and `test` empty.
pub fn unsplit_parts(names: &[String]) -> Vec<(String, Vec<String>)> {
    vec![
        ("train".into(), names.to_vec()),
        ("val".into(), Vec::new()),
        ("test".into(), Vec::new()),
    ]
}

/// Writes `.nv-meta/` into the staging directory, once every writer wrote its shards' rows
/// ([`write_shard`]); removes the rows.
///
/// # Errors
/// A shard name energon cannot read, a key in two samples (which energon refuses), a file that
/// cannot be read or written.
pub fn write_meta(staging: &Path, meta: &Meta<'_>) -> Result<()> {
    for name in meta.names {
        if let Some(problem) = shard_name_problem(name) {
            bail!("--energon: output shard {name:?}: {problem}");
        }
    }
    let dir = staging.join(META_DIR);
    let sink = storage::sink(&dir);
    sink.create_dir_all(&dir)
        .with_context(|| format!("{}: cannot create", dir.display()))?;
    let info = info_json(meta.names, meta.counts);
    let mut digest = md5::Md5::new();
    digest.update(info.as_bytes());
    for shard in 0..meta.names.len() as u64 {
        let path = digest_path(staging, shard);
        let rows = storage::source(&path).read(&path);
        digest.update(rows.with_context(|| format!("{}: cannot read", path.display()))?);
    }
    if meta.key_index {
        write_sqlite(staging, &dir.join("index.sqlite"), meta.names)?;
    }
    let _ = sink.remove_dir_all(&staging.join(ROWS_DIR));
    let uuid = uuid_of(&digest.finalize());
    for (file, text) in [
        (".info.json", info),
        ("split.yaml", split_yaml(meta.parts)),
        ("dataset.yaml", dataset_yaml(meta.dataset)),
        ("index.uuid", uuid),
    ] {
        let path = dir.join(file);
        sink.write(&path, text.as_bytes())
            .with_context(|| format!("{}: cannot write", path.display()))?;
    }
    Ok(())
}

/// `.info.json` as energon writes it (JSON, two-space indent, no final newline).
fn info_json(names: &[String], counts: &[u64]) -> String {
    let mut text = format!(
        "{{\n  \"energon_version\": {},\n  \"shard_counts\": {{",
        serde_json::Value::from(FORMAT_VERSION)
    );
    for (i, (name, count)) in names.iter().zip(counts).enumerate() {
        let sep = if i == 0 { "" } else { "," };
        text += &format!(
            "{sep}\n    {}: {count}",
            serde_json::Value::from(name.as_str())
        );
    }
    text += if names.is_empty() { "}\n}" } else { "\n  }\n}" };
    text
}

/// The schema `energon prepare` creates (energon 7.x `SqliteIndexWriter`).
const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS samples (
    tar_file_id INTEGER NOT NULL,
    sample_key TEXT NOT NULL UNIQUE,
    sample_index INTEGER NOT NULL,
    byte_offset INTEGER,
    byte_size INTEGER
);
CREATE TABLE IF NOT EXISTS sample_parts (
    tar_file_id INTEGER,
    sample_index INTEGER,
    part_name TEXT,
    content_byte_offset INTEGER,
    content_byte_size INTEGER
);";

/// The indexes energon creates once the rows are in.
const INDEXES: &str = "
CREATE INDEX IF NOT EXISTS idx_samples_by_tar_and_idx ON samples(tar_file_id, sample_index);
CREATE INDEX IF NOT EXISTS idx_sample_parts_seq ON sample_parts(tar_file_id, sample_index, content_byte_offset);
CREATE INDEX IF NOT EXISTS idx_sample_parts_full ON sample_parts(tar_file_id, sample_index, part_name, content_byte_offset, content_byte_size);";

/// Builds `index.sqlite` from the writers' per-shard files, in shard order: one `ATTACH` and
/// one `INSERT … SELECT` per table and shard, then energon's indexes. The same statements in the
/// same order whatever the rank count, so the file is the same too.
fn write_sqlite(staging: &Path, path: &Path, names: &[String]) -> Result<()> {
    let shown = path.display().to_string();
    let _ = storage::sink(path).remove_file(path);
    let db = rusqlite::Connection::open(path).with_context(|| format!("{shown}: cannot create"))?;
    // A staging file: nothing to roll back to, and it is synced once complete.
    db.execute_batch("PRAGMA journal_mode = OFF; PRAGMA synchronous = OFF;")
        .and_then(|()| db.execute_batch(SCHEMA))
        .with_context(|| format!("{shown}: cannot create the tables"))?;
    for (shard, name) in names.iter().enumerate() {
        let rows = rows_path(staging, shard as u64);
        copy_shard(&db, &rows, shard as i64, name)?;
        let _ = storage::sink(&rows).remove_file(&rows);
    }
    db.execute_batch(INDEXES)
        .with_context(|| format!("{shown}: cannot finish"))?;
    db.close()
        .map_err(|(_, e)| e)
        .with_context(|| format!("{shown}: cannot close"))?;
    storage::sink(path)
        .reopen(path)
        .and_then(|f| f.sync_all())
        .with_context(|| format!("{shown}: cannot sync"))
}

/// Copies one shard's rows (`rows`, a writer's file) into `db` as shard `shard`.
fn copy_shard(db: &rusqlite::Connection, rows: &Path, shard: i64, name: &str) -> Result<()> {
    let failed = |e: rusqlite::Error| {
        anyhow::Error::new(e).context(format!(
            "{}: cannot copy its rows into index.sqlite",
            rows.display()
        ))
    };
    let file = rows
        .to_str()
        .with_context(|| format!("{}: a path that is not UTF-8", rows.display()))?;
    db.execute("ATTACH DATABASE ?1 AS shard", [file])
        .map_err(failed)?;
    let copied = db
        .execute(
            "INSERT INTO samples (tar_file_id, sample_key, sample_index, byte_offset, byte_size) \
             SELECT ?1, sample_key, rowid - 1, byte_offset, byte_size FROM shard.samples ORDER BY rowid",
            [shard],
        )
        .map_err(|e| match e.sqlite_error_code() {
            Some(rusqlite::ErrorCode::ConstraintViolation) => duplicate(db, name),
            _ => failed(e),
        })
        .and_then(|_| {
            db.execute(
                "INSERT INTO sample_parts (tar_file_id, sample_index, part_name, content_byte_offset, content_byte_size) \
                 SELECT ?1, sample_index, part_name, content_byte_offset, content_byte_size FROM shard.sample_parts ORDER BY rowid",
                [shard],
            )
            .map_err(failed)
        });
    // Detached whatever happened, so that the error (not a locked file) is what is reported.
    let detached = db.execute("DETACH DATABASE shard", []);
    copied?;
    detached.map(|_| ()).map_err(failed)
}

/// The error for a key the unique index refused: which key, in which shard at which offset.
fn duplicate(db: &rusqlite::Connection, name: &str) -> anyhow::Error {
    // In an earlier shard, or twice in this one.
    let found: Option<(String, i64)> = db
        .query_row(
            "SELECT sample_key, byte_offset FROM shard.samples WHERE sample_key IN (SELECT sample_key FROM main.samples) \
             UNION ALL SELECT sample_key, min(byte_offset) FROM shard.samples GROUP BY sample_key HAVING count(*) > 1 LIMIT 1",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .ok();
    match found {
        Some((key, at)) => anyhow::anyhow!(
            "--energon: sample key {key:?} of {name} (byte offset {at}) appears in another sample too: energon requires unique sample keys"
        ),
        None => anyhow::anyhow!("--energon: a sample key of {name} appears in another sample too: energon requires unique sample keys"),
    }
}

/// A digest shaped as a UUID (version 8: custom; RFC 4122 variant).
fn uuid_of(digest: &[u8]) -> String {
    let mut b = [0u8; 16];
    b.copy_from_slice(&digest[..16]);
    b[6] = (b[6] & 0x0f) | 0x80;
    b[8] = (b[8] & 0x3f) | 0x80;
    let hex = crate::hex::hex(&b);
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

/// `split.yaml`: each part's shards, runs of consecutively numbered names collapsed into one
/// brace range as energon does (`shard-{000000..000009}.tar`), then an empty `exclude`.
pub(crate) fn split_yaml(parts: &[(String, Vec<String>)]) -> String {
    let mut text = String::from("split_parts:\n");
    for (part, names) in parts {
        let collapsed = collapse(names);
        if collapsed.is_empty() {
            text += &format!("  {}: []\n", yaml_scalar(part));
        } else {
            text += &format!("  {}:\n", yaml_scalar(part));
            for name in collapsed {
                text += &format!("  - {}\n", yaml_scalar(&name));
            }
        }
    }
    text += "exclude: []\n";
    text
}

/// A YAML scalar: plain when that reads back as the same string, else single-quoted.
fn yaml_scalar(s: &str) -> String {
    let simple = s
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-./".contains(c));
    let plain = simple || is_brace_range(s);
    let numeric_or_word = s.parse::<f64>().is_ok()
        || [
            "true", "false", "yes", "no", "null", "on", "off", "y", "n", "~",
        ]
        .contains(&s.to_ascii_lowercase().as_str());
    if plain && !numeric_or_word {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "''"))
    }
}

/// Whether `s` is a name with one `{A..B}` range of numbers and otherwise plain characters.
fn is_brace_range(s: &str) -> bool {
    let Some((head, rest)) = s.split_once('{') else {
        return false;
    };
    let Some((range, tail)) = rest.split_once('}') else {
        return false;
    };
    let numbers = range.split_once("..").is_some_and(|(a, b)| {
        [a, b]
            .iter()
            .all(|n| !n.is_empty() && n.bytes().all(|c| c.is_ascii_digit()))
    });
    let plain = |p: &str| {
        p.chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-./".contains(c))
    };
    numbers
        && plain(head)
        && plain(tail)
        && s.chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// A name split into its literal pieces and its runs of digits.
fn tokens(name: &str) -> (Vec<&str>, Vec<&str>) {
    let (mut lits, mut nums) = (Vec::new(), Vec::new());
    let mut at = 0;
    let bytes = name.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i].is_ascii_digit() {
            let j = i + bytes[i..].iter().take_while(|b| b.is_ascii_digit()).count();
            lits.push(&name[at..i]);
            nums.push(&name[i..j]);
            at = j;
            i = j;
        } else {
            i += 1;
        }
    }
    lits.push(&name[at..]);
    (lits, nums)
}

/// Collapses runs of names that differ only in one number, counting up by one at the same
/// width, into `{FIRST..LAST}`; other names stay as they are, in order.
fn collapse(names: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < names.len() {
        let mut j = i + 1;
        let mut slot = None;
        while j < names.len() {
            match step_slot(&names[j - 1], &names[j]) {
                Some(s) if slot.is_none_or(|t| t == s) => {
                    slot = Some(s);
                    j += 1;
                }
                _ => break,
            }
        }
        match slot {
            Some(s) if j - i > 1 => {
                let (lits, nums) = tokens(&names[i]);
                let last = tokens(&names[j - 1]).1[s];
                let mut name = String::new();
                for (k, num) in nums.iter().enumerate() {
                    name += lits[k];
                    if k == s {
                        name += &format!("{{{num}..{last}}}");
                    } else {
                        name += num;
                    }
                }
                name += lits[nums.len()];
                out.push(name);
            }
            _ => out.push(names[i].clone()),
        }
        i = j;
    }
    out
}

/// The number slot in which `b` is `a` plus one (same literals, same widths, every other
/// number equal).
fn step_slot(a: &str, b: &str) -> Option<usize> {
    let (la, na) = tokens(a);
    let (lb, nb) = tokens(b);
    if la != lb || na.len() != nb.len() {
        return None;
    }
    let mut slot = None;
    for (k, (x, y)) in na.iter().zip(&nb).enumerate() {
        if x == y {
            continue;
        }
        let next = x.parse::<u128>().ok()? + 1;
        if slot.is_some() || x.len() != y.len() || y.parse::<u128>().ok()? != next {
            return None;
        }
        slot = Some(k);
    }
    slot
}

/// `dataset.yaml`: `CrudeWebdataset`, or a sample type with its field map.
fn dataset_yaml(dataset: &EnergonDataset) -> String {
    match dataset {
        EnergonDataset::Crude => {
            "__module__: megatron.energon\n__class__: CrudeWebdataset\n".to_string()
        }
        EnergonDataset::Typed {
            sample_type,
            field_map,
        } => format!(
            "sample_type:\n  __module__: megatron.energon\n  __class__: {sample_type}\nfield_map: {field_map}\n"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    use crate::comm::local::LocalComm;
    use crate::output::members::Part;

    /// `n` samples of two parts (`jpg`, `json`) with 20-byte keys, as `examples/energon_index.rs`.
    fn samples(n: u64, salt: u64) -> Vec<SampleParts> {
        (0..n)
            .map(|i| {
                let start = i * 4096;
                let part = |ext: &str, data: u64, size: u64| Part {
                    path: format!("{i:016}.{ext}"),
                    ext: ext.to_string(),
                    data,
                    size,
                };
                SampleParts {
                    key: format!("img/{:016x}", i.wrapping_mul(0x9e37_79b9) ^ salt),
                    start,
                    len: 4096,
                    parts: vec![
                        part("jpg", start + 512, 2000),
                        part("json", start + 3072, 300),
                    ],
                }
            })
            .collect()
    }

    #[test]
    fn writers_rows_reach_rank_0_whole_from_other_nodes() {
        // Rank 0's node (rank 0 alone) and another node (ranks 1 and 2, one disk).
        let (lead, other) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        // Shard 1's rows take several rounds.
        let own: [&[u64]; 3] = [&[0], &[1, 3], &[2]];
        let counts = [5, 30_000, 7, 0];
        let out = LocalComm::run(3, |c| {
            let staging = if c.rank() == 0 {
                lead.path()
            } else {
                other.path()
            };
            for &s in own[c.rank()] {
                let shard = staging.join(format!("{s}.tar"));
                write_shard(staging, &shard, s, &samples(counts[s as usize], s), true)?;
            }
            rows_to_lead(c, staging, own[c.rank()], c.rank() != 0, true)
        });
        assert!(out.iter().all(Result::is_ok), "{out:?}");
        assert!(fs::metadata(rows_path(other.path(), 1)).unwrap().len() > 2 * ROWS_ROUND);
        for s in 0..4 {
            let from = if s == 0 { lead.path() } else { other.path() };
            for file in [rows_path, digest_path] {
                let (got, sent) = (file(lead.path(), s), file(from, s));
                assert_eq!(fs::read(&got).unwrap(), fs::read(&sent).unwrap(), "{got:?}");
            }
        }
    }

    #[test]
    fn a_writers_rows_take_under_100_bytes_a_sample() {
        let dir = tempfile::tempdir().unwrap();
        let n = 100_000;
        write_shard(
            dir.path(),
            &dir.path().join("0.tar"),
            0,
            &samples(n, 0),
            true,
        )
        .unwrap();
        let bytes = fs::metadata(rows_path(dir.path(), 0)).unwrap().len();
        println!(
            "{bytes} bytes of rows for {n} samples: {} a sample",
            bytes / n
        );
        assert!(bytes < 100 * n, "{bytes} bytes for {n} samples");
    }

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn consecutive_names_collapse_into_one_range() {
        let n = names(&["s-000000.tar", "s-000001.tar", "s-000002.tar"]);
        assert_eq!(collapse(&n), ["s-{000000..000002}.tar"]);
        let n = names(&["a2-000009.tar", "a2-000010.tar", "a2-000012.tar", "b.tar"]);
        assert_eq!(
            collapse(&n),
            ["a2-{000009..000010}.tar", "a2-000012.tar", "b.tar"]
        );
        assert_eq!(
            collapse(&names(&["x-9.tar", "x-10.tar"])),
            ["x-9.tar", "x-10.tar"]
        );
    }

    #[test]
    fn split_yaml_reads_like_energons() {
        let n = names(&["shard-000000.tar", "shard-000001.tar", "shard-000002.tar"]);
        assert_eq!(
            split_yaml(&unsplit_parts(&n)),
            "split_parts:\n  train:\n  - shard-{000000..000002}.tar\n  val: []\n  test: []\nexclude: []\n"
        );
        assert_eq!(yaml_scalar("it's.tar"), "'it''s.tar'");
        assert_eq!(yaml_scalar("a{b.tar"), "'a{b.tar'");
    }

    #[test]
    fn info_json_is_energons_layout() {
        let n = names(&["a.tar", "b.tar"]);
        assert_eq!(
            info_json(&n, &[4, 5]),
            "{\n  \"energon_version\": \"7.4.1\",\n  \"shard_counts\": {\n    \"a.tar\": 4,\n    \"b.tar\": 5\n  }\n}"
        );
    }

    #[test]
    fn shard_names_energon_reads_otherwise_are_refused() {
        assert!(shard_name_problem("s-{0}.tar").is_some());
        assert!(shard_name_problem("s.tar.gz").is_some());
        assert!(shard_name_problem("s-000001.tar").is_none());
        let uuid = uuid_of(&[0xff; 16]);
        assert_eq!(uuid, "ffffffff-ffff-8fff-bfff-ffffffffffff");
    }
}
