//! The rule `--link` follows, in one place: it is checked before the run (phase "expand"), so
//! that a run that could not publish its link fails before any work, and again when publishing,
//! where the path may have changed since.

use std::path::{Component, Path, PathBuf};

use anyhow::{bail, Result};

use crate::storage::{self, Kind};

/// Refuses a `--link` path that holds something other than a symbolic link: `--link` replaces
/// only a link, never a file or directory someone else put there.
///
/// # Errors
/// `link` exists and is not a symbolic link.
pub(crate) fn check_link(link: &Path) -> Result<()> {
    let found = storage::source(link).stat_link(link);
    if found.is_ok_and(|s| s.kind != Kind::Link) {
        bail!(
            "--link {}: exists and is not a symbolic link; not replacing it",
            link.display()
        );
    }
    Ok(())
}

/// The expand phase's check of `--link`, before any work: [`check_link`], and a link that could
/// never be made after publishing (its directory does not exist, or it is the output itself or
/// inside it) is a usage error (exit 2), not a failure after the output is published (exit 3).
///
/// # Errors
/// As [`check_link`]; or a [`crate::cli::resolve::UsageError`] naming the link and why.
pub(crate) fn check_link_before_the_run(link: &Path, target: &Path) -> Result<()> {
    check_link(link)?;
    let usage = |why: String| {
        anyhow::Error::new(crate::cli::resolve::UsageError::new(anyhow::anyhow!(
            "--link {}: {why}",
            link.display()
        )))
    };
    let dir = match link.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let Some(name) = link.file_name() else {
        return Err(usage("expected a file name for the link".into()));
    };
    let Ok(dir) = storage::source(dir).canonical(dir) else {
        return Err(usage(format!(
            "its directory {} does not exist (the link is made after publishing; create the \
             directory first)",
            dir.display()
        )));
    };
    let at = dir.join(name);
    if at == target || at.starts_with(target) {
        return Err(usage(format!(
            "is the --output {} itself, or inside it: the link must be beside the outputs it \
             points at",
            target.display()
        )));
    }
    Ok(())
}

/// What a `--link` at `link` holds to reach `target`: the path of `target` relative to the
/// link's directory, as `ln -sr` makes it, so that the link keeps working when the tree that
/// holds both is moved or mounted at another path on other nodes. Both paths are resolved
/// first (symbolic links in them included), as `ln -sr` does.
///
/// # Errors
/// The link's directory or the target cannot be resolved (one does not exist).
pub(crate) fn relative_target(link: &Path, target: &Path) -> Result<PathBuf> {
    let dir = match link.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let dir = storage::source(dir)
        .canonical(dir)
        .map_err(|e| anyhow::anyhow!("--link {}: its directory: {e}", link.display()))?;
    let target = storage::source(target)
        .canonical(target)
        .map_err(|e| anyhow::anyhow!("--link: the output {}: {e}", target.display()))?;
    Ok(relative_path(&dir, &target))
}

/// The path that leads from the directory `from` to `to`; both absolute and resolved.
fn relative_path(from: &Path, to: &Path) -> PathBuf {
    let from: Vec<Component> = from.components().collect();
    let to: Vec<Component> = to.components().collect();
    let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
    let mut path: PathBuf = from[common..]
        .iter()
        .map(|_| Component::ParentDir)
        .collect();
    path.extend(&to[common..]);
    if path.as_os_str().is_empty() {
        path.push(".");
    }
    path
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_lead_from_the_links_directory() {
        let rel = |a: &str, b: &str| relative_path(Path::new(a), Path::new(b));
        assert_eq!(rel("/data", "/data/epoch-3"), Path::new("epoch-3"));
        assert_eq!(
            rel("/data/links", "/data/epochs/e3"),
            Path::new("../epochs/e3")
        );
        assert_eq!(rel("/a/b/c", "/x"), Path::new("../../../x"));
        assert_eq!(rel("/data", "/data"), Path::new("."));
    }
}
