//! How an output on a file system becomes live and what follows, for the output's life
//! ([`crate::job::destination::life`]): the finished staging directory is renamed to the output
//! in one rename that replaces nothing (with `--force`: an atomic exchange with an older output
//! of reshard, which then goes from the staging name); `--link` is a symbolic link replaced by a
//! rename; `--keep` moves an older output aside before removing it.

use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::config::Keep;
use crate::hooks;
use crate::job::destination::life::{may_replace, Commit};
use crate::job::destination::link::{check_link, relative_target};
use crate::job::destination::lock::OutputLock;
use crate::job::destination::owned::{inspect, AtOutput, OutputManifest};
use crate::job::destination::series::{clear_aside, remove_epoch, unfinished_removals};
use crate::job::destination::staging;
use crate::job::destination::written::{self, Written};
use crate::output::checkpoint;
use crate::storage::{self, Kind};

/// A finished staging directory and the output it becomes.
pub(crate) struct ByRename<'a> {
    pub(crate) staging: &'a Path,
    pub(crate) target: &'a Path,
    pub(crate) force: bool,
    /// The output's lock, checked right before the rename.
    pub(crate) lock: Option<&'a OutputLock>,
    /// The staged copy of an object store's output: not the output yet, so its `--resume`
    /// records stay until it is uploaded.
    pub(crate) staged_for_upload: bool,
}

impl Commit for ByRename<'_> {
    fn target(&self) -> &Path {
        self.target
    }

    fn check_owned(&self) -> Result<()> {
        self.lock
            .map_or(Ok(()), |l| l.check_before_publish(self.staging))
    }

    fn commit(&self) -> Result<bool> {
        publish(self.force, self.staging, self.target)
    }

    fn drop_records(&self) -> Result<()> {
        let records = checkpoint::dir(self.target);
        if self.staged_for_upload || storage::source(&records).stat(&records).is_err() {
            return Ok(());
        }
        storage::sink(&records)
            .remove_dir_all(&records)
            .with_context(|| format!("{}: cannot remove", records.display()))
    }

    /// The replaced output waits at the staging name, where the exchange put it: only what
    /// reshard wrote of it goes ([`written`]), and what is left (the user's own) is carried into
    /// the new output where its name is free there, or else left in a directory the message
    /// names.
    fn remove_replaced(&self, replaced: bool) -> Result<()> {
        if !replaced {
            return Ok(());
        }
        finish_replaced(self.staging, self.target)
    }

    fn release_staging(&self) -> Result<()> {
        staging::unpoint(&staging::pointer_of(self.staging), self.staging);
        Ok(())
    }

    fn point_link(&self, link: &Path) -> Result<()> {
        point_link(link, self.target)
    }

    fn unfinished_removals(&self, keep: &Keep) -> Result<(Vec<PathBuf>, &'static str)> {
        let aside = unfinished_removals(self.target, keep)?;
        Ok((aside, "an earlier run moved it aside"))
    }

    fn finish_removal(&self, half: &Path) -> Result<()> {
        clear_aside(half)
    }

    fn remove_older(&self, old: &Path) -> Result<()> {
        remove_epoch(old)
    }
}

