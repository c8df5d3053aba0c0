//! Every test hook and diagnostic switch, read from the environment in this one place, so that a
//! reader sees all the ways a test can steer a run. None of them changes the output.
//!
//! The test hooks (`RESHARD_TEST_*`) exist only in a build with the `test-hooks` feature, which
//! the tests turn on (see `Cargo.toml`); in every other build they do nothing and their variables
//! are not even named in the binary. Two switches stay in every build because they are for users
//! (README, slurm/README and examples/netbench.sh tell users to set them) and only observe or
//! bound a run: `RESHARD_TRACE_ROUNDS`, `RESHARD_TRACE_PHASES` and `RESHARD_FINALIZE_TIMEOUT`.
//!
//! Test hooks:
//! - `RESHARD_TEST_PANIC_RANK=r`: rank r panics as the exchange starts (a panic must abort every
//!   rank).
//! - `RESHARD_TEST_STALL_RANK=r`: rank r stops itself with SIGSTOP as the exchange starts, like
//!   a node that froze (the others' watchdogs must end the job).
//! - `RESHARD_TEST_PAUSE_FINISH=seconds`: every rank sleeps at the start of the finish phase,
//!   marked by a file `.paused-RANK` (holding its pid) in the staging directory, so that a test can change an input
//!   or take the output over; a rank whose marker the test removes goes on at once.
//! - `RESHARD_TEST_PAUSE_PUBLISH=seconds`: the same between the finish and publish phases
//!   (marker `.paused-publish-RANK`).
//! - `RESHARD_TEST_PAUSE_EXCHANGE=seconds`: the same as the exchange starts (marker
//!   `.paused-exchange-RANK`): after `--input-files` were walked and indexed, before any file's
//!   bytes are read, so that a test changes or removes a listed file.
//! - `RESHARD_TEST_PAUSE_INDEX=seconds`: every indexing thread sleeps that long once its header
//!   walk has passed half of a shard, once per shard, so that a test sees the index's progress
//!   while no shard is done.
//! - `RESHARD_TEST_KILL=r:n`: rank r kills itself with SIGKILL as exchange round n starts (before
//!   its status), like a node that died. Or at a named point: `r:index` (after indexing),
//!   `r:plan` (after planning), `r:finish` (as the finish phase starts), `r:publish` (as the
//!   publish phase starts); on rank 0 only: `0:rename` (right before the publishing rename),
//!   `0:renamed` (right after it, the checkpoint records still in the output), `0:published`
//!   (right after the rename and the removal of the checkpoint records), `0:keep` (after
//!   `--keep` moved an old epoch aside, before removing it); `r:uploaded` (an object-store
//!   output: every rank's share is up, before rank 0's metadata and manifest); `r:layout` (a
//!   resumed `s3://` run, right before it writes a kept shard's saved index again, its lock
//!   checked); `0:unmark-failed` (an object-store run's clearing: its own marker written and
//!   its lock checked, right before it removes a failed run's marker); `0:unmark` (an
//!   object-store run after its manifest and the removal of what it replaced, before it
//!   removes its own marker); `r:multipart` (an object-store multipart upload started, its
//!   journal not yet holding its id; the rank as its launcher numbered it); `r:remove` (an
//!   object-store output: an object at one of the output's names is about to be removed, the
//!   run's fence checked; the rank as its launcher numbered it, 0 without a launcher);
//!   `0:unindex` (an object-store output with `--force`: the index.json of the output it
//!   replaces is about to be removed before its upload, the lock checked); `0:replaced` (an object-store output published with `--force`: a shard of the output it
//!   replaced is about to be removed, the lock checked). For `--resume` and kill tests.
//! - `RESHARD_TEST_STOP=r:at`: rank r stops itself with SIGSTOP at the point named `at` (any
//!   point of `RESHARD_TEST_KILL`), like a node that froze there: its peers must end the job.
//! - `RESHARD_TEST_SLOW_ROUNDS=ms`: every exchange round waits that long first (until a stop
//!   signal came), so that a test can signal a job surely in the middle of its exchange;
//!   `ms:r`: only rank r's rounds do (so that a test sees the other ranks go on without it).
//! - `RESHARD_TEST_SLOW_SPEAKER=ms`: the process that speaks for the job waits that long before
//!   it reports a failure met before MPI joined the processes (a launcher that does not match
//!   the MPI library), so that a test sees the quiet ones wait for it.
//! - `RESHARD_TEST_HANG_FINALIZE=r|all`: rank r (or every rank) blocks where it would call
//!   MPI_Finalize, as MPI_Finalize does when it hangs (the finalize deadline must end the job).
//! - `RESHARD_TEST_PER_NODE=1`: an object-store output is staged as if `--scratch` were each
//!   node's own although every rank sees rank 0's (heartbeats in the bucket, no checkpoints), so
//!   that one host without namespaces per node runs what a cluster without a shared disk does.
//!
//! Diagnostics, in every build:
//! - `RESHARD_TRACE_ROUNDS`: every exchange round prints its timeline on stderr (when it was
//!   packed, in flight and written, per rank; `examples/timeline.py` summarizes them).
//! - `RESHARD_TRACE_PHASES`: every rank prints each phase's wall and CPU time and peak memory on
//!   stderr (what grows with the number of samples, phase by phase).
//! - `RESHARD_FINALIZE_TIMEOUT=seconds`: the finalize deadline (default 10 s).

