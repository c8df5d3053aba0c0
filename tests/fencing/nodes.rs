//! Fencing on an object store's output staged on each node's own `--scratch` (one host: a test
//! hook stages per node, and two scratch directories stand for two nodes' disks): what a run
//! takes of an earlier run's heartbeats in the bucket and of its copy on a node's disk.

use crate::util::data::sized;
use crate::util::lock::{in_namespaces, wait_until};
use crate::util::s3::Server;
use crate::util::stores::Store as _;
use crate::util::{signal, Dir};

use super::{kill_all_but, stop_run_a, upload_args};

/// Heartbeats in the bucket (an output staged per node; one host does it with a test hook) are
/// named by the run's one token, its lock's: run A (another PID namespace, so only its silence
/// can tell) is stopped as it starts beating, B takes the output over by A's silence and is
/// killed (its pid proves it dead), and C takes the output over from B. C removes B's heartbeats
/// and leaves A's: A may live (the bug: a takeover removed every run's heartbeats, and the
/// staging directory that names them had a token of its own, not the lock's). A, continued,
/// fails having lost the lock and removes its own: nothing is left beside C's output.
#[test]
fn a_takeover_removes_only_the_heartbeats_of_the_run_it_proved_dead() {
    let Some((dir, s3, bucket, target)) =
        three_runs("a_takeover_removes_only_the_heartbeats_of_the_run_it_proved_dead")
    else {
        return;
    };
    // The tokens whose heartbeats are in the bucket, sorted.
    let beating = || -> Vec<String> {
        let mut tokens: Vec<String> = s3
            .keys(&dir, &bucket, ".out.reshard-tmp.")
            .into_iter()
            .filter_map(|k| {
                let (prefix, rest) = k.split_once('/')?;
                let token = prefix.strip_prefix(".out.reshard-tmp.")?;
                rest.starts_with(".heartbeats/").then(|| token.to_string())
            })
            .collect();
        tokens.dedup();
        tokens
    };
    let holder = || lock_holder(s3, &dir, &bucket);
    let per_node = |cmd: &mut crate::util::TestCommand, scratch: &str| {
        staged_per_node(cmd, s3, &dir, scratch);
    };
    let mut a = in_namespaces(&dir, &upload_args(&target, 4, "1"));
    per_node(&mut a, "scratch-a");
    let a = std::thread::spawn(move || a.output());
    wait_until("run A beats in the bucket", || !beating().is_empty());
    let (a_pid, stopped_a) = stop_run_a(&dir);
    let a_token = holder();
    assert_eq!(
        beating(),
        std::slice::from_ref(&a_token),
        "named by A's lock's token"
    );

    let mut b = dir.reshard(None);
    b.args(upload_args(&target, 4, "2"))
        .args(["--lock-stale-after", "1"]);
    per_node(&mut b, "scratch-b");
    let b = std::thread::spawn(move || b.output());
    wait_until("run B beats in the bucket", || beating().len() == 2);
    let b_token = holder();
    assert!(b_token != a_token && beating().contains(&b_token));
    kill_all_but(&dir, a_pid);
    let b = b.join().unwrap();
    b.check(b.code() != Some(0), "B was killed");
    b.stderr_has("taking over");

    let mut c = dir.reshard(None);
    c.args(upload_args(&target, 4, "3"))
        .arg("--scratch")
        .arg(dir.join("scratch-c"));
    s3.with_env(&mut c);
    c.assert_success();
    assert_eq!(beating(), [a_token], "only B's heartbeats go: A may live");

    drop(stopped_a);
    let a = a.join().unwrap();
    a.check(a.code() == Some(1), "A lost the output: it must fail");
    a.stderr_has("this run lost the output's lock");
    assert_eq!(beating(), Vec::<String>::new(), "A removed its own");
    s3.assert_only_the_output(&dir, &bucket, "ref-c", &["ranks", "inputs"]);
}

