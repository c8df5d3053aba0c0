//! Phase "expand": rank 0 expands the input spec into the ordered shard list, takes the output's
//! lock (one run at a time per output, see [`crate::job::destination::lock`]), checks the output (refusing
//! what would replace an input or a non-empty directory) and creates the staging directory next
//! to it, or with `--resume` checks that an earlier attempt's staging directory continues this
//! request; every rank receives the result.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::config::JobSettings;
use crate::config::{ExpandSettings, ResumeSettings};
use crate::input::{expand_specs, InputShard};
use crate::job::destination::link::check_link;
use crate::job::destination::lock::{lock_path, OutputLock};
use crate::job::destination::owned::check_replaceable;
use crate::job::destination::resume;
use crate::job::destination::series::say_what_keep_would_remove;
use crate::job::destination::staging::Staging;
use crate::job::destination::{self, Held};
use crate::job::handoff::{Resume, Setup};
use crate::output::checkpoint::{self, InputRecord};
use crate::report::narrate::count;
use crate::size::human_bytes;
use crate::storage::{self, Kind};

/// Rank 0: the output's location made ready by its own kind first ([`destination::prepare`]:
/// an `s3://` output's lock object), then [`prepare`].
///
/// # Errors
/// As [`destination::prepare`] and [`prepare`].
pub(crate) fn run(settings: &JobSettings) -> Result<(Setup, Held)> {
    let remote = destination::prepare(&settings.upload)?;
    let (setup, mut held) = prepare(&settings.expand, &settings.resume)?;
    held.remote = remote;
    Ok((setup, held))
}

/// Rank 0's checks and set-up before any data is read: expand the input, take the output's
/// lock, refuse unsafe outputs, create the staging directory next to the output or find the one
/// `--resume` continues (not when only planning: a plan writes nothing).
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
) -> Result<(Setup, Held)> {
    let (inputs, records) = expand_inputs(settings)?;
    let Some(out) = &settings.output else {
        // Only planning, without an output to check.
        return Ok((Setup::planning(inputs), Held::default()));
    };
    let (target, staging) = output_paths(out)?;
    // Before anything is checked or touched: another live run may be writing this output.
    let lock = (!settings.dry_run)
        .then(|| OutputLock::acquire(&lock_path(&staging), out, settings.lock_stale_after))
        .transpose()?;
    check_output(settings, out, &target, &staging, &inputs)?;
    if settings.dry_run {
        // Checked as `run` would, but nothing is created, removed or written.
        if let Some(keep) = &settings.keep {
            say_what_keep_would_remove(&target, keep, settings.epoch)?;
        }
        return Ok((Setup::planning(inputs), Held::default()));
    }
    if let Some(lock) = &lock {
        // Taken over from a run that may only be suspended: its staging directory is not ours
        // to continue or remove.
        lock.set_aside_staging(&staging)?;
    }
    let resume = if settings.resume {
        continue_staging(resuming, &staging, &records)?
    } else {
        None
    };
    if resume.is_none() {
        create_staging(&staging)?;
    }
    if let Some(lock) = &lock {
        lock.mark_staging(&staging)?;
    }
    let setup = Setup {
        inputs,
        staging: Some(staging),
        target: Some(target),
        resume,
    };
    Ok((
        setup,
        Held {
            lock,
            inputs: records,
            remote: None,
        },
    ))
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

/// The input spec, expanded, with every shard's size; and rank 0's records of them.
fn expand_inputs(settings: &ExpandSettings) -> Result<(Vec<InputShard>, Vec<InputRecord>)> {
    let paths = expand_specs(&settings.inputs)?;
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
    Ok((inputs, records))
}

/// The output's absolute path and its staging directory beside it.
fn output_paths(out: &Path) -> Result<(PathBuf, PathBuf)> {
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
    let parent = storage::source(parent).canonical(parent).with_context(|| {
        format!(
            "--output {}: the parent directory {} does not exist",
            out.display(),
            parent.display()
        )
    })?;
    let staging = crate::job::destination::staging::path_for(&parent, name);
    Ok((parent.join(name), staging))
}

/// Refuses an output that would replace an input, a non-empty output without `--force`, with
/// `--force` anything but an empty directory or a reshard output, and a `--link` that is not a
/// symbolic link.
fn check_output(
    settings: &ExpandSettings,
    out: &Path,
    target: &Path,
    staging: &Path,
    inputs: &[InputShard],
) -> Result<()> {
    for input in inputs {
        let canon = storage::source(&input.path)
            .canonical(&input.path)
            .with_context(|| format!("input {}", input.path.display()))?;
        if canon.starts_with(target) || canon.starts_with(staging) {
            bail!(
                "--output {} would replace the input {}: choose an output directory that holds no input",
                out.display(),
                input.path.display()
            );
        }
    }
    let at_target = storage::source(target);
    match at_target.stat(target) {
        Ok(s) if s.kind != Kind::Dir => {
            bail!("--output {}: exists and is not a directory", out.display())
        }
        Ok(_) => {
            let non_empty = !at_target
                .list(target)
                .with_context(|| format!("--output {}: cannot list it", out.display()))?
                .is_empty();
            if non_empty && !settings.force {
                bail!(
                    "--output {}: exists and is not empty (use --force to replace it if it is an output of reshard)",
                    out.display()
                );
            }
        }
        Err(_) => {}
    }
    if settings.force {
        // Refused now, before any work, and checked again when publishing.
        check_replaceable(target, "before the run")?;
    }
    if let Some(link) = &settings.link {
        check_link(link)?;
    }
    Ok(())
}

/// Creates the staging directory (removing one an earlier run left: this run holds the output's
/// lock, and one a run that may still live left was moved aside, so no live run uses it), with
/// the saved-index and heartbeat directories inside.
fn create_staging(staging: &Path) -> Result<()> {
    if Staging::at(staging).present() {
        let durable = checkpoint::read_checkpoint(staging)
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
            staging.display()
        );
        Staging::at(staging)
            .remove()
            .with_context(|| format!("{}: cannot remove", staging.display()))?;
    }
    Staging::at(staging).create().with_context(|| {
        format!(
            "cannot create the staging directory {} (is the output's parent writable?)",
            staging.display()
        )
    })
}
