//! What the staging directory records so that `--resume` can continue a run that failed: the
//! plan the run made ([`PlanRecord`], written once before any data moves) and which samples are
//! durably in the staging shards ([`Checkpoint`], replaced atomically as the exchange goes on).
//!
//! A checkpoint is a set of ranges of global sample indices ([`Done`]): every copy of every
//! sample in them was written at its place and `fdatasync`ed by its writer. Ranges, not shards:
//! with a shuffle, almost no shard is complete before the exchange's last round, while each
//! rank's readers finish a prefix of their samples round after round.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use super::seal;
use crate::storage::{self, FileStamp};

/// The directory inside the staging directory that holds the records.
pub(crate) const DIR_NAME: &str = ".resume";

/// The form of what a run records for `--resume` beyond its arguments (a loose unit's listing
/// digest, [`crate::tree::view::Listing::digest`]), recorded with the version: raise it when
/// that form changes, so that a staging directory an earlier build of the same version made is
/// refused for what it is ("reshard version was 0.1.0 (resume records 1), now ...") rather
/// than as changed input files.
pub(crate) const RECORD_FORMAT: u32 = 2;

/// The version as a run records it for `--resume`: the crate's, and [`RECORD_FORMAT`].
pub(crate) fn recorded_version() -> String {
    format!(
        "{} (resume records {RECORD_FORMAT})",
        env!("CARGO_PKG_VERSION")
    )
}
const PLAN: &str = "plan.json";
const CHECKPOINT: &str = "checkpoint.json";

/// Sorted, disjoint, non-adjacent half-open ranges of global sample indices.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Done(Vec<(u64, u64)>);

impl Done {
    /// The union of `ranges` (in any order, overlapping or not; empty ones ignored).
    pub(crate) fn of(ranges: impl IntoIterator<Item = (u64, u64)>) -> Self {
        let mut v: Vec<(u64, u64)> = ranges.into_iter().filter(|r| r.0 < r.1).collect();
        v.sort_unstable();
        let mut out: Vec<(u64, u64)> = Vec::with_capacity(v.len());
        for (a, b) in v {
            match out.last_mut() {
                Some(last) if a <= last.1 => last.1 = last.1.max(b),
                _ => out.push((a, b)),
            }
        }
        Done(out)
    }

    /// This set and `ranges` together.
    pub(crate) fn with(&self, ranges: impl IntoIterator<Item = (u64, u64)>) -> Self {
        Done::of(self.0.iter().copied().chain(ranges))
    }

    /// The end of the range holding global index `g`, if any: every index in `g..end` is done.
    pub(crate) fn done_until(&self, g: u64) -> Option<u64> {
        let k = self.0.partition_point(|r| r.1 <= g);
        self.0.get(k).filter(|r| r.0 <= g).map(|r| r.1)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Number of indices in the set.
    pub(crate) fn count(&self) -> u64 {
        self.0.iter().map(|r| r.1 - r.0).sum()
    }

    #[cfg(test)]
    pub(crate) fn ranges(&self) -> &[(u64, u64)] {
        &self.0
    }
}

/// One input shard as the plan saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct InputRecord {
    pub(crate) path: String,
    pub(crate) size: u64,
    /// Modification time, nanoseconds since the epoch (0 where unknown).
    pub(crate) mtime_ns: u128,
}

/// What a run planned, recorded before any data moves: what a resumed run must match.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PlanRecord {
    /// Every argument that shapes the staging shards, as (flag, value).
    pub(crate) arguments: Vec<(String, String)>,
    pub(crate) inputs: Vec<InputRecord>,
    /// A digest of every sample's input range and output place, and every shard's name and
    /// layout, independent of the rank count.
    pub(crate) digest: String,
    /// For the reader: the run's rank count and memory budget (a resumed run may differ).
    pub(crate) ranks: usize,
    pub(crate) mem_limit: u64,
}

/// Which samples are durable in the staging shards.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Checkpoint {
    pub(crate) done: Done,
    /// Samples the ranges hold, for reporting.
    pub(crate) samples: u64,
    /// Checkpoints taken so far over all attempts of the run.
    pub(crate) checkpoints: u64,
    /// Once every staging shard is complete and synced ([`record_all`]): each one's path in
    /// the staging directory and stamp. Nothing writes them after that, so a resumed run
    /// refuses a shard whose stamp differs ([`check_shards`]).
    #[serde(default)]
    pub(crate) shards: Vec<(String, FileStamp)>,
}

