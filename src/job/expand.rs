//! Phase "expand": rank 0 expands the input spec into the ordered shard list, takes the output's
//! lock (one run at a time per output, see [`crate::job::destination::lock`]), checks the output (refusing
//! what would replace an input or a non-empty directory) and creates the staging directory next
//! to it, or with `--resume` checks that an earlier attempt's staging directory continues this
//! request; every rank receives the result.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::config::{ExpandSettings, JobSettings, ResumeSettings, UploadSettings};
use crate::input::{expand_specs, InputShard};
use crate::job::destination::life::{self, may_replace, StagingSteps};
use crate::job::destination::link::check_link_before_the_run;
use crate::job::destination::lock::{lock_of, OutputLock};
use crate::job::destination::owned::inspect;
use crate::job::destination::resume;
use crate::job::destination::series::say_what_keep_would_remove;
use crate::job::destination::staging::{self, Staging};
use crate::job::destination::{by_rename, scratch, upload, Held};
use crate::job::handoff::{Resume, Setup};
use crate::output::checkpoint::{self, InputRecord};
use crate::report::narrate::count;
use crate::size::human_bytes;
use crate::storage::{self, Kind};
use crate::tree::{self, Root};

/// Rank 0: [`prepare`], for the output the job's settings name, wherever it is.
///
/// # Errors
/// As [`prepare`].
pub(crate) fn run(settings: &JobSettings) -> Result<(Setup, Held)> {
    prepare(&settings.expand, &settings.resume, Some(&settings.upload))
}

/// Rank 0's checks and set-up before any data is read: expand the input, then the output's life
/// before the commit, one [`life::prepare`] per run: over [`OnDisk`] for an output on a file
/// system, over the upload's strategy (its lock and marker in the bucket, its staging directory
/// on `--scratch`, [`StagingDir`]) for an object store's (`upload`, whose `target` says where).
/// It takes the output's lock, refuses unsafe outputs, creates the staging directory or finds
/// the one `--resume` continues (not when only planning: a plan writes nothing).
///
/// # Errors
/// An input that cannot be found or read, another live run on the same output, an output that
/// would replace an input or a non-empty directory (without `--force`; with it, anything but a
/// reshard output), a `--link` that is not a
/// symbolic link, a staging directory that cannot be created, or one that `--resume` cannot
/// continue (a [`crate::cli::resolve::UsageError`]).
pub(crate) fn prepare(
    settings: &ExpandSettings,
    resuming: &ResumeSettings,
    upload: Option<&UploadSettings>,
) -> Result<(Setup, Held)> {
    let Some(out) = &settings.output else {
        // Only planning, without an output to check.
        let (inputs, _, trees) = expand_inputs(settings)?;
        return Ok((Setup::planning(inputs, trees), Held::default()));
    };
    let bucket = upload.filter(|u| u.target.is_some());
    // An output on a file system is looked at once the inputs are known; an object store's
    // lock is taken, and its store cleared and checked, first (the inputs are then expanded
    // for the staging directory's check, [`StagingDir::expand`]).
    let expanded = match bucket {
        Some(cfg) => upload::make_scratch(cfg).map(|()| None)?,
        None => Some(expand_inputs(settings)?),
    };
    let (target, pointer) = output_paths(out, settings.dry_run)?;
    let mut dir = StagingDir {
        settings,
        resuming,
        out,
        target: &target,
        pointer: &pointer,
        expanded,
        for_store: bucket.is_some(),
        remote: bucket.and_then(|b| b.target.as_deref()),
        staged: None,
    };
    let (own, remote) = match bucket {
        Some(cfg) => (None, upload::prepare(cfg, &mut dir)?),
        None => {
            let mut on_disk = OnDisk {
                dir: &mut dir,
                own: None,
            };
            life::prepare(&mut on_disk)?;
            (on_disk.own, None)
        }
    };
    let (inputs, records, trees) = match dir.expanded.take() {
        Some(expanded) => expanded,
        None => expand_inputs(settings)?,
    };
    let Some((staging, resume)) = dir.staged else {
        // Checked as `run` would, but nothing is created, removed or written.
        return Ok((Setup::planning(inputs, trees), Held::default()));
    };
    let setup = Setup {
        inputs,
        staging: Some(staging),
        target: Some(target),
        resume,
        trees,
        files: None,
        walk: Default::default(),
    };
    Ok((
        setup,
        Held {
            lock: own,
            inputs: records,
            remote,
        },
    ))
}