/// Three runs on an output staged on each node's own `--scratch` (one host: two scratch
/// directories stand for two nodes' disks, the per-node staging forced by a test hook). Run A
/// (rank 0 on node 0; another PID namespace, so that only its silence can tell) is stopped as it
/// starts beating; run B (rank 0 on node 1) takes the lock over by A's silence, publishes and
/// releases the lock; run C (rank 0 on node 0, with `--resume`) finds the lock free, and the
/// staging pointer on node 0 leading to A's copy. Nothing in the bucket names A (B's publish
/// left no marker), so C leaves A's copy alone and starts over; A, continued, fails having lost
/// the lock and removes its own. The bug: C took A's copy over (with `--resume`, renamed it to
/// its own; without, removed it) while A lived.
#[test]
fn a_run_finding_the_lock_free_leaves_a_node_copy_nothing_in_the_bucket_names() {
    let Some((dir, s3, bucket, target)) =
        three_runs("a_run_finding_the_lock_free_leaves_a_node_copy_nothing_in_the_bucket_names")
    else {
        return;
    };
    let per_node = |cmd: &mut crate::util::TestCommand, node: &str| {
        staged_per_node(cmd, s3, &dir, node);
    };
    let beats = || !s3.keys(&dir, &bucket, ".out.reshard-tmp.").is_empty();
    let mut a = in_namespaces(&dir, &upload_args(&target, 4, "1"));
    per_node(&mut a, "node-0");
    let a = std::thread::spawn(move || a.output());
    wait_until("run A beats in the bucket", beats);
    let (_, stopped_a) = stop_run_a(&dir);
    let a_token = lock_holder(s3, &dir, &bucket);
    let node_0 = crate::util::staged_bucket(&dir.join("node-0"), &bucket).unwrap();
    let a_copy = node_0.join(format!(".out.reshard-tmp.{a_token}"));
    assert!(a_copy.is_dir(), "{}", crate::util::listing(&node_0));

    let mut b = dir.reshard(None);
    b.args(upload_args(&target, 4, "2"))
        .args(["--lock-stale-after", "1"]);
    per_node(&mut b, "node-1");
    let b = b.output();
    b.check(b.code() == Some(0), "B takes the output over and publishes");
    b.stderr_has("taking over");

    let mut c = dir.reshard(None);
    c.args(upload_args(&target, 4, "3"))
        .args(["--force", "--resume"]);
    per_node(&mut c, "node-0");
    let c = c.output();
    c.check(c.code() == Some(0), "C publishes");
    c.stderr_has("left");
    c.stderr_has("nothing in its store names that run");
    c.check(
        a_copy.is_dir(),
        &format!("A's copy must be left: {}", crate::util::listing(&node_0)),
    );

    drop(stopped_a);
    let a = a.join().unwrap();
    a.check(a.code() == Some(1), "A lost the output: it must fail");
    a.stderr_has("this run lost the output's lock");
    a.check(!a_copy.exists(), "A removed its own copy");
    s3.assert_only_the_output(&dir, &bucket, "ref-c", &["ranks", "inputs"]);
}

/// The three runs again, A now stopped in its upload: its copy on node 0 was renamed to the
/// staged path (no token in its name) and uploads from there. C, finding the lock free, moves
/// that copy aside rather than removing it while A may live: whether B published (no marker
/// left in the bucket) or failed after its begin (B's marker left, naming B, which staged on
/// node 1: a marker names no node). The bug: C removed it; after a failed B, still after the
/// first fix (it trusted any failed run's marker to claim the copy).
#[test]
fn a_run_finding_the_lock_free_moves_an_unclaimed_staged_copy_aside() {
    for b_fails in [false, true] {
        a_stopped_in_its_upload_and_c_on_its_node(b_fails);
    }
}

