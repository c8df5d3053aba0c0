//! How an object store's output becomes live and what follows, for the output's life
//! ([`crate::job::destination::life`]): there is no rename, so the commit is the manifest,
//! created last and only where none is (never over another run's); once it is up, the objects
//! of what it replaced (or a failed run left) that it does not name go, each while the run
//! still holds the lock, then the marker of the upload under way that named them, then the
//! staged copy.
//! `--keep` removes an older output holding its lock, its marker written first: a removal cut
//! short is found by the marker and finished by the next run.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};

use super::fenced::{self, Found};
use super::marker::{is_marker, name_of};
use super::{files_of, lock_path, remove_if_there, RemoteLock, MANIFEST};
use crate::config::Keep;
use crate::job::destination::life::Commit;
use crate::job::destination::owned::{inspect, AtOutput, OutputManifest};
use crate::job::destination::written::Written;
use crate::storage::{self, Kind};

/// The object inside an older output of an `s3://` series that `--keep` is removing, written
/// before its `index.json` goes and removed last: what a removal cut short leaves, for the next
/// `--keep` run to finish (there is no rename to move it aside first, as on a file system).
pub(super) const REMOVING: &str = ".reshard-removing";

/// The uploaded output at `target`, from the staged copy `local`, with the names it holds
/// (`files`) and the run's lock.
pub(crate) struct ByManifest<'a> {
    pub(crate) target: &'a Path,
    pub(crate) local: &'a Path,
    pub(crate) files: &'a [(String, u64)],
    pub(crate) lock: Option<&'a RemoteLock>,
    /// What a failed commit says (where the finished output stays for `--resume`).
    pub(crate) not_published: String,
    /// `--lock-stale-after`, for the locks of the older outputs `--keep` removes.
    pub(crate) stale_after: Duration,
}

impl Commit for ByManifest<'_> {
    fn target(&self) -> &Path {
        self.target
    }

    fn check_owned(&self) -> Result<()> {
        self.lock.map_or(Ok(()), RemoteLock::check_owned)
    }

    /// The manifest, created only where none is, so never over another run's.
    fn commit(&self) -> Result<bool> {
        let fence = self.lock.map(|l| l.fence(self.target));
        let (target, local) = (self.target, self.local);
        fenced::create(local, target, MANIFEST, Found::Fail, fence.as_ref(), None)
            .with_context(|| self.not_published.clone())?;
        Ok(self.lock.is_some_and(|l| !l.replaced.is_empty()))
    }

    /// Nothing yet: this run's marker names what the output replaced until that is removed
    /// ([`ByManifest::remove_replaced`] removes it last).
    fn drop_records(&self) -> Result<()> {
        Ok(())
    }

    /// The objects of the output replaced, or of a failed run, that the new manifest does not
    /// name; only while this run holds the lock, so that a run suspended past its lock here
    /// removes nothing a successor published since. Then this run's marker of its upload under
    /// way, and only its own: until then it names them (`replaces`), so a run killed before
    /// leaves them to the next run (which removes what the manifest does not name); a
    /// successor's, written while this run was suspended, has another name and stays.
    fn remove_replaced(&self, _replaced: bool) -> Result<()> {
        let Some(lock) = self.lock else {
            return Ok(());
        };
        let new: HashSet<&str> = self.files.iter().map(|f| f.0.as_str()).collect();
        let fence = lock.fence(self.target);
        for old in lock.replaced.iter().chain(&lock.preserved) {
            if !new.contains(&old.as_str()) {
                let path = self.target.join(old);
                let hook = || {
                    if super::is_shard(old) {
                        crate::hooks::kill_at(0, "replaced");
                    }
                };
                // Gone already where a failed run removed it, or never there (a replaced
                // output without saved indexes); removed only while it is the object looked
                // at before the lock check (a successor may have published there since).
                fenced::remove_after_publish(&fence, &path, hook).with_context(|| {
                    format!(
                        "{} is published; removing {} of the output it replaced failed",
                        self.target.display(),
                        path.display()
                    )
                })?;
            }
        }
        let marker = self.target.join(name_of(lock.lock.token()));
        crate::hooks::kill_at(0, "unmark");
        remove_if_there(&marker).map(drop).with_context(|| {
            format!(
                "{} is published; removing {} failed",
                self.target.display(),
                marker.display()
            )
        })
    }

    /// The staged copy, while this run holds the lock.
    fn release_staging(&self) -> Result<()> {
        if let Some(lock) = self.lock {
            lock.fence(self.target).check_lock()?;
        }
        super::records::remove_all(self.target); // read by no run once the output is published
        storage::sink(self.local)
            .remove_dir_all(self.local)
            .with_context(|| {
                format!(
                    "{} is published; removing the staged copy {} failed",
                    self.target.display(),
                    self.local.display()
                )
            })
    }

    fn point_link(&self, link: &Path) -> Result<()> {
        bail!(
            "--link {}: an object store has no symbolic links",
            link.display()
        )
    }

    fn unfinished_removals(&self, keep: &Keep) -> Result<(Vec<PathBuf>, &'static str)> {
        let parent = self
            .target
            .parent()
            .context("the output has no parent prefix")?;
        let entries = storage::source(parent)
            .list(parent)
            .with_context(|| format!("--keep: cannot list {}", parent.display()))?;
        let mut halves = Vec::new();
        for e in entries {
            let path = parent.join(&e.name);
            let of_series = e.name.to_str().and_then(|n| keep.epoch_of(n)).is_some();
            if e.kind == Kind::Dir && of_series && path != self.target && half_removed(&path) {
                halves.push(path);
            }
        }
        Ok((halves, "an earlier run began it"))
    }

    fn finish_removal(&self, half: &Path) -> Result<()> {
        remove_remote_epoch(half, self.stale_after)
    }

    fn remove_older(&self, old: &Path) -> Result<()> {
        remove_remote_epoch(old, self.stale_after)
    }
}

