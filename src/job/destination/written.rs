//! What reshard wrote of an output, in one place for every store, from its typed manifest
//! ([`OutputManifest`]): its index.json (and each split's), the shards it lists with their saved and loader indexes
//! (`NAME.idx`, `NAME.tar.idx`), and whatever is under its `.reshard/` directories, `.resume/` and
//! `.nv-meta/`. `--force` removes only that of the output it replaces, `--keep` only that of an
//! older output; anything else there is the user's and is never deleted: on a file system it is
//! carried into the new output where its name is free ([`carry`]).

use std::collections::HashSet;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::job::destination::owned::OutputManifest;
use crate::output::{checkpoint, dali, energon, saved_index};
use crate::storage::{self, Kind};

/// An output's manifest, at the top of the output.
pub(crate) const MANIFEST: &str = "index.json";

/// The names (relative to the output, `/`-separated) of what reshard wrote of one output.
pub(crate) struct Written {
    /// Whether the output's index.json is reshard's (it was read as its manifest).
    manifest: bool,
    /// The shards the manifest lists with their saved and loader indexes.
    of_shards: HashSet<String>,
    /// The directories below the output that hold listed shards (a `--split` output's
    /// splits), each with reshard's own index.json and `.nv-meta/`.
    splits: HashSet<String>,
}

impl Written {
    /// What reshard wrote of the output described by `manifest`; without one (its index.json
    /// already removed, or not reshard's) only what is under reshard's own directories.
    pub(crate) fn of(manifest: Option<&OutputManifest>) -> Written {
        let of_shards = manifest
            .iter()
            .flat_map(|m| &m.shardlist)
            .flat_map(|s| {
                let shard = Path::new(&s.url);
                [
                    shard.to_path_buf(),
                    dali::index_path(shard),
                    energon::tar_idx_path(shard),
                ]
            })
            .map(|p| p.to_string_lossy().into_owned())
            .collect();
        // A split's directory is where its shards are, and, for a split with no sample (no
        // shard, but its own index.json), the name the manifest gives it.
        let splits = manifest
            .iter()
            .flat_map(|m| &m.shardlist)
            .filter_map(|s| Some(s.url.rsplit_once('/')?.0.to_string()))
            .chain(
                manifest
                    .iter()
                    .flat_map(|m| m.split_names().map(String::from)),
            )
            .collect();
        Written {
            manifest: manifest.is_some(),
            of_shards,
            splits,
        }
    }

    /// Whether reshard wrote the file `rel` of the output.
    pub(crate) fn includes(&self, rel: &str) -> bool {
        (self.manifest && rel == MANIFEST)
            || self.of_shards.contains(rel)
            || reshards_dir(rel)
            || self.of_a_split(rel)
    }

    /// Whether `rel` is a split's index.json or under its `.nv-meta/`.
    fn of_a_split(&self, rel: &str) -> bool {
        self.splits.iter().any(|split| {
            rel.strip_prefix(split.as_str())
                .and_then(|r| r.strip_prefix('/'))
                .is_some_and(|r| r == MANIFEST || r.starts_with(&format!("{}/", energon::META_DIR)))
        })
    }
}

/// Whether `rel` is under one of reshard's own directories (`.reshard/` at any depth, the
/// output's `.nv-meta/`, or its `.resume/`: the checkpoint records of the run that published
/// it, left when that run was killed between its rename and their removal), or is one.
fn reshards_dir(rel: &str) -> bool {
    let top = rel.split('/').next();
    top == Some(energon::META_DIR)
        || top == Some(checkpoint::DIR_NAME)
        || rel.split('/').any(|part| part == saved_index::DIR_NAME)
}

/// Removes from the directory `dir` what reshard wrote of the output it holds (`written`), its
/// index.json last (so that a removal cut short still finds the rest by it), then the
/// directories that removal emptied. Whether anything is left (the user's own).
///
/// # Errors
/// Something cannot be listed or removed.
pub(crate) fn remove_written(dir: &Path, written: &Written) -> Result<bool> {
    let mut files = Vec::new();
    let mut dirs = Vec::new();
    walk(dir, "", &mut files, &mut dirs)?;
    let sink = storage::sink(dir);
    let mut emptied: HashSet<String> = HashSet::new();
    let ours = files
        .iter()
        .filter(|rel| rel.as_str() != MANIFEST && written.includes(rel));
    let manifest = written.manifest.then(|| MANIFEST.to_string());
    for rel in ours.chain(manifest.iter()) {
        let path = dir.join(rel);
        match sink.remove_file(&path) {
            Err(e) if e.kind() != ErrorKind::NotFound => {
                return Err(e).with_context(|| format!("{}: cannot remove", path.display()))
            }
            _ => {}
        }
        let mut parent = Path::new(rel).parent();
        while let Some(p) = parent.filter(|p| !p.as_os_str().is_empty()) {
            emptied.insert(p.to_string_lossy().into_owned());
            parent = p.parent();
        }
    }
    // Deepest first: a directory emptied by the removal, or one of reshard's own, goes.
    for rel in dirs.iter().rev() {
        let path = dir.join(rel);
        if (emptied.contains(rel) || reshards_dir(rel)) && is_empty(&path)? {
            sink.remove_dir_all(&path)
                .with_context(|| format!("{}: cannot remove", path.display()))?;
        }
    }
    Ok(!is_empty(dir)?)
}

