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

use crate::storage::posix::Posix;
use crate::storage::{Kind, Source};
use crate::tree::view::file_path;
use crate::tree::walk::{hidden, join, not_utf8};
use crate::tree::Unit;

/// A level with at least this many directories is cut into units.
pub(crate) const WIDE: usize = 64;
/// Levels listed at most before the directories are units whatever their count.
pub(crate) const DEEPEST: usize = 3;

/// The units of `root` in the canonical order (by directory, a shallow unit before the deep
/// units below it), and the root's own directories (the classes of `--label-from-dir`), sorted.
/// `whole`: the root is one unit (`--key-regex`: a key may gather files of any directories, and
/// a sample's files must be in one unit to be grouped).
///
/// # Errors
/// A directory that cannot be listed, or a name that is not UTF-8.
pub(crate) fn cut(root: &Path, whole: bool) -> Result<(Vec<Unit>, Vec<Vec<u8>>)> {
    let mut units = Vec::new();
    let mut level = vec![Vec::new()];
    let mut classes = None;
    for depth in 0.. {
        let mut below = Vec::new();
        for dir in &level {
            let path = file_path(root, dir);
            let entries = Posix
                .list(&path)
                .with_context(|| format!("{}: cannot list the directory", path.display()))?;
            let mut files = false;
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
                    _ => files = true,
                }
            }
            if files {
                units.push(Unit {
                    dir: dir.clone(),
                    deep: false,
                });
            }
        }
        below.sort();
        if depth == 0 {
            classes = Some(below.clone());
            if whole {
                let unit = Unit {
                    dir: Vec::new(),
                    deep: true,
                };
                return Ok((vec![unit], below));
            }
        }
        if below.len() >= WIDE || depth + 1 >= DEEPEST {
            units.extend(below.into_iter().map(|dir| Unit { dir, deep: true }));
            break;
        }
        if below.is_empty() {
            break;
        }
        level = below;
    }
    units.sort_by(|a, b| (&a.dir, a.deep).cmp(&(&b.dir, b.deep)));
    Ok((units, classes.unwrap_or_default()))
}