/// The output `target` replaced, waiting at the staging name `staging` where the exchange put
/// it, goes as `--force` removes it: only what reshard wrote of it ([`written`]), and what is
/// left (the user's own) is carried into the output at `target` where its name is free there,
/// or else left in a directory the message names. The publishing run does it right after its
/// exchange; a next run finishes it where that run was cut short
/// ([`crate::job::destination::staging::Staging::holds_a_replaced_output`]).
///
/// # Errors
/// Something of it cannot be removed or moved.
pub(crate) fn finish_replaced(staging: &Path, target: &Path) -> Result<()> {
    let failed = || {
        format!(
            "{}: cannot remove the replaced output (the next run on this output removes it)",
            staging.display()
        )
    };
    // A symbolic link put at the output after the exchange's check was swapped here: what it
    // leads to is not the output this run replaced, and nothing is removed through it.
    if storage::source(staging)
        .stat_link(staging)
        .is_ok_and(|st| st.kind == storage::Kind::Link)
    {
        return leave_replaced(staging, target, Left::Link);
    }
    // Checked at the exchange: its index.json is reshard's (were it not any more, nothing
    // of it can be told to be reshard's: it is all left, and the message says where).
    let Ok(manifest) = OutputManifest::parse(staging) else {
        return leave_replaced(staging, target, Left::All);
    };
    let written = Written::of(Some(&manifest));
    if !written::remove_written(staging, &written).with_context(failed)? {
        return storage::sink(staging)
            .remove_dir_all(staging)
            .with_context(failed);
    }
    if inspect(target)? != AtOutput::ReshardOutput {
        // The output it was replaced by is not there any more (moved away since): nothing
        // to carry the user's files into.
        return leave_replaced(staging, target, Left::NoOutput);
    }
    let left = written::carry(staging, target).with_context(failed)?;
    if !left.is_empty() {
        leave_replaced(staging, target, Left::Taken(&left))?;
    }
    Ok(())
}

/// What is left of a replaced output once reshard's own went, and why.
enum Left<'a> {
    /// All of it: its index.json is not reshard's any more, so nothing of it can be told to be.
    All,
    /// A symbolic link put at the output after this run checked it, swapped in its place.
    Link,
    /// The user's files: the output that replaced it is not at its path any more.
    NoOutput,
    /// The user's files whose names (relative to the staging name) the new output also has.
    Taken(&'a [PathBuf]),
}

/// What is left of the output `target` replaced (`left`; the staging name `staging` holds it)
/// moved from the staging name (which a next run may take) to one no run removes,
/// `NAME.reshard-replaced`, and named in the run's message. The new output is published all the
/// same.
///
/// # Errors
/// It cannot be moved.
fn leave_replaced(staging: &Path, target: &Path, left: Left<'_>) -> Result<()> {
    let name = target
        .file_name()
        .with_context(|| format!("--output {}: not a file name", target.display()))?
        .to_string_lossy();
    let sink = storage::sink(target);
    let mut n = 0;
    let kept = loop {
        let suffix = if n == 0 {
            String::new()
        } else {
            format!("-{n}")
        };
        let kept = target.with_file_name(format!("{name}.reshard-replaced{suffix}"));
        match sink.rename_noreplace(staging, &kept) {
            Ok(()) => break kept,
            Err(e) if e.kind() == ErrorKind::AlreadyExists && n < 1000 => n += 1,
            Err(e) => {
                return Err(e).with_context(|| {
                    format!(
                        "{} is published; what is left of the output it replaced stays in {}",
                        target.display(),
                        staging.display()
                    )
                })
            }
        }
    };
    let left = match left {
        Left::All => {
            crate::errln!(
                "reshard: --force: {} is published; the output it replaced no longer holds reshard's index.json, so nothing of it was removed: it is left in {}",
                target.display(),
                kept.display()
            );
            return Ok(());
        }
        Left::Link => {
            crate::errln!(
                "reshard: --force: {} is published; what it replaced was a symbolic link put there after this run checked the output, so nothing was removed through it: the link is left in {}",
                target.display(),
                kept.display()
            );
            return Ok(());
        }
        Left::NoOutput => {
            crate::errln!(
                "reshard: --force: what reshard wrote of the output {} replaced was removed; the files it held that reshard did not write are left in {} ({} is not there to move them into)",
                target.display(),
                kept.display(),
                target.display()
            );
            return Ok(());
        }
        Left::Taken(left) => left,
    };
    let shown: Vec<String> = left
        .iter()
        .take(3)
        .map(|p| p.display().to_string())
        .collect();
    let more = match left.len() - shown.len() {
        0 => String::new(),
        more => format!(" and {more} more"),
    };
    crate::errln!(
        "reshard: --force: {} is published; the output it replaced held files reshard did not write whose names the new output also has ({}{more}): they are left in {}, with nothing of reshard's (the rest of yours was moved into {})",
        target.display(),
        shown.join(", "),
        kept.display(),
        target.display()
    );
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
    let replaced = force && may_replace(target, &inspect(target)?, force, "at publishing")?;
    if replaced {
        drop_replaced_records(target)?;
    }
    hooks::kill_at(0, "rename");
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
    hooks::kill_at(0, "renamed");
    Ok(replaced)
}

