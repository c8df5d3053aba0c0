//! `--resume`: what a run records so that a rerun can continue it, and the checks that the rerun
//! continues the same plan.
//!
//! Before any data moves, rank 0 records the plan in the staging directory
//! ([`crate::output::checkpoint::PlanRecord`]): the arguments that shape the staging shards, every
//! input's name, size and modification time, and a digest of the plan itself (every sample's
//! input range and output place, every shard's name and layout), which no rank count or memory
//! budget changes. During the exchange, checkpoints record which samples are durable. A rerun
//! with `--resume` checks the arguments and inputs before indexing and the digest after planning;
//! any difference is refused, named, with exit 2.

use std::path::Path;

use crate::cli::resolve::UsageError;
use crate::comm::{agree, Comm};
use crate::config::ResumeSettings;
use crate::input::InputShard;
use crate::job::handoff::{Checkpoints, Planned, Resume};
use crate::output::checkpoint::{self, InputRecord, PlanRecord};
use crate::report::narrate::count;
use crate::storage::{self, FileStamp};
use anyhow::{anyhow, Context, Result};

/// The arguments that shape the staging shards, as `--resume` records and compares them: those
/// decided when the request was resolved, and the key map's size and time now.
pub(crate) fn arguments(settings: &ResumeSettings) -> Vec<(String, String)> {
    let mut args = settings.arguments.clone();
    if let Some(map) = &settings.key_map {
        let stamp = storage::stamp(map).map_or_else(
            |_| "missing".to_string(),
            |s| format!("{} bytes, modified {}", s.size, storage::mtime_ns(&s)),
        );
        args.push(("--key-map file".to_string(), stamp));
    }
    args
}

/// An input shard as a plan record names it, from its stamp.
pub(crate) fn input_record(input: &InputShard, stamp: &FileStamp) -> InputRecord {
    InputRecord {
        path: input.path.display().to_string(),
        size: stamp.size,
        mtime_ns: storage::mtime_ns(stamp),
    }
}

/// Checks that a rerun asks for what the recorded run planned: the same arguments and inputs.
///
/// # Errors
/// A [`UsageError`] naming the first difference.
pub(crate) fn check_same_request(
    recorded: &PlanRecord,
    args: &[(String, String)],
    inputs: &[InputRecord],
    staging: &Path,
) -> Result<()> {
    let differs = |what: String| {
        anyhow::Error::new(UsageError::new(anyhow!(
            "cannot --resume the run whose staging directory is {}: {what}. Rerun with the \
             arguments and inputs of that run, or without --resume to start over (its staging \
             directory is then removed)",
            staging.display()
        )))
    };
    for (flag, now) in args {
        let then = recorded.arguments.iter().find(|(f, _)| f == flag);
        match then {
            Some((_, then)) if then == now => {}
            Some((_, then)) => return Err(differs(format!("{flag} was {then}, now {now}"))),
            None => return Err(differs(format!("{flag} was not given, now {now}"))),
        }
    }
    if let Some((flag, then)) = recorded
        .arguments
        .iter()
        .find(|(f, _)| !args.iter().any(|(g, _)| g == f))
    {
        return Err(differs(format!("{flag} was {then}, now it is not given")));
    }
    // The units of loose files are cut again and stamped once walked ([`record_units`]).
    let shards = |records: &[InputRecord]| -> Vec<InputRecord> {
        let unit = |r: &&InputRecord| crate::tree::parse(Path::new(&r.path)).is_some();
        records.iter().filter(|r| !unit(r)).cloned().collect()
    };
    let (then, now) = (shards(&recorded.inputs), shards(inputs));
    if then.len() != now.len() {
        return Err(differs(format!(
            "that run read {}, this one {}",
            count(then.len() as u64, "input shard"),
            now.len()
        )));
    }
    for (then, now) in then.iter().zip(&now) {
        if then.path != now.path {
            return Err(differs(format!(
                "an input was {}, now {}",
                then.path, now.path
            )));
        }
        if (then.size, then.mtime_ns) != (now.size, now.mtime_ns) {
            return Err(differs(format!(
                "the input {} changed since (then {} bytes, modified at {} ns; now {} bytes, modified at {} ns)",
                now.path, then.size, then.mtime_ns, now.size, now.mtime_ns
            )));
        }
    }
    Ok(())
}

