//! Phase "publish": energon's `.nv-meta/` (`--energon`) and the manifest are written, the
//! staging directory becomes the output in one rename that replaces nothing (with `--force`:
//! an atomic exchange with an older reshard output), then the checkpoint records and the
//! replaced output go, and `--link` and `--keep` act. Nothing is visible at the output path
//! before; a failure after the rename is a [`CleanupFailed`].

use std::io::ErrorKind;
use std::path::Path;

use anyhow::{bail, Context, Result};

use crate::comm::{broadcast_result, Comm};
use crate::config::PublishSettings;
pub(crate) use crate::exit::CleanupFailed;
use crate::hooks;
use crate::job::destination::link::{check_link, relative_target};
use crate::job::destination::lock::OutputLock;
use crate::job::destination::owned::{check_replaceable, inspect, AtOutput};
use crate::job::destination::series::{outputs_beyond, remove_epoch, unfinished_removals};
use crate::job::destination::staging::{self, Staging};
use crate::job::handoff::{Finished, Laid, Placed, Planned, Setup};
use crate::output::manifest::{KeyMapInfo, Manifest, RunInfo, ShardEntry};
use crate::output::{checkpoint, energon};
use crate::report::Stats;
use crate::storage;

/// Rank 0 writes the manifest, publishes the output and acts on `--link` and `--keep`; every
/// rank learns the outcome.
///
/// # Errors
/// The manifest cannot be written, this run lost the output's `lock`, or the rename fails
/// (nothing is published, and the finished staging directory stays for `--resume`); or a step
/// after the rename fails: removing the replaced output or the checkpoint records, `--link` or
/// `--keep` (a [`CleanupFailed`]: the new output is live).
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
        energon_meta(settings, staging, planned)
            .and_then(|()| write_manifests(staging, &Manifest::new(shardlist, info)))
            .and_then(|()| lock.map_or(Ok(()), |l| l.check_before_publish(staging)))
            .and_then(|()| publish(settings.force, staging, target))
            .and_then(|replaced| {
                after_publish(settings, staging, target, replaced).map_err(|e| {
                    e.context(CleanupFailed {
                        output: target.to_path_buf(),
                    })
                })
            })
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
        input_bytes: inputs.iter().map(|s| s.size).sum(),
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
        entry.md5sum = Some(sum.iter().map(|b| format!("{b:02x}")).collect());
    }
    shardlist
}

