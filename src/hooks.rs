//! Every test hook and trace switch, read from the environment in this one place, so that a
//! reader sees all the ways a test can steer a run. None of them changes the output.
//!
//! - `RESHARD_TEST_PANIC_RANK=r`: rank r panics as the exchange starts (a panic must abort every
//!   rank).
//! - `RESHARD_TEST_STALL_RANK=r`: rank r stops itself with SIGSTOP as the exchange starts, like
//!   a node that froze (the others' watchdogs must end the job).
//! - `RESHARD_TEST_PAUSE_FINISH=seconds`: every rank sleeps at the start of the finish phase,
//!   marked by a file `.paused-RANK` in the staging directory, so that a test can change an input.
//! - `RESHARD_TRACE_ROUNDS`: every exchange round prints its timings on stderr.

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

/// `RESHARD_TEST_PAUSE_FINISH`: a window in which a test changes an input.
pub fn pause_before_finish(staging: &Path, rank: usize) {
    let Some(secs) = std::env::var("RESHARD_TEST_PAUSE_FINISH")
        .ok()
        .and_then(|v| v.parse().ok())
    else {
        return;
    };
    let marker = staging.join(format!(".paused-{rank}"));
    let _ = std::fs::write(&marker, b"");
    std::thread::sleep(Duration::from_secs(secs));
    let _ = std::fs::remove_file(&marker);
}

/// `RESHARD_TRACE_ROUNDS`.
pub fn trace_rounds() -> bool {
    std::env::var_os("RESHARD_TRACE_ROUNDS").is_some()
}
