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
//! ([`write_for`]), and the object's ETag (as its stamp's identity) is matched too, since
//! two uploads in one second of one size would otherwise look the same. That ETag is the one the
//! uploading run verified of its own object (its create's answer, or its record), never what is
//! at the shard's name when the index is written: an index written late is believed only beside
//! the object it describes.
//!
//! Each file is sealed ([`super::seal`]): one whose checksum does not match (damaged, cut
//! short, or written before saved indexes carried one) is stale, as a changed shard's is, and
//! the shard is indexed again from its tar headers. What a matching one says is still checked
//! against the shard's bytes by the exchange before any of them is copied.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use super::seal;
use crate::storage::{self, mtime_ns, FileStamp};
use crate::tar::{Sample, ShardIndex, Skipped};

/// The directory, inside an output, that holds reshard's own files.
pub const DIR_NAME: &str = ".reshard";
/// 3: sealed ([`seal`]); files of formats 1 and 2 carry no checksum and are stale.
const FORMAT: u32 = 3;
/// What follows a shard's file name in its saved index's name.
pub(crate) const SUFFIX: &str = ".reshard-layout";
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

impl Saved {
    fn decode(bytes: &[u8]) -> std::result::Result<Saved, String> {
        let config = bincode::config::standard();
        let (saved, used) =
            bincode::serde::decode_from_slice(bytes, config).map_err(|e| e.to_string())?;
        if used != bytes.len() {
            return Err(format!("{} bytes after its end", bytes.len() - used));
        }
        Ok(saved)
    }

    /// The sealed bytes of the file.
    fn encode(&self) -> Vec<u8> {
        seal::seal(
            bincode::serde::encode_to_vec(self, bincode::config::standard()).expect("encodable"),
        )
    }

    /// The saved index whose file holds `bytes`: its seal checked, then its body decoded.
    fn open(bytes: &[u8]) -> std::result::Result<Saved, String> {
        let body = seal::open(bytes).map_err(|e| e.to_string())?;
        Saved::decode(body)
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

/// What a run verified of a shard object it created, or keeps from an earlier attempt: its size
/// and its stamp's identity (on an object store the hash of the ETag the store answered to its
/// create, as the run's own record of it says; `None` where the store answered none). A saved
/// index written for the object carries these, never what a later look at its name finds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Verified {
    pub(crate) size: u64,
    pub(crate) identity: Option<u64>,
}

impl Verified {
    /// What the store answered to this run's create of the object.
    pub(crate) fn created(made: &storage::Created) -> Verified {
        Verified {
            size: made.size,
            identity: made.e_tag.as_deref().map(storage::e_tag_identity),
        }
    }
}

/// What [`write_for`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Restamped {
    /// The saved index is at its name, stamped for the verified object.
    Written,
    /// One that holds for the object at the shard's name was there already, and stays.
    There,
    /// The object at the shard's name is not the verified one (or none is, or the store gave no
    /// ETag to verify it by): nothing was written.
    NotIt,
}

