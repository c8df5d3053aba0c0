//! Phase "publish": energon's `.nv-meta/` (`--energon`) and the manifest are written, the
//! staging directory becomes the output in one rename, then `--link` and `--keep` act. Nothing
//! is visible at the output path before.

use std::fs;
use std::path::Path;

use anyhow::{Context, Result};

use crate::comm::{broadcast_result, Comm};
use crate::config::RunConfig;
use crate::hooks;
use crate::job::expand::{Setup, HEARTBEATS};
use crate::job::finish::Finished;
use crate::job::layout::Laid;
use crate::job::link::check_link;
use crate::job::place::Placed;
use crate::job::series::outputs_beyond;
use crate::job::Planned;
use crate::output::manifest::{KeyMapInfo, Manifest, RunInfo, ShardEntry};
use crate::output::{checkpoint, energon};
use crate::report::Stats;

/// Rank 0 writes the manifest, publishes the output and acts on `--link` and `--keep`; every
/// rank learns the outcome.
///
/// # Errors
/// The manifest cannot be written, the rename fails, or `--link`/`--keep` fail.
pub fn run(
    comm: &impl Comm,
    cfg: &RunConfig,
    setup: &Setup,
    planned: &Planned,
    finished: &Finished,
) -> Result<()> {
    hooks::kill_before_publish(comm.rank());
    let published = (comm.rank() == 0).then(|| {
        let (staging, target) = (setup.staging()?, setup.target()?);
        let _ = fs::remove_dir_all(staging.join(HEARTBEATS));
        let _ = fs::remove_dir_all(checkpoint::dir(staging));
        let info = run_info(comm.size(), cfg, setup, planned, finished);
        let shardlist = shard_list(cfg, &planned.placed, &planned.laid, finished);
        energon_meta(cfg, staging, planned)
            .and_then(|()| write_manifests(staging, &Manifest::new(shardlist, info)))
            .and_then(|()| publish(staging, target))
            .and_then(|()| after_publish(cfg, target))
    });
    broadcast_result(comm, 0, published)
}

/// `--energon`: `.nv-meta/`, from the rows every writer left in the staging directory.
fn energon_meta(cfg: &RunConfig, staging: &Path, planned: &Planned) -> Result<()> {
    let Some(dataset) = &cfg.loaders.energon else {
        return Ok(());
    };
    let placed = &planned.placed;
    let names: Vec<String> = (0..placed.shards).map(|s| placed.names.plain(s)).collect();
    energon::write_meta(
        staging,
        &energon::Meta {
            names: &names,
            counts: &planned.laid.shard_samples,
            parts: &energon_parts(cfg, planned, &names),
            dataset,
            key_index: cfg.loaders.energon_key_index,
        },
    )
}