/// Where the records of the staging directory `staging` are.
pub(crate) fn dir(staging: &Path) -> PathBuf {
    staging.join(DIR_NAME)
}

/// Reads the plan record, if there is one.
///
/// # Errors
/// It exists but cannot be read or parsed.
pub(crate) fn read_plan(staging: &Path) -> Result<Option<PlanRecord>> {
    read_json(&dir(staging).join(PLAN))
}

/// Reads the latest checkpoint, if there is one.
///
/// # Errors
/// It exists but cannot be read or parsed.
pub(crate) fn read_checkpoint(staging: &Path) -> Result<Option<Checkpoint>> {
    read_json(&dir(staging).join(CHECKPOINT))
}

/// Records the plan durably (the directory is created).
///
/// # Errors
/// It cannot be written or synced.
pub(crate) fn write_plan(staging: &Path, plan: &PlanRecord) -> Result<()> {
    storage::sink(staging)
        .create_dir_all(&dir(staging))
        .with_context(|| format!("{}: cannot create", dir(staging).display()))?;
    write_json(&dir(staging).join(PLAN), plan)
}

/// Replaces the checkpoint durably and atomically: a crash leaves the old one or the new one.
///
/// # Errors
/// It cannot be written, synced or renamed.
pub(crate) fn write_checkpoint(staging: &Path, checkpoint: &Checkpoint) -> Result<()> {
    write_json(&dir(staging).join(CHECKPOINT), checkpoint)
}

/// Records that every sample in `all` (every sample of the run) is durably in place, once the
/// shards are complete and synced, and only if the plan was recorded; with the stamps of the
/// staging shards `shards` (paths in `staging`).
///
/// # Errors
/// It cannot be written, or a shard cannot be stat'ed.
pub(crate) fn record_all(staging: &Path, all: (u64, u64), shards: &[String]) -> Result<()> {
    let plan = dir(staging).join(PLAN);
    if storage::source(&plan).stat(&plan).is_err() {
        return Ok(());
    }
    let mut latest = read_checkpoint(staging)?.unwrap_or_default();
    latest.done = latest.done.with([all]);
    latest.samples = latest.done.count();
    latest.checkpoints += 1;
    latest.shards = shards
        .iter()
        .map(|name| {
            let path = staging.join(name);
            storage::stamp(&path)
                .map(|stamp| (name.clone(), stamp))
                .with_context(|| format!("{}: cannot stat", path.display()))
        })
        .collect::<Result<_>>()?;
    write_checkpoint(staging, &latest)
}

/// Checks that the staging shards `checkpoint` recorded complete are as they were then: a
/// shard rewritten, replaced or truncated between attempts would publish samples that are
/// missing or not the input's.
///
/// # Errors
/// A shard is missing or changed (named, with what changed).
pub(crate) fn check_shards(staging: &Path, checkpoint: &Checkpoint) -> Result<()> {
    for (name, then) in &checkpoint.shards {
        let path = staging.join(name);
        let now = storage::stamp(&path).with_context(|| {
            format!(
                "cannot --resume: the staging shard {} that the earlier attempt completed is gone; rerun without --resume to start over",
                path.display()
            )
        })?;
        // Rank 0 of this run may be on another host than the one that took the stamps.
        let changes = now.changes_since(then, false);
        if !changes.is_empty() {
            anyhow::bail!(
                "cannot --resume: the staging shard {} changed since the earlier attempt completed it ({changes}), so its samples cannot be trusted; rerun without --resume to start over",
                path.display()
            );
        }
    }
    Ok(())
}

/// Removes the records: the staging shards can no longer be resumed from.
pub(crate) fn forget(staging: &Path) {
    let sink = storage::sink(staging);
    let _ = sink.remove_file(&dir(staging).join(CHECKPOINT));
    let _ = sink.remove_file(&dir(staging).join(PLAN));
}

