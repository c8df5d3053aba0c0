//! How an `s3://` output's objects are written and committed, so that a run that lost the
//! output's lock cannot change what its successor publishes (fencing by construction, not by
//! checks at moments): every object at the output's final names, the manifest included, is only
//! created, never put over another ([`crate::storage::Sink::create_stream_new`]: `If-None-Match:
//! *` on the PUT and on the multipart upload's completion). A run records the size and ETag of
//! every object it created and, before its manifest, finds each still as it left it; an object
//! at one of its names that is not its own (a late write of a run that lost the lock, landed
//! before this run's) is removed and created again, a bounded number of times, and only while
//! this run holds the lock and no manifest is there. Once the manifest is up, every name it lists
//! exists, so a late create of a run that lost the lock fails and changes nothing.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use super::records::still_created;
use super::{remove_if_there, CHUNK};
use crate::job::destination::lock::lost_by_token;
use crate::output::saved_index;
use crate::storage::{self, Created};

/// How many times an object is created at one name before the run gives up: each time after the
/// first, something else was there (another run keeps writing the output).
const ATTEMPTS: usize = 4;

/// The manifest, whose creation commits the output.
const MANIFEST: &str = "index.json";

/// What lets any rank check that its run still holds the output's lock before it removes an
/// object at the output's names: the lock object and the run's token (rank 0's, broadcast).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct Fence {
    pub(crate) lock: PathBuf,
    pub(crate) token: String,
    pub(crate) target: PathBuf,
}

impl Fence {
    /// That this run still holds the lock (the lock object holds its token) and that no
    /// manifest is at the output: checked right before an object at the output's names is
    /// removed, so that a run that lost the lock, or that another run beat to publishing,
    /// removes nothing there.
    ///
    /// # Errors
    /// The lock is another run's or gone, or a manifest is there (both say nothing is
    /// published), or the lock cannot be read.
    pub(crate) fn check(&self) -> Result<()> {
        match self.lost()? {
            None => Ok(()),
            Some(why) => Err(anyhow::anyhow!(why)),
        }
    }

    /// Why this run may remove nothing at the output any more (the lock is another run's or
    /// gone, or a manifest is there), or `None` while it may.
    ///
    /// # Errors
    /// The lock cannot be read (the store cannot tell).
    fn lost(&self) -> Result<Option<String>> {
        if let Some(why) = self.lock_lost()? {
            return Ok(Some(format!("{why} and nothing is published")));
        }
        let manifest = self.target.join(MANIFEST);
        Ok(storage::source(&manifest).stat(&manifest).is_ok().then(|| {
            format!(
                "{}: another run published this output meanwhile: this run removes nothing \
                 there and nothing of it is published",
                manifest.display()
            )
        }))
    }

    /// That this run still holds the lock: checked right before each removal after its own
    /// manifest is up (the manifest half of [`Fence::check`] cannot apply then), so that a run
    /// suspended past its lock after publishing removes nothing a successor published since.
    ///
    /// # Errors
    /// The lock is another run's or gone, or cannot be read.
    pub(crate) fn check_lock(&self) -> Result<()> {
        match self.lock_lost()? {
            None => Ok(()),
            Some(why) => Err(anyhow::anyhow!(why)),
        }
    }

    /// Why this run no longer holds the lock, or `None` while it does.
    fn lock_lost(&self) -> Result<Option<String>> {
        let why = lost_by_token(&self.lock, &self.token)?;
        Ok(why.map(|why| {
            format!(
                "{}: this run lost the output's lock ({why}): it removes nothing at {}",
                self.lock.display(),
                self.target.display()
            )
        }))
    }
}

/// What is done when an object is found at a name this run creates.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Found {
    /// Removed (the fence checked first) and created again: a shard or metadata.
    Replace,
    /// The run fails: the manifest (another run committed the output).
    Fail,
}

