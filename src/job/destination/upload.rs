//! Phase "upload" of an `s3://` output: objects cannot be written at an offset and cannot be
//! renamed, so the whole POSIX pipeline runs on a scratch directory (`--scratch`) and its
//! published output is then uploaded: every rank its share of the shards (balanced by bytes,
//! multipart for large ones), then rank 0 the loader metadata, and the manifest `index.json`
//! last. A reader that follows the manifest never sees a partial output: until `index.json`
//! is written, the output does not exist.
//!
//! One run per output: a lock object beside the output, created with a conditional PUT
//! (`If-None-Match: *`), holding this run's token; checked before the manifest is written and
//! removed at the end. `--force` replaces only a reshard output, and removes only the objects
//! its manifest lists.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::comm::{agree, broadcast_result, Comm};
use crate::config::UploadSettings;
use crate::job::destination::life::{self, may_replace, Rules, StagingSteps};
use crate::job::destination::lock::OutputLock;
use crate::job::destination::series::say_what_keep_would_remove;
use crate::job::destination::written::Written;
use crate::output::{checkpoint, saved_index, seal};
use crate::size::human_bytes;
use crate::storage::{self, Kind, Source};
use by_manifest::{half_removed, remove_objects, ByManifest, REMOVING};
use fenced::{Fence, Found};
use marker::{clean_up_failed_run, is_own_name, Marker};
use progress::{report_progress, Sent};

mod by_manifest;
mod deal;
mod fenced;
mod marker;
mod progress;
mod records;

pub(crate) use deal::written;

// The manifest: written last, it is what makes the output exist.
use crate::job::destination::written::MANIFEST;

/// The folder of the staged copy's `--resume` records where the rank that uploaded a shard
/// notes the object's stamp once it (and its saved index) is up: a resumed upload keeps the
/// objects whose stamp is still the one noted, instead of uploading them again.
const UPLOADED: &str = "uploaded";

/// How much of a file one read moves into an upload.
const CHUNK: usize = 8 << 20;

/// The lock of an `s3://` output, held by rank 0 from before any work until the end: the
/// lock of a file system's output ([`OutputLock`]) on an object created with a conditional
/// PUT, so with the same rules: a token unique to the run, the owner's host, boot, PID
/// namespace, pid and start time, and a heartbeat it rewrites every second (a conditional PUT
/// on the ETag it read). A holder dead by its pid (this host, boot and PID namespace) is taken
/// over at once; any other once its heartbeat has not moved for `--lock-stale-after`.
pub(crate) struct RemoteLock {
    lock: OutputLock,
    /// Objects of the reshard output `--force` replaces (its manifest's names), removed once
    /// the new manifest is written.
    replaced: Vec<String>,
    /// Objects a failed attempt uploaded that its clean-up left in place for `--resume`
    /// (shards noted as uploaded, still as noted, and their saved indexes): those the new
    /// output names from the same staged files are not uploaded again ([`still_staged`]); the
    /// others are replaced or, not named by the new manifest, removed after it.
    preserved: Vec<String>,
    /// The bucket's records of a failed attempt's uploads that hold still, carried over under
    /// this run's prefix ([`records::carry_over`]): what [`records::kept`] chooses from.
    records: Vec<(String, records::Record)>,
    /// This run's marker of its upload under way as it last wrote it: its next write is made
    /// only over it ([`Marker::put`]).
    marker: Option<Vec<u8>>,
    /// The runs whose markers this run's supersedes ([`Marker::carried`]).
    lineage: Vec<String>,
    /// The token the marker of a failed run names (its records'), as found before it was
    /// cleared: on `--scratch`, the one run whose staged copy a run finding the lock free may
    /// take ([`crate::job::destination::scratch::may_take_copy`]).
    failed: Option<String>,
}

/// The lock object of the output `target`: beside it, hidden, outside its prefix.
fn lock_path(target: &Path) -> PathBuf {
    crate::job::destination::lock::lock_of(target)
}

impl RemoteLock {
    /// Takes the lock of `target`, taking over one whose holder is dead.
    ///
    /// # Errors
    /// Another live run holds it, or the store has no conditional PUT.
    fn acquire(target: &Path, stale_after: Duration) -> Result<Self> {
        let lock = OutputLock::acquire(&lock_path(target), target, stale_after)?;
        Ok(RemoteLock {
            lock,
            replaced: Vec::new(),
            preserved: Vec::new(),
            records: Vec::new(),
            marker: None,
            lineage: Vec::new(),
            failed: None,
        })
    }