/// A record as written ([`write_json`]): its seal checked, then its JSON parsed. A damaged
/// record is an error naming it: what it says about the staging shards cannot be believed.
fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<Option<T>> {
    match storage::source(path).read(path) {
        Ok(bytes) => {
            let body = seal::open(&bytes).map_err(|e| {
                anyhow::anyhow!(
                    "{}: cannot --resume from this record: {e}; rerun without --resume to start over",
                    path.display()
                )
            })?;
            serde_json::from_slice(body)
                .map(Some)
                .with_context(|| format!("{}: cannot parse", path.display()))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("{}: cannot read", path.display())),
    }
}

/// Sealed ([`seal`]), written aside, synced, renamed over, and the directory synced.
fn write_json(path: &Path, value: &impl Serialize) -> Result<()> {
    let text = seal::seal(serde_json::to_vec(value).expect("serializable"));
    storage::sink(path)
        .replace(path, &text)
        .with_context(|| format!("{}: cannot write", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn done_ranges_merge_and_answer_membership() {
        let d = Done::of([(10, 20), (0, 5), (5, 7), (30, 30), (15, 25)]);
        assert_eq!(d.ranges(), [(0, 7), (10, 25)]);
        assert_eq!(d.count(), 22);
        assert_eq!(d.done_until(0), Some(7));
        assert_eq!(d.done_until(6), Some(7));
        assert_eq!(d.done_until(7), None);
        assert_eq!(d.done_until(24), Some(25));
        assert_eq!(d.done_until(25), None);
        assert_eq!(d.with([(7, 10)]).ranges(), [(0, 25)]);
        assert!(Done::default().done_until(0).is_none());
    }

    #[test]
    fn records_round_trip() {
        let tmp = tempfile::tempdir().unwrap();
        assert!(read_plan(tmp.path()).unwrap().is_none());
        let plan = PlanRecord {
            arguments: vec![("--seed".into(), "3".into())],
            inputs: vec![InputRecord {
                path: "a.tar".into(),
                size: 10,
                mtime_ns: 5,
            }],
            digest: "ab".into(),
            ranks: 2,
            mem_limit: 1 << 20,
        };
        write_plan(tmp.path(), &plan).unwrap();
        assert_eq!(read_plan(tmp.path()).unwrap(), Some(plan));
        let c = Checkpoint {
            done: Done::of([(0, 3)]),
            samples: 3,
            checkpoints: 1,
            shards: Vec::new(),
        };
        write_checkpoint(tmp.path(), &c).unwrap();
        assert_eq!(read_checkpoint(tmp.path()).unwrap(), Some(c));
        forget(tmp.path());
        assert!(read_checkpoint(tmp.path()).unwrap().is_none());
    }

    #[test]
    fn completed_shards_rewritten_in_place_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let staging = tmp.path();
        write_plan(
            staging,
            &PlanRecord {
                arguments: Vec::new(),
                inputs: Vec::new(),
                digest: String::new(),
                ranks: 1,
                mem_limit: 1,
            },
        )
        .unwrap();
        fs::write(staging.join("a.tar"), [1u8; 1024]).unwrap();
        record_all(staging, (0, 2), &["a.tar".to_string()]).unwrap();
        let c = read_checkpoint(staging).unwrap().unwrap();
        check_shards(staging, &c).unwrap();
        // Same size, other bytes: the times move.
        std::thread::sleep(std::time::Duration::from_millis(20));
        fs::write(staging.join("a.tar"), [2u8; 1024]).unwrap();
        let e = format!("{:#}", check_shards(staging, &c).unwrap_err());
        assert!(e.contains("a.tar") && e.contains("changed"), "{e}");
        fs::remove_file(staging.join("a.tar")).unwrap();
        let e = format!("{:#}", check_shards(staging, &c).unwrap_err());
        assert!(e.contains("is gone"), "{e}");
    }

    fn plan() -> PlanRecord {
        PlanRecord {
            arguments: Vec::new(),
            inputs: Vec::new(),
            digest: String::new(),
            ranks: 1,
            mem_limit: 1,
        }
    }

    #[test]
    fn an_empty_set_is_one_without_a_sample() {
        assert!(Done::default().is_empty());
        assert!(Done::of([(3, 3), (5, 4)]).is_empty());
        assert!(!Done::of([(3, 4)]).is_empty());
    }

    #[test]
    fn the_records_belong_to_their_staging_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
        fs::create_dir(&a).unwrap();
        fs::create_dir(&b).unwrap();
        write_plan(&a, &plan()).unwrap();
        write_checkpoint(&a, &Checkpoint::default()).unwrap();
        assert!(read_plan(&b).unwrap().is_none() && read_checkpoint(&b).unwrap().is_none());
        // They move with it (the publishing rename), and go with its own directory.
        let moved = tmp.path().join("moved");
        fs::rename(&a, &moved).unwrap();
        assert_eq!(read_plan(&moved).unwrap(), Some(plan()));
        assert!(dir(&moved).starts_with(&moved));
    }

    #[test]
    fn records_that_cannot_be_read_or_parsed_are_errors_not_absent() {
        let tmp = tempfile::tempdir().unwrap();
        fs::create_dir_all(dir(tmp.path()).join(CHECKPOINT)).unwrap();
        let e = format!("{:#}", read_checkpoint(tmp.path()).unwrap_err());
        assert!(e.contains("checkpoint.json: cannot read"), "{e}");
        fs::write(dir(tmp.path()).join(PLAN), seal::seal(b"{".to_vec())).unwrap();
        let e = format!("{:#}", read_plan(tmp.path()).unwrap_err());
        assert!(e.contains("plan.json: cannot parse"), "{e}");
    }

    /// A record damaged anywhere, cut short, or unsealed (an older reshard's) is refused,
    /// naming it and what failed, and never read as some other set of done samples.
    #[test]
    fn damaged_records_are_refused_naming_the_file() {
        let tmp = tempfile::tempdir().unwrap();
        write_plan(tmp.path(), &plan()).unwrap();
        let c = Checkpoint {
            done: Done::of([(0, 30), (40, 52)]),
            samples: 42,
            checkpoints: 2,
            shards: Vec::new(),
        };
        write_checkpoint(tmp.path(), &c).unwrap();
        fn plan_of(p: &Path) -> Result<()> {
            read_plan(p).map(|_| ())
        }
        fn checkpoint_of(p: &Path) -> Result<()> {
            read_checkpoint(p).map(|_| ())
        }
        type Reader = fn(&Path) -> Result<()>;
        let readers: [(&str, Reader); 2] = [(PLAN, plan_of), (CHECKPOINT, checkpoint_of)];
        for (name, read) in readers {
            let path = dir(tmp.path()).join(name);
            let good = fs::read(&path).unwrap();
            for i in 0..good.len() {
                let mut bad = good.clone();
                bad[i] ^= 0x04;
                fs::write(&path, &bad).unwrap();
                let e = format!("{:#}", read(tmp.path()).unwrap_err());
                assert!(e.contains(name) && e.contains("--resume"), "byte {i}: {e}");
            }
            fs::write(&path, &good[..good.len() - 3]).unwrap();
            let e = format!("{:#}", read(tmp.path()).unwrap_err());
            assert!(e.contains("no checksum trailer"), "{e}");
            fs::write(&path, seal::open(&good).unwrap()).unwrap();
            let e = format!("{:#}", read(tmp.path()).unwrap_err());
            assert!(e.contains(name) && e.contains("no checksum trailer"), "{e}");
            fs::write(&path, &good).unwrap();
            read(tmp.path()).unwrap();
        }
        assert_eq!(read_checkpoint(tmp.path()).unwrap(), Some(c));
    }

    #[test]
    fn the_last_checkpoint_adds_everything_and_counts_itself() {
        let tmp = tempfile::tempdir().unwrap();
        let staging = tmp.path();
        fs::write(staging.join("a.tar"), [1u8; 10]).unwrap();
        let shards = ["a.tar".to_string()];
        // No plan recorded: nothing to resume, nothing recorded.
        record_all(staging, (0, 9), &shards).unwrap();
        assert!(read_checkpoint(staging).unwrap().is_none());
        write_plan(staging, &plan()).unwrap();
        let earlier = Checkpoint {
            done: Done::of([(0, 4)]),
            samples: 4,
            checkpoints: 2,
            shards: Vec::new(),
        };
        write_checkpoint(staging, &earlier).unwrap();
        record_all(staging, (0, 9), &shards).unwrap();
        let c = read_checkpoint(staging).unwrap().unwrap();
        assert_eq!(
            (c.done.ranges(), c.samples, c.checkpoints),
            (&[(0, 9)][..], 9, 3)
        );
        assert_eq!(c.shards.len(), 1);
        assert_eq!(c.shards[0].0, "a.tar");
    }
}