/// Before `--force` exchanges the older output `target` with its staging directory: the
/// checkpoint records the older output kept (its run was killed between its rename and their
/// removal) go, and durably so, before the exchange. They are reshard's ([`written`]) and
/// describe a run that published: nothing resumes from them, and `--force` would remove them
/// with the rest of the output right after the exchange. Removed now, the replaced output never
/// holds `.resume/` at the staging name, which is how the next run tells it from a failed run's
/// staging directory should this run be cut short before its removal
/// ([`staging::Staging::holds_a_replaced_output`]); kept, it would be taken for one and removed
/// whole, the user's files inside with it.
///
/// # Errors
/// They cannot be removed: nothing is published, the staging directory stays for `--resume`.
fn drop_replaced_records(target: &Path) -> Result<()> {
    let records = checkpoint::dir(target);
    let sink = storage::sink(&records);
    let removed = match storage::source(&records).stat_link(&records) {
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
        Ok(s) if s.kind == Kind::Dir => sink.remove_dir_all(&records),
        _ => sink.remove_file(&records),
    };
    removed.with_context(|| {
        format!(
            "{}: cannot remove the checkpoint records of the output --force replaces (nothing was published)",
            records.display()
        )
    })?;
    sync_dir(target)
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

    use super::*;
    use crate::job::destination::life::{after_commit, Rules};
    use crate::output::manifest::Manifest;
    use crate::output::saved_index;

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

    /// The records an older output kept (its run killed between its rename and their removal)
    /// go before the exchange, whatever form they have: the output that then waits at the
    /// staging name is told from a run's staging directory, the user's file inside it.
    #[test]
    fn force_drops_the_records_an_older_output_kept_before_the_exchange() {
        for dir_form in [true, false] {
            let tmp = tempfile::tempdir().unwrap();
            let (staging, target) = staged(tmp.path());
            fs::create_dir_all(checkpoint::dir(&staging)).unwrap();
            fs::write(checkpoint::dir(&staging).join("plan.json"), b"this run's").unwrap();
            reshard_output(&target);
            fs::write(target.join("README"), b"the user's").unwrap();
            let kept = checkpoint::dir(&target);
            if dir_form {
                fs::create_dir(&kept).unwrap();
                fs::write(kept.join("plan.json"), b"the published run's").unwrap();
            } else {
                fs::write(&kept, b"the published run's").unwrap();
            }
            assert!(publish(true, &staging, &target).unwrap(), "replaced");
            let waiting = staging::Staging::at(&staging);
            assert!(!waiting.resume_records().exists(), "dir form: {dir_form}");
            assert!(waiting.holds_a_replaced_output(), "dir form: {dir_form}");
            assert_eq!(fs::read(staging.join("README")).unwrap(), b"the user's");
            assert_eq!(
                fs::read(checkpoint::dir(&target).join("plan.json")).unwrap(),
                b"this run's",
                "the new output's records, removed after the exchange"
            );
        }
        // Without --force nothing is replaced, and an output's records are not touched.
        let tmp = tempfile::tempdir().unwrap();
        let (staging, target) = staged(tmp.path());
        reshard_output(&target);
        fs::create_dir(checkpoint::dir(&target)).unwrap();
        assert!(publish(false, &staging, &target).is_err());
        assert!(checkpoint::dir(&target).is_dir());
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
        let rules = Rules {
            link: Some(&link),
            keep: None,
            epoch: 0,
        };
        let strategy = ByRename {
            staging: &staging,
            target: &target,
            force: true,
            lock: None,
            staged_for_upload: false,
        };
        after_commit(&strategy, true, &rules).unwrap();
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
}