/// Every file (or link) and directory under `dir/rel`, relative to `dir`, directories before
/// what they hold.
fn walk(dir: &Path, rel: &str, files: &mut Vec<String>, dirs: &mut Vec<String>) -> Result<()> {
    let here = dir.join(rel);
    let entries = storage::source(dir)
        .list(&here)
        .with_context(|| format!("{}: cannot list", here.display()))?;
    for e in entries {
        let name = e.name.to_string_lossy();
        let rel = if rel.is_empty() {
            name.into_owned()
        } else {
            format!("{rel}/{name}")
        };
        if e.kind == Kind::Dir {
            dirs.push(rel.clone());
            walk(dir, &rel, files, dirs)?;
        } else {
            files.push(rel);
        }
    }
    Ok(())
}

/// Whether the directory `dir` holds nothing (gone counts as empty).
fn is_empty(dir: &Path) -> Result<bool> {
    match storage::source(dir).list(dir) {
        Ok(entries) => Ok(entries.is_empty()),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(true),
        Err(e) => Err(e).with_context(|| format!("{}: cannot list", dir.display())),
    }
}

/// Moves what is in the directory `from` into the directory `to` where its name is free there,
/// into a directory of the same name where both have one, never over anything; `from` goes
/// once it is empty. What could not be moved, relative to `from` (its name is taken in `to`).
///
/// # Errors
/// Something cannot be listed or renamed.
pub(crate) fn carry(from: &Path, to: &Path) -> Result<Vec<PathBuf>> {
    let mut left = Vec::new();
    carry_under(from, to, Path::new(""), &mut left)?;
    if left.is_empty() && is_empty(from)? {
        storage::sink(from)
            .remove_dir_all(from)
            .with_context(|| format!("{}: cannot remove", from.display()))?;
    }
    Ok(left)
}