    /// The output's lock: the run's one lock, its token the run's one token.
    pub(crate) fn lock(&self) -> &OutputLock {
        &self.lock
    }

    /// The token of the failed run the bucket's marker named when this run took the lock, if
    /// one did.
    pub(crate) fn failed_run(&self) -> Option<&str> {
        self.failed.as_deref()
    }

    /// That the lock still holds this run's token (right before the manifest is written).
    fn check_owned(&self) -> Result<()> {
        self.lock.check_held()
    }

    /// What lets every rank check that this run still holds the lock of `target`.
    fn fence(&self, target: &Path) -> Fence {
        Fence {
            lock: lock_path(target),
            token: self.lock.token().to_string(),
            target: target.to_path_buf(),
        }
    }
}

/// Rank 0, before the steps before the commit: the scratch directory where the output is
/// staged made.
///
/// # Errors
/// It cannot be made.
pub(crate) fn make_scratch(cfg: &UploadSettings) -> Result<()> {
    let Some(local) = &cfg.local else {
        return Ok(());
    };
    let parent = local.parent().unwrap_or(Path::new("."));
    storage::sink(parent)
        .create_dir_all(parent)
        .with_context(|| format!("--scratch: cannot create {}", parent.display()))
}

/// Rank 0, before any work: the steps before the commit, one [`life::prepare`] over
/// [`ToBucket`]: the lock taken in the bucket, what a failed run left cleared (this run's own
/// marker of its upload under way created first, carrying forward what stays named), the
/// output checked (empty, or with `--force` a reshard output), then that marker written again
/// with what the run replaces, an earlier attempt's staged copy continued or removed and the staging directory
/// on `--scratch` begun (`scratch`). The lock; none in a dry run, which writes nothing and says
/// what `--keep` would remove.
///
/// # Errors
/// The lock is held or cannot be taken, or the output holds something that is not reshard's.
pub(crate) fn prepare(
    cfg: &UploadSettings,
    scratch: &mut dyn StagingSteps,
) -> Result<Option<RemoteLock>> {
    let (Some(target), Some(local)) = (&cfg.target, &cfg.local) else {
        return Ok(None);
    };
    let mut bucket = ToBucket {
        cfg,
        target,
        local,
        lock: None,
        staged: false,
        rest: None,
        seen: None,
        scratch,
    };
    life::prepare(&mut bucket)?;
    Ok(bucket.lock)
}

/// The steps before the commit of an object store's output, for the output's life.
struct ToBucket<'a> {
    cfg: &'a UploadSettings,
    target: &'a Path,
    local: &'a Path,
    lock: Option<RemoteLock>,
    /// Whether an earlier attempt's finished copy is staged on `--scratch`.
    staged: bool,
    /// This run's marker as its clearing made it, naming what is left of failed runs.
    rest: Option<Marker>,
    /// The bytes of this run's marker as its clearing wrote it (none: not written yet, `begin`
    /// creates it): `begin` writes it again only over them, so that a run that lost the lock
    /// meanwhile (its marker carried forward and removed by its successor) writes nothing.
    seen: Option<Vec<u8>>,
    /// The staging directory on `--scratch`: its steps are this strategy's, under its lock.
    scratch: &'a mut dyn StagingSteps,
}

impl ToBucket<'_> {
    fn lock(&mut self) -> Result<&mut RemoteLock> {
        self.lock
            .as_mut()
            .context("internal error: the output's lock is taken first")
    }
}