/// The staging directory of an output on a file system, or of the copy an object store's
/// output is staged in on `--scratch` (the output here is that copy), for the output's life.
struct StagingDir<'a> {
    settings: &'a ExpandSettings,
    resuming: &'a ResumeSettings,
    out: &'a Path,
    target: &'a Path,
    pointer: &'a Path,
    /// The inputs, their records and the `--input-files` roots, once expanded.
    expanded: Option<Expanded>,
    /// The copy an object store's output is staged in on `--scratch`, not an output.
    for_store: bool,
    /// That object store's output, which no input may be under either.
    remote: Option<&'a Path>,
    /// The staging directory begun, and what `--resume` continues there (none in a dry run).
    staged: Option<(PathBuf, Option<Resume>)>,
}

/// The inputs, rank 0's records of them, the `--input-files` roots ([`expand_inputs`]).
type Expanded = (Vec<InputShard>, Vec<InputRecord>, Vec<Root>);

impl StagingDir<'_> {
    /// The inputs expanded, if they are not yet.
    fn expand(&mut self) -> Result<&Expanded> {
        let settings = self.settings;
        match &mut self.expanded {
            Some(expanded) => Ok(expanded),
            none => Ok(none.insert(expand_inputs(settings)?)),
        }
    }
}

impl StagingSteps for StagingDir<'_> {
    /// Only the heartbeats a run stopped while it published (the watchdog ended it) left
    /// beside its staging directory, once its pid proved it dead: nothing continues them. Its
    /// staging directory, which `--resume` may continue, is taken only by [`Self::begin`].
    fn clear_failed(&mut self, lock: Option<&OutputLock>) -> Result<()> {
        let Some(lock) = lock else {
            return Ok(());
        };
        if let Some(dead) = lock.dead_predecessor() {
            Staging::at(&staging::run_dir(self.pointer, dead)).remove_heartbeats_aside();
        }
        // A copy staged on `--scratch` for an object store never replaced an output there.
        if self.for_store {
            return Ok(());
        }
        finish_replaced_output(lock, self.pointer, self.target)
    }

    fn check_replace(&mut self, taken: bool) -> Result<()> {
        let (settings, out, target, pointer) = (self.settings, self.out, self.target, self.pointer);
        let remote = self.remote;
        let (inputs, _, trees) = self.expand()?;
        check_output(settings, (out, target, taken), pointer, inputs)?;
        if let Some(remote) = remote {
            check_not_over_inputs(remote, inputs, trees)?;
        }
        check_not_in_a_root(out, target, trees)
    }

    /// The staging directory ([`take_staging`]); a dry run says what `--keep` would remove.
    fn begin(&mut self, lock: Option<&OutputLock>, named: Option<Option<&str>>) -> Result<()> {
        let Some(lock) = lock else {
            if let Some(keep) = &self.settings.keep {
                say_what_keep_would_remove(self.target, keep, self.settings.epoch)?;
            }
            return Ok(());
        };
        let (resume, resuming, pointer) = (self.settings.resume, self.resuming, self.pointer);
        let (_, records, _) = self.expand()?;
        let staged = take_staging((resume, resuming), (lock, named), pointer, records)?;
        self.staged = Some(staged);
        Ok(())
    }
}

/// The steps before the commit of an output on a file system, for the output's life: its lock
/// beside it; all else is its staging directory's.
struct OnDisk<'a, 'b> {
    dir: &'b mut StagingDir<'a>,
    /// The lock this run took beside the output (none in a dry run).
    own: Option<OutputLock>,
}