/// Creates the object `rel` under `target` from the file `rel` under `local`, only where
/// nothing is at its name; with [`Found::Replace`] an object there already is removed (once
/// `fence` allows it) and the object created again, up to [`ATTEMPTS`] times. `pause`: the
/// rank whose test hook may pause in this upload. What was created: its size and ETag.
///
/// # Errors
/// The upload fails, something stays at the name, or the fence forbids a removal.
pub(crate) fn create(
    local: &Path,
    target: &Path,
    rel: &str,
    found: Found,
    fence: Option<&Fence>,
    pause: Option<usize>,
) -> Result<Created> {
    create_hashed(local, target, rel, found, fence, pause).map(|(created, _)| created)
}

/// [`create`], with the MD5 of the bytes it sent (hashed as they are read for the upload).
///
/// # Errors
/// As [`create`].
pub(crate) fn create_hashed(
    local: &Path,
    target: &Path,
    rel: &str,
    found: Found,
    fence: Option<&Fence>,
    pause: Option<usize>,
) -> Result<(Created, [u8; 16])> {
    let to = target.join(rel);
    for attempt in 0..ATTEMPTS {
        // A test hook pauses the first attempt only.
        match upload(local, target, rel, pause.filter(|_| attempt == 0)) {
            Ok(created) => return Ok(created),
            Err(e) if is_exists(&e) && found == Found::Replace => replace(fence, &to)?,
            Err(e) if is_exists(&e) => {
                // A create sent again after its answer was lost finds its own first copy.
                if let Some(own) = same_bytes(local, &to, rel)? {
                    return Ok((own, crate::output::md5_file(&local.join(rel))?));
                }
                return Err(e).with_context(|| {
                    format!("another run published {} meanwhile", target.display())
                });
            }
            Err(e) => return Err(e),
        }
    }
    bail!(
        "{}: something else was created at this name {ATTEMPTS} times after this run removed \
         it (another run keeps writing this output); nothing is published",
        to.display()
    )
}

/// The object at `to` when it holds exactly the bytes of the file `rel` under `local` (a
/// small object, the manifest: read back whole), else `None`.
///
/// # Errors
/// Either cannot be read.
fn same_bytes(local: &Path, to: &Path, rel: &str) -> Result<Option<Created>> {
    let file = local.join(rel);
    let ours = storage::source(&file)
        .read(&file)
        .with_context(|| format!("{}: cannot read", file.display()))?;
    let there = match storage::source(to).read(to) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("{}: cannot read", to.display())),
    };
    let size = ours.len() as u64;
    Ok((there == ours).then_some(Created { size, e_tag: None }))
}

/// An object this run must remove from `to` before it can create its own there ([`remove`]).
fn replace(fence: Option<&Fence>, to: &Path) -> Result<()> {
    crate::errln!(
        "reshard: {} was there before this run created it (a run that lost the output's lock \
         wrote it late): removed, and created again",
        to.display()
    );
    remove(fence, to)?;
    // Checked again before the create that follows: an object of a successor's that holds the
    // very bytes of the one looked at has its ETag, and goes; a run that lost the lock then at
    // least does not put its own bytes at that name.
    fence.map_or(Ok(()), Fence::check)
}

/// Removes the object `path` at the output's names if it is there, `fence` checked right
/// before (so that a run that lost the lock removes nothing there); whether it was there.
///
/// # Errors
/// The fence forbids it, or it cannot be removed.
pub(crate) fn remove(fence: Option<&Fence>, path: &Path) -> Result<bool> {
    let Some(f) = fence else {
        return remove_if_there(path).with_context(|| format!("{}: cannot remove", path.display()));
    };
    remove_checked(
        path,
        || f.check(),
        || {
            crate::hooks::kill_in_removal(|| {
                crate::comm::launcher::launcher_rank(|k| std::env::var(k).ok()).unwrap_or(0)
            });
        },
    )
}

/// Removes the object `path` of the output this run's manifest replaced, after that manifest
/// is up, if it is there: as [`remove`], but with only the lock checked ([`Fence::check_lock`]:
/// the manifest there is this run's own), so that a run suspended past its lock after
/// publishing cannot remove what a successor published at that name since.
///
/// # Errors
/// The lock is lost, or the object cannot be removed.
pub(crate) fn remove_after_publish(
    fence: &Fence,
    path: &Path,
    checked: impl FnOnce(),
) -> Result<bool> {
    remove_checked(path, || fence.check_lock(), checked)
}