/// Energon's split parts: with `--split`, one part per split holding its shards (and energon's
/// usual `train`, `val` and `test` empty where no split has that name); otherwise every shard in
/// `train`.
fn energon_parts(
    cfg: &RunConfig,
    planned: &Planned,
    names: &[String],
) -> Vec<(String, Vec<String>)> {
    let placed = &planned.placed;
    let Some(splits) = placed.names.split_parts(placed.shards, cfg.compress) else {
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
    cfg: &RunConfig,
    setup: &Setup,
    planned: &Planned,
    finished: &Finished,
) -> RunInfo {
    let (index, placed, laid) = (&planned.index, &planned.placed, &planned.laid);
    let inputs = &setup.inputs;
    RunInfo {
        version: env!("CARGO_PKG_VERSION").to_string(),
        seed: cfg.seed,
        epoch: cfg.epoch,
        shards: placed.shards,
        samples: index.samples,
        sample_bytes: index.sample_bytes,
        output_bytes: finished.file_bytes.iter().sum(),
        inputs: inputs
            .iter()
            .map(|s| s.path.display().to_string())
            .collect(),
        input_bytes: inputs.iter().map(|s| s.size).sum(),
        skipped: index.skipped,
        ranks,
        sizing: placed.sizing.clone(),
        equalize: cfg.equalize,
        balance: cfg.balance,
        output_samples: placed.output_samples,
        dropped: laid.dropped_keys.clone(),
        repeated: laid.repeated_keys.clone(),
        shard_samples: Stats::of(&laid.shard_samples),
        shard_bytes: Stats::of(&laid.shard_bytes),
        gpus: laid.gpus,
        hygiene: index.hygiene,
        order: cfg.order.describe(),
        stratify: placed.stratify.clone(),
        key_map: cfg.order.key_map.as_ref().map(|path| KeyMapInfo {
            file: path.display().to_string(),
            unmatched: placed.unmatched,
            groups: placed.groups.clone(),
        }),
        splits: cfg.split.as_ref().map(|_| placed.groups.clone()),
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
    cfg: &RunConfig,
    placed: &Placed,
    laid: &Laid,
    finished: &Finished,
) -> Vec<ShardEntry> {
    let mut shardlist = laid.shardlist.clone();
    for (s, entry) in shardlist.iter_mut().enumerate() {
        entry.url = placed.names.published(s as u64, cfg.compress);
        entry.filesize = finished.file_bytes[s];
    }
    for (entry, sum) in shardlist.iter_mut().zip(finished.md5.chunks_exact(16)) {
        entry.md5sum = Some(sum.iter().map(|b| format!("{b:02x}")).collect());
    }
    shardlist
}

/// `--link` and `--keep`, once the output is published.
fn after_publish(cfg: &RunConfig, target: &Path) -> Result<()> {
    if let Some(link) = &cfg.link {
        point_link(link, target)?;
    }
    if let Some(keep) = &cfg.keep {
        for old in outputs_beyond(target, keep, cfg.epoch, cfg.link.as_deref())? {
            eprintln!(
                "reshard: --keep {}: removing the older output {}",
                keep.count,
                old.display()
            );
            fs::remove_dir_all(&old)
                .with_context(|| format!("--keep: cannot remove {}", old.display()))?;
        }
    }
    Ok(())
}

/// Atomically points the symlink `link` at `target`: a new link under a temporary name, renamed
/// over the old one, so a reader of `link` always sees a complete dataset.
fn point_link(link: &Path, target: &Path) -> Result<()> {
    check_link(link)?;
    let name = link
        .file_name()
        .with_context(|| format!("--link {}: not a file name", link.display()))?;
    let tmp = link.with_file_name(format!(".{}.reshard-link", name.to_string_lossy()));
    let _ = fs::remove_file(&tmp);
    std::os::unix::fs::symlink(target, &tmp)
        .with_context(|| format!("--link: cannot create {}", tmp.display()))?;
    fs::rename(&tmp, link).with_context(|| format!("--link: cannot replace {}", link.display()))?;
    if let Some(parent) = link.parent().filter(|p| !p.as_os_str().is_empty()) {
        sync_dir(parent)?;
    }
    Ok(())
}

/// Makes the finished staging directory the output, in one rename where the output does not
/// exist or is empty, or by an atomic exchange with the old output (`--force`).
fn publish(staging: &Path, target: &Path) -> Result<()> {
    sync_dir(staging)?;
    let replaced = match fs::rename(staging, target) {
        Ok(()) => false,
        Err(_) if target.is_dir() => {
            crate::sys::exchange_paths(staging, target).with_context(|| {
                format!(
                    "cannot replace {} with {}",
                    target.display(),
                    staging.display()
                )
            })?;
            true
        }
        Err(e) => {
            return Err(e).with_context(|| {
                format!(
                    "cannot rename {} to {}",
                    staging.display(),
                    target.display()
                )
            });
        }
    };
    if let Some(parent) = target.parent() {
        sync_dir(parent)?;
    }
    if replaced {
        // The staging name now holds the previous output.
        fs::remove_dir_all(staging)
            .with_context(|| format!("{}: cannot remove the replaced output", staging.display()))?;
    }
    Ok(())
}

pub fn sync_dir(dir: &Path) -> Result<()> {
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("{}: cannot sync directory", dir.display()))
}