/// After the walk phase: the units of loose files as the walk cut them, each stamped in rank
/// 0's `records` (its tar view's size, and its listing's digest in place of a modification
/// time), and with `--resume` checked against the recorded run's: a unit whose files changed
/// since (one added, removed, replaced, or changed in size, times or ETag), or cut otherwise, refuses the
/// resume, naming its directory. `digests`: every unit's (input index, digest), from the walk.
///
/// # Errors
/// A changed unit (a [`UsageError`]), or the plan record cannot be read; agreed on every rank.
pub(crate) fn record_units(
    comm: &impl Comm,
    setup: &crate::job::handoff::Setup,
    records: Option<&mut Vec<InputRecord>>,
    digests: &[(usize, u128)],
) -> Result<()> {
    let Some(records) = records else {
        return agree(comm, Ok(()));
    };
    // The `--input` shards come first; the walk may have cut the units again.
    records.retain(|r| crate::tree::parse(Path::new(&r.path)).is_none());
    for &(i, digest) in digests {
        let mut record = input_record(&setup.inputs[i], &FileStamp::default());
        (record.size, record.mtime_ns) = (setup.inputs[i].size, digest);
        records.push(record);
    }
    let outcome = match (&setup.resume, &setup.staging) {
        (Some(_), Some(staging)) if !digests.is_empty() => check_units(staging, records),
        _ => Ok(()),
    };
    agree(comm, outcome)
}

/// The units of `records` against those of the plan the run in `staging` recorded.
fn check_units(staging: &Path, records: &[InputRecord]) -> Result<()> {
    let Some(plan) = checkpoint::read_plan(staging)? else {
        return Ok(());
    };
    let units = |records: &[InputRecord]| -> Vec<InputRecord> {
        let unit = |r: &&InputRecord| crate::tree::parse(Path::new(&r.path)).is_some();
        records.iter().filter(unit).cloned().collect()
    };
    let (then, now) = (units(&plan.inputs), units(records));
    let blank = InputRecord {
        path: String::new(),
        size: 0,
        mtime_ns: 0,
    };
    for k in 0..then.len().max(now.len()) {
        let (then, now) = (then.get(k).unwrap_or(&blank), now.get(k).unwrap_or(&blank));
        if then == now {
            continue;
        }
        // A unit cut otherwise (a directory that grew past a unit's worth of keys) is named
        // by the location of either run.
        let now = if now.path.is_empty() { then } else { now };
        let dir = crate::tree::parse(Path::new(&now.path))
            .map(|(root, unit)| crate::tree::view::file_path(&root, &unit.dir))
            .unwrap_or_else(|| now.path.clone().into());
        return Err(anyhow::Error::new(UsageError::new(anyhow!(
            "cannot --resume the run whose staging directory is {}: the loose files under {} \
             changed since that run (a file added, removed, replaced, or changed in size, \
             modification or status-change time, or ETag; its tar view was {} bytes, now {}). \
             Rerun without --resume to start over (its staging directory is then removed)",
            staging.display(),
            dir.display(),
            then.size,
            now.size
        ))));
    }
    Ok(())
}

/// After planning, before any data moves: rank 0 records the plan (a first attempt) or checks
/// that it is the plan of the run being continued (`--resume`). `inputs`: rank 0's records of
/// the inputs, taken as the run started.
///
/// # Errors
/// The record cannot be written, or the plan differs from the recorded one (a [`UsageError`]);
/// agreed on every rank.
pub(crate) fn record_plan(
    comm: &impl Comm,
    settings: &ResumeSettings,
    staging: &Path,
    resume: Option<&Resume>,
    inputs: Option<&[InputRecord]>,
    planned: &Planned,
) -> Result<()> {
    let digest = digest(comm, planned);
    let outcome = match (comm.rank(), resume) {
        (0, Some(r)) if r.digest != digest => Err(anyhow::Error::new(UsageError::new(anyhow!(
            "cannot --resume the run whose staging directory is {}: the plan differs from that \
             run's although the arguments and inputs match (a changed file the plan reads?); \
             rerun without --resume to start over",
            staging.display()
        )))),
        (0, None) => checkpoint::write_plan(
            staging,
            &PlanRecord {
                arguments: arguments(settings),
                inputs: inputs.map(<[InputRecord]>::to_vec).unwrap_or_default(),
                digest,
                ranks: comm.size(),
                mem_limit: settings.mem_limit,
            },
        ),
        _ => Ok(()),
    };
    agree(comm, outcome)
}