impl life::Prepare for OnDisk<'_, '_> {
    /// Before anything is checked or touched: another live run may be writing this output.
    fn take_lock(&mut self) -> Result<()> {
        let (settings, out) = (self.dir.settings, self.dir.out);
        self.own = (!settings.dry_run)
            .then(|| OutputLock::acquire(&lock_of(self.dir.target), out, settings.lock_stale_after))
            .transpose()?;
        Ok(())
    }

    fn clear_failed(&mut self) -> Result<()> {
        Ok(())
    }

    fn check_replace(&mut self) -> Result<()> {
        Ok(())
    }

    fn begin(&mut self) -> Result<()> {
        Ok(())
    }

    fn staging(&mut self) -> life::StagingPart<'_> {
        life::StagingPart {
            lock: self.own.as_ref(),
            steps: &mut *self.dir,
            taken: false,
            named: None,
        }
    }
}

/// This run's staging directory, named after its token, and what `--resume` continues there.
/// The directory the staging `pointer` leads to (the run that last took the lock) is this
/// run's only when that run surely ended ([`OutputLock::may_take`]): `--resume` then renames it
/// to this run's name before it reads anything in it (the earlier run's paths lead nowhere from
/// then on), and a run without `--resume` removes it. The pointer then leads to this run's.
/// Staged on `--scratch` for an object store (`named`: the token of the failed run the bucket's
/// marker names, if any), a copy found with the lock free is taken only as
/// [`scratch::may_take_copy`] allows.
///
/// # Errors
/// As [`continue_staging`] and [`create_staging`], or the pointer cannot be read or set.
fn take_staging(
    (resume, resuming): (bool, &ResumeSettings),
    (lock, named): (&OutputLock, Option<Option<&str>>),
    pointer: &Path,
    records: &[InputRecord],
) -> Result<(PathBuf, Option<Resume>)> {
    let staging = lock.run_dir(pointer);
    let earlier = staging::pointed(pointer)
        .with_context(|| format!("{}: cannot read the staging pointer", pointer.display()))?;
    let earlier = match earlier {
        Some(e) if lock.may_take(&e, pointer)? => Some(e),
        _ => None,
    };
    let earlier = earlier.filter(|e| match named {
        Some(named) if lock.found_free() => scratch::may_take_copy(e, pointer, named),
        _ => true,
    });
    // A run stopped while it published (the watchdog ended it) left its heartbeats beside its
    // staging directory, which its rename may have published: they go once it surely ended
    // (a run its pid proved dead: cleared before the checks, `StagingDir::clear_failed`).
    if let Some(ended) = &earlier {
        Staging::at(ended).remove_heartbeats_aside();
    }
    let mut continued = None;
    if resume {
        if let Some(earlier) = &earlier {
            // Pointed at at once: a rerun after a refusal below finds it.
            adopt(earlier, &staging)?;
            point(pointer, &staging)?;
        }
        continued = continue_staging(resuming, &staging, records)?;
    } else if let Some(earlier) = &earlier {
        remove_earlier(earlier)?;
    }
    if continued.is_none() {
        if resume && Staging::at(&staging).present() {
            Staging::at(&staging)
                .remove()
                .with_context(|| format!("{}: cannot remove", staging.display()))?;
        }
        create_staging(&staging)?;
    }
    lock.mark_staging(&staging)?;
    point(pointer, &staging)?;
    Ok((staging, continued))
}

fn point(pointer: &Path, staging: &Path) -> Result<()> {
    staging::point(pointer, staging).with_context(|| {
        format!(
            "{}: cannot point the staging pointer at {}",
            pointer.display(),
            staging.display()
        )
    })
}

