//! Every test hook and trace switch, read from the environment in this one place, so that a
//! reader sees all the ways a test can steer a run. None of them changes the output.
//!
//! - `RESHARD_TEST_PANIC_RANK=r`: rank r panics as the exchange starts (a panic must abort every
//!   rank).
//! - `RESHARD_TEST_STALL_RANK=r`: rank r stops itself with SIGSTOP as the exchange starts, like
//!   a node that froze (the others' watchdogs must end the job).
//! - `RESHARD_TEST_PAUSE_FINISH=seconds`: every rank sleeps at the start of the finish phase,
//!   marked by a file `.paused-RANK` in the staging directory, so that a test can change an input.
//! - `RESHARD_TEST_KILL=r:n`: rank r kills itself with SIGKILL as exchange round n starts (before
//!   its status), like a node that died; `r:publish`: as the publish phase starts. For
//!   `--resume` tests.
//! - `RESHARD_TRACE_ROUNDS`: every exchange round prints its timings on stderr.
//! - `RESHARD_TEST_HANG_FINALIZE=r|all`: rank r (or every rank) blocks where it would call
//!   MPI_Finalize, as MPI_Finalize does when it hangs (the finalize deadline must end the job).
//! - `RESHARD_FINALIZE_TIMEOUT=seconds`: the finalize deadline (default 10 s).

use std::path::Path;
use std::time::Duration;

/// How long a rank waits for `MPI_Finalize` (and the process exit after it) once the job is over,
/// unless `RESHARD_FINALIZE_TIMEOUT` (seconds) says otherwise.
pub const FINALIZE_TIMEOUT: Duration = Duration::from_secs(10);

/// Whether the variable `var` names this `rank`.
fn names_rank(var: &str, rank: usize) -> bool {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        == Some(rank)
}

/// `RESHARD_TEST_PANIC_RANK` and `RESHARD_TEST_STALL_RANK`, as the exchange starts (the stall
/// watchdog already running).
pub fn inject_fault(rank: usize) {
    if names_rank("RESHARD_TEST_PANIC_RANK", rank) {
        panic!("RESHARD_TEST_PANIC_RANK={rank}: injected panic");
    }
    if names_rank("RESHARD_TEST_STALL_RANK", rank) {
        eprintln!("reshard: RESHARD_TEST_STALL_RANK={rank}: this rank now stops (SIGSTOP)");
        // The whole process stops, its watchdog included, like a node that froze.
        crate::sys::stop_process();
    }
}

/// `RESHARD_TEST_KILL=r:n`: rank r dies (SIGKILL) as exchange round n starts.
pub fn kill_in_round(rank: usize, round: u64) {
    kill_at(rank, &round.to_string());
}

/// `RESHARD_TEST_KILL=r:publish`: rank r dies (SIGKILL) as the publish phase starts.
pub fn kill_before_publish(rank: usize) {
    kill_at(rank, "publish");
}

fn kill_at(rank: usize, at: &str) {
    let Ok(v) = std::env::var("RESHARD_TEST_KILL") else {
        return;
    };
    let named = v
        .split_once(':')
        .is_some_and(|(r, n)| r.trim().parse::<usize>().ok() == Some(rank) && n.trim() == at);
    if named {
        eprintln!("reshard: RESHARD_TEST_KILL={v}: rank {rank} now dies (SIGKILL) at {at}");
        crate::sys::kill_process();
    }
}

/// `RESHARD_TEST_PAUSE_FINISH`: a window in which a test changes an input.
/// A marker left by an attempt that was killed while paused is removed in any case: a resumed
/// run publishes its staging directory.
pub fn pause_before_finish(staging: &Path, rank: usize) {
    let marker = staging.join(format!(".paused-{rank}"));
    let _ = std::fs::remove_file(&marker);
    let Some(secs) = std::env::var("RESHARD_TEST_PAUSE_FINISH")
        .ok()
        .and_then(|v| v.parse().ok())
    else {
        return;
    };
    let _ = std::fs::write(&marker, b"");
    std::thread::sleep(Duration::from_secs(secs));
    let _ = std::fs::remove_file(&marker);
}

/// For unit tests: reports that a part of `test` cannot run here, and why, as the integration
/// tests' `util::skip` does. With `RESHARD_NO_SKIP=1` (CI sets it) that is a failure; otherwise
/// one `SKIPPED <test>: <reason>` line goes straight to the process's stderr (the harness
/// captures `eprintln!`, not this) and the caller leaves the part out.
#[cfg(test)]
pub fn skip(test: &str, reason: &str) {
    if std::env::var_os("RESHARD_NO_SKIP").is_some_and(|v| v == "1") {
        panic!("{test} cannot run: {reason} (RESHARD_NO_SKIP=1: skipping is a failure)");
    }
    let line = format!("SKIPPED {test}: {reason}\n");
    let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
}

/// `RESHARD_TRACE_ROUNDS`.
pub fn trace_rounds() -> bool {
    std::env::var_os("RESHARD_TRACE_ROUNDS").is_some()
}

/// The finalize deadline: `RESHARD_FINALIZE_TIMEOUT` seconds (fractions allowed) if it is a
/// positive number, else [`FINALIZE_TIMEOUT`].
pub fn finalize_timeout(env: impl Fn(&str) -> Option<String>) -> Duration {
    env("RESHARD_FINALIZE_TIMEOUT")
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0)
        .and_then(|s| Duration::try_from_secs_f64(s).ok())
        .unwrap_or(FINALIZE_TIMEOUT)
}

/// Test hook: `RESHARD_TEST_HANG_FINALIZE=r` makes rank r block forever where it would call
/// MPI_Finalize (`all`: every rank), as MPI_Finalize does when it hangs.
pub fn hang_finalize(rank: usize, env: impl Fn(&str) -> Option<String>) -> bool {
    env("RESHARD_TEST_HANG_FINALIZE").is_some_and(|v| {
        let v = v.trim();
        v == "all" || v.parse::<usize>().ok() == Some(rank)
    })
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