/// What is at an object store's output for life's rule of what may be replaced: the objects
/// under its prefix (an object named as the prefix itself is beside it, not at it), but for
/// the markers of uploads under way (this run's, written before it asks, and failed runs'
/// whose names it carries forward): a prefix holding only those holds nothing yet.
///
/// # Errors
/// The store cannot tell.
pub(super) fn found(target: &Path) -> Result<AtOutput> {
    match storage::source(target).stat(target) {
        Ok(s) if s.kind == Kind::Dir && only_markers(target)? => Ok(AtOutput::Nothing),
        Ok(s) if s.kind == Kind::Dir => inspect(target),
        Ok(_) => Ok(AtOutput::Nothing),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(AtOutput::Nothing),
        Err(e) => Err(e).with_context(|| format!("--output {}", target.display())),
    }
}

/// Whether the prefix `target` holds nothing but markers of uploads under way, and folders
/// that hold no object (a store such as SeaweedFS lists a folder whose objects were all
/// removed, as a failed run's `.reshard/` is by the clearing of its uploads): one listing of the
/// top, and for each folder one look ([`has_objects`]), not a walk of all it holds.
fn only_markers(target: &Path) -> Result<bool> {
    let entries = storage::source(target)
        .list(target)
        .with_context(|| format!("--output {}: cannot list", target.display()))?;
    for e in entries {
        let ours = match e.kind {
            Kind::File => e.name.to_str().is_some_and(is_marker),
            Kind::Dir => !has_objects(&target.join(&e.name))?,
            _ => false,
        };
        if !ours {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Whether any object is under the folder `dir`: on an object store its `stat` (one page of a
/// listing of at most one key; a folder kept with no object under it holds none), not a walk of
/// all it holds; elsewhere (the memory store of the tests keeps empty folders) a walk.
///
/// # Errors
/// The store cannot tell.
fn has_objects(dir: &Path) -> Result<bool> {
    if !storage::is_object_store(dir) {
        return Ok(!super::records::names_under(dir).is_ok_and(|n| n.is_empty()));
    }
    match storage::source(dir).stat(dir) {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e).with_context(|| format!("--output {}: cannot list", dir.display())),
    }
}

/// Whether `old` is an output whose removal by `--keep` began and did not finish: its marker
/// [`REMOVING`] there and its `index.json` gone. (A marker beside an `index.json` is a removal
/// that failed before it began: that output stands.)
pub(super) fn half_removed(old: &Path) -> bool {
    let source = storage::source(old);
    source.stat(&old.join(REMOVING)).is_ok() && source.stat(&old.join(MANIFEST)).is_err()
}

/// Removes every object of the older output `old` of an `s3://` series (as a file system's
/// `--keep` removes its whole directory), holding its lock, so that no run writes it meanwhile
/// (one that does is left alone: "skipped"): its unfinished multipart uploads aborted, the
/// marker [`REMOVING`] written, then its `index.json` removed (it stops being an output), then
/// the rest, the marker last.
fn remove_remote_epoch(old: &Path, stale_after: Duration) -> Result<()> {
    let skipped = |why: &dyn std::fmt::Display| {
        crate::errln!(
            "reshard: --keep: skipped {}: {why}; the next run with --keep removes it",
            old.display()
        );
    };
    if crate::job::destination::lock::may_be_held(&lock_path(old)) {
        skipped(&"another run holds its lock");
        return Ok(());
    }
    let _held = match RemoteLock::acquire(old, stale_after) {
        Ok(lock) => lock,
        Err(e) => {
            skipped(&format_args!("{e:#}"));
            return Ok(());
        }
    };
    remove_objects(old)
}

/// [`remove_remote_epoch`]'s removal, its lock held: only what reshard wrote of `old`
/// ([`Written`], by its manifest), whose names the marker records before the manifest goes, so
/// that a removal cut short is finished by them; the user's own objects stay.
pub(super) fn remove_objects(old: &Path) -> Result<()> {
    let sink = storage::sink(old);
    sink.abort_unfinished(old).with_context(|| {
        format!(
            "--keep: cannot abort the unfinished uploads under {}",
            old.display()
        )
    })?;
    let marker = old.join(REMOVING);
    let manifest = OutputManifest::parse(old).ok();
    let written = Written::of(manifest.as_ref());
    // A removal cut short: the marker names what it was removing.
    let mut names: Vec<String> = match manifest {
        Some(_) => Vec::new(),
        None => storage::source(&marker)
            .read(&marker)
            .map(|text| {
                String::from_utf8_lossy(&text)
                    .lines()
                    .map(String::from)
                    .collect()
            })
            .unwrap_or_default(),
    };
    // Without the manifest (a removal cut short whose marker names nothing: an earlier
    // version's), a shard is known as reshard's by its saved index, which matches that very
    // object (size and ETag): such shards go, a user's object never.
    let unlisted = manifest.is_none();
    names.extend(
        files_of(old, false)?
            .into_iter()
            .map(|f| f.0)
            .filter(|rel| rel != REMOVING && rel != MANIFEST)
            .filter(|rel| written.includes(rel) || unlisted && fenced::layout_holds(old, rel)),
    );
    names.retain(|n| !n.is_empty() && n != REMOVING && n != MANIFEST);
    names.sort();
    names.dedup();
    sink.write(&marker, names.join("\n").as_bytes())
        .with_context(|| format!("--keep: {}: cannot write", marker.display()))?;
    let remove = |path: &Path| {
        remove_if_there(path).with_context(|| format!("--keep: cannot remove {}", path.display()))
    };
    if manifest.is_some() {
        remove(&old.join(MANIFEST))?;
    }
    crate::hooks::kill_at(0, "keep");
    for rel in &names {
        remove(&old.join(rel))?;
    }
    sink.remove_file(&marker)
        .with_context(|| format!("--keep: cannot remove {}", marker.display()))
}