impl life::Prepare for ToBucket<'_> {
    fn take_lock(&mut self) -> Result<()> {
        if self.cfg.dry_run {
            return Ok(());
        }
        let lock = RemoteLock::acquire(self.target, self.cfg.lock_stale_after)?;
        if let Some(dead) = lock.lock.dead_predecessor() {
            // Its pid proved it dead: what it could not remove itself, and only what is its.
            crate::job::destination::scratch::remove_dead_heartbeats(self.target, dead);
        }
        self.lock = Some(lock);
        Ok(())
    }

    /// What failed runs left (their markers and no manifest), but for the shards uploaded
    /// completely, which `--resume` keeps; and an output whose removal `--keep` began. This
    /// run's own marker is created here, naming what stays of them, before theirs go.
    fn clear_failed(&mut self) -> Result<()> {
        if self.cfg.dry_run {
            return Ok(());
        }
        let (cfg, target, local) = (self.cfg, self.target, self.local);
        // First, before anything at the output is removed or anything can fail: the other
        // runs' markers listed and sealed, this run stopped if one supersedes it (it lost the
        // lock), and its own marker created, carrying them forward ([`marker::claim`]).
        let lock = self.lock()?;
        let from = lock
            .lock
            .dead_predecessor()
            .or(lock.lock.taken_from_silent());
        let (fence, token) = (lock.fence(target), lock.lock.token().to_string());
        let (found, run) = marker::claim(target, &token, from, Some(&fence))?;
        lock.lineage.clone_from(&run.lineage);
        finish_keeps_removal(target)?;
        self.staged = storage::source(local).stat(&local.join(MANIFEST)).is_ok();
        let left = storage::source(target)
            .stat(&target.join(MANIFEST))
            .is_err();
        // The lock free: the run that staged a copy with no plan record (each node's own) lost
        // the lock by its silence (a run killed outright leaves the lock taken, and one that
        // failed removed its copy), and may live; a failed run's marker does not say on which
        // node it staged, so it claims no copy here. Moved aside, never removed.
        let lock = &self.lock()?.lock;
        let own = lock.found_free().then(|| lock.token().to_string());
        if let Some(own) = own.filter(|_| self.staged) {
            self.staged = !crate::job::destination::scratch::set_aside_unclaimed(local, &own)?;
        }
        if left && found.iter().any(|f| !f.marker.replaces.is_empty()) && !cfg.force {
            bail!(
                "--output {}: an earlier run with --force was replacing the reshard output there and did not finish: rerun with --force",
                target.display()
            );
        }
        let mut up = if cfg.resume && self.staged && left && !found.is_empty() {
            uploaded_before(local, target)?
        } else {
            Vec::new()
        };
        let earlier = marker::Found::named(&found).filter(|_| left);
        let lock = self.lock()?;
        lock.records = records::carry_over(target, earlier.as_deref(), &lock.lock, cfg.resume)?;
        lock.failed = earlier;
        up.extend(lock.records.iter().map(|r| r.0.clone()));
        let (rest, seen) = clean_up_failed_run(target, (&found, left), &up, &run)?;
        lock.marker.clone_from(&seen);
        (self.rest, self.seen) = (Some(rest), seen);
        Ok(())
    }

    /// What is left of a failed run is this run's: the objects kept for `--resume` (the
    /// marker's uploads), and those of the output a failed `--force` run was replacing (its
    /// manifest already gone). Else the rule, asked of what is there.
    fn check_replace(&mut self) -> Result<()> {
        let (force, target) = (self.cfg.force, self.target);
        if self.cfg.dry_run {
            return replaced_objects(force, target).map(drop);
        }
        let rest = self.rest.take();
        let lock = self.lock()?;
        lock.replaced = match rest {
            Some(m) if m.names_objects() => {
                lock.preserved = m.uploads;
                m.replaces
            }
            _ => replaced_objects(force, target)?,
        };
        Ok(())
    }

    /// This run's marker of its upload under way, first, written over what its clearing wrote:
    /// its token, what it replaces, what a failed run left that `--resume` may keep (the upload
    /// phase adds what it uploads, [`name_uploads`]). Then a copy an earlier attempt staged and did not finish uploading:
    /// ours to continue (`--resume`) or to remove, unless that run may only be suspended. A dry
    /// run says what `--keep` would remove.
    fn begin(&mut self) -> Result<()> {
        let (cfg, target) = (self.cfg, self.target);
        if cfg.dry_run {
            if let Some(keep) = &cfg.keep {
                say_what_keep_would_remove(target, keep, cfg.epoch)?;
            }
            return Ok(());
        }
        let (resume, local, staged) = (cfg.resume, self.local, self.staged);
        let seen = self.seen.take();
        let lock = self.lock()?;
        // Only while this run holds the lock, and only over the marker it sees there now.
        lock.check_owned()?;
        let marker = Marker {
            uploads: lock.preserved.clone(),
            replaces: lock.replaced.clone(),
            records: Some(lock.lock.token().to_string()),
            carried: lock.lineage.clone(),
            superseded_by: None,
        };
        let token = lock.lock.token();
        lock.marker = Some(marker.put(target, token, seen.as_deref())?);
        if staged {
            if let Some(token) = lock.lock.taken_from_silent() {
                fenced::set_aside(local, token)?;
            } else if !(resume && restage(local)?) {
                storage::sink(local)
                    .remove_dir_all(local)
                    .with_context(|| {
                        format!("{}: cannot remove the staged copy", local.display())
                    })?;
            }
        }
        Ok(())
    }

    /// The staging directory on `--scratch`, under the bucket's lock.
    fn staging(&mut self) -> life::StagingPart<'_> {
        life::StagingPart {
            lock: self.lock.as_ref().map(RemoteLock::lock),
            steps: &mut *self.scratch,
            taken: self.staged,
            named: Some(self.lock.as_ref().and_then(RemoteLock::failed_run)),
        }
    }
}

