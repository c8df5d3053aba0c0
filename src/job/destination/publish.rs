//! Phase "publish": energon's `.nv-meta/` (`--energon`) and the manifest are written, the
//! staging directory becomes the output in one rename that replaces nothing (with `--force`:
//! an atomic exchange with an older reshard output), then the checkpoint records and the
//! replaced output go, and `--link` and `--keep` act. Nothing is visible at the output path
//! before; a failure after the rename is a [`crate::exit::CleanupFailed`]. The steps and their
//! rules are the output's life's ([`crate::job::destination::life`]), done by renaming
//! ([`crate::job::destination::by_rename`]).

use std::path::Path;

use anyhow::Result;

use crate::comm::{broadcast_result, Comm};
use crate::config::PublishSettings;
use crate::hooks;
use crate::job::destination::by_rename::{sync_dir, ByRename};
use crate::job::destination::life::{self, Rules};
use crate::job::destination::lock::OutputLock;
use crate::job::destination::staging::Staging;
use crate::job::handoff::{Finished, Laid, Placed, Planned, Setup};
use crate::output::energon;
use crate::output::manifest::{KeyMapInfo, Manifest, RunInfo, ShardEntry};
use crate::report::Stats;

/// Rank 0 writes the manifest, publishes the output and acts on `--link` and `--keep`; every
/// rank learns the outcome.
///
/// # Errors
/// The manifest cannot be written, this run lost the output's `lock`, or the rename fails
/// (nothing is published, and the finished staging directory stays for `--resume`); or a step
/// after the rename fails: removing the replaced output or the checkpoint records, `--link` or
/// `--keep` (a [`crate::exit::CleanupFailed`]: the new output is live).
pub(crate) fn run(
    comm: &impl Comm,
    settings: &PublishSettings,
    setup: &Setup,
    planned: &Planned,
    finished: &Finished,
    lock: Option<&OutputLock>,
) -> Result<()> {
    hooks::kill_before_publish(comm.rank());
    let published = (comm.rank() == 0).then(|| {
        let (staging, target) = (setup.staging()?, setup.target()?);
        Staging::at(staging).move_heartbeats_aside();
        let info = run_info(comm.size(), settings, setup, planned, finished);
        let shardlist = shard_list(settings, &planned.placed, &planned.laid, finished);
        // The checkpoint records stay until the rename: a failure before it leaves a finished
        // staging directory that `--resume` publishes without moving data again.
        let strategy = ByRename {
            staging,
            target,
            force: settings.force,
            lock,
            staged_for_upload: settings.staged_for_upload,
        };
        let rules = Rules {
            link: settings.link.as_deref(),
            keep: settings.keep.as_ref(),
            epoch: settings.epoch,
        };
        energon_meta(settings, staging, planned)
            .and_then(|()| write_manifests(staging, &Manifest::new(shardlist, info)))
            .and_then(|()| life::commit(&strategy, &rules))
    });
    broadcast_result(comm, 0, published)
}

/// `--energon`: `.nv-meta/`, from the rows every writer left in the staging directory.
fn energon_meta(settings: &PublishSettings, staging: &Path, planned: &Planned) -> Result<()> {
    let Some(dataset) = &settings.loaders.energon else {
        return Ok(());
    };
    let placed = &planned.placed;
    let names: Vec<String> = (0..placed.shards).map(|s| placed.names.plain(s)).collect();
    energon::write_meta(
        staging,
        &energon::Meta {
            names: &names,
            counts: &planned.laid.shard_samples,
            parts: &energon_parts(settings, planned, &names),
            dataset,
            key_index: settings.loaders.energon_key_index,
        },
    )
}

/// Energon's split parts: with `--split`, one part per split holding its shards (and energon's
/// usual `train`, `val` and `test` empty where no split has that name); otherwise every shard in
/// `train`.
fn energon_parts(
    settings: &PublishSettings,
    planned: &Planned,
    names: &[String],
) -> Vec<(String, Vec<String>)> {
    let placed = &planned.placed;
    let Some(splits) = placed.names.split_parts(placed.shards, settings.compress) else {
        return energon::unsplit_parts(names);
    };
    let mut parts: Vec<(String, Vec<String>)> =
        splits.into_iter().map(|p| (p.name, p.shards)).collect();
    for usual in ["train", "val", "test"] {
        if !parts.iter().any(|(name, _)| name == usual) {
            parts.push((usual.to_string(), Vec::new()));
        }
    }
    parts
}