/// A `--force` run cut short between its publishing exchange and the end of the replaced
/// output's removal (killed, its node lost) left that output at its staging name, where the
/// `pointer` leads, with whatever the user had put in it: its removal is finished as `--force`
/// does it ([`by_rename::finish_replaced`]: only what reshard wrote of it goes, the user's files
/// are carried into the output at `target`), never by removing the directory whole. Only where
/// that run surely ended: the lock was free, or taken over from it by its dead pid.
///
/// # Errors
/// The pointer cannot be read, or the removal cannot be finished.
fn finish_replaced_output(lock: &OutputLock, pointer: &Path, target: &Path) -> Result<()> {
    let Some((earlier, kind)) = staging::pointed_entry(pointer)
        .with_context(|| format!("{}: cannot read the staging pointer", pointer.display()))?
    else {
        return Ok(());
    };
    let ended = match lock.dead_predecessor() {
        Some(dead) => earlier == staging::run_dir(pointer, dead),
        None => lock.found_free(),
    };
    // A link at the run directory's name (the output was a symbolic link when the exchange
    // swapped it there) is moved aside by `finish_replaced`, never followed.
    let replaced = kind == Kind::Link || Staging::at(&earlier).holds_a_replaced_output();
    if !ended || earlier == pointer || !replaced {
        return Ok(());
    }
    crate::errln!(
        "reshard: finishing the removal of the output {} replaced, which {} still holds (the --force run that published it ended before it was done): what reshard wrote of it goes, the files it held that reshard did not write are kept",
        target.display(),
        earlier.display()
    );
    by_rename::finish_replaced(&earlier, target)?;
    staging::unpoint(pointer, &earlier);
    Ok(())
}

/// `--resume`: the earlier run's staging directory becomes this run's, by one rename; from then
/// on nothing the earlier run writes by path reaches it.
fn adopt(earlier: &Path, staging: &Path) -> Result<()> {
    storage::sink(staging)
        .rename(earlier, staging)
        .with_context(|| {
            format!(
                "--resume: cannot take over the staging directory {} as {}",
                earlier.display(),
                staging.display()
            )
        })
}

/// `--resume`: what the staging directory an earlier attempt left holds to continue from, once
/// checked against this request; `None` (and a note) when there is nothing to continue.
fn continue_staging(
    resuming: &ResumeSettings,
    staging: &Path,
    inputs: &[InputRecord],
) -> Result<Option<Resume>> {
    let plan = if Staging::at(staging).present() {
        checkpoint::read_plan(staging)?
    } else {
        None
    };
    let Some(plan) = plan else {
        crate::errln!(
            "reshard: --resume: no earlier attempt to continue in {} (none ran, or it stopped before moving data): starting from the beginning",
            staging.display()
        );
        return Ok(None);
    };
    resume::check_same_request(&plan, &resume::arguments(resuming), inputs, staging)?;
    let checkpoint = checkpoint::read_checkpoint(staging)?.unwrap_or_default();
    crate::errln!(
        "reshard: --resume: continuing the run in {}: {} durably in place ({}; that run had {}, {} per rank)",
        staging.display(),
        count(checkpoint.done.count(), "sample"),
        count(checkpoint.checkpoints, "checkpoint"),
        count(plan.ranks as u64, "rank"),
        human_bytes(plan.mem_limit)
    );
    // What the earlier attempt's finish phase may have left is made again.
    Staging::at(staging)
        .prepare_resume()
        .with_context(|| format!("{}: cannot prepare to resume", staging.display()))?;
    Ok(Some(Resume {
        checkpoint,
        digest: plan.digest,
    }))
}