/// A `--keep` run began removing the output `target`: with its `index.json` gone, that is
/// finished (it is reshard's, and no output any more); with it there, the removal never began.
fn finish_keeps_removal(target: &Path) -> Result<()> {
    if storage::source(target)
        .stat(&target.join(REMOVING))
        .is_err()
    {
        return Ok(());
    }
    if half_removed(target) {
        crate::errln!(
            "reshard: --keep: finishing the removal of {} (an earlier run began it) before writing it again",
            target.display()
        );
        remove_objects(target)
    } else {
        let marker = target.join(REMOVING);
        storage::sink(&marker)
            .remove_file(&marker)
            .with_context(|| format!("{}: cannot remove", marker.display()))
    }
}

/// Where the upload of `shard` of the staged copy `local` is noted.
fn upload_record(local: &Path, shard: &str) -> PathBuf {
    checkpoint::dir(local).join(UPLOADED).join(shard)
}

/// A stamp as noted: size, modification time, identity (an object's ETag hash, a file's inode).
fn stamp_line(s: &storage::FileStamp) -> String {
    format!("{} {} {}", s.size, s.mtime_ns, s.identity)
}

/// What is noted of an upload: the object's stamp after it, then the staged file's it came from.
fn note_of(object: &storage::FileStamp, file: &storage::FileStamp) -> String {
    format!("object {}\nfile {}\n", stamp_line(object), stamp_line(file))
}

/// The note of `shard`'s upload, as (object, file) lines, if there is a readable one. A note
/// whose seal does not match is said (naming it) and not believed: its shard is uploaded again.
fn read_note(local: &Path, shard: &str) -> Option<(String, String)> {
    let record = upload_record(local, shard);
    let bytes = storage::source(&record).read(&record).ok()?;
    let body = match seal::open(&bytes) {
        Ok(body) => body,
        Err(e) => {
            crate::errln!(
                "reshard: warning: {}: {e}; {shard} is uploaded again",
                record.display()
            );
            return None;
        }
    };
    let text = std::str::from_utf8(body).ok()?;
    let mut lines = text.lines();
    let object = lines.next()?.strip_prefix("object ")?.to_string();
    let file = lines.next()?.strip_prefix("file ")?.to_string();
    Some((object, file))
}

/// What the note of `shard`'s upload in the staged copy `local` says of the object (its size
/// and identity), if there is a readable one.
fn noted_object(local: &Path, shard: &str) -> Option<saved_index::Verified> {
    let (object, _) = read_note(local, shard)?;
    let mut fields = object.split(' ');
    let size = fields.next()?.parse().ok()?;
    let identity = fields.nth(1)?.parse().ok()?;
    Some(saved_index::Verified {
        size,
        identity: Some(identity),
    })
}

/// After `shard` and its saved index are up (`made`: the store's answer to this run's create):
/// the object's stamp and the staged file's noted in the staged copy's records, so that a
/// `--resume` after a failure keeps the object while the file is the one it was uploaded from.
/// Noted only where the object at the name is still the one created (its size and ETag), as
/// the saved index is ([`saved_index::write_for`]): a note never names another's object.
fn note_uploaded(local: &Path, target: &Path, shard: &str, made: &storage::Created) -> Result<()> {
    let (to, from) = (target.join(shard), local.join(shard));
    let object = storage::stamp(&to).with_context(|| format!("{}: cannot stat", to.display()))?;
    let made = saved_index::Verified::created(made);
    if object.size != made.size || made.identity.is_some_and(|id| id != object.identity) {
        return Ok(());
    }
    let file = storage::stamp(&from).with_context(|| format!("{}: cannot stat", from.display()))?;
    let record = upload_record(local, shard);
    let parent = record.parent().unwrap_or(local);
    storage::sink(parent)
        .create_dir_all(parent)
        .and_then(|()| {
            storage::write_unsynced(&record, &seal::seal(note_of(&object, &file).into_bytes()))
        })
        .with_context(|| format!("{}: cannot write", record.display()))
}