/// Removes the object `path` if it is there, `check` passed right before (`checked` runs
/// between the two: the test hooks' point).
fn remove_checked(
    path: &Path,
    check: impl Fn() -> Result<()>,
    checked: impl FnOnce(),
) -> Result<bool> {
    // The object is looked at before the fence is checked, and removed only while it is still
    // the one looked at: a run suspended past its lock between the check and the removal then
    // cannot take an object its successor put at the name since (one it saw was there while
    // it held the lock, so not its successor's).
    let sink = storage::sink(path);
    let tag = match sink.tag_of(path) {
        Ok(tag) => tag,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e).with_context(|| format!("{}: cannot look at", path.display())),
    };
    check()?;
    checked();
    if sink
        .remove_file_if(path, tag.as_deref())
        .with_context(|| format!("{}: cannot remove", path.display()))?
    {
        return Ok(true);
    }
    // Another object is at the name since it was looked at, and stays: this run's fence says
    // why where it lost the lock; else the caller's create finds the name taken again.
    check()?;
    Ok(false)
}

fn is_exists(e: &anyhow::Error) -> bool {
    e.chain()
        .filter_map(|c| c.downcast_ref::<std::io::Error>())
        .any(|io| io.kind() == std::io::ErrorKind::AlreadyExists)
}

/// Before the manifest: each object this rank created (`created`, by name under `target`) is
/// found as it left it; one that is not (a late write of a run that lost the lock landed after
/// this run removed what was there, or this run's own create was answered "exists" after a
/// retry) is replaced as [`create`] does, and looked at again. The objects created again, with
/// the MD5 of the bytes sent (their answers are in `created`): what was noted of their first
/// create no longer holds.
///
/// # Errors
/// As [`create`], or one stays another's after [`ATTEMPTS`] rounds.
pub(crate) fn verify(
    local: &Path,
    target: &Path,
    created: &mut [(String, Created)],
    fence: Option<&Fence>,
) -> Result<Vec<(String, [u8; 16])>> {
    let mut again = Vec::new();
    for (rel, made) in created.iter_mut() {
        let to = target.join(rel.as_str());
        let mut rounds = 0;
        let mut md5 = None;
        while !still_created(&to, made)? {
            rounds += 1;
            if rounds > ATTEMPTS {
                bail!(
                    "{}: not the object this run created there, {ATTEMPTS} times (another run \
                     keeps writing this output); nothing is published",
                    to.display()
                );
            }
            replace(fence, &to)?;
            let (now, sent) = create_hashed(local, target, rel, Found::Replace, fence, None)?;
            (*made, md5) = (now, Some(sent));
        }
        if let Some(md5) = md5 {
            again.push((rel.clone(), md5));
        }
    }
    Ok(again)
}

/// Uploads the local file `rel` under `local` to a new object of the same name under `target`
/// (create only). `pause`: the rank whose test hook may pause once the first 16 MiB part is out.
fn upload(
    local: &Path,
    target: &Path,
    rel: &str,
    pause: Option<usize>,
) -> Result<(Created, [u8; 16])> {
    use md5::Digest;
    let (from, to) = (local.join(rel), target.join(rel));
    let mut md5 = md5::Md5::new();
    let input = storage::open(&from).with_context(|| format!("{}: cannot open", from.display()))?;
    let mut out = storage::sink(&to)
        .create_stream_new(&to)
        .with_context(|| format!("{}: cannot start the upload", to.display()))?;
    let mut buf = vec![0u8; CHUNK];
    let mut at = 0u64;
    loop {
        let n = storage::read_up_to_at(input.as_ref(), &mut buf, at)
            .with_context(|| format!("{}: read failed at byte {at}", from.display()))?;
        if n == 0 {
            break;
        }
        out.write_all(&buf[..n])
            .with_context(|| format!("{}: upload failed at byte {at}", to.display()))?;
        md5.update(&buf[..n]);
        at += n as u64;
        if let Some(rank) = pause.filter(|_| at == 2 * CHUNK as u64) {
            // The first 16 MiB part of the rank's last shard is out: a multipart upload is
            // under way, and the rank's other shards are up.
            crate::hooks::pause_in_upload(local.parent().unwrap_or(local), rank);
        }
    }
    let created = out
        .finish_created()
        .with_context(|| format!("{}: the upload did not complete", to.display()))?;
    Ok((created, md5.finalize().into()))
}