use std::time::Duration;

pub use test_hooks::slow_speaker;
pub(crate) use test_hooks::{
    hang_finalize, inject_fault, kill_at, kill_before_publish, kill_in_multipart, kill_in_removal,
    kill_in_round, pause_before_exchange, pause_before_finish, pause_before_publish,
    pause_in_index, pause_in_upload, slow_round, stage_per_node,
};

/// How long a rank waits for `MPI_Finalize` (and the process exit after it) once the job is over,
/// unless `RESHARD_FINALIZE_TIMEOUT` (seconds) says otherwise.
pub(crate) const FINALIZE_TIMEOUT: Duration = Duration::from_secs(10);

/// For unit tests: reports that a part of `test` cannot run here, and why, as the integration
/// tests' `util::skip` does. With `RESHARD_NO_SKIP=1` (CI sets it) that is a failure; otherwise
/// one `SKIPPED <test>: <reason>` line goes straight to the process's stderr (the harness
/// captures `eprintln!`, not this) and the caller leaves the part out.
#[cfg(test)]
pub(crate) fn skip(test: &str, reason: &str) {
    if std::env::var_os("RESHARD_NO_SKIP").is_some_and(|v| v == "1") {
        panic!("{test} cannot run: {reason} (RESHARD_NO_SKIP=1: skipping is a failure)");
    }
    let line = format!("SKIPPED {test}: {reason}\n");
    let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
}

/// `RESHARD_TRACE_ROUNDS`.
pub(crate) fn trace_rounds() -> bool {
    std::env::var_os("RESHARD_TRACE_ROUNDS").is_some()
}

/// `RESHARD_TRACE_PHASES`.
pub(crate) fn trace_phases() -> bool {
    std::env::var_os("RESHARD_TRACE_PHASES").is_some()
}

/// The finalize deadline: `RESHARD_FINALIZE_TIMEOUT` seconds (fractions allowed) if it is a
/// positive number, else [`FINALIZE_TIMEOUT`].
pub(crate) fn finalize_timeout(env: impl Fn(&str) -> Option<String>) -> Duration {
    env("RESHARD_FINALIZE_TIMEOUT")
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0)
        .and_then(|s| Duration::try_from_secs_f64(s).ok())
        .unwrap_or(FINALIZE_TIMEOUT)
}

/// The test hooks as the tests build reshard (the `test-hooks` feature, see `Cargo.toml`).
#[cfg(feature = "test-hooks")]
mod test_hooks {
    use std::path::Path;
    use std::time::Duration;

    /// Whether the variable `var` names this `rank`.
    fn names_rank(var: &str, rank: usize) -> bool {
        std::env::var(var)
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            == Some(rank)
    }

    /// `RESHARD_TEST_PANIC_RANK` and `RESHARD_TEST_STALL_RANK`, as the exchange starts (the stall
    /// watchdog already running).
    pub(crate) fn inject_fault(rank: usize) {
        if names_rank("RESHARD_TEST_PANIC_RANK", rank) {
            panic!("RESHARD_TEST_PANIC_RANK={rank}: injected panic");
        }
        if names_rank("RESHARD_TEST_STALL_RANK", rank) {
            crate::errln!("reshard: RESHARD_TEST_STALL_RANK={rank}: this rank now stops (SIGSTOP)");
            // The whole process stops, its watchdog included, like a node that froze.
            crate::sys::stop_process();
        }
    }

    /// `RESHARD_TEST_KILL=r:n`: rank r dies (SIGKILL) as exchange round n starts.
    pub(crate) fn kill_in_round(rank: usize, round: u64) {
        kill_at(rank, &round.to_string());
    }

