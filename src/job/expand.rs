//! Phase "expand": rank 0 expands the input spec into the ordered shard list, checks the output
//! (refusing what would replace an input or a non-empty directory) and creates the staging
//! directory next to it; every rank receives the result.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::config::RunConfig;
use crate::input::{expand_specs, InputShard};
use crate::job::link::check_link;
use crate::job::series::outputs_beyond;
use crate::output::saved_index;

/// Where the ranks' watchdogs leave heartbeats during the exchange (inside the staging
/// directory, removed before publishing).
pub const HEARTBEATS: &str = ".heartbeats";

/// What rank 0 resolves before any data is read, shared with every rank.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Setup {
    pub inputs: Vec<InputShard>,
    /// Where the output is assembled and where it goes (none when only planning).
    pub staging: Option<PathBuf>,
    pub target: Option<PathBuf>,
}

impl Setup {
    /// Where the output is assembled.
    ///
    /// # Errors
    /// Only planning: there is no staging directory.
    pub fn staging(&self) -> Result<&Path> {
        self.staging
            .as_deref()
            .context("internal error: no staging directory when only planning")
    }

    /// Where the output goes.
    ///
    /// # Errors
    /// Only planning: there is no output.
    pub fn target(&self) -> Result<&Path> {
        self.target
            .as_deref()
            .context("internal error: no output when only planning")
    }
}

/// Rank 0's checks and set-up before any data is read: expand the input, refuse unsafe outputs,
/// create the staging directory next to the output (not when only planning: a plan writes
/// nothing).
///
/// # Errors
/// An input that cannot be found or read, an output that would replace an input or a
/// non-empty directory (without `--force`), a `--link` that is not a symbolic link, or a staging
/// directory that cannot be created.
pub fn prepare(cfg: &RunConfig) -> Result<Setup> {
    let inputs = expand_inputs(cfg)?;
    let Some(out) = &cfg.output else {
        // Only planning, without an output to check.
        return Ok(Setup {
            inputs,
            staging: None,
            target: None,
        });
    };
    let (target, staging) = output_paths(out)?;
    check_output(cfg, out, &target, &staging, &inputs)?;
    if cfg.dry_run {
        // Checked as `run` would, but nothing is created, removed or written.
        if let Some(keep) = &cfg.keep {
            // --link would point at the new output by then, so only the output itself is spared.
            for old in outputs_beyond(&target, keep, cfg.epoch, None)? {
                eprintln!(
                    "reshard: --keep {} would remove the older output {}",
                    keep.count,
                    old.display()
                );
            }
        }
        return Ok(Setup {
            inputs,
            staging: None,
            target: None,
        });
    }
    create_staging(&staging)?;
    Ok(Setup {
        inputs,
        staging: Some(staging),
        target: Some(target),
    })
}

/// The input spec, expanded, with every shard's size.
fn expand_inputs(cfg: &RunConfig) -> Result<Vec<InputShard>> {
    let paths = expand_specs(&cfg.inputs)?;
    let mut inputs = Vec::with_capacity(paths.len());
    for path in paths {
        let size = fs::metadata(&path)
            .with_context(|| format!("input {}", path.display()))?
            .len();
        inputs.push(InputShard { path, size });
    }
    Ok(inputs)
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
    let parent = fs::canonicalize(parent).with_context(|| {
        format!(
            "--output {}: the parent directory {} does not exist",
            out.display(),
            parent.display()
        )
    })?;
    let staging = parent.join(format!(".{}.reshard-tmp", name.to_string_lossy()));
    Ok((parent.join(name), staging))
}

/// Refuses an output that would replace an input, a non-empty output without `--force`, and a
/// `--link` that is not a symbolic link.
fn check_output(
    cfg: &RunConfig,
    out: &Path,
    target: &Path,
    staging: &Path,
    inputs: &[InputShard],
) -> Result<()> {
    for input in inputs {
        let canon = fs::canonicalize(&input.path)
            .with_context(|| format!("input {}", input.path.display()))?;
        if canon.starts_with(target) || canon.starts_with(staging) {
            bail!(
                "--output {} would replace the input {}: choose an output directory that holds no input",
                out.display(),
                input.path.display()
            );
        }
    }
    match fs::metadata(target) {
        Ok(m) if !m.is_dir() => bail!("--output {}: exists and is not a directory", out.display()),
        Ok(_) => {
            let non_empty = fs::read_dir(target)
                .with_context(|| format!("--output {}: cannot list it", out.display()))?
                .next()
                .is_some();
            if non_empty && !cfg.force {
                bail!(
                    "--output {}: exists and is not empty (use --force to replace it)",
                    out.display()
                );
            }
        }
        Err(_) => {}
    }
    if let Some(link) = &cfg.link {
        check_link(link)?;
    }
    Ok(())
}

/// Creates the staging directory (removing one an earlier run left), with the saved-index and
/// heartbeat directories inside.
fn create_staging(staging: &Path) -> Result<()> {
    if staging.exists() {
        eprintln!(
            "reshard: removing {} left by an earlier run that did not finish",
            staging.display()
        );
        fs::remove_dir_all(staging)
            .with_context(|| format!("{}: cannot remove", staging.display()))?;
    }
    fs::create_dir(staging)
        .and_then(|()| fs::create_dir(staging.join(saved_index::DIR_NAME)))
        .and_then(|()| fs::create_dir(staging.join(HEARTBEATS)))
        .with_context(|| {
            format!(
                "cannot create the staging directory {} (is the output's parent writable?)",
                staging.display()
            )
        })
}