/// The staged copy `local` of the run whose lock this one took over by its silence (it may
/// only be suspended, and read its files when it wakes): moved aside, to `.NAME.reshard-left.
/// TOKEN` beside it, not removed, so that this run can stage at `local`.
pub(crate) fn set_aside(local: &Path, token: &str) -> Result<()> {
    let aside = crate::job::destination::scratch::move_aside(local, token)?;
    crate::errln!(
        "reshard: moved {} aside to {}: it is the staged copy of the run whose lock this one \
         took over, which may only be suspended; remove it once that run is surely gone",
        local.display(),
        aside.display()
    );
    Ok(())
}

/// When a run that took part in uploading finds it lost the output's lock (or that another run
/// published meanwhile): what its failure says instead of "rerun with --resume" (nothing of it
/// is the output's, and its staged copy is no longer where it was).
pub(crate) fn lost(fence: Option<&Fence>, target: &Path) -> Option<String> {
    let why = fence?.lost().ok()??;
    Some(format!(
        "nothing of this run is published at {} ({why})",
        target.display()
    ))
}

/// The shards a resumed run keeps from the earlier attempt (`kept`): each still the object that
/// attempt noted (its size, modification time and ETag) in the staged copy's notes, or the size
/// and ETag of its record in the bucket (`records`), not trusted; and its saved index, where the
/// output has one (`names`), at the output and matching the object: checked at the store, so
/// the same whichever node's writer staged it and wrote it again ([`restore_layouts`]).
///
/// # Errors
/// One is not.
pub(crate) fn check_kept(
    local: &Path,
    target: &Path,
    kept: &[String],
    records: &[(String, super::records::Record)],
    names: &HashSet<&str>,
) -> Result<()> {
    let now = |p: &Path| storage::stamp(p).ok().map(|s| super::stamp_line(&s));
    let holds = |k: &String| -> Result<bool> {
        let to = target.join(k.as_str());
        if let Some((_, r)) = records.iter().find(|r| &r.0 == k) {
            let made = Created {
                size: r.size,
                e_tag: Some(r.e_tag.clone()),
            };
            if still_created(&to, &made)? {
                return Ok(true);
            }
        }
        Ok(super::read_note(local, k).is_some_and(|n| Some(n.0) == now(&to)))
    };
    for k in kept {
        if !holds(k)? {
            bail!(
                "{}: kept from the earlier attempt, but it is not the object that attempt noted \
                 any more",
                target.join(k).display()
            );
        }
        let layout = super::layout_of(k);
        if names.contains(layout.as_str()) && !layout_holds(target, k) {
            bail!(
                "{}: the saved index of {k}, kept from the earlier attempt, is not at the output \
                 (or not of that object) after its writer wrote it again",
                target.join(&layout).display()
            );
        }
    }
    Ok(())
}

/// Whether the saved index of `shard` at `target` matches the object.
pub(super) fn layout_holds(target: &Path, shard: &str) -> bool {
    let (object, layout) = (target.join(shard), target.join(super::layout_of(shard)));
    let dir = layout.parent().unwrap_or(target);
    matches!(
        saved_index::load(&object, Some(dir)),
        saved_index::Lookup::Found(_)
    )
}

