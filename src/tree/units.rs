//! A root cut into units: the directories the ranks walk, each read as one input shard.
//!
//! Rank 0 lists the root and, while a level holds fewer than [`WIDE`] directories, the level
//! below (at most [`DEEPEST`] levels): the directories of the last level listed become deep
//! units (walked with all they hold), and each directory listed on the way that holds files
//! becomes a shallow unit (its own files only). The cut depends on the tree alone, never on
//! the rank count, and rank 0 lists only the few directories above the units.

use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use anyhow::{Context, Result};

use crate::storage::{self, Kind};
use crate::tar::key::sample_key;
use crate::tree::view::file_path;
use crate::tree::walk::{hidden, join, not_utf8};
use crate::tree::Unit;

/// A level with at least this many directories is cut into units.
pub(crate) const WIDE: usize = 64;
/// A directory's own files beyond this many keys are cut into units of this many keys each
/// (by key ranges, from the names rank 0 has listed anyway), so that a flat directory is read
/// by several ranks. Not on object storage, where each unit's listing would be the whole
/// directory's again: there, and below the levels listed here, the walk phase cuts a unit
/// once walked ([`crate::tree::recut`]).
pub(crate) const KEYS_PER_UNIT: usize = 4096;
/// Levels listed at most before the directories are units whatever their count.
pub(crate) const DEEPEST: usize = 3;

/// The units of `root` in the canonical order (by directory, a shallow unit before the deep
/// units below it), and the root's own directories (the classes of `--label-from-dir`), sorted.
///
/// # Errors
/// A directory that cannot be listed, or a name that is not UTF-8.
pub(crate) fn cut(root: &Path) -> Result<(Vec<Unit>, Vec<Vec<u8>>)> {
    let mut units = Vec::new();
    let mut level = vec![Vec::new()];
    let mut classes = None;
    for depth in 0.. {
        let mut below = Vec::new();
        for dir in &level {
            let path = file_path(root, dir);
            let entries = storage::source(&path)
                .list(&path)
                .with_context(|| format!("{}: cannot list the directory", path.display()))?;
            let mut files = Vec::new();
            for e in entries {
                let name = e.name.as_bytes();
                if hidden(name) {
                    continue;
                }
                let rel = join(dir, name);
                if std::str::from_utf8(&rel).is_err() {
                    return Err(not_utf8(root, &rel));
                }
                match e.kind {
                    Kind::Dir => below.push(rel),
                    _ => files.push(rel),
                }
            }
            if !files.is_empty() {
                let split = !storage::is_object_store(root);
                units.extend(own_files(dir, files, split));
            }
        }
        below.sort();
        if depth == 0 {
            classes = Some(below.clone());
        }
        if below.len() >= WIDE || depth + 1 >= DEEPEST {
            units.extend(below.into_iter().map(|dir| Unit::of(dir, true)));
            break;
        }
        if below.is_empty() {
            break;
        }
        level = below;
    }
    units.sort_by(|a, b| (&a.dir, a.deep, &a.keys.0).cmp(&(&b.dir, b.deep, &b.keys.0)));
    Ok((units, classes.unwrap_or_default()))
}

/// The shallow units of `dir`, whose own files (paths relative to the root) are `files`: one,
/// or with `split` one per [`KEYS_PER_UNIT`] keys (WebDataset's rule), in key order. A unit
/// holds whole samples, and the units together hold the files in the order one unit would.
fn own_files(dir: &[u8], files: Vec<Vec<u8>>, split: bool) -> Vec<Unit> {
    let whole = Unit::of(dir.to_vec(), false);
    if !split || files.len() <= KEYS_PER_UNIT {
        return vec![whole];
    }
    let mut keys: Vec<&[u8]> = files.iter().filter_map(|f| sample_key(f)).collect();
    keys.sort_unstable();
    keys.dedup();
    let starts: Vec<&[u8]> = keys
        .iter()
        .copied()
        .step_by(KEYS_PER_UNIT)
        .skip(1)
        .collect();
    let mut units = Vec::with_capacity(starts.len() + 1);
    let mut from = None;
    for start in starts {
        let mut unit = whole.clone();
        unit.keys = (from.clone(), Some(start.to_vec()));
        units.push(unit);
        from = Some(start.to_vec());
    }
    let mut last = whole;
    last.keys = (from, None);
    units.push(last);
    units
}