fn a_stopped_in_its_upload_and_c_on_its_node(b_fails: bool) {
    let test = if b_fails {
        "a_run_finding_the_lock_free_moves_an_unclaimed_staged_copy_aside_b_failed"
    } else {
        "a_run_finding_the_lock_free_moves_an_unclaimed_staged_copy_aside"
    };
    let Some((dir, s3, bucket, target)) = three_runs(test) else {
        return;
    };
    let shards_up = || {
        s3.keys(&dir, &bucket, "out/")
            .into_iter()
            .filter(|k| k.ends_with(".tar") && !k.contains("/."))
            .count()
    };
    let mut a = in_namespaces(&dir, &upload_args(&target, 4, "1"));
    staged_per_node(&mut a, s3, &dir, "node-0");
    let a = std::thread::spawn(move || a.output());
    wait_until("run A has uploaded a shard", || shards_up() >= 1);
    let (_, stopped_a) = stop_run_a(&dir);
    let node_0 = crate::util::staged_bucket(&dir.join("node-0"), &bucket).unwrap();
    assert!(node_0.join("out/index.json").exists(), "A's copy is staged");

    let mut b_args = upload_args(&target, 4, "2");
    if b_fails {
        // B's input: a copy of A's with a shard cut short, refused once B has begun.
        crate::util::copy_dir(&dir.join("in"), &dir.join("in-cut"));
        let shard = crate::util::tar_files(&dir.join("in-cut"))[1].clone();
        let len = std::fs::metadata(&shard).unwrap().len();
        std::fs::File::options()
            .write(true)
            .open(&shard)
            .unwrap()
            .set_len(len / 2 + 100)
            .unwrap();
        let at = b_args.iter().position(|a| a == "in").unwrap();
        b_args[at] = "in-cut".into();
    }
    let mut b = dir.reshard(None);
    b.args(&b_args).args(["--lock-stale-after", "1"]);
    staged_per_node(&mut b, s3, &dir, "node-1");
    let b = b.output();
    if b_fails {
        b.check(b.code() == Some(1), "B fails on its cut input");
        // B's own marker is left, alone: A's, which B's supersedes, went.
        let markers = s3.keys(&dir, &bucket, "out/.reshard-incomplete");
        let [marker] = &markers[..] else {
            panic!("one marker is left, B's: {markers:?}")
        };
        let marker = s3.cat(&dir, &bucket, marker);
        assert!(marker.contains("carried"), "B's marker is left: {marker}");
    } else {
        b.check(b.code() == Some(0), "B takes the output over and publishes");
    }

    let mut c = dir.reshard(None);
    c.args(upload_args(&target, 4, "3")).arg("--force");
    staged_per_node(&mut c, s3, &dir, "node-0");
    let c = c.output();
    c.check(c.code() == Some(0), "C publishes");
    c.stderr_has("aside");
    let aside = moved_aside(&node_0);
    c.check(
        aside.len() == 1 && aside[0].join("index.json").exists(),
        &format!(
            "A's copy must be moved aside whole: {}",
            crate::util::listing(&node_0)
        ),
    );

    drop(stopped_a);
    let a = a.join().unwrap();
    a.check(a.code() == Some(1), "A lost the output: it must fail");
    s3.assert_only_the_output(&dir, &bucket, "ref-c", &["ranks", "inputs"]);
}

/// A copy of run A on node 0's disk, left by a run C that found the lock free while A was only
/// stopped (A may live), goes once A is really dead (SIGKILL): the next run D on that node
/// finds that every process that made it is gone (their pids, checked from there) and removes
/// it. The bug: it stayed until removed by hand, since nothing recorded A's pid once B took the
/// lock. Here the copy the staging pointer leads to (`.out.reshard-tmp.A`), left alone.
#[test]
fn a_node_copy_left_alone_goes_once_its_run_is_killed() {
    a_killed_after_its_copy_was_left(
        "a_node_copy_left_alone_goes_once_its_run_is_killed",
        false,
        false,
    );
}

/// The same, A stopped in its upload: C moves its copy at the staged path aside
/// (`.out.reshard-left.TOKEN`), and D removes that once A is killed.
#[test]
fn a_node_copy_moved_aside_goes_once_its_run_is_killed() {
    a_killed_after_its_copy_was_left(
        "a_node_copy_moved_aside_goes_once_its_run_is_killed",
        true,
        false,
    );
}

/// A's copy made in another PID namespace (a container on the same node): its pid says
/// nothing to C and D, so the copy stays even after A is killed, and both say why.
#[test]
fn a_node_copy_made_in_another_pid_namespace_stays() {
    a_killed_after_its_copy_was_left(
        "a_node_copy_made_in_another_pid_namespace_stays",
        false,
        true,
    );
}

