//! Removals of a `--force` run (the replaced manifest before its upload, the replaced output's
//! objects after its manifest), each checked against the output's lock first: a
//! run suspended between such a check and its removal, past its lock, must remove nothing its
//! successor published since.

use crate::util::data::sized;
use crate::util::lock::{in_namespaces, stopped_in, wait_until, Stopped};
use crate::util::stores::Store as _;
use crate::util::verifier::assert_same_output;
use crate::util::Dir;

/// After its manifest, a `--force` run removes what the new manifest does not name of the
/// output it replaced, each removal preceded by a check of the lock only: run A (another PID
/// namespace, 3 shards, seed 1) replaces an older output of 6 shards and is stopped (SIGSTOP)
/// right after that check, before it removes the older output's `shard-000003.tar`. Run B
/// (`--force`, 6 shards, seed 2) takes the output over by A's silence and publishes, exit 0. A
/// is continued: B's published output must stay exactly B's. The bug: A's removal landed and
/// took B's `shard-000003.tar`, which B's index.json lists.
#[test]
fn a_force_run_stopped_in_its_clean_up_after_its_lock_check_removes_nothing_published() {
    a_force_run_stopped_at(
        "a_force_run_stopped_in_its_clean_up_after_its_lock_check_removes_nothing_published",
        "0:replaced",
        (3, "A published, then lost the lock in its clean-up"),
    );
}

/// Before its upload, a `--force` run removes the index.json of the output it replaces, after a
/// check of the lock: run A (another PID namespace, 3 shards, seed 1) is stopped right after
/// that check (`0:unindex`); run B (`--force`, 6 shards, seed 2) takes the output over by A's
/// silence and publishes, exit 0. A is continued: B's output must stay B's, its index.json
/// included. The bug: A's plain DELETE took B's published index.json, leaving B's shards named
/// by no manifest.
#[test]
fn a_force_run_stopped_before_it_removes_the_replaced_manifest_leaves_its_successors() {
    a_force_run_stopped_at(
        "a_force_run_stopped_before_it_removes_the_replaced_manifest_leaves_its_successors",
        "0:unindex",
        (1, "A lost the lock before its upload"),
    );
}

/// Run A (`--force`, another PID namespace, 3 shards, seed 1) over an older output of 6 shards
/// (seed 9), stopped at the hook `point`; run B (`--force`, 6 shards, seed 2) takes the output
/// over by A's silence and publishes; A, continued, exits with `a_exits` (its status, why);
/// the output is then B's, byte for byte, its index.json included.
fn a_force_run_stopped_at(test: &str, point: &str, a_exits: (i32, &str)) {
    let dir = Dir::new(test);
    sized(&dir, "in", "4MiB", "16KiB", 3);
    let Some(s3) = crate::util::s3::server(test) else {
        return;
    };
    let bucket = s3.bucket(&dir, test);
    let target = format!("s3://{bucket}/out");
    dir.reshard(None)
        .args(super::upload_args("ref-b", 6, "2"))
        .assert_success();
    let mut old = dir.reshard(None);
    old.args(super::upload_args(&target, 6, "9"))
        .arg("--scratch")
        .arg(dir.join("scratch"));
    s3.with_env(&mut old);
    old.assert_success();

    let mut a = in_namespaces(&dir, &super::upload_args(&target, 3, "1"));
    a.args(["--force", "--scratch"])
        .arg(dir.join("scratch"))
        .env("RESHARD_TEST_STOP", point);
    s3.with_env(&mut a);
    let a = std::thread::spawn(move || a.output());
    wait_until("run A stops at its hook point", || {
        !stopped_in(&dir).is_empty()
    });
    let stopped_a = Stopped::already(stopped_in(&dir));

    let mut b = dir.reshard(None);
    b.args(super::upload_args(&target, 6, "2"))
        .args(["--force", "--lock-stale-after", "1", "--scratch"])
        .arg(dir.join("scratch"));
    s3.with_env(&mut b);
    let b = b.output();
    b.check(b.code() == Some(0), "B takes the output over and publishes");
    b.stderr_has("taking over");

    drop(stopped_a);
    let a = a.join().unwrap();
    a.check(a.code() == Some(a_exits.0), a_exits.1);

    s3.get(&dir, &bucket, "out", &dir.join("got"));
    assert!(
        dir.join("got/index.json").is_file(),
        "B's index.json is there"
    );
    assert_same_output(&dir.join("ref-b"), &dir.join("got"), &["ranks", "inputs"]);
}
