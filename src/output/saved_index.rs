//! Index reuse: the layout of every output shard (each sample's offset and length) is saved
//! next to the output, in `DIR/.reshard/NAME.reshard-layout`, by the rank that wrote the shard.
//! A later run whose input is that output — the next epoch's reshuffle — reads these instead of
//! the tar headers, after checking that each shard's size and modification time still match.
//!
//! The name is reshard's own: the earlier `NAME.idx` (`shard-000000.tar.idx`) read like
//! Megatron-Energon's `.tar.idx`, a different format that `--energon` writes beside the shards.
//! Outputs written under that name are still read.
//!
//! On object storage a shard's modification time is when its upload completed, not when the
//! scratch copy was written: the upload phase saves the index again with the object's stamp
//! ([`copy_restamped`]), and the object's ETag (as its stamp's identity) is matched too, since
//! two uploads in one second of one size would otherwise look the same.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::storage::{self, mtime_ns, FileStamp};
use crate::tar::{Sample, ShardIndex, Skipped};

/// The directory, inside an output, that holds reshard's own files.
pub const DIR_NAME: &str = ".reshard";
const FORMAT: u32 = 2;
/// The format before the object version was saved (still read: a file-system shard's).
const FORMAT_1: u32 = 1;
/// What follows a shard's file name in its saved index's name.
pub const SUFFIX: &str = ".reshard-layout";
/// The suffix outputs written before it had (still read).
const OLD_SUFFIX: &str = ".idx";

#[derive(Debug, Serialize, Deserialize)]
struct Saved {
    format: u32,
    /// The shard's file name, size and modification time (ns since the epoch) when saved.
    name: String,
    size: u64,
    mtime_ns: u128,
    /// On object storage the object's version (its stamp's identity, a hash of its ETag);
    /// 0 on a file system, where the inode differs between hosts and is not compared.
    version: u64,
    /// (start, length) of every sample, in file order.
    samples: Vec<(u64, u64)>,
    skipped: Skipped,
}

/// A saved index of format 1: no version.
#[derive(Deserialize)]
struct SavedV1 {
    _format: u32,
    name: String,
    size: u64,
    mtime_ns: u128,
    samples: Vec<(u64, u64)>,
    skipped: Skipped,
}

impl Saved {
    fn decode(bytes: &[u8]) -> std::result::Result<Saved, String> {
        let config = bincode::config::standard();
        let (format, _): (u32, _) =
            bincode::serde::decode_from_slice(bytes, config).map_err(|e| e.to_string())?;
        if format == FORMAT_1 {
            let (old, _): (SavedV1, _) =
                bincode::serde::decode_from_slice(bytes, config).map_err(|e| e.to_string())?;
            // In memory it is of the current format: encoded again, it has a version.
            return Ok(Saved {
                format: FORMAT,
                name: old.name,
                size: old.size,
                mtime_ns: old.mtime_ns,
                version: 0,
                samples: old.samples,
                skipped: old.skipped,
            });
        }
        bincode::serde::decode_from_slice(bytes, config)
            .map(|(s, _)| s)
            .map_err(|e| e.to_string())
    }

    fn encode(&self) -> Vec<u8> {
        bincode::serde::encode_to_vec(self, bincode::config::standard()).expect("encodable")
    }

    /// Notes `stamp` as the shard's, taken of the shard at `shard`.
    fn stamped(mut self, shard: &Path, stamp: &FileStamp) -> Saved {
        self.size = stamp.size;
        self.mtime_ns = mtime_ns(stamp);
        self.version = version(shard, stamp);
        self
    }
}

/// The version a saved index notes of the shard at `shard`: its identity on object storage,
/// where it is the object's ETag; 0 on a file system.
fn version(shard: &Path, stamp: &FileStamp) -> u64 {
    if storage::is_object_store(shard) {
        stamp.identity
    } else {
        0
    }
}

