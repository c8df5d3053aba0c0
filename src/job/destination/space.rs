//! The space check before any data moves: the plan knows every output shard's size, so a run
//! whose output's file system clearly cannot hold it is refused at once instead of failing with
//! ENOSPC mid-exchange (`--no-space-check` starts it anyway).

use std::path::Path;

use anyhow::{bail, Result};

use crate::comm::{agree, Comm};
use crate::size::human_bytes;
use crate::storage::{self, Kind};

/// The bytes the staging directory still needs: the shards' bytes less what its files already
/// hold on disk (a resumed run's earlier attempt).
pub(crate) fn still_needed(staging: &Path, shard_bytes: u64) -> u64 {
    let source = storage::source(staging);
    let allocated: u64 = source
        .list(staging)
        .into_iter()
        .flatten()
        .filter(|e| e.kind == Kind::File)
        .filter_map(|e| source.allocated(&staging.join(&e.name)).ok())
        .sum();
    shard_bytes.saturating_sub(allocated)
}

/// Rank 0 compares what the staging directory still needs with the free space of its file
/// system; every rank learns the outcome.
///
/// # Errors
/// The output clearly does not fit (agreed on every rank).
pub(crate) fn check(comm: &impl Comm, staging: &Path, shard_bytes: &[u64]) -> Result<()> {
    let outcome = if comm.rank() == 0 {
        fits(staging, shard_bytes.iter().sum())
    } else {
        Ok(())
    };
    agree(comm, outcome)
}

fn fits(staging: &Path, shard_bytes: u64) -> Result<()> {
    let needed = still_needed(staging, shard_bytes);
    // Where the backend cannot say, nothing is refused.
    let Ok(Some(free)) = storage::sink(staging).free_space(staging) else {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::memory;

    /// The check on a backend that is not a file system: what the staging area holds counts, and
    /// a backend that knows its free space refuses an output that does not fit.
    #[test]
    fn counts_what_is_there_and_refuses_what_does_not_fit() {
        let staging = Path::new("mem://space/.out.reshard-tmp");
        memory::put(&staging.join("shard-000000.tar"), vec![1; 400]);
        assert_eq!(still_needed(staging, 1000), 600);
        assert!(
            fits(staging, 1000).is_ok(),
            "free space unknown: not refused"
        );
        memory::set_capacity(Path::new("mem://space"), 900);
        // 500 free, 600 needed.
        let refused = fits(staging, 1000).unwrap_err().to_string();
        assert!(refused.contains("needs 600 B more"), "{refused}");
        assert!(fits(staging, 900).is_ok());
    }
}