/// The shards of the staged copy `local` that an earlier attempt noted as uploaded to `target`
/// and that are there still as it left them (the object's stamp as noted), sorted: what the
/// clean-up of its failed run leaves in place. Whether each is kept is decided once the
/// resumed run has its output ([`still_staged`]). A note that cannot be read or does not match
/// is no reason to fail: that shard is uploaded again.
fn uploaded_before(local: &Path, target: &Path) -> Result<Vec<String>> {
    let records = checkpoint::dir(local).join(UPLOADED);
    let Ok(noted) = records::names_under(&records) else {
        return Ok(Vec::new());
    };
    let mut up = Vec::new();
    for shard in noted {
        let Some((object, _)) = read_note(local, &shard).filter(|_| is_shard(&shard)) else {
            continue;
        };
        match storage::stamp(&target.join(&shard)) {
            Ok(now) if object == stamp_line(&now) => up.push(shard),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(e)
                    .with_context(|| format!("{}: cannot stat", target.join(&shard).display()))
            }
        }
    }
    up.sort();
    Ok(up)
}

/// Of the shards `up` (left in place from a failed attempt, [`uploaded_before`]), those whose
/// staged file about to be uploaded is still the file each was uploaded from (its stamp as
/// noted: a resumed run that continued the staged copy moves no data and leaves its shards
/// alone, one that started over or named its shards otherwise does not): these are kept, the
/// others uploaded again.
fn still_staged(local: &Path, files: &[(String, u64)], up: &[String]) -> Vec<String> {
    let named: HashSet<&str> = files.iter().map(|f| f.0.as_str()).collect();
    up.iter()
        .filter(|shard| named.contains(shard.as_str()))
        .filter(|shard| {
            let now = storage::stamp(&local.join(shard.as_str())).ok();
            read_note(local, shard)
                .is_some_and(|(_, file)| now.is_some_and(|n| file == stamp_line(&n)))
        })
        .cloned()
        .collect()
}

/// `--resume` after a failed upload: the staged copy, finished and still holding its
/// `--resume` records, is moved back to the staging directory it was published from, where the
/// expand phase finds it and checks it as any attempt to continue (same arguments and inputs,
/// then the same plan): every sample is in place, so no data moves again, and the output is
/// published on the scratch directory and uploaded once more. Whether it was moved.
fn restage(local: &Path) -> Result<bool> {
    let records = checkpoint::dir(local);
    let (Some(parent), Some(name)) = (local.parent(), local.file_name()) else {
        return Ok(false);
    };
    let staging = crate::job::destination::staging::path_for(parent, name);
    let source = storage::source(local);
    if source.stat(&records).is_err() || source.stat(&staging).is_ok() {
        return Ok(false);
    }
    // A pointer that leads nowhere is this copy's: its run was killed between renaming its
    // staging directory to the copy and removing the pointer. It goes; the copy takes its path.
    if source
        .stat_link(&staging)
        .is_ok_and(|s| s.kind == storage::Kind::Link)
    {
        storage::sink(&staging)
            .remove_file(&staging)
            .with_context(|| format!("{}: cannot remove", staging.display()))?;
    }
    storage::sink(local)
        .rename(local, &staging)
        .with_context(|| {
            format!(
                "{}: cannot move the staged copy back to {} to resume its upload",
                local.display(),
                staging.display()
            )
        })?;
    crate::errln!(
        "reshard: --resume: {} was staged but not uploaded completely: continuing from it",
        local.display()
    );
    Ok(true)
}

/// What is at the output now: nothing, or with `--force` a reshard output, of which the new
/// output replaces every object reshard wrote: the shards its manifest lists with their saved
/// and loader indexes (`NAME.idx`, `NAME.tar.idx`; of shards beyond the new count too), and
/// whatever is under its `.reshard/` directories and `.nv-meta/`. An object reshard did not write
/// there (the user's own, which the manifest does not name) stays.
fn replaced_objects(force: bool, target: &Path) -> Result<Vec<String>> {
    // The one rule of what a run may replace, on every store (destination::life).
    if !may_replace(
        target,
        &by_manifest::found(target)?,
        force,
        "before the run",
    )? {
        return Ok(Vec::new());
    }
    let written = match crate::job::destination::owned::OutputManifest::read(target) {
        Ok(m) => Written::of(Some(&m)),
        Err(why) => bail!("--output {}: {why}", target.display()),
    };
    let mut names: Vec<String> = files_of(target, false)?.into_iter().map(|f| f.0).collect();
    // Its manifest is replaced by the new one's, written last.
    names.retain(|n| is_own_name(n) && n != MANIFEST && written.includes(n));
    Ok(names)
}