/// The three runs on node-local copies, then A killed and a fourth run D on node 0. A runs
/// `elsewhere` (another PID namespace than C and D) or not; B runs where A's pid cannot be
/// checked (the other namespace), so that it takes the lock over by A's silence. A is stopped
/// `in_upload` (its copy renamed to the staged path, which C moves aside) or as it starts
/// beating (its copy at its token's name, which C leaves alone).
fn a_killed_after_its_copy_was_left(test: &str, in_upload: bool, elsewhere: bool) {
    let Some((dir, s3, bucket, target)) = three_runs(test) else {
        return;
    };
    let run = |args: Vec<String>, in_ns: bool| {
        if in_ns {
            in_namespaces(&dir, &args)
        } else {
            let mut cmd = dir.reshard(None);
            cmd.args(args);
            cmd
        }
    };
    let mut a = run(upload_args(&target, 4, "1"), elsewhere);
    staged_per_node(&mut a, s3, &dir, "node-0");
    let a = std::thread::spawn(move || a.output());
    if in_upload {
        wait_until("run A has uploaded a shard", || {
            s3.keys(&dir, &bucket, "out/")
                .iter()
                .any(|k| k.ends_with(".tar") && !k.contains("/."))
        });
    } else {
        wait_until("run A beats in the bucket", || {
            !s3.keys(&dir, &bucket, ".out.reshard-tmp.").is_empty()
        });
    }
    let (a_pid, stopped_a) = stop_run_a(&dir);
    let a_token = lock_holder(s3, &dir, &bucket);
    let node_0 = crate::util::staged_bucket(&dir.join("node-0"), &bucket).unwrap();
    let a_copy = if in_upload {
        node_0.join("out")
    } else {
        node_0.join(format!(".out.reshard-tmp.{a_token}"))
    };
    assert!(a_copy.is_dir(), "{}", crate::util::listing(&node_0));

    let mut b = run(upload_args(&target, 4, "2"), !elsewhere);
    b.args(["--lock-stale-after", "1"]);
    staged_per_node(&mut b, s3, &dir, "node-1");
    let b = b.output();
    b.check(b.code() == Some(0), "B takes the output over and publishes");
    b.stderr_has("has not moved its heartbeat");

    let on_node_0 = || {
        let mut cmd = dir.reshard(None);
        cmd.args(upload_args(&target, 4, "3")).arg("--force");
        staged_per_node(&mut cmd, s3, &dir, "node-0");
        cmd.output()
    };
    let why_kept = if elsewhere {
        "in another boot or PID namespace".to_string()
    } else {
        format!("its maker, pid {a_pid} on")
    };
    let c = on_node_0();
    c.check(c.code() == Some(0), "C publishes");
    let left = if in_upload {
        let aside = moved_aside(&node_0);
        c.check(aside.len() == 1, "A's copy is moved aside");
        aside[0].clone()
    } else {
        a_copy.clone()
    };
    c.check(
        left.is_dir(),
        &format!("A's copy stays: {}", crate::util::listing(&node_0)),
    );

    signal(u32::try_from(a_pid).unwrap(), libc::SIGKILL);
    let a = a.join().unwrap();
    a.check(a.code() != Some(0), "A was killed");
    drop(stopped_a);

    let d = on_node_0();
    d.check(d.code() == Some(0), "D publishes");
    if elsewhere {
        d.check(
            left.is_dir(),
            &format!("A's copy stays: {}", crate::util::listing(&node_0)),
        );
        d.stderr_has(&why_kept);
    } else {
        d.check(
            !left.exists(),
            &format!("A's copy goes: {}", crate::util::listing(&node_0)),
        );
        d.stderr_has(&format!("removed {}", left.display()));
    }
    // C said why it left the copy: A lived, or its pid could not be checked.
    c.stderr_has(&why_kept);
    // A killed leaves its heartbeats in the bucket (nothing proves its death there): not this
    // test's subject.
    for key in s3.keys(&dir, &bucket, &format!(".out.reshard-tmp.{a_token}/")) {
        s3.remove(&dir, &bucket, &key);
    }
    s3.assert_only_the_output(&dir, &bucket, "ref-c", &["ranks", "inputs"]);
}

/// The copies moved aside in the directory `node` (`.out.reshard-left.TOKEN`).
fn moved_aside(node: &std::path::Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(node)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.to_string_lossy().contains(".out.reshard-left."))
        .collect()
}

/// The token of the run holding the lock of `out` in `bucket`.
fn lock_holder(s3: &crate::util::s3::Server, dir: &Dir, bucket: &str) -> String {
    let lock = s3.cat(dir, bucket, ".out.reshard-lock");
    lock.lines()
        .find_map(|l| l.strip_prefix("token "))
        .map(str::to_string)
        .unwrap_or_else(|| panic!("no token in the lock:\n{lock}"))
}

/// `cmd` staged as if on each node's own `--scratch` (a test hook), `scratch` standing for its
/// node's disk, its writes slowed so that it can be stopped mid-run, against the server `s3`.
fn staged_per_node(
    cmd: &mut crate::util::TestCommand,
    s3: &crate::util::s3::Server,
    dir: &Dir,
    scratch: &str,
) {
    cmd.env("RESHARD_TEST_PER_NODE", "1")
        .args(["--max-write-rate", "1MiB", "--scratch"])
        .arg(dir.join(scratch));
    s3.with_env(cmd);
}

/// The set-up of three runs on `s3://BUCKET/out`: 8 MiB of input, the bytes of the last run's
/// request (seed 3) on a file system in `ref-c`, the server, the bucket and the output.
fn three_runs(test: &str) -> Option<(Dir, &'static Server, String, String)> {
    let dir = Dir::new(test);
    sized(&dir, "in", "8MiB", "64KiB", 4);
    let s3 = crate::util::s3::server(test)?;
    let bucket = s3.bucket(&dir, test);
    let target = format!("s3://{bucket}/out");
    dir.reshard(None)
        .args(upload_args("ref-c", 4, "3"))
        .assert_success();
    Some((dir, s3, bucket, target))
}