/// The checkpoints of this run's exchange: rank 0 adds the ranges that became durable to those
/// an earlier attempt recorded, and replaces the checkpoint file.
pub(crate) fn checkpoints<'a>(
    settings: &ResumeSettings,
    staging: &'a Path,
    resume: Option<&Resume>,
) -> Checkpoints<'a> {
    let mut latest = resume.map(|r| r.checkpoint.clone()).unwrap_or_default();
    Checkpoints {
        every: settings.checkpoint_every,
        record: Box::new(move |ranges| {
            latest.done = latest.done.with(ranges);
            latest.samples = latest.done.count();
            latest.checkpoints += 1;
            checkpoint::write_checkpoint(staging, &latest)
                .context("recording a checkpoint of the exchange")
        }),
    }
}

/// A digest of the plan, the same for every rank count: sums (over all ranks, in 32-bit halves so
/// that nothing overflows) of hashes of every sample's input range and output positions, and
/// of every shard's name, size and layout.
pub(crate) fn digest(comm: &impl Comm, planned: &Planned) -> String {
    let (index, placed, laid) = (&planned.index, &planned.placed, &planned.laid);
    let mut sums = [0u64; 4];
    let mut add = |words: &[u64]| {
        let h = hash(words);
        let g = mix(h ^ 0x5851_f42d_4c95_7f2d);
        for (k, v) in [h, g].into_iter().enumerate() {
            sums[2 * k] += v & 0xffff_ffff;
            sums[2 * k + 1] += v >> 32;
        }
    };
    placed.placement.for_each(index.local.len(), &mut |i, p| {
        let s = index.local[i];
        add(&[
            1,
            index.first_global + i as u64,
            u64::from(s.shard),
            s.start,
            s.len,
            p,
        ]);
    });
    let (plan, layout) = (&laid.plan, &laid.layout);
    for (k, &s) in layout.shards.iter().enumerate() {
        let name = hash(
            &placed
                .names
                .plain(s)
                .bytes()
                .map(u64::from)
                .collect::<Vec<_>>(),
        );
        add(&[2, s, layout.shard_bytes[k], name]);
        for p in plan.shard_positions(s) {
            let (at, len) = layout.place(p).unwrap_or((u64::MAX, u64::MAX));
            add(&[3, p, at, len]);
        }
    }
    let total = comm.all_sum(&sums);
    total.iter().map(|v| format!("{v:016x}")).collect()
}

/// splitmix64's finalizer.
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