/// Every file under `dir`, as (path relative to it, size), sorted by path; without the staged
/// copy's `--resume` records and its makers' records at its top when `staged` (they are no part
/// of the output).
fn files_under(
    source: &dyn Source,
    dir: &Path,
    rel: &Path,
    out: &mut Vec<(String, u64)>,
    staged: bool,
) -> Result<()> {
    let here = dir.join(rel);
    let entries = source
        .list(&here)
        .with_context(|| format!("{}: cannot list", here.display()))?;
    for e in entries {
        let records = [
            checkpoint::DIR_NAME,
            crate::job::destination::makers::DIR_NAME,
        ];
        if staged && rel.as_os_str().is_empty() && records.iter().any(|r| e.name == *r) {
            continue;
        }
        let name = rel.join(&e.name);
        if e.kind == Kind::Dir {
            files_under(source, dir, &name, out, staged)?;
        } else {
            let size = source.stat(&dir.join(&name))?.stamp.size;
            out.push((name.to_string_lossy().into_owned(), size));
        }
    }
    out.sort();
    Ok(())
}

/// [`files_under`] of all of `dir`, sorted by path.
fn files_of(dir: &Path, staged: bool) -> Result<Vec<(String, u64)>> {
    let mut files = Vec::new();
    files_under(storage::source(dir), dir, Path::new(""), &mut files, staged)?;
    Ok(files)
}

/// Removes the object `path` if it is there; whether it was.
fn remove_if_there(path: &Path) -> std::io::Result<bool> {
    match storage::sink(path).remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// A shard (uploaded by any rank) rather than metadata (rank 0's, after every shard): a file at
/// the top of the output or, with `--split`, at the top of a split's directory (`NAME/FILE`; a
/// key map's templates name no directory), hidden in neither, and no manifest.
fn is_shard(rel: &str) -> bool {
    let parts: Vec<&str> = rel.split('/').collect();
    parts.len() <= 2
        && parts.iter().all(|p| !p.is_empty() && !p.starts_with('.'))
        && parts.last() != Some(&MANIFEST)
}

/// The saved index of the shard `shard`, relative to the output, if the output has one: in the
/// `.reshard/` beside it (a split's own, for a split's shard).
fn layout_of(shard: &str) -> String {
    saved_index::path_for(Path::new(shard), None)
        .to_string_lossy()
        .into_owned()
}

/// The shards `shards` and their saved indexes, by name (the saved index of a shard is
/// written by the rank that uploads the shard, [`restamp_layout`], and goes or stays with it).
pub(super) fn with_layouts<'a>(shards: impl IntoIterator<Item = &'a str>) -> HashSet<String> {
    shards
        .into_iter()
        .flat_map(|s| [s.to_string(), layout_of(s)])
        .collect()
}

/// After the shard `shard` is uploaded (`made`: the store's answer to this run's create): its
/// saved index, if any, written beside it stamped for that object (its size and ETag as
/// created, its modification time), so that the next run reading this output from the store
/// reuses it instead of streaming the shard to read its headers. Where the object at the name
/// is no longer this run's, nothing is written ([`saved_index::write_for`]): the check before
/// the manifest ([`fenced::verify`]) creates the shard again and comes back here, or the run
/// lost the lock and publishes nothing.
fn restamp_layout(
    local: &Path,
    target: &Path,
    shard: &str,
    names: &HashSet<&str>,
    made: &storage::Created,
) -> Result<()> {
    let layout = layout_of(shard);
    if !names.contains(layout.as_str()) {
        return Ok(());
    }
    saved_index::write_for(
        &local.join(&layout),
        &target.join(shard),
        &target.join(&layout),
        &saved_index::Verified::created(made),
    )
    .map(|_| ())
}

/// Where an upload reads: `local`, the copy rank 0 published on its scratch directory;
/// `copy`, this rank's node's copy (`local`, or where `--scratch` is each node's own, the
/// node's staging directory: [`crate::job::destination::scratch`]); the per-shard files this
/// rank wrote ([`written`]).
pub(crate) struct Staged<'a> {
    pub(crate) local: &'a Path,
    pub(crate) copy: &'a Path,
    pub(crate) written: Vec<String>,
}