/// The input spec, expanded, with every shard's size, then the `--input-files` roots' units
/// (sized by the walk phase); rank 0's records of the shards; the roots.
fn expand_inputs(
    settings: &ExpandSettings,
) -> Result<(Vec<InputShard>, Vec<InputRecord>, Vec<Root>)> {
    let paths = expand_specs(&settings.inputs)?;
    crate::input::refuse_equalized_output(&paths)?;
    let mut inputs = Vec::with_capacity(paths.len());
    let mut records = Vec::with_capacity(paths.len());
    for path in paths {
        let stamp = storage::stamp(&path).with_context(|| format!("input {}", path.display()))?;
        let input = InputShard {
            path,
            size: stamp.size,
        };
        records.push(resume::input_record(&input, &stamp));
        inputs.push(input);
    }
    let (units, trees) = tree::expand(&settings.files)?;
    // Stamped once walked (`resume::record_units`); a resumed run's units are the same
    // locations (the cut depends on the tree alone).
    records.extend(
        units
            .iter()
            .map(|u| resume::input_record(u, &Default::default())),
    );
    inputs.extend(units);
    Ok((inputs, records, trees))
}

/// An output inside an `--input-files` root would be packed by the next run from that root.
fn check_not_in_a_root(out: &Path, target: &Path, trees: &[Root]) -> Result<()> {
    for root in trees {
        if target.starts_with(&root.canonical) {
            bail!(
                "--output {} is inside the --input-files root {}: choose an output outside it",
                out.display(),
                root.path.display()
            );
        }
    }
    Ok(())
}

/// The output's absolute path and its staging directory beside it. A missing parent directory
/// is created (as `--scratch` is), and said; a dry run only says it would be.
fn output_paths(out: &Path, dry_run: bool) -> Result<(PathBuf, PathBuf)> {
    let name = out.file_name().with_context(|| {
        format!(
            "--output {}: expected a directory name (not '.', '..' or '/')",
            out.display()
        )
    })?;
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let cannot = || {
        format!(
            "--output {}: cannot create its parent directory {}",
            out.display(),
            parent.display()
        )
    };
    let parent = match storage::source(parent).canonical(parent) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && dry_run => {
            crate::errln!(
                "reshard: --dry-run: would create {} for the output",
                parent.display()
            );
            std::path::absolute(parent).with_context(cannot)?
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            storage::sink(parent)
                .create_dir_all(parent)
                .with_context(cannot)?;
            crate::errln!("reshard: created {} for the output", parent.display());
            storage::source(parent)
                .canonical(parent)
                .with_context(cannot)?
        }
        other => other.with_context(|| {
            format!(
                "--output {}: its parent directory {} cannot be resolved",
                out.display(),
                parent.display()
            )
        })?,
    };
    let staging = crate::job::destination::staging::path_for(&parent, name);
    Ok((parent.join(name), staging))
}

/// Refuses an object store's output `remote` where an input is under it, or an `--input-files`
/// root overlaps it: its `--force` would replace the input's objects, as a file system's output
/// is refused ([`check_output`], [`check_not_in_a_root`]).
///
/// # Errors
/// An input is under `remote`, or a path cannot be resolved.
fn check_not_over_inputs(remote: &Path, inputs: &[InputShard], trees: &[Root]) -> Result<()> {
    let target = storage::source(remote)
        .canonical(remote)
        .with_context(|| format!("--output {}", remote.display()))?;
    refuse_an_input_under(remote, "an output", inputs, |canon| {
        key_under(canon, &target)
    })?;
    for root in trees {
        if key_under(&root.canonical, &target) || key_under(&target, &root.canonical) {
            bail!(
                "--output {} and the --input-files root {} overlap: its --force would replace \
                 the root's objects; choose an output outside it",
                remote.display(),
                root.path.display()
            );
        }
    }
    Ok(())
}

/// Refuses the output `out` where an input's resolved path is `under` it (`choose`: what to
/// choose instead, for the message).
///
/// # Errors
/// An input is under it, or an input's path cannot be resolved.
fn refuse_an_input_under(
    out: &Path,
    choose: &str,
    inputs: &[InputShard],
    under: impl Fn(&Path) -> bool,
) -> Result<()> {
    for input in inputs {
        let canon = storage::source(&input.path)
            .canonical(&input.path)
            .with_context(|| format!("input {}", input.path.display()))?;
        if under(&canon) {
            bail!(
                "--output {} would replace the input {}: choose {choose} that holds no input",
                out.display(),
                input.path.display()
            );
        }
    }
    Ok(())
}

