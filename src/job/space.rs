//! The space check before any data moves: the plan knows every output shard's size, so a run
//! whose output's file system clearly cannot hold it is refused at once instead of failing with
//! ENOSPC mid-exchange (`--no-space-check` starts it anyway).

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use anyhow::{bail, Result};

use crate::comm::{agree, Comm};
use crate::size::human_bytes;

/// The bytes the staging directory still needs: the shards' bytes less what its files already
/// hold on disk (a resumed run's earlier attempt).
pub fn still_needed(staging: &Path, shard_bytes: u64) -> u64 {
    let allocated: u64 = fs::read_dir(staging)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.metadata().ok())
        .filter(|m| m.is_file())
        .map(|m| m.blocks() * 512)
        .sum();
    shard_bytes.saturating_sub(allocated)
}

/// Rank 0 compares what the staging directory still needs with the free space of its file
/// system; every rank learns the outcome.
///
/// # Errors
/// The output clearly does not fit (agreed on every rank).
pub fn check(comm: &impl Comm, staging: &Path, shard_bytes: &[u64]) -> Result<()> {
    let outcome = if comm.rank() == 0 {
        fits(staging, shard_bytes.iter().sum())
    } else {
        Ok(())
    };
    agree(comm, outcome)
}

fn fits(staging: &Path, shard_bytes: u64) -> Result<()> {
    let needed = still_needed(staging, shard_bytes);
    // Where the file system cannot say, nothing is refused.
    let Ok(free) = crate::sys::free_space(staging) else {
        return Ok(());
    };
    if needed > free {
        bail!(
            "not enough space: the output needs {} more but the file system of {} has {} free \
             (statvfs); nothing was written. Free some space or choose another --output; \
             --no-space-check starts anyway (where a quota or compression allows more)",
            human_bytes(needed),
            staging.display(),
            human_bytes(free)
        );
    }
    Ok(())
}