/// The manifest's `reshard` object: what was run and what it made.
fn run_info(
    ranks: usize,
    settings: &PublishSettings,
    setup: &Setup,
    planned: &Planned,
    finished: &Finished,
) -> RunInfo {
    let (index, placed, laid) = (&planned.index, &planned.placed, &planned.laid);
    let inputs = &setup.inputs;
    RunInfo {
        version: env!("CARGO_PKG_VERSION").to_string(),
        seed: settings.seed,
        epoch: settings.epoch,
        shards: placed.shards,
        samples: index.samples,
        sample_bytes: index.sample_bytes,
        output_bytes: finished.file_bytes.iter().sum(),
        inputs: crate::input::recorded_paths(inputs.iter().map(|s| s.path.as_path())),
        input_bytes: setup.input_bytes(),
        skipped: index.skipped,
        ranks,
        sizing: placed.sizing.clone(),
        equalize: settings.equalize,
        balance: settings.balance,
        output_samples: placed.output_samples,
        dropped: laid.dropped_keys.clone(),
        repeated: laid.repeated_keys.clone(),
        shard_samples: Stats::of(&laid.shard_samples),
        shard_bytes: Stats::of(&laid.shard_bytes),
        gpus: laid.gpus,
        hygiene: index.hygiene,
        order: settings.order.clone(),
        stratify: placed.stratify.clone(),
        key_map: settings.key_map.as_ref().map(|path| KeyMapInfo {
            file: path.display().to_string(),
            unmatched: placed.unmatched,
            groups: placed.groups.clone(),
        }),
        splits: settings.split.then(|| placed.groups.clone()),
        split: None,
    }
}

/// `OUTPUT/index.json`, and with `--split` each split's own `OUTPUT/NAME/index.json`.
fn write_manifests(staging: &Path, manifest: &Manifest) -> Result<()> {
    if let Some(groups) = &manifest.reshard.splits {
        for (k, group) in groups.iter().enumerate() {
            let name = group.split.as_deref().unwrap_or_default();
            manifest
                .of_split(groups, k)
                .write(&staging.join(name).join("index.json"))?;
            sync_dir(&staging.join(name))?;
        }
    }
    manifest.write(&staging.join("index.json"))
}

/// The manifest's shard list: the published names and file sizes, and with `--checksum` each
/// shard's MD5.
fn shard_list(
    settings: &PublishSettings,
    placed: &Placed,
    laid: &Laid,
    finished: &Finished,
) -> Vec<ShardEntry> {
    let mut shardlist = laid.shardlist.clone();
    for (s, entry) in shardlist.iter_mut().enumerate() {
        entry.url = placed.names.published(s as u64, settings.compress);
        entry.filesize = finished.file_bytes[s];
    }
    for (entry, sum) in shardlist.iter_mut().zip(finished.md5.chunks_exact(16)) {
        entry.md5sum = Some(crate::hex::hex(sum));
    }
    shardlist
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;
    use crate::cli::resolve::job_settings;
    use crate::comm::local::LocalComm;
    use crate::config::EnergonDataset;
    use crate::exit::CleanupFailed;

    #[test]
    fn a_failing_step_is_reported_with_what_to_know() {
        let tmp = tempfile::tempdir().unwrap();
        let missing = tmp.path().join("missing");
        let msg = format!("{:#}", sync_dir(&missing).unwrap_err());
        assert!(msg.contains(&missing.display().to_string()), "{msg}");
        let failed = CleanupFailed { output: missing };
        assert_eq!(
            failed.to_string(),
            format!(
                "published {} (the new output is live and complete); clean-up failed",
                tmp.path().join("missing").display()
            )
        );
    }

    /// The split parts of energon's split.yaml, from a whole in-process run with `--energon`.
    fn energon_parts_of(split: Option<&str>) -> String {
        let tmp = tempfile::tempdir().unwrap();
        let inputs = (0..2)
            .map(|s| {
                let path = tmp.path().join(format!("in-{s}.tar"));
                let mut b = tar::Builder::new(fs::File::create(&path).unwrap());
                for k in 0..10 {
                    let mut h = tar::Header::new_gnu();
                    h.set_size(3);
                    h.set_mode(0o644);
                    b.append_data(&mut h, format!("k{s}{k:02}.cls"), &b"abc"[..])
                        .unwrap();
                }
                b.finish().unwrap();
                path.display().to_string()
            })
            .collect();
        let out = tmp.path().join("out");
        let mut cfg = crate::job::tests::config(inputs, out.clone(), 1 << 20);
        cfg.sizing = crate::plan::Sizing::Count(2);
        cfg.loaders.energon = Some(EnergonDataset::Crude);
        cfg.split = split.map(|spec| crate::config::Splits {
            spec: spec.parse().unwrap(),
            shards: vec![None, Some(1)],
        });
        let results = LocalComm::run(1, |c| crate::job::run(c, &job_settings(&cfg)).map(|_| ()));
        assert!(results.iter().all(Result::is_ok), "{results:?}");
        fs::read_to_string(out.join(".nv-meta").join("split.yaml")).unwrap()
    }

    #[test]
    fn energon_parts_are_the_splits_and_its_usual_names() {
        assert_eq!(
            energon_parts_of(None),
            "split_parts:\n  train:\n  - shard-{000000..000001}.tar\n  val: []\n  test: []\nexclude: []\n"
        );
        // A split named as energon's own is its part; the usual parts no split has are empty.
        assert_eq!(
            energon_parts_of(Some("train=0.5,holdout=rest")),
            "split_parts:\n  train:\n  - train/shard-{000000..000001}.tar\n  holdout:\n  - holdout/shard-000000.tar\n  val: []\n  test: []\nexclude: []\n"
        );
    }
}