/// Whether the object store location `path` is `under` or inside it, by the keys' own
/// components, split at each `/` as the store names them: `Path::starts_with` drops `.`
/// components and repeated separators, which on an object store are parts of other keys
/// (`s3://b/./out/x.tar` is not under `s3://b/out`).
fn key_under(path: &Path, under: &Path) -> bool {
    let (path, under) = (path.to_string_lossy(), under.to_string_lossy());
    let under = under.trim_end_matches('/');
    path.strip_prefix(under)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// Refuses an output that would replace an input, a non-empty output without `--force`, with
/// `--force` anything but an empty directory or a reshard output, and a `--link` that is not a
/// symbolic link. `taken`: what is at the output is a copy an earlier attempt staged for an
/// object store, which that store's `begin` takes before anything is written here.
fn check_output(
    settings: &ExpandSettings,
    (out, target, taken): (&Path, &Path, bool),
    staging: &Path,
    inputs: &[InputShard],
) -> Result<()> {
    refuse_an_input_under(out, "an output directory", inputs, |canon| {
        canon.starts_with(target) || canon.starts_with(staging)
    })?;
    let at_target = storage::source(target);
    if at_target
        .stat_link(target)
        .is_ok_and(|s| s.kind == Kind::Link)
    {
        // Refused now: publishing renames a directory into place, which never goes through
        // a link (it would fail, or with --force refuse, only after the whole job ran).
        bail!(
            "--output {}: is a symbolic link; reshard publishes by renaming a directory to that \
             path, not into where the link leads: give the directory itself (see readlink -f), \
             or --link to keep a link pointing at each new output",
            out.display()
        );
    }
    if at_target.stat(target).is_ok_and(|s| s.kind != Kind::Dir) {
        bail!("--output {}: exists and is not a directory", out.display());
    }
    // The rule of what a run may replace (life's, on every store): refused now, before any
    // work, and asked again when publishing.
    if !taken {
        may_replace(out, &inspect(target)?, settings.force, "before the run")?;
    }
    if let Some(link) = &settings.link {
        check_link_before_the_run(link, target)?;
    }
    Ok(())
}

/// Removes the staging directory an earlier run left that did not finish (it surely ended:
/// see [`OutputLock::may_take`]), saying whether `--resume` would have continued it.
fn remove_earlier(earlier: &Path) -> Result<()> {
    let durable = checkpoint::read_checkpoint(earlier)
        .ok()
        .flatten()
        .map(|c| {
            format!(
                " ({} samples of it were durable: --resume would have continued it)",
                c.done.count()
            )
        })
        .unwrap_or_default();
    crate::errln!(
        "reshard: removing {} left by an earlier run that did not finish{durable}",
        earlier.display()
    );
    Staging::at(earlier)
        .remove()
        .with_context(|| format!("{}: cannot remove", earlier.display()))
}

/// Creates this run's staging directory, with the saved-index and heartbeat directories inside.
fn create_staging(staging: &Path) -> Result<()> {
    Staging::at(staging).create().with_context(|| {
        format!(
            "cannot create the staging directory {} (is the output's parent writable?)",
            staging.display()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_object_key_is_under_an_output_by_its_own_components() {
        let out = Path::new("s3://b/out");
        assert!(key_under(Path::new("s3://b/out/x.tar"), out));
        assert!(key_under(Path::new("s3://b/out"), out));
        assert!(key_under(
            Path::new("s3://b/out/x.tar"),
            Path::new("s3://b/out/")
        ));
        // Other keys, which `Path::starts_with` takes for the same (it drops `.` and `//`).
        assert!(!key_under(Path::new("s3://b/./out/x.tar"), out));
        assert!(!key_under(Path::new("s3://b//out/x.tar"), out));
        assert!(!key_under(Path::new("s3://b/outer/x.tar"), out));
        assert!(Path::new("s3://b/./out/x.tar").starts_with(out));
    }
}
