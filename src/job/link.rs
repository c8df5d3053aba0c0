//! The rule `--link` follows, in one place: it is checked before the run (phase "expand"), so
//! that a run that could not publish its link fails before any work, and again when publishing,
//! where the path may have changed since.

use std::fs;
use std::path::Path;

use anyhow::{bail, Result};

/// Refuses a `--link` path that holds something other than a symbolic link: `--link` replaces
/// only a link, never a file or directory someone else put there.
///
/// # Errors
/// `link` exists and is not a symbolic link.
pub fn check_link(link: &Path) -> Result<()> {
    if fs::symlink_metadata(link).is_ok_and(|m| !m.file_type().is_symlink()) {
        bail!(
            "--link {}: exists and is not a symbolic link; not replacing it",
            link.display()
        );
    }
    Ok(())
}