/// Every writer uploads its own shards (and their saved and loader indexes) from its node's
/// copy; rank 0 then writes the metadata, checks the lock, writes the manifest, removes what
/// `--force` replaced and the local copy; a node's own copy goes with its ranks.
///
/// # Errors
/// An upload fails (its multipart upload is aborted; nothing is published: no manifest), the
/// lock was lost, or removing what was replaced fails after the manifest is written.
pub(crate) fn run(
    comm: &impl Comm,
    cfg: &UploadSettings,
    staged: &Staged<'_>,
    lock: Option<&RemoteLock>,
) -> Result<()> {
    let Some(target) = &cfg.target else {
        return Ok(());
    };
    let (local, copy) = (staged.local, staged.copy);
    let started = Instant::now();
    let dealt = deal::deal(comm, local, copy, &staged.written)?;
    let files = &dealt.files;
    let lead = (comm.rank() == 0).then(|| {
        let up = lock.map(|l| &l.preserved[..]).unwrap_or_default();
        let records = lock.map(|l| l.records.iter()).into_iter().flatten();
        let records = records.filter(|r| up.contains(&r.0)).cloned().collect();
        let noted = still_staged(local, files, up).into_iter();
        let kept = noted.filter_map(|k| noted_object(local, &k).map(|v| (k, v)));
        let kept = kept.collect();
        records::Candidates { kept, records }
    });
    let verified = records::kept(comm, copy, &dealt, lead)?;
    let kept: Vec<String> = verified.iter().map(|k| k.0.clone()).collect();
    if comm.rank() == 0 && !kept.is_empty() {
        crate::errln!(
            "reshard: --resume: kept {} shard(s) the earlier run uploaded completely to {}",
            kept.len(),
            target.display()
        );
    }
    let begun = lock.map_or(Ok(()), |l| name_uploads(target, files, &kept, l));
    agree(comm, begun)?;
    let fence: Option<Fence> = broadcast_result(comm, 0, Some(Ok(lock.map(|l| l.fence(target)))))?;
    let fence = fence.as_ref();
    let names: HashSet<&str> = files.iter().map(|f| f.0.as_str()).collect();
    let was_up = with_layouts(kept.iter().map(String::as_str));
    let mine = dealt.mine(comm.rank());
    let todo: Vec<_> = mine
        .iter()
        .filter(|f| !was_up.contains(&f.0))
        .copied()
        .collect();
    let kept_mine: Vec<(&str, saved_index::Verified)> = verified
        .iter()
        .filter(|k| mine.iter().any(|f| f.0 == k.0))
        .map(|k| (k.0.as_str(), k.1))
        .collect();
    let all_todo = files
        .iter()
        .filter(|f| is_shard(&f.0) && !was_up.contains(&f.0));
    let sent = Sent::default();
    let rank = comm.rank();
    let sent: Result<u64> = std::thread::scope(|scope| {
        let uploads = scope.spawn(|| {
            let r = fenced::restore_layouts(copy, target, &kept_mine, &names, fence, rank)
                .and_then(|()| {
                    fenced::upload_share(copy, target, &todo, &names, rank, fence, &sent)
                });
            sent.end();
            r
        });
        report_progress(comm, cfg.progress, all_todo, &sent);
        uploads.join().expect("the upload thread does not panic")
    });
    let per_node = dealt.per_node;
    agree(comm, sent.map(|_| ())).with_context(|| {
        fenced::lost(fence, target).unwrap_or_else(|| not_published(target, local, per_node))
    })?;
    crate::hooks::kill_at(comm.rank(), "uploaded");
    let finished = (comm.rank() == 0).then(|| finish(cfg, local, &dealt, &kept, lock));
    broadcast_result(comm, 0, finished)?;
    if copy != local {
        crate::job::destination::scratch::remove_node_copy(copy);
    }
    let tally = |up: bool| {
        let v = files.iter().filter(|f| was_up.contains(&f.0) == up);
        (v.clone().count(), human_bytes(v.map(|f| f.1).sum()))
    };
    let (put, was_up) = (tally(false), tally(true));
    let kept_note = if was_up.0 == 0 {
        String::new()
    } else {
        format!("; {} objects ({}) were up already", was_up.0, was_up.1)
    };
    crate::report::narrate::narrate(
        comm.rank() == 0,
        format_args!(
            "uploaded {} objects ({}) to {} in {:.2} s{kept_note}",
            put.0,
            put.1,
            target.display(),
            started.elapsed().as_secs_f64()
        ),
    );
    Ok(())
}

