//! The series of outputs that `--keep` prunes: siblings named by the same `--output` template
//! with another epoch number, holding reshard's own index.json and `.reshard/`. Shared by the
//! expand phase (a dry run says what would go) and the publish phase (which removes them).

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::config::Keep;
use crate::output::manifest::Manifest;
use crate::output::saved_index;

/// The older epochs of `target`'s series that `--keep` removes: siblings of `target` whose name
/// is the series template with another epoch number and that hold reshard's own index.json and
/// `.reshard` directory. With `target` (epoch `epoch`, whether it exists yet or not) they are
/// ranked by epoch number, highest first; those beyond the first `keep.count` are returned,
/// lowest last. Never `target`, never what `link` points at, never a symbolic link, never a
/// directory of another name.
pub fn outputs_beyond(
    target: &Path,
    keep: &Keep,
    epoch: u64,
    link: Option<&Path>,
) -> Result<Vec<PathBuf>> {
    let parent = target
        .parent()
        .context("the output has no parent directory")?;
    let linked = link.and_then(|l| fs::canonicalize(l).ok());
    let canonical_target = fs::canonicalize(target).ok();
    let mut series: Vec<(u64, Option<PathBuf>)> = vec![(epoch, None)];
    for entry in
        fs::read_dir(parent).with_context(|| format!("--keep: cannot list {}", parent.display()))?
    {
        let entry = entry?;
        let Some(e) = entry.file_name().to_str().and_then(|n| keep.epoch_of(n)) else {
            continue;
        };
        let path = entry.path();
        if e == epoch || path == target {
            continue;
        }
        if !fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir())
            || !path.join(saved_index::DIR_NAME).is_dir()
            || !made_by_reshard(&path.join("index.json"))
        {
            continue;
        }
        let canon = fs::canonicalize(&path).ok();
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

/// Whether `index` is an index.json that reshard wrote (a wids index with a `reshard` object).
fn made_by_reshard(index: &Path) -> bool {
    let Ok(text) = fs::read(index) else {
        return false;
    };
    serde_json::from_slice::<serde_json::Value>(&text)
        .is_ok_and(|m| m["__kind__"] == Manifest::KIND && m["reshard"].is_object())
}
