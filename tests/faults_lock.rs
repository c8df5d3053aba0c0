//! One run per output, attacked as issue 22 did: each way a live run's lock was taken over
//! (its rank 0 stopped past the staleness limit, its heartbeat unwritable for a while, a second
//! run in another PID namespace under the same hostname) must end with the right output
//! published by exactly one run, and the other failing with a clear message, publishing nothing.

use std::fs;

use crate::util::lock::{
    a_stderr, in_namespaces, inputs, lock, lock_field, paused_run, release, run_args, staging,
    stopped_in, wait_until, Hold, Immutable, Stopped, OUT,
};
use crate::util::verifier::assert_same_output;
use crate::util::{skip, snapshot, Dir, FAIL_FAST};

/// A clean run's output, to compare with.
fn reference(dir: &Dir) {
    dir.reshard(Some(1)).args(run_args("ref")).assert_success();
}

/// Run A's rank 0 is stopped (as `scontrol suspend` does) in its finish phase; run B, in
/// another PID namespace so that only A's heartbeat can tell, takes the output over once A has
/// been silent past B's `--lock-stale-after`, leaves A's staging directory (named after A's token)
/// alone, stages in its own and stops itself mid-exchange. A wakes: it must fail, naming the lock, publish nothing and leave B's files
/// alone (the bug: it published B's half-written staging directory with its own manifest and
/// exit 0). B then finishes to a clean run's bytes.
#[test]
fn a_run_stopped_before_finish_and_taken_over_fails_when_it_wakes() {
    taken_over_while_stopped("lock-stopped-finish", Hold::Finish);
}

/// As above, with A stopped between its finish and publish phases: the check right before the
/// publishing rename must catch it.
#[test]
fn a_run_stopped_before_publish_and_taken_over_fails_when_it_wakes() {
    taken_over_while_stopped("lock-stopped-publish", Hold::Publish);
}

fn taken_over_while_stopped(name: &str, hold: Hold) {
    let dir = Dir::new(name);
    inputs(&dir);
    reference(&dir);
    let a = paused_run(&dir, hold);
    let a_pid: i32 = lock_field(&dir, "pid").parse().unwrap();
    let a_token = lock_field(&dir, "token");
    let stopped_a = Stopped::stop(a_pid);

    let mut args = run_args(OUT);
    args.extend(["--lock-stale-after", "6"].map(String::from));
    let mut b = in_namespaces(&dir, &args);
    b.env("RESHARD_TEST_STALL_RANK", "0");
    let b = std::thread::spawn(move || b.output());
    wait_until("run B stops itself mid-exchange", || {
        stopped_in(&dir).iter().any(|&p| p != a_pid)
    });
    let stopped_b = Stopped::already(
        stopped_in(&dir)
            .into_iter()
            .filter(|&p| p != a_pid)
            .collect(),
    );
    let aside = dir.join(format!(".{OUT}.reshard-tmp.{a_token}"));
    assert!(
        aside.join(hold.marker(0)).exists(),
        "A's staging directory is left where it is"
    );
    assert!(
        !staging(&dir).join(hold.marker(0)).exists(),
        "the staging pointer leads to B's"
    );
    let b_staging = snapshot(&staging(&dir));

    // A's pause ends (once B moved A's staging directory aside, its markers went with it).
    release(&aside);
    drop(stopped_a);
    let a = a.join().unwrap();
    let said = a_stderr(&dir);
    a.check(
        a.code() == Some(1),
        &format!("A lost the output: it must fail\n{said}"),
    );
    let lost = format!("{}: this run lost the output's lock", lock(&dir).display());
    assert!(
        said.contains(&lost) && said.contains("Nothing is published"),
        "{said}"
    );
    a.check(!dir.join(OUT).exists(), "A must publish nothing");
    a.check(
        snapshot(&staging(&dir)) == b_staging,
        "A must leave B's staging directory alone",
    );
    a.check(!aside.exists(), "A removes its own staging directory");

    drop(stopped_b);
    let b = b.join().unwrap();
    b.check(b.code() == Some(0), "B must finish");
    b.stderr_has("taken over in");
    b.stderr_has(&format!("left {} alone", aside.display()));
    assert_same_output(&dir.join("ref"), &dir.join(OUT), &["ranks"]);
    assert!(!lock(&dir).exists() && !staging(&dir).exists());
}