/// Rank 0 before any object is uploaded, having checked that it still holds the lock: the
/// names it will upload added to the marker of the upload under way (written over the one this
/// run's `begin` wrote, and only over it: [`Marker::put`]), and with `--force` the replaced
/// output's manifest removed (it stops being an output before any of its objects is
/// overwritten).
fn name_uploads(
    target: &Path,
    files: &[(String, u64)],
    kept: &[String],
    lock: &RemoteLock,
) -> Result<()> {
    let names: HashSet<&str> = files.iter().map(|f| f.0.as_str()).collect();
    let mut uploads: Vec<String> = files.iter().map(|f| f.0.clone()).collect();
    uploads.extend(
        lock.preserved
            .iter()
            .filter(|p| !names.contains(p.as_str()))
            .cloned(),
    );
    // Written only while this run holds the lock, and only over its own marker: never over a
    // successor's.
    lock.check_owned()?;
    let token = lock.lock.token();
    Marker {
        uploads,
        replaces: lock.replaced.clone(),
        records: Some(token.to_string()),
        carried: lock.lineage.clone(),
        superseded_by: None,
    }
    .put(target, token, lock.marker.as_deref())?;
    if lock.replaced.is_empty() && lock.preserved.is_empty() {
        return Ok(());
    }
    lock.check_owned()?; // again, before anything of the output goes
    let fence = lock.fence(target);
    if !lock.replaced.is_empty() {
        // Already gone where a failed run that was replacing it removed it. Removed only while
        // it is the one looked at before the lock check: a successor's, published while this
        // run was suspended past its lock, stays.
        let old = target.join(MANIFEST);
        fenced::remove_after_publish(&fence, &old, || crate::hooks::kill_at(0, "unindex"))?;
    }
    // Every object is only created: what is at a name this run creates (of the replaced output,
    // or of the earlier attempt and not kept) goes first, the old output no output any more.
    let keeps = with_layouts(kept.iter().map(String::as_str));
    for (rel, _) in files.iter().filter(|f| !keeps.contains(&f.0)) {
        fenced::remove(Some(&fence), &target.join(rel))?;
    }
    Ok(())
}

/// What a failed upload says: where the finished output stays for `--resume`, or where each
/// node staged its own copy (`per_node`), that there is nothing to resume from.
fn not_published(target: &Path, local: &Path, per_node: bool) -> String {
    if per_node {
        return format!(
            "nothing is published at {} (no {MANIFEST} written); each node staged its own copy: rerun with the same arguments and --resume (on any nodes) to keep the shards uploaded completely and redo the rest",
            target.display()
        );
    }
    format!(
        "nothing is published at {} (no {MANIFEST} written); the finished output stays in {}: rerun with the same arguments and --resume to upload it without moving data again",
        target.display(),
        local.display()
    )
}

/// Rank 0 after every shard is up: the metadata, found as this run created it with the kept
/// shards, then the output's life commits it by its manifest ([`ByManifest`]) and does what
/// follows (what `--force` replaced removed, the staged copy, `--keep`).
fn finish(
    cfg: &UploadSettings,
    local: &Path,
    dealt: &deal::Deal,
    kept: &[String],
    lock: Option<&RemoteLock>,
) -> Result<()> {
    let target = cfg.target.as_deref().context("an upload has a target")?;
    let fence = lock.map(|l| l.fence(target));
    let fence = fence.as_ref();
    let files = &dealt.files;
    let metadata = files
        .iter()
        .filter(|f| dealt.is_metadata(&f.0) && f.0 != MANIFEST);
    let mut created = Vec::new();
    for (rel, _) in metadata {
        let made = fenced::create(local, target, rel, Found::Replace, fence, None)
            .with_context(|| not_published(target, local, dealt.per_node))?;
        created.push((rel.clone(), made));
    }
    let not_published = || not_published(target, local, dealt.per_node);
    fenced::verify(local, target, &mut created, fence).with_context(not_published)?;
    let kept_records = lock.map_or(&[][..], |l| &l.records);
    let names: HashSet<&str> = files.iter().map(|f| f.0.as_str()).collect();
    fenced::check_kept(local, target, kept, kept_records, &names).with_context(not_published)?;
    let strategy = ByManifest {
        target,
        local,
        files,
        lock,
        not_published: not_published(),
        stale_after: cfg.lock_stale_after,
    };
    let rules = Rules {
        link: None,
        keep: cfg.keep.as_ref(),
        epoch: cfg.epoch,
    };
    life::commit(&strategy, &rules)
}

#[cfg(test)]
mod tests;