/// Once the output is published: its checkpoint records go, the output it replaced (now at
/// the staging name) is removed, then `--link` and `--keep` act.
fn after_publish(
    settings: &PublishSettings,
    staging: &Path,
    target: &Path,
    replaced: bool,
) -> Result<()> {
    let sink = storage::sink(target);
    let records = checkpoint::dir(target);
    // A staged output is not the output yet: until it is uploaded, `--resume` continues it.
    if !settings.staged_for_upload && storage::source(&records).stat(&records).is_ok() {
        sink.remove_dir_all(&records)
            .with_context(|| format!("{}: cannot remove", records.display()))?;
    }
    hooks::kill_at(0, "published");
    if replaced {
        sink.remove_dir_all(staging).with_context(|| {
            format!(
                "{}: cannot remove the replaced output (the next run on this output removes it)",
                staging.display()
            )
        })?;
    }
    staging::unpoint(&staging::pointer_of(staging), staging);
    if let Some(link) = &settings.link {
        point_link(link, target)?;
    }
    if let Some(keep) = &settings.keep {
        for aside in unfinished_removals(target, keep)? {
            crate::errln!(
                "reshard: --keep: finishing the removal of {} (an earlier run moved it aside)",
                aside.display()
            );
            sink.remove_dir_all(&aside)
                .with_context(|| format!("--keep: cannot remove {}", aside.display()))?;
        }
        for old in outputs_beyond(target, keep, settings.epoch, settings.link.as_deref())? {
            crate::errln!(
                "reshard: --keep {}: removing the older output {}",
                keep.count,
                old.display()
            );
            remove_epoch(&old)?;
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
    let sink = storage::sink(link);
    let _ = sink.remove_file(&tmp);
    // Relative, as `ln -sr` makes it: the link survives a move of the tree that holds both.
    let points_to = relative_target(link, target)?;
    sink.symlink(&points_to, &tmp)
        .with_context(|| format!("--link: cannot create {}", tmp.display()))?;
    sink.rename(&tmp, link)
        .with_context(|| format!("--link: cannot replace {}", link.display()))?;
    if let Some(parent) = link.parent().filter(|p| !p.as_os_str().is_empty()) {
        sync_dir(parent)?;
    }
    Ok(())
}

/// Makes the finished staging directory the output: in one rename that replaces nothing (but
/// an empty directory), or with `--force` over an older reshard output by an atomic exchange
/// with it. Whether an output was replaced (it is then at the staging name).
///
/// # Errors
/// Something that may not be replaced is at the output (it is left as it is), or the rename
/// fails: nothing is published and the staging directory is left as it is.
fn publish(force: bool, staging: &Path, target: &Path) -> Result<bool> {
    sync_dir(staging)?;
    // Checked before the run, and again now: the output may have changed since.
    let found = if force {
        check_replaceable(target, "at publishing")?
    } else {
        AtOutput::Nothing
    };
    hooks::kill_at(0, "rename");
    let replaced = found == AtOutput::ReshardOutput;
    if replaced {
        storage::sink(target)
            .swap(staging, target)
            .with_context(|| {
                format!(
                    "cannot replace {} with {}",
                    target.display(),
                    staging.display()
                )
            })?;
    } else {
        rename_without_replacing(staging, target)?;
    }
    if let Some(parent) = target.parent() {
        sync_dir(parent)?;
    }
    Ok(replaced)
}

/// Renames `staging` to `target` where nothing is, or where an empty directory is: never over
/// anything else, whatever appeared there during the run. Where `renameat2(RENAME_NOREPLACE)`
/// is not supported, rename(2) is as safe here: a directory replaces only an empty directory.
fn rename_without_replacing(staging: &Path, target: &Path) -> Result<()> {
    let failed = |e: std::io::Error| {
        anyhow::Error::new(e).context(format!(
            "cannot rename {} to {}",
            staging.display(),
            target.display()
        ))
    };
    let sink = storage::sink(target);
    match sink.rename_noreplace(staging, target) {
        Ok(()) => Ok(()),
        Err(e) if crate::sys::unsupported(&e) => sink.rename(staging, target).map_err(failed),
        Err(e) if e.kind() == ErrorKind::AlreadyExists => match inspect(target)? {
            AtOutput::Empty => sink.rename(staging, target).map_err(failed),
            found => bail!(
                "--output {}: {} appeared there during the run; not replacing it (nothing was published). The finished output stays in {}: move what is at {} away, then rerun with the same arguments and --resume to publish it without moving data again",
                target.display(),
                describe(&found),
                staging.display(),
                target.display()
            ),
        },
        Err(e) => Err(failed(e)),
    }
}

/// What was found at the output, for a message.
fn describe(found: &AtOutput) -> String {
    match found {
        AtOutput::Nothing => "nothing".into(),
        AtOutput::Empty => "an empty directory".into(),
        AtOutput::ReshardOutput => "an output of another reshard run".into(),
        AtOutput::Other(what) => what.clone(),
    }
}

pub(crate) fn sync_dir(dir: &Path) -> Result<()> {
    storage::sink(dir)
        .sync_dir(dir)
        .with_context(|| format!("{}: cannot sync directory", dir.display()))
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::path::PathBuf;

    use super::*;
    use crate::cli::resolve::job_settings;
    use crate::comm::local::LocalComm;
    use crate::config::{Balance, EnergonDataset, LoaderIndexes};
    use crate::output::saved_index;
    use crate::plan::Equalize;
    use crate::tar::Codec;

    /// A finished staging directory holding one shard, and the output it is published as.
    fn staged(root: &Path) -> (PathBuf, PathBuf) {
        let staging = root.join(".out.reshard-tmp");
        fs::create_dir(&staging).unwrap();
        fs::write(staging.join("shard-000000.tar"), b"new").unwrap();
        (staging, root.join("out"))
    }

    /// What an earlier reshard run published at `dir`: its index.json and `.reshard/`.
    fn reshard_output(dir: &Path) {
        fs::create_dir_all(dir.join(saved_index::DIR_NAME)).unwrap();
        let index = format!(
            r#"{{"__kind__": "{}", "reshard": {{}}, "shardlist": [{{"url": "shard-000000.tar", "filesize": 3}}]}}"#,
            Manifest::KIND
        );
        fs::write(dir.join("index.json"), index).unwrap();
        fs::write(dir.join("shard-000000.tar"), b"old").unwrap();
    }

    fn settings(link: Option<PathBuf>) -> PublishSettings {
        PublishSettings {
            force: false,
            compress: Codec::Plain,
            loaders: LoaderIndexes::default(),
            link,
            keep: None,
            seed: 0,
            epoch: 0,
            equalize: Equalize::None,
            balance: Balance::Count,
            order: String::new(),
            key_map: None,
            split: false,
            staged_for_upload: false,
        }
    }

    #[test]
    fn the_staging_directory_becomes_the_output_where_nothing_or_an_empty_directory_is() {
        let tmp = tempfile::tempdir().unwrap();
        let (staging, target) = staged(tmp.path());
        assert!(
            !publish(false, &staging, &target).unwrap(),
            "nothing replaced"
        );
        assert_eq!(fs::read(target.join("shard-000000.tar")).unwrap(), b"new");
        assert!(!staging.exists());

        fs::remove_dir_all(&target).unwrap();
        let (staging, target) = staged(tmp.path());
        fs::create_dir(&target).unwrap();
        assert!(!publish(false, &staging, &target).unwrap());
        assert_eq!(fs::read(target.join("shard-000000.tar")).unwrap(), b"new");
        // With --force too, when there is nothing to replace.
        fs::remove_dir_all(&target).unwrap();
        let (staging, target) = staged(tmp.path());
        assert!(!publish(true, &staging, &target).unwrap());
        assert_eq!(fs::read(target.join("shard-000000.tar")).unwrap(), b"new");
    }

    #[test]
    fn what_appeared_at_the_output_during_the_run_is_never_replaced() {
        let tmp = tempfile::tempdir().unwrap();
        let (staging, target) = staged(tmp.path());
        fs::create_dir(&target).unwrap();
        fs::write(target.join("notes.txt"), b"mine").unwrap();
        let msg = format!("{:#}", publish(false, &staging, &target).unwrap_err());
        assert!(
            msg.contains("a directory holding notes.txt")
                && msg.contains("appeared there during the run")
                && msg.contains(&staging.display().to_string()),
            "{msg}"
        );
        assert_eq!(fs::read(target.join("notes.txt")).unwrap(), b"mine");
        assert_eq!(fs::read(staging.join("shard-000000.tar")).unwrap(), b"new");

        // Without --force, an output of another run is not replaced either.
        fs::remove_dir_all(&target).unwrap();
        reshard_output(&target);
        let msg = format!("{:#}", publish(false, &staging, &target).unwrap_err());
        assert!(msg.contains("an output of another reshard run"), "{msg}");
        assert_eq!(fs::read(target.join("shard-000000.tar")).unwrap(), b"old");

        // With --force, anything but an output of reshard is refused as well.
        fs::remove_dir_all(&target).unwrap();
        fs::write(&target, b"a file").unwrap();
        assert!(publish(true, &staging, &target).is_err());
        assert_eq!(fs::read(&target).unwrap(), b"a file");
        assert!(staging.join("shard-000000.tar").exists());
    }

    #[test]
    fn a_rename_that_fails_otherwise_says_so_and_publishes_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let (staging, _) = staged(tmp.path());
        let target = tmp.path().join("gone").join("out");
        let msg = format!(
            "{:#}",
            rename_without_replacing(&staging, &target).unwrap_err()
        );
        assert!(
            msg.contains("cannot rename") && msg.contains(&target.display().to_string()),
            "{msg}"
        );
        assert!(staging.join("shard-000000.tar").exists());
    }

    #[test]
    fn force_exchanges_with_an_older_output_which_then_goes() {
        let tmp = tempfile::tempdir().unwrap();
        let (staging, target) = staged(tmp.path());
        reshard_output(&target);
        fs::create_dir_all(checkpoint::dir(&staging)).unwrap();
        assert!(publish(true, &staging, &target).unwrap(), "replaced");
        assert_eq!(fs::read(target.join("shard-000000.tar")).unwrap(), b"new");
        assert_eq!(
            fs::read(staging.join("shard-000000.tar")).unwrap(),
            b"old",
            "the replaced output waits at the staging name"
        );

        let link = tmp.path().join("current");
        fs::write(&link, b"").unwrap();
        fs::remove_file(&link).unwrap();
        std::os::unix::fs::symlink("elsewhere", &link).unwrap();
        after_publish(&settings(Some(link.clone())), &staging, &target, true).unwrap();
        assert!(!staging.exists(), "the replaced output is removed");
        assert!(!checkpoint::dir(&target).exists(), "the records go");
        assert_eq!(fs::read_link(&link).unwrap(), Path::new("out"));
        assert_eq!(fs::read(link.join("shard-000000.tar")).unwrap(), b"new");
        let leftovers: Vec<_> = fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(leftovers.len(), 2, "{leftovers:?}");
    }

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