/// Writes the saved index `from` (of a shard now copied to `shard`, e.g. uploaded) to `to`,
/// stamped for the object this run `verified` at `shard`: its size and identity are the
/// verified ones, and only its modification time is taken from a look at `shard`, which must
/// find that very object (else nothing is written). Fencing by construction: a run that lost
/// its lock and writes late still stamps the index for its own object, which a reader
/// ([`load`]) believes only where the object at the shard's name is that object (its ETag,
/// size and modification time), whose bytes the index describes. The write only creates; an
/// index there already stays where it holds for the object at the shard's name, and is
/// otherwise replaced only as read (a conditional PUT, `If-Match`), so that a late writer
/// cannot put its index over one a successor wrote meanwhile.
///
/// # Errors
/// `from` cannot be read or decoded or is of another size, `shard` cannot be stat'ed, or `to`
/// cannot be written (or is changed by another writer every time).
pub(crate) fn write_for(
    from: &Path,
    shard: &Path,
    to: &Path,
    verified: &Verified,
) -> Result<Restamped> {
    let bytes = storage::source(from)
        .read(from)
        .with_context(|| format!("{}: cannot read", from.display()))?;
    let saved = Saved::open(&bytes)
        .map_err(|e| anyhow::anyhow!("{}: unreadable saved index ({e})", from.display()))?;
    if verified.size != saved.size {
        anyhow::bail!(
            "{}: {} bytes, but its saved index {} says {}: the copy is not the shard",
            shard.display(),
            verified.size,
            from.display(),
            saved.size
        );
    }
    let now = match storage::stamp(shard) {
        Ok(now) => now,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Restamped::NotIt),
        Err(e) => return Err(e).with_context(|| format!("{}: cannot stat", shard.display())),
    };
    let object = storage::is_object_store(shard);
    let version = match verified.identity {
        Some(id) if id != now.identity => return Ok(Restamped::NotIt),
        Some(id) if object => id,
        None if object => return Ok(Restamped::NotIt),
        _ => 0,
    };
    if now.size != verified.size {
        return Ok(Restamped::NotIt);
    }
    let saved = Saved {
        size: verified.size,
        mtime_ns: mtime_ns(&now),
        version,
        ..saved
    };
    put_exclusive(to, shard, &saved.encode())
}

/// How many times [`put_exclusive`] tries before it gives up: each time after the first,
/// another writer changed the object between its read and its write.
const ATTEMPTS: usize = 4;

/// Creates `to` holding `bytes` (a saved index of the shard at `shard`) only where nothing is
/// there; else leaves what is there where it is `bytes` or holds for the shard now, and replaces
/// it otherwise, conditionally on the very version read.
fn put_exclusive(to: &Path, shard: &Path, bytes: &[u8]) -> Result<Restamped> {
    let sink = storage::sink(to);
    for _ in 0..ATTEMPTS {
        match sink.create_new(to, bytes) {
            Ok(()) => return Ok(Restamped::Written),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e).with_context(|| format!("{}: cannot write", to.display())),
        }
        let mut found = None;
        let mut judge = |old: &[u8]| {
            if old == bytes {
                found = Some(Restamped::Written);
            } else if matches!(judged(old, to, shard), Lookup::Found(_)) {
                found = Some(Restamped::There);
            }
            found.is_none().then(|| bytes.to_vec())
        };
        match sink.update(to, &mut judge) {
            Ok(true) => return Ok(Restamped::Written),
            // What was there stays; or it changed since it was read: looked at again.
            Ok(false) => {
                if let Some(found) = found {
                    return Ok(found);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("{}: cannot write", to.display())),
        }
    }
    anyhow::bail!(
        "{}: another writer changed it {ATTEMPTS} times while this run wrote it",
        to.display()
    )
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
    judged(&bytes, &path, shard)
}