/// What a lookup found.
#[derive(Debug)]
pub enum Lookup {
    /// A saved index that matches the shard as it is now.
    Found(ShardIndex),
    /// No saved index.
    Missing,
    /// A saved index that no longer matches (why).
    Stale(String),
}

/// Where the saved index of `shard` would be: in `index_dir` if given, else in the `.reshard`
/// directory next to it.
pub fn path_for(shard: &Path, index_dir: Option<&Path>) -> PathBuf {
    named(shard, index_dir, SUFFIX)
}

fn named(shard: &Path, index_dir: Option<&Path>, suffix: &str) -> PathBuf {
    let name = shard
        .file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .into_owned();
    let dir = match index_dir {
        Some(d) => d.to_path_buf(),
        None => shard.parent().unwrap_or(Path::new(".")).join(DIR_NAME),
    };
    dir.join(format!("{name}{suffix}"))
}

/// Saves the index of the shard file at `shard` (already complete and synced) into `dir`.
///
/// # Errors
/// The shard cannot be stat'ed or the index file cannot be written.
pub fn save(dir: &Path, shard: &Path, samples: impl Iterator<Item = Sample>) -> Result<()> {
    let stamp =
        storage::stamp(shard).with_context(|| format!("{}: cannot stat", shard.display()))?;
    let saved = Saved {
        format: FORMAT,
        name: shard
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned(),
        size: 0,
        mtime_ns: 0,
        version: 0,
        samples: samples.map(|s| (s.start, s.len)).collect(),
        skipped: Skipped::default(),
    }
    .stamped(shard, &stamp);
    let path = path_for(shard, Some(dir));
    storage::sink(&path)
        .write(&path, &saved.encode())
        .with_context(|| format!("{}: cannot write", path.display()))
}

/// Writes the saved index `from` (of a shard now copied to `shard`, e.g. uploaded) to `to`,
/// noting the copy's stamp: the copy's modification time (and on object storage its version)
/// is not the original's, so the index as saved would be stale beside the copy.
///
/// # Errors
/// `from` cannot be read or decoded, the copy cannot be stat'ed or differs in size, or `to`
/// cannot be written.
pub fn copy_restamped(from: &Path, shard: &Path, to: &Path) -> Result<()> {
    let bytes = storage::source(from)
        .read(from)
        .with_context(|| format!("{}: cannot read", from.display()))?;
    let saved = Saved::decode(&bytes)
        .map_err(|e| anyhow::anyhow!("{}: unreadable saved index ({e})", from.display()))?;
    let stamp =
        storage::stamp(shard).with_context(|| format!("{}: cannot stat", shard.display()))?;
    if stamp.size != saved.size {
        anyhow::bail!(
            "{}: {} bytes, but its saved index {} says {}: the copy is not the shard",
            shard.display(),
            stamp.size,
            from.display(),
            saved.size
        );
    }
    let saved = saved.stamped(shard, &stamp);
    storage::sink(to)
        .write(to, &saved.encode())
        .with_context(|| format!("{}: cannot write", to.display()))
}