    /// `RESHARD_TEST_KILL=r:multipart`: rank r dies (SIGKILL) right after a multipart upload
    /// started, before its journal names its id. The storage layer knows no rank: `rank` gives
    /// the launcher's number of this process.
    pub(crate) fn kill_in_multipart(rank: impl FnOnce() -> Option<usize>) {
        if let Some(rank) = rank() {
            kill_at(rank, "multipart");
        }
    }

    /// `RESHARD_TEST_KILL=r:remove` (or `RESHARD_TEST_STOP`): right before an object at the
    /// output's names is removed, the fence checked. `rank` gives the launcher's number of this
    /// process (0 without one): the storage layer knows no rank.
    pub(crate) fn kill_in_removal(rank: impl FnOnce() -> usize) {
        kill_at(rank(), "remove");
    }

    /// `RESHARD_TEST_KILL=r:publish`: rank r dies (SIGKILL) as the publish phase starts.
    pub(crate) fn kill_before_publish(rank: usize) {
        kill_at(rank, "publish");
    }

    /// `RESHARD_TEST_KILL=r:at`: rank r dies (SIGKILL) at the point named `at`;
    /// `RESHARD_TEST_STOP=r:at`: it stops (SIGSTOP) there.
    pub(crate) fn kill_at(rank: usize, at: &str) {
        let names = |var: &str| {
            std::env::var(var).ok().filter(|v| {
                v.split_once(':').is_some_and(|(r, n)| {
                    r.trim().parse::<usize>().ok() == Some(rank) && n.trim() == at
                })
            })
        };
        if let Some(v) = names("RESHARD_TEST_STOP") {
            crate::errln!(
                "reshard: RESHARD_TEST_STOP={v}: rank {rank} now stops (SIGSTOP) at {at}"
            );
            crate::sys::stop_process();
        }
        if let Some(v) = names("RESHARD_TEST_KILL") {
            crate::errln!("reshard: RESHARD_TEST_KILL={v}: rank {rank} now dies (SIGKILL) at {at}");
            crate::sys::kill_process();
        }
    }

    /// `RESHARD_TEST_PAUSE_FINISH`: a window in which a test changes an input.
    /// A marker left by an attempt that was killed while paused is removed in any case: a resumed
    /// run publishes its staging directory.
    pub(crate) fn pause_before_finish(staging: &Path, rank: usize) {
        pause(
            "RESHARD_TEST_PAUSE_FINISH",
            &staging.join(format!(".paused-{rank}")),
        );
    }

    /// `RESHARD_TEST_PAUSE_PUBLISH`: a window between finish and publish, as
    /// [`pause_before_finish`].
    pub(crate) fn pause_before_publish(staging: &Path, rank: usize) {
        pause(
            "RESHARD_TEST_PAUSE_PUBLISH",
            &staging.join(format!(".paused-publish-{rank}")),
        );
    }

    /// `RESHARD_TEST_PAUSE_EXCHANGE`: a window between planning and the exchange, as
    /// [`pause_before_finish`].
    pub(crate) fn pause_before_exchange(staging: &Path, rank: usize) {
        pause(
            "RESHARD_TEST_PAUSE_EXCHANGE",
            &staging.join(format!(".paused-exchange-{rank}")),
        );
    }

    /// `RESHARD_TEST_PAUSE_UPLOAD`: a window in the middle of a multipart upload of an `s3://`
    /// output (a part sent, more to come), in which a test stops the server; the marker
    /// `.paused-upload-RANK` is in `dir`, the scratch directory's folder of the output.
    pub(crate) fn pause_in_upload(dir: &Path, rank: usize) {
        pause(
            "RESHARD_TEST_PAUSE_UPLOAD",
            &dir.join(format!(".paused-upload-{rank}")),
        );
    }

    /// `RESHARD_TEST_PAUSE_INDEX`: an indexing thread halfway through a shard sleeps.
    pub(crate) fn pause_in_index() {
        if let Some(secs) = std::env::var("RESHARD_TEST_PAUSE_INDEX")
            .ok()
            .and_then(|v| v.trim().parse::<f64>().ok())
        {
            std::thread::sleep(Duration::from_secs_f64(secs));
        }
    }

