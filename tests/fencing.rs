//! Fencing, attacked as issue 37 did: a run that lost the output's lock (suspended past
//! `--lock-stale-after`, then taken over) wakes and goes on writing. Whatever it writes must be
//! unreachable from its successor, so that nothing a later `--resume` trusts can come from it;
//! and the early refusals the attack found (`--output` a symbolic link, a `--link` that cannot
//! be made) come before any work.

use std::fs;

use crate::util::data::sized;
use crate::util::lock::{in_namespaces, lock_field, stopped_in, wait_until, Stopped};
use crate::util::verifier::assert_same_output;
use crate::util::{reshard_processes, signal, Dir};

/// Many small rounds (a 1 MiB budget), a checkpoint after every one: the exchange records
/// checkpoints for as long as it runs.
fn args(out: &str) -> Vec<String> {
    [
        "run",
        "--input",
        "in",
        "--output",
        out,
        "--shards",
        "6",
        "--seed",
        "11",
        "--mem-limit",
        "1MiB",
        "--checkpoint-every",
        "0",
    ]
    .map(String::from)
    .to_vec()
}

/// Run A, in another PID namespace (so that only its heartbeat can tell whether it lives), is
/// stopped (SIGSTOP, as `scontrol suspend` does) mid-exchange. Run B takes the output over once
/// A has been silent past its `--lock-stale-after` and stops itself as its exchange starts. A
/// wakes, goes on with its exchange (checkpoint records after every round) and fails. B's node is
/// then lost (SIGKILL). A run with `--resume` continues B's staging directory: it must publish
/// the clean run's bytes. The bug: A wrote its next checkpoint record by path into B's staging
/// directory, and the resumed run trusted it and published six shards with holes, exit 0.
#[test]
fn a_run_that_lost_its_lock_mid_exchange_writes_nothing_a_resumed_successor_trusts() {
    let dir = Dir::new("fence-fs-checkpoint");
    sized(&dir, "in", "16MiB", "16KiB", 6);
    dir.reshard(None).args(args("ref")).assert_success();

    let mut a = in_namespaces(&dir, &args("out"));
    a.env("RESHARD_TEST_SLOW_ROUNDS", "150");
    let a = std::thread::spawn(move || a.output());
    let checkpoint = dir.join(".out.reshard-tmp/.resume/checkpoint.json");
    wait_until("run A records a checkpoint", || checkpoint.exists());
    let a_token = lock_field(&dir, "token");
    let a_pid = reshard_processes(dir.path())
        .first()
        .map(|&(pid, _)| i32::try_from(pid).unwrap())
        .expect("run A runs");
    let stopped_a = Stopped::stop(a_pid);
    wait_until("run A is stopped", || stopped_in(&dir).contains(&a_pid));

    let mut b = dir.reshard(None);
    b.args(args("out"))
        .args(["--lock-stale-after", "1"])
        .env("RESHARD_TEST_STALL_RANK", "0");
    let b = std::thread::spawn(move || b.output());
    wait_until("run B takes the lock over and stops itself", || {
        stopped_in(&dir).iter().any(|&p| p != a_pid)
    });
    let b_pid = stopped_in(&dir)
        .into_iter()
        .find(|&p| p != a_pid)
        .expect("run B is stopped");
    assert_ne!(lock_field(&dir, "token"), a_token, "B holds the lock");

    drop(stopped_a);
    let a = a.join().unwrap();
    a.check(a.code() == Some(1), "A lost the output: it must fail");
    a.stderr_has("this run lost the output's lock");
    a.check(!dir.join("out").exists(), "A must publish nothing");

    // B's node is lost: its lock stays, held by a pid that is gone.
    signal(u32::try_from(b_pid).unwrap(), libc::SIGKILL);
    let b = b.join().unwrap();
    b.check(b.code() != Some(0), "B was killed");

    let c = dir
        .reshard(None)
        .args(args("out"))
        .arg("--resume")
        .assert_success();
    c.stderr_has("--resume");
    assert_same_output(&dir.join("ref"), &dir.join("out"), &["ranks"]);
    let left: Vec<String> = fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".out."))
        .collect();
    assert!(
        left.is_empty(),
        "nothing of the three runs is left: {left:?}"
    );
}