/// Looks for a saved index of the shard at `shard` whose size and modification time match.
pub fn load(shard: &Path, index_dir: Option<&Path>) -> Lookup {
    let path = path_for(shard, index_dir);
    let old = named(shard, index_dir, OLD_SUFFIX);
    let Some((path, bytes)) = [path, old]
        .into_iter()
        .find_map(|p| storage::source(&p).read(&p).ok().map(|b| (p, b)))
    else {
        return Lookup::Missing;
    };
    let saved = match Saved::decode(&bytes) {
        Ok(s) => s,
        Err(e) => return Lookup::Stale(format!("{}: unreadable ({e})", path.display())),
    };
    let Ok(stamp) = storage::stamp(shard) else {
        return Lookup::Missing;
    };
    if saved.format != FORMAT {
        return Lookup::Stale(format!(
            "{}: format {} is not {FORMAT}",
            path.display(),
            saved.format
        ));
    }
    if saved.size != stamp.size
        || saved.mtime_ns != mtime_ns(&stamp)
        || saved.version != version(shard, &stamp)
    {
        return Lookup::Stale(format!(
            "{} changed since {} was saved (size {} -> {}, or modification time, or object version)",
            shard.display(),
            path.display(),
            saved.size,
            stamp.size
        ));
    }
    // Reshard's own output was checked when it was written: no keys, no hygiene checks here.
    Lookup::Found(ShardIndex {
        keys: Vec::new(),
        contents: Vec::new(),
        edge_keys: None,
        hygiene: Default::default(),
        key_hashes: Vec::new(),
        zero_runs: 0,
        saved: true,
        samples: saved
            .samples
            .into_iter()
            .map(|(start, len)| Sample { start, len })
            .collect(),
        skipped: saved.skipped,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::{self, File};
    use std::time::UNIX_EPOCH;

    #[test]
    fn saved_index_round_trips_and_goes_stale() {
        let dir = tempfile::tempdir().unwrap();
        let shard = dir.path().join("s.tar");
        fs::write(&shard, vec![0u8; 4096]).unwrap();
        let idx = dir.path().join(DIR_NAME);
        fs::create_dir(&idx).unwrap();
        assert!(matches!(load(&shard, None), Lookup::Missing));
        let samples = vec![
            Sample {
                start: 0,
                len: 1024,
            },
            Sample {
                start: 1024,
                len: 2048,
            },
        ];
        save(&idx, &shard, samples.clone().into_iter()).unwrap();
        match load(&shard, None) {
            Lookup::Found(i) => assert_eq!(i.samples, samples),
            other => panic!("{other:?}"),
        }
        // An explicit index directory works the same.
        assert!(matches!(load(&shard, Some(&idx)), Lookup::Found(_)));
        // An output written before the rename: its NAME.idx is still read.
        fs::rename(path_for(&shard, None), idx.join("s.tar.idx")).unwrap();
        assert!(matches!(load(&shard, None), Lookup::Found(_)));
        // Touching the shard makes the saved index stale.
        fs::write(&shard, vec![1u8; 4096 + 512]).unwrap();
        assert!(matches!(load(&shard, None), Lookup::Stale(_)));
    }

    /// An index saved in format 1 (before the object version) is still read, as version 0.
    #[test]
    fn format_1_is_still_read() {
        let old = (
            FORMAT_1,
            "s.tar".to_string(),
            4096u64,
            7u128,
            vec![(0u64, 1024u64)],
            Skipped::default(),
        );
        let bytes = bincode::serde::encode_to_vec(&old, bincode::config::standard()).unwrap();
        let saved = Saved::decode(&bytes).unwrap();
        assert_eq!((saved.size, saved.mtime_ns, saved.version), (4096, 7, 0));
        assert_eq!(saved.samples, [(0, 1024)]);
        let now = Saved::decode(&saved.encode()).unwrap();
        assert_eq!((now.format, now.samples), (FORMAT, vec![(0, 1024)]));
    }

    /// A shard rewritten in place with the same size (another epoch's bytes) is told apart by
    /// its modification time alone, to the nanosecond.
    #[test]
    fn a_rewrite_of_the_same_size_is_stale() {
        let dir = tempfile::tempdir().unwrap();
        let shard = dir.path().join("s.tar");
        fs::write(&shard, vec![0u8; 4096]).unwrap();
        let f = File::options().write(true).open(&shard).unwrap();
        let then = UNIX_EPOCH + std::time::Duration::new(1_700_000_000, 123);
        f.set_modified(then).unwrap();
        save(dir.path(), &shard, std::iter::empty()).unwrap();
        let found = |shard: &Path| matches!(load(shard, Some(dir.path())), Lookup::Found(_));
        assert!(found(&shard));
        f.set_modified(then + std::time::Duration::from_nanos(1))
            .unwrap();
        assert!(!found(&shard), "one nanosecond later, same size: stale");
        f.set_modified(then).unwrap();
        assert!(found(&shard));
    }
}