    /// Sleeps the seconds `var` says, or until the test removes `marker`.
    fn pause(var: &str, marker: &Path) {
        let _ = std::fs::remove_file(marker);
        let Some(secs) = std::env::var(var).ok().and_then(|v| v.parse().ok()) else {
            return;
        };
        // The pid, for a test that looks at the paused rank (its I/O priority, say); written
        // aside and renamed, so that a test never finds the marker there and still empty.
        let aside = marker.with_extension("writing");
        let _ = std::fs::write(&aside, std::process::id().to_string())
            .and_then(|()| std::fs::rename(&aside, marker));
        let paused = std::time::Instant::now();
        while paused.elapsed() < Duration::from_secs(secs) && marker.exists() {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = std::fs::remove_file(marker);
    }

    /// `RESHARD_TEST_SLOW_ROUNDS`: waits before an exchange round.
    pub(crate) fn slow_round(rank: usize) {
        if crate::sys::stop_signal().is_some() {
            return;
        }
        let Ok(v) = std::env::var("RESHARD_TEST_SLOW_ROUNDS") else {
            return;
        };
        let (ms, only) = match v.split_once(':') {
            Some((ms, r)) => (ms, r.trim().parse::<usize>().ok()),
            None => (v.as_str(), None),
        };
        if only.is_some_and(|r| r != rank) {
            return;
        }
        if let Ok(ms) = ms.trim().parse() {
            std::thread::sleep(Duration::from_millis(ms));
        }
    }

    /// `RESHARD_TEST_SLOW_SPEAKER`: waits before the speaker reports a failure met before MPI.
    pub fn slow_speaker() {
        if let Some(ms) = std::env::var("RESHARD_TEST_SLOW_SPEAKER")
            .ok()
            .and_then(|v| v.trim().parse().ok())
        {
            std::thread::sleep(Duration::from_millis(ms));
        }
    }

    /// `RESHARD_TEST_PER_NODE=1`: an object-store output staged as if per node.
    pub(crate) fn stage_per_node() -> bool {
        std::env::var_os("RESHARD_TEST_PER_NODE").is_some_and(|v| v == "1")
    }

    /// Test hook: `RESHARD_TEST_HANG_FINALIZE=r` makes rank r block forever where it would call
    /// MPI_Finalize (`all`: every rank), as MPI_Finalize does when it hangs.
    pub(crate) fn hang_finalize(rank: usize, env: impl Fn(&str) -> Option<String>) -> bool {
        env("RESHARD_TEST_HANG_FINALIZE").is_some_and(|v| {
            let v = v.trim();
            v == "all" || v.parse::<usize>().ok() == Some(rank)
        })
    }
}

/// The test hooks in every other build (`cargo build --release`, `cargo install`): each does
/// nothing, reads no variable and touches no file, and no `RESHARD_TEST_` name is compiled in.
#[cfg(not(feature = "test-hooks"))]
mod test_hooks {
    use std::path::Path;

    pub(crate) fn inject_fault(_rank: usize) {}
    pub(crate) fn kill_in_round(_rank: usize, _round: u64) {}
    pub(crate) fn kill_before_publish(_rank: usize) {}
    pub(crate) fn kill_in_multipart(_rank: impl FnOnce() -> Option<usize>) {}
    pub(crate) fn kill_in_removal(_rank: impl FnOnce() -> usize) {}
    pub(crate) fn kill_at(_rank: usize, _at: &str) {}
    pub(crate) fn pause_before_finish(_staging: &Path, _rank: usize) {}
    pub(crate) fn pause_before_publish(_staging: &Path, _rank: usize) {}
    pub(crate) fn pause_before_exchange(_staging: &Path, _rank: usize) {}
    pub(crate) fn pause_in_upload(_dir: &Path, _rank: usize) {}
    pub(crate) fn pause_in_index() {}
    pub(crate) fn slow_round(_rank: usize) {}
    pub(crate) fn stage_per_node() -> bool {
        false
    }
    pub fn slow_speaker() {}
    pub(crate) fn hang_finalize(_rank: usize, _env: impl Fn(&str) -> Option<String>) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finalize_timeout_from_the_environment() {
        let with =
            |v: &'static str| move |k: &str| (k == "RESHARD_FINALIZE_TIMEOUT").then(|| v.into());
        assert_eq!(finalize_timeout(with("3")), Duration::from_secs(3));
        assert_eq!(finalize_timeout(with(" 0.5 ")), Duration::from_millis(500));
        for bad in ["0", "-1", "soon", "inf", "NaN", ""] {
            assert_eq!(finalize_timeout(with(bad)), FINALIZE_TIMEOUT, "{bad:?}");
        }
        assert_eq!(finalize_timeout(|_| None), FINALIZE_TIMEOUT);
    }

    #[cfg(feature = "test-hooks")]
    #[test]
    fn hang_finalize_chooses_ranks() {
        let with =
            |v: &'static str| move |k: &str| (k == "RESHARD_TEST_HANG_FINALIZE").then(|| v.into());
        assert!(hang_finalize(1, with("1")));
        assert!(!hang_finalize(0, with("1")));
        assert!(hang_finalize(0, with("all")) && hang_finalize(5, with("all")));
        assert!(!hang_finalize(0, |_| None));
    }
}