/// The saved indexes of the shards a resumed run keeps that this rank uploads (`mine`, each with
/// what this run verified of its object: its record's size and ETag, or the earlier attempt's
/// note), at `target`: each written again from this rank's node's `copy` where the output has
/// one (`names`) and the one there does not match the object. That attempt may have died
/// between the shard and its index, or the index may have gone since. Done by the shard's
/// writer, whose node staged the index (rank 0's node may hold none of it).
///
/// Fenced by construction ([`saved_index::write_for`]): the index is stamped with the verified
/// ETag, not with a look at whatever is at the shard's name, and only created (or replaced as
/// read); so a run that lost the lock and writes it late writes nothing a successor believes
/// beside another object, nor over an index a successor wrote. The lock is checked before each
/// write too ([`Fence::check`]), which only spares the requests. `rank`: this rank, whose test
/// hook may stop it right after that check.
///
/// # Errors
/// One cannot be read from `copy` or written, the object at a shard's name is not the one
/// verified, or the run lost the lock.
pub(crate) fn restore_layouts(
    copy: &Path,
    target: &Path,
    mine: &[(&str, saved_index::Verified)],
    names: &HashSet<&str>,
    fence: Option<&Fence>,
    rank: usize,
) -> Result<()> {
    for (shard, verified) in mine {
        let layout = super::layout_of(shard);
        if !names.contains(layout.as_str()) || layout_holds(target, shard) {
            continue;
        }
        if let Some(fence) = fence {
            fence.check()?;
        }
        crate::hooks::kill_at(rank, "layout");
        let (object, to) = (target.join(shard), target.join(&layout));
        match saved_index::write_for(&copy.join(&layout), &object, &to, verified)? {
            saved_index::Restamped::Written | saved_index::Restamped::There => {}
            saved_index::Restamped::NotIt => bail!(
                "{}: kept from the earlier attempt, but it is not the object that attempt \
                 uploaded any more: its saved index is not written",
                object.display()
            ),
        }
    }
    Ok(())
}

/// The side objects an earlier run's create-only uploads left under `target` (on a store that
/// completes them at a side name and then copies them): that run's, never an output's. Removed
/// by the run that holds the lock now; a run that lost it then fails to copy from them.
///
/// # Errors
/// They cannot be listed or removed.
pub(crate) fn remove_side_objects(target: &Path) -> Result<()> {
    let side = target.join(crate::storage::s3::SIDE);
    match storage::sink(&side).remove_dir_all(&side) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(e).with_context(|| format!("{}: cannot remove", side.display()))
        }
        _ => Ok(()),
    }
}

/// This rank's share `todo` (its shards and their per-shard files) uploaded from its node's
/// `copy`, each created (never put over another object), a shard with its saved index, its
/// note and its record in the bucket ([`super::records`]); then each found still as created (before the manifest): the bytes uploaded.
pub(crate) fn upload_share(
    copy: &Path,
    target: &Path,
    todo: &[&(String, u64)],
    names: &HashSet<&str>,
    rank: usize,
    fence: Option<&Fence>,
    sent: &super::progress::Sent,
) -> Result<u64> {
    let mut created = Vec::new();
    let mut sum = 0;
    let noted = |rel: &str, made: &Created, md5| -> Result<()> {
        super::restamp_layout(copy, target, rel, names, made)?;
        super::note_uploaded(copy, target, rel, made)?;
        match fence {
            Some(f) => super::records::note(&f.target, &f.token, rel, made, md5),
            None => Ok(()),
        }
    };
    for (i, f) in todo.iter().enumerate() {
        let pause = (i + 1 == todo.len()).then_some(rank);
        let (made, md5) = create_hashed(copy, target, &f.0, Found::Replace, fence, pause)?;
        if super::is_shard(&f.0) {
            noted(&f.0, &made, md5)?;
            sent.add(f.1);
        }
        sum += made.size;
        created.push((f.0.clone(), made));
    }
    // A shard created again: its saved index, note and record of the first create are stale
    // (a resume would upload it again), so they are written again.
    for (rel, md5) in verify(copy, target, &mut created, fence)? {
        if let Some((_, made)) = created.iter().find(|c| c.0 == rel) {
            if super::is_shard(&rel) {
                noted(&rel, made, md5)?;
            }
        }
    }
    Ok(sum)
}