/// What the saved index `bytes`, read at `path`, is for the shard at `shard` as it is now.
fn judged(bytes: &[u8], path: &Path, shard: &Path) -> Lookup {
    let saved = match Saved::open(bytes) {
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
    if let Err(why) = layout_problem(&saved) {
        return Lookup::Stale(format!("{}: {why}", path.display()));
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

/// What is wrong with the sample ranges of `saved` as ranges of a tar of its size, if
/// anything: each whole blocks, in file order without overlap, and (when no entry was skipped)
/// one after the other from the first byte. What each
/// range holds is checked against the shard's bytes by the exchange ([`crate::tar::check`]).
fn layout_problem(saved: &Saved) -> std::result::Result<(), String> {
    const BLOCK: u64 = 512;
    let contiguous = saved.skipped == Skipped::default();
    let mut end = 0u64;
    for (i, &(start, len)) in saved.samples.iter().enumerate() {
        let bad = |what: &str| {
            Err(format!(
                "sample {i} ({len} bytes at byte offset {start}) {what}"
            ))
        };
        if len < BLOCK || len % BLOCK != 0 || start % BLOCK != 0 {
            return bad("is not whole tar blocks");
        }
        if start < end {
            return bad(&format!(
                "overlaps the one before it, which ends at byte {end}"
            ));
        }
        if contiguous && start != end {
            return bad(&format!("does not start where the one before it ends (byte {end}), and no entry was skipped"));
        }
        // Offsets are in the decompressed stream of a compressed shard, which may be longer
        // than the file: the exchange finds a range past the stream's end.
        end = match start.checked_add(len) {
            Some(e) => e,
            None => return bad("ends past the largest offset"),
        };
    }
    Ok(())
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

    /// A saved index damaged anywhere (each byte in turn), cut short, or written before saved
    /// indexes were sealed is stale, naming the file and what failed: the shard is re-indexed.
    #[test]
    fn a_damaged_saved_index_is_stale_and_says_why() {
        let dir = tempfile::tempdir().unwrap();
        let shard = dir.path().join("s.tar");
        fs::write(&shard, vec![0u8; 4096]).unwrap();
        let samples = [(0, 1024), (1024, 2048)].map(|(start, len)| Sample { start, len });
        save(dir.path(), &shard, samples.into_iter()).unwrap();
        let path = path_for(&shard, Some(dir.path()));
        let good = fs::read(&path).unwrap();
        let stale = |bytes: &[u8]| {
            fs::write(&path, bytes).unwrap();
            match load(&shard, Some(dir.path())) {
                Lookup::Stale(why) => why,
                other => panic!("{other:?}"),
            }
        };
        for i in 0..good.len() {
            let mut bad = good.clone();
            bad[i] ^= 0x10;
            let why = stale(&bad);
            assert!(why.contains("s.tar.reshard-layout"), "{why}");
        }
        assert!(stale(&good[..good.len() - 1]).contains("no checksum trailer"));
        let mut bad = good.clone();
        bad[3] ^= 1;
        assert!(stale(&bad).contains("checksum mismatch"));
        // The body alone, as formats 1 and 2 wrote it.
        assert!(stale(seal::open(&good).unwrap()).contains("no checksum trailer"));
        fs::write(&path, &good).unwrap();
        assert!(matches!(load(&shard, Some(dir.path())), Lookup::Found(_)));
    }

    /// Ranges that cannot be a tar's samples make a saved index stale, before the exchange
    /// would read them: not whole blocks, out of order or overlapping, past any offset, or with
    /// a gap where no entry was skipped.
    #[test]
    fn ranges_that_are_no_tar_layout_are_stale() {
        let saved = |samples: &[(u64, u64)], skipped: u64| Saved {
            format: FORMAT,
            name: "s.tar".into(),
            size: 10 * 512,
            mtime_ns: 0,
            version: 0,
            samples: samples.to_vec(),
            skipped: Skipped {
                directories: skipped,
                ..Skipped::default()
            },
        };
        let problem = |samples: &[(u64, u64)], skipped| layout_problem(&saved(samples, skipped));
        assert_eq!(problem(&[(0, 1024), (1024, 3072)], 0), Ok(()));
        assert_eq!(problem(&[(0, 1024), (2048, 2048)], 1), Ok(()));
        for (samples, skipped, why) in [
            (&[(0, 1000)][..], 0, "whole tar blocks"),
            (&[(0, 0)][..], 0, "whole tar blocks"),
            (&[(100, 512)][..], 1, "whole tar blocks"),
            (&[(0, 1024), (512, 512)][..], 0, "overlaps"),
            (&[(1024, 512), (0, 512)][..], 1, "overlaps"),
            (&[(0, 1024), (2048, 512)][..], 0, "does not start where"),
            (&[(512, 512)][..], 0, "does not start where"),
            (&[(512, u64::MAX - 511)][..], 1, "largest offset"),
        ] {
            let e = problem(samples, skipped).unwrap_err();
            assert!(e.contains(why), "{samples:?}: {e}");
        }
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