fn hash(words: &[u64]) -> u64 {
    words.iter().fold(0x9e37_79b9_7f4a_7c15, |acc, &w| {
        mix(acc ^ w).wrapping_add(w)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::checkpoint::Checkpoint;

    fn record(args: &[(&str, &str)], inputs: &[(&str, u64, u128)]) -> PlanRecord {
        PlanRecord {
            arguments: args
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            inputs: inputs
                .iter()
                .map(|&(path, size, mtime_ns)| InputRecord {
                    path: path.into(),
                    size,
                    mtime_ns,
                })
                .collect(),
            digest: String::new(),
            ranks: 2,
            mem_limit: 1 << 30,
        }
    }

    #[test]
    fn a_rerun_must_ask_for_what_the_recorded_run_planned() {
        let then = record(&[("--seed", "3"), ("--epoch", "0")], &[("a.tar", 10, 1)]);
        let check = |now: &PlanRecord| {
            check_same_request(&then, &now.arguments, &now.inputs, Path::new("/s")).map_err(|e| {
                assert!(e.downcast_ref::<UsageError>().is_some(), "exits 2");
                format!("{e:#}")
            })
        };
        assert!(check(&then).is_ok());
        let differs = [
            (
                record(&[("--seed", "4"), ("--epoch", "0")], &[("a.tar", 10, 1)]),
                "--seed was 3, now 4",
            ),
            (
                record(&[("--seed", "3")], &[("a.tar", 10, 1)]),
                "--epoch was 0, now it is not given",
            ),
            (
                record(
                    &[("--seed", "3"), ("--epoch", "0"), ("--key-map file", "x")],
                    &[("a.tar", 10, 1)],
                ),
                "--key-map file was not given, now x",
            ),
            (
                record(&[("--seed", "3"), ("--epoch", "0")], &[("b.tar", 10, 1)]),
                "an input was a.tar, now b.tar",
            ),
            (
                record(&[("--seed", "3"), ("--epoch", "0")], &[("a.tar", 11, 1)]),
                "the input a.tar changed since",
            ),
            (
                record(&[("--seed", "3"), ("--epoch", "0")], &[("a.tar", 10, 2)]),
                "the input a.tar changed since",
            ),
            (
                record(&[("--seed", "3"), ("--epoch", "0")], &[]),
                "that run read 1 input shard, this one 0",
            ),
        ];
        for (now, needle) in differs {
            let msg = check(&now).unwrap_err();
            assert!(msg.contains(needle) && msg.contains("/s"), "{msg}");
        }
    }

    #[test]
    fn every_argument_that_shapes_the_staging_shards_is_recorded() {
        let cfg = crate::job::tests::config(vec!["a.tar".into()], "out".into(), 1 << 30);
        let recorded = |cfg: &crate::config::RunConfig| {
            arguments(&crate::cli::resolve::job_settings(cfg).resume)
        };
        let args = recorded(&cfg);
        let value = |flag: &str| {
            args.iter()
                .find(|(f, _)| f == flag)
                .map(|(_, v)| v.clone())
                .unwrap_or_else(|| panic!("{flag} not recorded: {args:?}"))
        };
        assert_eq!(
            value("reshard version"),
            format!("{} (resume records 2)", env!("CARGO_PKG_VERSION"))
        );
        assert_eq!(value("--shards/--shard-size/--gpus"), "--shards 5");
        assert_eq!(value("--equalize"), "none");
        assert_eq!(value("--balance"), "count");
        assert_eq!(value("--seed"), "3");
        assert_eq!(value("--epoch"), "0");
        assert_eq!(value("--prefix"), "shard");
        assert_eq!(value("--split/--split-shards"), "none");
        assert_eq!(
            value("--require-ext/--on-incomplete/--on-duplicate"),
            cfg.rules.flags()
        );
        assert_eq!(args.len(), 10, "{args:?}");
        // What a resumed run may change is not recorded: it would refuse a legal resume.
        let mut other = cfg.clone();
        other.mem_limit = 1 << 20;
        other.inputs.push("b.tar".into());
        assert_eq!(recorded(&other), args);
        // With a key map, its file's size and time: an edited map reorders the output.
        let tmp = tempfile::tempdir().unwrap();
        let map = tmp.path().join("map.json");
        std::fs::write(&map, "{}").unwrap();
        other.order.key_map = Some(map.clone());
        let args = recorded(&other);
        assert!(args[10].0 == "--key-map file" && args[10].1.starts_with("2 bytes, modified "));
        std::fs::remove_file(&map).unwrap();
        assert_eq!(recorded(&other)[10].1, "missing");
    }

    #[test]
    fn an_input_is_recorded_by_path_size_and_time() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("a.tar");
        std::fs::write(&path, [0u8; 1024]).unwrap();
        let stamp = storage::stamp(&path).unwrap();
        let input = InputShard {
            path: path.clone(),
            size: 1024,
        };
        let r = input_record(&input, &stamp);
        assert_eq!(r.path, path.display().to_string());
        assert_eq!(r.size, 1024);
        assert_eq!(r.mtime_ns, storage::mtime_ns(&stamp));
        assert!(r.mtime_ns > 0);
    }

    #[test]
    fn each_checkpoint_adds_to_what_the_earlier_attempt_recorded() {
        let tmp = tempfile::tempdir().unwrap();
        let staging = tmp.path();
        std::fs::create_dir_all(checkpoint::dir(staging)).unwrap();
        let cfg = crate::job::tests::config(Vec::new(), "out".into(), 1 << 30);
        let settings = crate::cli::resolve::job_settings(&cfg).resume;
        let earlier = Resume {
            checkpoint: Checkpoint {
                done: checkpoint::Done::of([(0, 10)]),
                samples: 10,
                checkpoints: 3,
                shards: Vec::new(),
            },
            digest: String::new(),
        };
        let mut c = checkpoints(&settings, staging, Some(&earlier));
        assert_eq!(c.every, cfg.checkpoint_every);
        (c.record)(vec![(10, 15), (20, 20)]).unwrap();
        (c.record)(vec![(30, 32)]).unwrap();
        let latest = checkpoint::read_checkpoint(staging).unwrap().unwrap();
        assert_eq!(latest.done, checkpoint::Done::of([(0, 15), (30, 32)]));
        assert_eq!(latest.samples, 17);
        assert_eq!(latest.checkpoints, 5);
        // A first attempt starts from nothing.
        let mut c = checkpoints(&settings, staging, None);
        (c.record)(vec![(4, 6)]).unwrap();
        let latest = checkpoint::read_checkpoint(staging).unwrap().unwrap();
        assert_eq!((latest.samples, latest.checkpoints), (2, 1));
    }

    #[test]
    fn the_plan_hash_is_built_as_documented() {
        // splitmix64's first two outputs from seed 0 (its published reference values).
        const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;
        assert_eq!(mix(GOLDEN), 0xe220_a839_7b1d_cdaf);
        assert_eq!(mix(GOLDEN.wrapping_mul(2)), 0x6e78_9e6a_a1b9_65f4);
        // The fold over the words, from the golden ratio: mix(acc ^ w) + w.
        assert_eq!(hash(&[]), GOLDEN);
        // Computed outside this code (Python, from the construction above).
        assert_eq!(hash(&[5, 1 << 40, 7]), 0xa2ae_3084_2f2e_01e3);
        assert_ne!(
            hash(&[1, 2]),
            hash(&[2, 1]),
            "the order of the words counts"
        );
    }

    /// The digest of the plan of `cfg` on each rank of a world of `ranks`.
    fn digests(ranks: usize, cfg: &crate::config::RunConfig) -> Vec<String> {
        use crate::comm::local::LocalComm;
        LocalComm::run(ranks, |c| {
            Ok::<_, ()>(digest(c, &crate::job::tests::planned(c, cfg)))
        })
        .into_iter()
        .map(Result::unwrap)
        .collect()
    }

    #[test]
    fn the_plan_digest_is_one_for_any_rank_count_and_changes_with_the_plan() {
        use crate::job::tests::{config, write_inputs};
        let tmp = tempfile::tempdir().unwrap();
        let cfg = config(write_inputs(tmp.path(), 3), tmp.path().join("out"), 1 << 20);
        let one = digests(1, &cfg);
        assert_eq!(one[0].len(), 64, "{}", one[0]);
        for ranks in 2..=4 {
            assert!(
                digests(ranks, &cfg).iter().all(|d| d == &one[0]),
                "{ranks} ranks"
            );
        }
        // Another order (seed), other shard names, another sizing: each a plan of its own.
        let mut seed = cfg.clone();
        seed.seed += 1;
        let mut names = cfg.clone();
        names.prefix = "part".into();
        let mut sizing = cfg.clone();
        sizing.sizing = crate::plan::Sizing::Count(4);
        let mut all = vec![one[0].clone()];
        for other in [seed, names, sizing] {
            let d = digests(2, &other);
            assert!(!all.contains(&d[0]), "{d:?}");
            all.push(d[0].clone());
        }
    }
}