/// Run A's lock cannot be written for a while (`chattr +i`, as a network filesystem failing
/// writes): its heartbeat must go on once writes work again (the bug: the heartbeat thread ended
/// at its first failed write, and any run that could not check A's pid took A's output over).
/// Run B, in another PID namespace, then sees the heartbeat move and refuses.
#[test]
fn a_heartbeat_that_fails_for_a_while_keeps_the_lock() {
    let dir = Dir::new("lock-immutable");
    inputs(&dir);
    reference(&dir);
    let a = paused_run(&dir, Hold::Finish);
    let Some(frozen) = Immutable::set(&lock(&dir)) else {
        release(&staging(&dir));
        a.join().unwrap();
        skip(
            "lock heartbeat",
            "chattr +i does not work on the temporary directory",
        );
        return;
    };
    let beat = lock_field(&dir, "beat");
    wait_until("A reports a failed heartbeat write", || {
        a_stderr(&dir).contains("cannot write the lock's heartbeat")
    });
    assert_eq!(lock_field(&dir, "beat"), beat, "the lock cannot change");
    drop(frozen);
    wait_until("A's heartbeat moves again", || {
        lock_field(&dir, "beat") != beat
    });

    let mut args = run_args(OUT);
    args.extend(["--lock-stale-after", "30"].map(String::from));
    let b = in_namespaces(&dir, &args).assert_code(1);
    b.stderr_has("another reshard run is writing it");
    b.check(b.elapsed < FAIL_FAST, "a beating lock is refused at once");

    release(&staging(&dir));
    let a = a.join().unwrap();
    a.check(a.code() == Some(0), "A keeps its output");
    let said = a_stderr(&dir);
    assert!(said.contains("the heartbeat is written again"), "{said}");
    assert_same_output(&dir.join("ref"), &dir.join(OUT), &["ranks"]);
    assert!(!lock(&dir).exists(), "the lock is released");
}

/// Run B starts in another UTS and PID namespace with the same hostname while A lives: A's pid
/// means nothing there, so B must judge A by its heartbeat and refuse (the bug: B found no such
/// pid, took A for dead at once, and removed A's staging directory).
#[test]
fn a_run_in_another_pid_namespace_does_not_judge_by_pid() {
    let dir = Dir::new("lock-pidns");
    inputs(&dir);
    reference(&dir);
    let a = paused_run(&dir, Hold::Finish);
    // A's heartbeats move all along (the file written aside, then renamed): A's, not B's.
    let untouched_by_b = || {
        let mut files = snapshot(&staging(&dir));
        files.retain(|(path, _)| !path.starts_with(".heartbeats"));
        files
    };
    let before = untouched_by_b();
    let b = in_namespaces(&dir, &run_args(OUT)).assert_code(1);
    b.stderr_has("another reshard run is writing it");
    b.stderr_has(&format!("{}", lock(&dir).display()));
    b.check(b.elapsed < FAIL_FAST, "a beating lock is refused at once");
    b.check(untouched_by_b() == before, "A's staging is untouched");

    release(&staging(&dir));
    let a = a.join().unwrap();
    a.check(
        a.code() == Some(0),
        &format!("A keeps its output\n{}", a_stderr(&dir)),
    );
    assert_same_output(&dir.join("ref"), &dir.join(OUT), &["ranks"]);
    assert!(!fs::exists(lock(&dir)).unwrap(), "the lock is released");
}

/// A PID namespace whose `/proc` is not its own (`unshare --pid --fork` without
/// `--mount-proc`, as some containers run): `getpid()` names a pid of that namespace, but
/// `/proc/PID` is the host's. Run A, there, holds the output (paused) under a pid the host's
/// `/proc` has no entry for; run B, in the same namespace, must not take A for dead by that pid
/// (the bug: "its run (pid N) is gone", and the lock taken over from a live run), but tell by
/// A's heartbeat, which moves: B is refused, and A publishes.
#[test]
fn a_run_whose_proc_is_not_its_pid_namespaces_is_never_judged_by_its_pid() {
    let dir = Dir::new("lock-foreign-proc");
    inputs(&dir);
    reference(&dir);
    let marker = staging(&dir).join(Hold::Finish.marker(0));
    // The namespace's next pid moved on to one the host's /proc has no entry for; A runs
    // under it, paused; B runs once A is; A is let go after B.
    let script = r#"r="$1"; m="$2"; shift 2
while :; do sleep 0 & p=$!; wait $p; [ -e /proc/$((p + 1)) ] || break; done
RESHARD_TEST_PAUSE_FINISH=600 "$r" "$@" 2>a.stderr & a=$!
while [ ! -e "$m" ] && kill -0 $a 2>/dev/null; do sleep 0.05; done
"$r" "$@" --lock-stale-after 30 2>b.stderr; echo $? >b.code
rm -f "$m"; wait $a; echo $? >a.code"#;
    let mut run = dir.program("unshare");
    run.args(["--pid", "--fork", "sh", "-c", script, "sh"])
        .arg(crate::util::reshard_exe())
        .arg(&marker)
        .args(run_args(OUT))
        // UCX reaches its shared memory through /proc/PID, the host's here: MPI_Init fails.
        .env("UCX_TLS", "self,tcp");
    run.assert_success();
    let (a, b) = (
        a_stderr(&dir),
        fs::read_to_string(dir.join("b.stderr")).unwrap(),
    );
    let code = |name: &str| fs::read_to_string(dir.join(name)).unwrap();
    assert!(!b.contains("is gone"), "B judged A by its pid:\n{b}");
    assert_eq!(code("b.code").trim(), "1", "B is refused:\n{b}\nA:\n{a}");
    assert!(b.contains("another reshard run is writing it"), "{b}");
    assert_eq!(code("a.code").trim(), "0", "A keeps its output:\n{a}");
    assert_same_output(&dir.join("ref"), &dir.join(OUT), &["ranks"]);
}
