//! The series of outputs that `--keep` prunes: siblings named by the same `--output` template
//! with another epoch number, holding reshard's own index.json and `.reshard/`. Shared by the
//! expand phase (a dry run says what would go) and the publish phase (which removes them).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::config::Keep;
use crate::hooks;
use crate::job::destination::owned::{is_reshard_output, OutputManifest};
use crate::job::destination::written::{remove_written, Written};
use crate::storage::{self, Kind};

/// The older epochs of `target`'s series that `--keep` removes: siblings of `target` whose name
/// is the series template with another epoch number and that hold reshard's own index.json and
/// `.reshard` directory. With `target` (epoch `epoch`, whether it exists yet or not) they are
/// ranked by epoch number, highest first; those beyond the first `keep.count` are returned,
/// lowest last. Never `target`, never what `link` points at, never a symbolic link, never a
/// directory of another name.
pub(crate) fn outputs_beyond(
    target: &Path,
    keep: &Keep,
    epoch: u64,
    link: Option<&Path>,
) -> Result<Vec<PathBuf>> {
    let parent = target
        .parent()
        .context("the output has no parent directory")?;
    let source = storage::source(parent);
    let linked = link.and_then(|l| source.canonical(l).ok());
    let canonical_target = source.canonical(target).ok();
    let mut series: Vec<(u64, Option<PathBuf>)> = vec![(epoch, None)];
    for entry in source
        .list(parent)
        .with_context(|| format!("--keep: cannot list {}", parent.display()))?
    {
        let Some(e) = entry.name.to_str().and_then(|n| keep.epoch_of(n)) else {
            continue;
        };
        let path = parent.join(&entry.name);
        if e == epoch || path == target {
            continue;
        }
        if !is_reshard_output(&path) {
            continue;
        }
        let canon = source.canonical(&path).ok();
        if canon.is_none() || canon == canonical_target || canon == linked {
            continue;
        }
        series.push((e, Some(path)));
    }
    series.sort_by_key(|s| std::cmp::Reverse(s.0));
    Ok(series
        .into_iter()
        .skip(keep.count)
        .filter_map(|(_, path)| path)
        .collect())
}

/// A dry run's account of `--keep`: the older outputs of `target`'s series it would remove,
/// one line each (`--link` would point at the new output by then, so only the output itself
/// is spared).
///
/// # Errors
/// The output's parent cannot be listed.
pub(crate) fn say_what_keep_would_remove(target: &Path, keep: &Keep, epoch: u64) -> Result<()> {
    for old in outputs_beyond(target, keep, epoch, None)? {
        crate::errln!(
            "reshard: --keep {} would remove the older output {}",
            keep.count,
            old.display()
        );
    }
    Ok(())
}

/// What an old epoch `old` is renamed to before it is removed: a hidden name in reshard's own
/// namespace, so that a removal cut short (killed, failed) leaves no half-deleted dataset under
/// the series' name, and the next `--keep` run finds and finishes it.
fn aside_name(old: &Path) -> Option<PathBuf> {
    let name = old.file_name()?.to_str()?;
    Some(old.with_file_name(format!(".{name}{ASIDE}")))
}

const ASIDE: &str = ".reshard-removing";

/// Removes what reshard wrote of the old epoch `old` of the series: first moved aside (see
/// [`aside_name`]), then [`clear_aside`].
///
/// # Errors
/// It cannot be renamed or removed (what is left aside is finished by the next `--keep` run).
pub(crate) fn remove_epoch(old: &Path) -> Result<()> {
    let aside =
        aside_name(old).with_context(|| format!("--keep: {}: not a file name", old.display()))?;
    let sink = storage::sink(old);
    sink.rename(old, &aside).with_context(|| {
        format!(
            "--keep: cannot move {} aside to {} to remove it",
            old.display(),
            aside.display()
        )
    })?;
    hooks::kill_at(0, "keep");
    clear_aside(&aside)
}

/// Removes from an old epoch moved aside (`aside`, see [`aside_name`]) what reshard wrote of it
/// ([`Written`], by its index.json, which goes last), then the directory if nothing is left;
/// what is left is the user's own and goes back under the epoch's name, no output any more
/// (where that name is taken, it stays aside and the message says so).
///
/// # Errors
/// Something cannot be listed, removed or renamed (the next `--keep` run finishes it).
pub(crate) fn clear_aside(aside: &Path) -> Result<()> {
    let failed = || {
        format!(
            "--keep: cannot remove {} (the next run with --keep finishes it)",
            aside.display()
        )
    };
    let sink = storage::sink(aside);
    // The epoch was found an output of the series, then moved aside: what was at its name by
    // then may be a symbolic link put there since, which is never followed (where it leads was
    // never of the series); it goes back to its name as it is.
    let link = storage::source(aside)
        .stat_link(aside)
        .is_ok_and(|s| s.kind == Kind::Link);
    if !link {
        let manifest = OutputManifest::parse(aside).ok();
        if !remove_written(aside, &Written::of(manifest.as_ref())).with_context(failed)? {
            return sink.remove_dir_all(aside).with_context(failed);
        }
    }
    let home = home_of(aside).with_context(failed)?;
    let back = match sink.rename_noreplace(aside, &home) {
        Err(e)
            if crate::sys::unsupported(&e) && storage::source(&home).stat_link(&home).is_err() =>
        {
            sink.rename(aside, &home)
        }
        other => other,
    };
    match back {
        Ok(()) if link => crate::errln!(
            "reshard: --keep: {} is a symbolic link put at the epoch's name during the run: not followed, it is left as it is",
            home.display()
        ),
        Ok(()) => crate::errln!(
            "reshard: --keep: {} holds files reshard did not write: they stay there, and nothing of reshard's",
            home.display()
        ),
        Err(_) if link => crate::errln!(
            "reshard: --keep: {} is a symbolic link put at the epoch's name {} during the run: not followed, and left there ({} is taken)",
            aside.display(),
            home.display(),
            home.display()
        ),
        Err(_) => crate::errln!(
            "reshard: --keep: {} holds files reshard did not write and {} is taken: they stay in {}, and nothing of reshard's (the next run with --keep moves them back)",
            aside.display(),
            home.display(),
            aside.display()
        ),
    }
    Ok(())
}

/// The name of the epoch that `aside` (see [`aside_name`]) was moved aside from.
fn home_of(aside: &Path) -> Option<PathBuf> {
    let name = aside.file_name()?.to_str()?;
    let home = name.strip_prefix('.')?.strip_suffix(ASIDE)?;
    Some(aside.with_file_name(home))
}

/// Old epochs of `target`'s series that an earlier `--keep` moved aside but did not finish
/// removing: directories (never symbolic links) named `.NAME.reshard-removing` where NAME is
/// of the series.
///
/// # Errors
/// The output's parent cannot be listed.
pub(crate) fn unfinished_removals(target: &Path, keep: &Keep) -> Result<Vec<PathBuf>> {
    let parent = target
        .parent()
        .context("the output has no parent directory")?;
    let mut found = Vec::new();
    let entries = storage::source(parent)
        .list(parent)
        .with_context(|| format!("--keep: cannot list {}", parent.display()))?;
    for entry in entries {
        let name = &entry.name;
        let Some(series_name) = name
            .to_str()
            .and_then(|n| n.strip_prefix('.'))
            .and_then(|n| n.strip_suffix(ASIDE))
        else {
            continue;
        };
        if keep.epoch_of(series_name).is_some() && entry.kind == Kind::Dir {
            found.push(parent.join(name));
        }
    }
    found.sort();
    Ok(found)
}