fn carry_under(from: &Path, to: &Path, rel: &Path, left: &mut Vec<PathBuf>) -> Result<()> {
    let source = storage::source(from);
    let sink = storage::sink(to);
    let here = from.join(rel);
    let entries = source
        .list(&here)
        .with_context(|| format!("{}: cannot list", here.display()))?;
    for e in entries {
        let r = rel.join(&e.name);
        let (src, dst) = (from.join(&r), to.join(&r));
        let taken = match sink.rename_noreplace(&src, &dst) {
            Ok(()) => false,
            Err(err) if err.kind() == ErrorKind::AlreadyExists => true,
            Err(err) if crate::sys::unsupported(&err) => {
                let free =
                    matches!(source.stat_link(&dst), Err(e) if e.kind() == ErrorKind::NotFound);
                if free {
                    sink.rename(&src, &dst).with_context(|| {
                        format!("cannot move {} to {}", src.display(), dst.display())
                    })?;
                }
                !free
            }
            Err(err) => {
                return Err(err)
                    .with_context(|| format!("cannot move {} to {}", src.display(), dst.display()))
            }
        };
        if !taken {
            continue;
        }
        let into_dir = source.stat_link(&dst).is_ok_and(|s| s.kind == Kind::Dir);
        if e.kind == Kind::Dir && into_dir {
            carry_under(from, to, &r, left)?;
            if is_empty(&src)? {
                storage::sink(&src)
                    .remove_dir_all(&src)
                    .with_context(|| format!("{}: cannot remove", src.display()))?;
            }
        } else {
            left.push(r);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;
    use crate::output::manifest::Manifest;

    /// An output at `dir` of two shards with their loader indexes, `.nv-meta/` and `.reshard/`,
    /// and the user's own files beside them.
    fn output(dir: &Path) {
        fs::create_dir_all(dir.join(".reshard")).unwrap();
        fs::create_dir_all(dir.join(".nv-meta")).unwrap();
        fs::create_dir_all(dir.join(".resume")).unwrap();
        fs::create_dir_all(dir.join("docs")).unwrap();
        fs::create_dir_all(dir.join("train/.reshard")).unwrap();
        let index = format!(
            r#"{{"__kind__": "{}", "reshard": {{}}, "shardlist": [{{"url": "s-0.tar", "filesize": 1}}, {{"url": "train/s-1.tar", "filesize": 1}}]}}"#,
            Manifest::KIND
        );
        fs::write(dir.join("index.json"), index).unwrap();
        for f in [
            "s-0.tar",
            "s-0.idx",
            "s-0.tar.idx",
            ".reshard/s-0.tar.reshard-layout",
            ".nv-meta/index.sqlite",
            ".resume/plan.json",
            "train/s-1.tar",
            "train/.reshard/x",
        ] {
            fs::write(dir.join(f), b"r").unwrap();
        }
        fs::write(dir.join("README"), b"mine").unwrap();
        fs::write(dir.join("docs/notes.txt"), b"notes").unwrap();
        fs::write(dir.join("train/mine.txt"), b"train notes").unwrap();
    }

    fn all(dir: &Path) -> Vec<String> {
        let (mut files, mut dirs) = (Vec::new(), Vec::new());
        walk(dir, "", &mut files, &mut dirs).unwrap();
        files.extend(dirs.into_iter().map(|d| format!("{d}/")));
        files.sort();
        files
    }

    #[test]
    fn only_what_reshard_wrote_goes_and_the_rest_is_carried_where_its_name_is_free() {
        let tmp = tempfile::tempdir().unwrap();
        let old = tmp.path().join("old");
        output(&old);
        let written = Written::of(Some(&OutputManifest::read(&old).unwrap()));
        assert!(
            remove_written(&old, &written).unwrap(),
            "the user's files are left"
        );
        assert_eq!(
            all(&old),
            [
                "README",
                "docs/",
                "docs/notes.txt",
                "train/",
                "train/mine.txt"
            ]
        );
        // The new output has a README of its own and a train/ directory.
        let new = tmp.path().join("new");
        fs::create_dir_all(new.join("train")).unwrap();
        fs::write(new.join("README"), b"new").unwrap();
        let left = carry(&old, &new).unwrap();
        assert_eq!(left, [PathBuf::from("README")]);
        assert_eq!(fs::read(new.join("docs/notes.txt")).unwrap(), b"notes");
        assert_eq!(
            fs::read(new.join("train/mine.txt")).unwrap(),
            b"train notes"
        );
        assert_eq!(fs::read(new.join("README")).unwrap(), b"new");
        assert_eq!(all(&old), ["README"]);
        fs::remove_file(new.join("README")).unwrap();
        assert!(carry(&old, &new).unwrap().is_empty());
        assert!(!old.exists(), "emptied, it goes");
        assert_eq!(fs::read(new.join("README")).unwrap(), b"mine");
    }

    /// A `--split` output whose split `val` got no sample: no shard of it is listed, but its
    /// index.json is reshard's (the manifest names the split), never taken for the user's.
    #[test]
    fn an_empty_splits_index_is_reshards() {
        let tmp = tempfile::tempdir().unwrap();
        let old = tmp.path().join("old");
        fs::create_dir_all(old.join("train")).unwrap();
        fs::create_dir_all(old.join("val")).unwrap();
        let index = format!(
            r#"{{"__kind__": "{}", "reshard": {{"splits": [{{"split": "train"}}, {{"split": "val"}}]}}, "shardlist": [{{"url": "train/s-0.tar", "filesize": 1}}]}}"#,
            Manifest::KIND
        );
        fs::write(old.join("index.json"), index).unwrap();
        fs::write(old.join("train/s-0.tar"), b"r").unwrap();
        fs::write(old.join("train/index.json"), b"{}").unwrap();
        fs::write(old.join("val/index.json"), b"{}").unwrap();
        fs::write(old.join("val/mine.txt"), b"mine").unwrap();
        let written = Written::of(Some(&OutputManifest::read(&old).unwrap()));
        assert!(written.includes("val/index.json") && written.includes("train/index.json"));
        assert!(!written.includes("val/mine.txt") && !written.includes("test/index.json"));
        remove_written(&old, &written).unwrap();
        assert_eq!(all(&old), ["val/", "val/mine.txt"]);
    }

    #[test]
    fn without_a_manifest_only_reshards_own_directories_go() {
        let tmp = tempfile::tempdir().unwrap();
        let old = tmp.path().join("old");
        output(&old);
        fs::write(old.join("index.json"), b"the user's").unwrap();
        assert!(OutputManifest::parse(&old).is_err());
        remove_written(&old, &Written::of(None)).unwrap();
        assert!(old.join("s-0.tar").exists() && old.join("index.json").exists());
        assert!(!old.join(".nv-meta").exists() && !old.join(".reshard").exists());
    }
}
