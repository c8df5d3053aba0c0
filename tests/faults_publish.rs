//! Publishing under attack (issue 22, items 6-9): a directory that appears at the output during
//! the run is never replaced; `--force` replaces only a reshard output; a failure before the
//! publishing rename leaves a finished staging directory that `--resume` publishes; a failure
//! after it exits 3 ("published; clean-up failed"); an interrupted `--keep` is finished by the
//! next run; and every rank killed at every moment leaves the older output or the new one,
//! never a mix, with `--resume` then giving the clean run's bytes. Every exit status that
//! docs/guarantees.md lists is asserted here.

use std::fs;
use std::path::Path;
use std::process::Command;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::util::data::sized;
use crate::util::verifier::assert_same_output;
use crate::util::{copy_dir, skip, snapshot, Dir, RunOutput, TestCommand, FAIL_FAST};

/// Inputs of ~3.5 MiB: about 11 exchange rounds at np 2 with a 1 MiB budget.
fn inputs(dir: &Dir) {
    sized(dir, "in", "3MiB", "16KiB", 4);
}

/// `reshard run` of `in` to `out` under `mpirun -np np` (or without a launcher), with small
/// rounds and a checkpoint after every round.
fn job(dir: &Dir, np: Option<usize>, out: &str, extra: &[&str]) -> TestCommand {
    let mut cmd = dir.reshard(np);
    cmd.args(["run", "--input", "in", "--output", out, "--shards", "4"])
        .args(["--mem-limit", "1MiB", "--checkpoint-every", "0"]);
    if !extra.contains(&"--seed") {
        cmd.args(["--seed", "3"]);
    }
    cmd.args(extra);
    cmd
}

/// Starts `cmd` with every rank pausing before the finish phase, and returns once rank 0 is
/// paused (the data has moved): the caller then has `PAUSE` seconds to change the output.
fn paused(dir: &Dir, staging: &str, mut cmd: TestCommand) -> JoinHandle<RunOutput> {
    cmd.env("RESHARD_TEST_PAUSE_FINISH", PAUSE.to_string());
    let run = std::thread::spawn(move || cmd.output());
    let marker = dir.join(format!("{staging}/.paused-0"));
    let start = Instant::now();
    while !marker.exists() {
        assert!(start.elapsed() < 2 * FAIL_FAST, "the run never paused");
        assert!(!run.is_finished(), "the run ended before it paused");
        std::thread::sleep(Duration::from_millis(20));
    }
    run
}

const PAUSE: u64 = 4;

/// Resumes the run on `out` (with `extra`): it publishes without moving data again.
fn resumed_without_moving_data(dir: &Dir, out: &str, extra: &[&str]) {
    let mut args = vec!["--resume"];
    args.extend(extra);
    let res = job(dir, Some(2), out, &args).assert_success();
    res.stderr_has("--resume: continuing the run");
    res.check(
        res.stdout.contains("4 of 4 shards") && res.stdout.contains("exchange rounds: 0"),
        "every shard must be reused, no data moved",
    );
    assert_same_output(&dir.join("ref"), &dir.join(out), &["ranks"]);
}

/// Item 6 and 8: without `--force`, a directory with a user's file that appears at the output
/// while the run is in its finish phase stays as it is; the job fails saying so, the finished
/// staging directory stays, and `--resume` publishes it once the path is free.
#[test]
fn a_directory_appearing_at_the_output_is_left_alone_and_resume_publishes() {
    let dir = Dir::new("appearing-output");
    inputs(&dir);
    job(&dir, Some(1), "ref", &[]).assert_success();
    let run = paused(&dir, ".out.reshard-tmp", job(&dir, Some(2), "out", &[]));
    dir.create_bytes("out/thesis.txt", b"four years of work\n");
    let res = run.join().unwrap();
    res.check(res.code() == Some(1), "publishing must fail with status 1");
    res.stderr_has("appeared there during the run; not replacing it");
    res.stderr_has("a directory holding thesis.txt");
    res.stderr_has("--resume");
    res.check(
        fs::read(dir.join("out/thesis.txt")).unwrap() == b"four years of work\n"
            && fs::read_dir(dir.join("out")).unwrap().count() == 1,
        "the user's directory must be left exactly as it was",
    );
    res.check(
        dir.join(".out.reshard-tmp/.resume/checkpoint.json")
            .is_file(),
        "the finished staging directory must keep its checkpoint records",
    );
    fs::rename(dir.join("out"), dir.join("mine")).unwrap();
    resumed_without_moving_data(&dir, "out", &[]);
    assert!(dir.join("mine/thesis.txt").is_file());
}

/// Item 7: `--force` onto a directory reshard did not write is refused before any work, naming
/// what is there; and a reshard output replaced by a user's directory during the run is not
/// replaced at publishing either.
#[test]
fn force_replaces_only_a_reshard_output() {
    let dir = Dir::new("force-foreign");
    inputs(&dir);
    job(&dir, Some(1), "ref", &[]).assert_success();
    dir.create_bytes("out/cv.txt", b"curriculum vitae\n");
    dir.create_bytes("out/docs/notes.txt", b"notes\n");
    let before = snapshot(&dir.join("out"));
    let res = job(&dir, Some(2), "out", &["--force"]).assert_code(1);
    res.stderr_has("before the run it is a directory holding cv.txt, docs/");
    res.stderr_has("no index.json written by reshard");
    res.stderr_has("--force replaces only an empty directory or an output reshard wrote");
    res.check(res.elapsed < FAIL_FAST, "refusing must be quick");
    res.check(
        snapshot(&dir.join("out")) == before,
        "the directory changed",
    );
    res.check(
        !dir.join(".out.reshard-tmp").exists() && !dir.join(".out.reshard-lock").exists(),
        "refused before any work: no staging directory, no lock",
    );

    // An older reshard output, swapped for a user's directory while the run moves data.
    job(&dir, Some(1), "old", &["--seed", "4"]).assert_success();
    let run = paused(
        &dir,
        ".old.reshard-tmp",
        job(&dir, Some(2), "old", &["--force"]),
    );
    fs::rename(dir.join("old"), dir.join("old-moved")).unwrap();
    dir.create_bytes("old/notes.txt", b"mine\n");
    let res = run.join().unwrap();
    res.check(res.code() == Some(1), "publishing must fail with status 1");
    res.stderr_has("at publishing it is a directory holding notes.txt");
    res.check(
        fs::read(dir.join("old/notes.txt")).unwrap() == b"mine\n",
        "the user's file must stay",
    );
    fs::remove_dir_all(dir.join("old")).unwrap();
    // The moved reshard output is back: --force replaces it.
    fs::rename(dir.join("old-moved"), dir.join("old")).unwrap();
    resumed_without_moving_data(&dir, "old", &["--force"]);
}

/// Item 9: a `--link` that cannot be switched once the output is published exits 3, saying the
/// output is live; a `--link` or `--keep` problem is never "nothing published" (1).
#[test]
fn a_failing_link_after_publishing_exits_3() {
    let dir = Dir::new("link-after-publish");
    inputs(&dir);
    job(&dir, Some(1), "ref", &[]).assert_success();
    let run = paused(
        &dir,
        ".out.reshard-tmp",
        job(&dir, Some(2), "out", &["--link", "current"]),
    );
    dir.create_bytes("current/mine.txt", b"mine\n");
    let res = run.join().unwrap();
    res.check(res.code() == Some(3), "a failure after publishing exits 3");
    res.stderr_has("published ");
    res.stderr_has("(the new output is live and complete); clean-up failed: --link current");
    assert_same_output(&dir.join("ref"), &dir.join("out"), &["ranks"]);
    assert!(dir.join("current/mine.txt").is_file());
    assert!(!dir.join(".out.reshard-tmp").exists());
}

/// `reshard run` of epoch `epoch` of the series `data/epoch-{epoch}` with `--keep 2`.
fn epoch(dir: &Dir, epoch: u64) -> TestCommand {
    let out = "data/epoch-{epoch}";
    let mut cmd = job(dir, None, out, &["--keep", "2"]);
    cmd.args(["--epoch", &epoch.to_string()]);
    cmd
}

/// The entries of `data/` but a lock a killed run left and the heartbeats it had moved aside
/// for publishing (the next run on that output takes the lock over and removes them), sorted.
fn entries(dir: &Dir) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir.join("data"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !n.ends_with(".reshard-lock") && !n.ends_with(".heartbeats"))
        .collect();
    names.sort();
    names
}

/// Item 9: `--keep` moves an old epoch aside before removing it; a removal cut short by a kill
/// or by an error is finished by the next `--keep` run; the error exits 3.
#[test]
fn an_interrupted_keep_is_finished_by_the_next_run() {
    let dir = Dir::new("keep-interrupted");
    inputs(&dir);
    dir.create_dir("data");
    epoch(&dir, 0).assert_success();
    epoch(&dir, 1).assert_success();
    // Reshard's aside name, but of another series: never touched.
    dir.create_bytes("data/.notes.reshard-removing/notes.txt", b"mine\n");
    // Killed right after moving epoch 0 aside: epoch 2 is published, epoch 0 half-way.
    let res = epoch(&dir, 2).env("RESHARD_TEST_KILL", "0:keep").output();
    res.check(res.code() != Some(0), "the killed run must fail");
    assert_eq!(
        entries(&dir),
        [
            ".epoch-0.reshard-removing",
            ".notes.reshard-removing",
            "epoch-1",
            "epoch-2"
        ]
    );
    // Epoch 3 finishes the removal, then cannot remove epoch 1: a mount point inside it (as
    // root; an immutable file or a stale NFS handle would do the same).
    let pin = dir.create_dir("data/epoch-1/.reshard/pinned");
    if !mount_tmpfs(&pin) {
        return;
    }
    let res = epoch(&dir, 3).output();
    let aside = dir.join("data/.epoch-1.reshard-removing");
    let _ = Command::new("umount")
        .arg(aside.join(".reshard/pinned"))
        .status();
    res.check(res.code() == Some(3), "a failing --keep exits 3");
    res.stderr_has("finishing the removal of");
    res.stderr_has("(the new output is live and complete); clean-up failed: --keep: cannot remove");
    res.stderr_has("the next run with --keep finishes it");
    assert_eq!(
        entries(&dir),
        [
            ".epoch-1.reshard-removing",
            ".notes.reshard-removing",
            "epoch-2",
            "epoch-3"
        ]
    );
    let res = epoch(&dir, 4).assert_success();
    res.stderr_has("finishing the removal of");
    assert_eq!(
        entries(&dir),
        [".notes.reshard-removing", "epoch-3", "epoch-4"]
    );
    assert!(dir.join("data/.notes.reshard-removing/notes.txt").is_file());
}

/// Mounts a small tmpfs at `at`, which no `rmdir` can then remove; false (and a skip) where
/// this process may not mount.
fn mount_tmpfs(at: &Path) -> bool {
    let ok = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=64k", "tmpfs"])
        .arg(at)
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        skip(
            "an_interrupted_keep_is_finished_by_the_next_run (its failing removal)",
            "cannot mount a tmpfs here (needs root)",
        );
    }
    ok
}

/// The kill matrix: every rank killed (SIGKILL) at moments in every phase, with `--force` over
/// an older output, at np 2. After each kill the older output is intact or the new one is
/// complete (never a mix, never neither), and `--resume` then gives the clean run's bytes.
#[test]
fn every_rank_killed_anywhere_leaves_old_or_new_and_resume_is_identical() {
    let dir = Dir::new("kill-matrix");
    inputs(&dir);
    job(&dir, Some(1), "ref", &[]).assert_success();
    job(&dir, Some(1), "old", &["--seed", "4"]).assert_success();
    let old = snapshot(&dir.join("old"));
    // Rank 0 alone reaches the points inside publishing.
    let everywhere = ["index", "plan", "1", "5", "finish", "publish"];
    let cases = everywhere.iter().flat_map(|p| [(0, *p), (1, *p)]).chain([
        (0, "rename"),
        (0, "renamed"),
        (0, "published"),
    ]);
    for (victim, point) in cases {
        let out = format!("out-{victim}-{point}");
        copy_dir(&dir.join("old"), &dir.create_dir(&out));
        let res = job(&dir, Some(2), &out, &["--force"])
            .env("RESHARD_TEST_KILL", format!("{victim}:{point}"))
            .output();
        let at = format!("rank {victim} killed at {point}");
        res.check(res.code() != Some(0), &format!("{at}: the job must fail"));
        res.stderr_has(&format!("rank {victim} now dies (SIGKILL) at {point}"));
        let now = dir.join(&out);
        res.check(
            now.is_dir(),
            &format!("{at}: neither the older output nor the new one is at the output"),
        );
        if snapshot(&now) != old {
            // Not the old output: then the whole new one, and only it.
            res.check(
                !matches!(point, "index" | "plan" | "1" | "5" | "finish" | "rename"),
                &format!("{at}: the older output changed before publishing"),
            );
            let check = dir.join(format!("{out}-check"));
            copy_dir(&now, &dir.create_dir(&check));
            // Killed between the rename and the removal of the checkpoint records (at
            // `renamed`, or by a peer's kill), the new output holds them.
            let _ = fs::remove_dir_all(check.join(".resume"));
            assert_same_output(&dir.join("ref"), &check, &["ranks"]);
        } else {
            res.check(
                !matches!(point, "renamed" | "published"),
                &format!("{at}: the new output must be live"),
            );
        }
        let res = job(&dir, Some(2), &out, &["--force", "--resume"]).assert_success();
        assert_same_output(&dir.join("ref"), &now, &["ranks"]);
        if victim == 0 && matches!(point, "publish" | "rename") {
            // Killed with every shard complete and its records kept: no data moves again.
            res.check(
                res.stdout.contains("exchange rounds: 0"),
                &format!("{at}: the resumed run must move no data"),
            );
        }
        res.check(
            !dir.join(format!(".{out}.reshard-tmp")).exists()
                && !dir.join(format!(".{out}.reshard-lock")).exists(),
            "the staging directory and the lock must be gone",
        );
    }
}

/// The statuses docs/guarantees.md lists that the tests above do not: 0, 2, 70 and 75.
#[test]
fn every_exit_status_as_documented() {
    let dir = Dir::new("exit-statuses");
    inputs(&dir);
    job(&dir, Some(2), "out", &[]).assert_code(0);
    // A usage error: --keep needs {epoch} in the output's name.
    let res = job(&dir, Some(2), "other", &["--keep", "1"]).assert_code(2);
    res.check(!dir.join("other").exists(), "nothing written");
    // A panic aborts every rank with 70.
    let res = job(&dir, Some(2), "panicked", &[])
        .env("RESHARD_TEST_PANIC_RANK", "1")
        .assert_code(70);
    res.stderr_has("injected panic");
    // The stall watchdog ends the job with 75.
    let res = job(&dir, Some(2), "stalled", &["--stall-timeout", "2"])
        .env("RESHARD_TEST_STALL_RANK", "1")
        .assert_code(75);
    res.stderr_has("--stall-timeout");
    for out in ["panicked", "stalled"] {
        assert!(!dir.join(out).exists(), "{out}: nothing may be published");
    }
}

/// `--force` on a file system where the user's file in the replaced output has a name the new
/// output also has: the new output is published (exit 0), the user's other files are moved
/// into it, and the colliding one is left, alone, in `NAME.reshard-replaced`, which the message
/// names; nothing of it is deleted.
#[test]
fn force_leaves_a_users_file_whose_name_the_new_output_takes_and_says_where() {
    let dir = Dir::new("force-collide");
    sized(&dir, "in", "512KiB", "16KiB", 2);
    let run = |shards: &str, force: bool| {
        let mut cmd = dir.reshard(None);
        cmd.args(["run", "--input", "in", "--output", "out", "--seed", "1"]);
        cmd.args(["--shards", shards]);
        if force {
            cmd.arg("--force");
        }
        let res = cmd.output();
        res.check(res.code() == Some(0), "published");
        res
    };
    run("2", false);
    // Not a shard of the old output (of two): the new one, of three, writes that name.
    dir.create_bytes("out/shard-000002.tar", b"the user's tar");
    dir.create_bytes("out/notes/notes.txt", b"the user's notes");
    let res = run("3", true);
    res.stderr_has("they are left in");
    res.stderr_has("out.reshard-replaced");
    let kept: Vec<_> = fs::read_dir(dir.join("out.reshard-replaced"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(kept, ["shard-000002.tar"]);
    let read = |name: &str| fs::read(dir.join(name)).unwrap();
    assert_eq!(
        read("out.reshard-replaced/shard-000002.tar"),
        b"the user's tar"
    );
    assert_eq!(read("out/notes/notes.txt"), b"the user's notes");
    assert_ne!(read("out/shard-000002.tar"), b"the user's tar");
    // Nothing at a staging name: a next run would take it.
    let staged: Vec<String> = fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("reshard-tmp"))
        .collect();
    assert!(staged.is_empty(), "{staged:?}");
}

/// A `--force` run killed between its publishing exchange and the end of the replaced output's
/// removal (`0:published`) leaves the older output at its staging name, the user's files
/// inside. The next run finishes that removal as `--force` does: only what reshard wrote of it
/// goes, and the user's files survive byte for byte in the output (the bug: the next run removed
/// the directory whole, the user's files with it).
#[test]
fn a_users_files_in_an_output_replaced_by_a_run_killed_after_its_exchange_survive() {
    let dir = Dir::new("force-killed-after-swap");
    sized(&dir, "in", "512KiB", "16KiB", 2);
    let run = |out: &str, seed: &str| {
        let mut cmd = dir.reshard(None);
        cmd.args(["run", "--input", "in", "--output", out, "--shards", "2"])
            .args(["--seed", seed]);
        cmd
    };
    run("out", "1").assert_success();
    dir.create_bytes("out/README", b"the user's readme");
    dir.create_bytes("out/notes/notes.txt", b"the user's notes");
    let res = run("out", "2")
        .arg("--force")
        .env("RESHARD_TEST_KILL", "0:published")
        .output();
    res.check(res.code() != Some(0), "the run was killed");
    res.stderr_has("now dies (SIGKILL) at published");
    waits_at_the_staging_name(&dir, "README", b"the user's readme");

    let res = run("out", "3").arg("--force").assert_success();
    res.stderr_has("finishing the removal of the output");
    let read = |name: &str| fs::read(dir.join(name)).unwrap();
    assert_eq!(read("out/README"), b"the user's readme");
    assert_eq!(read("out/notes/notes.txt"), b"the user's notes");
    run("ref", "3").assert_success();
    let check = dir.create_dir("check");
    copy_dir(&dir.join("out"), &check);
    fs::remove_file(check.join("README")).unwrap();
    fs::remove_dir_all(check.join("notes")).unwrap();
    assert_same_output(&dir.join("ref"), &check, &[]);
    nothing_at_a_staging_name(&dir);
}

/// The output `out` that a `--force` run replaced waits at that run's staging name (where the
/// staging pointer leads), with the user's file `name` holding `bytes`.
fn waits_at_the_staging_name(dir: &Dir, name: &str, bytes: &[u8]) {
    let waiting = fs::canonicalize(dir.join(".out.reshard-tmp")).unwrap();
    assert_eq!(
        fs::read(waiting.join(name)).unwrap(),
        bytes,
        "the replaced output waits at the staging name"
    );
}

/// Nothing of reshard's is left beside the outputs in `dir` (staging, pointer, lock).
fn nothing_at_a_staging_name(dir: &Dir) {
    let left: Vec<String> = fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".reshard-"))
        .collect();
    assert!(left.is_empty(), "nothing at a staging name: {left:?}");
}

/// The double case: an output whose publishing run was killed between its rename and the
/// removal of its checkpoint records (`0:renamed`) keeps `.resume/`; the user puts a file in it;
/// a `--force` run replacing it is killed after its exchange (`0:published`), which leaves it at
/// that run's staging name. The next run still tells it from a failed run's staging directory
/// and finishes its removal as `--force` does: the user's file survives byte for byte, and the
/// output is the clean run's (the bug: the next run took it, `.resume/` and all, for a failed
/// run's staging directory and removed it whole, the user's file with it).
#[test]
fn a_users_file_in_a_replaced_output_that_kept_its_records_survives_both_kills() {
    let dir = Dir::new("force-killed-over-kept-records");
    inputs(&dir);
    job(&dir, Some(2), "ref", &[]).assert_success();
    let res = job(&dir, Some(2), "out", &["--seed", "4"])
        .env("RESHARD_TEST_KILL", "0:renamed")
        .output();
    res.check(res.code() != Some(0), "the publishing run was killed");
    res.stderr_has("rank 0 now dies (SIGKILL) at renamed");
    res.check(
        dir.join("out/index.json").is_file() && dir.join("out/.resume").is_dir(),
        "the published output keeps its checkpoint records",
    );
    dir.create_bytes("out/README", b"the user's readme");

    let res = job(&dir, Some(2), "out", &["--force", "--seed", "5"])
        .env("RESHARD_TEST_KILL", "0:published")
        .output();
    res.check(res.code() != Some(0), "the --force run was killed");
    res.stderr_has("rank 0 now dies (SIGKILL) at published");
    waits_at_the_staging_name(&dir, "README", b"the user's readme");

    let res = job(&dir, Some(2), "out", &["--force"]).assert_success();
    res.stderr_has("finishing the removal of the output");
    assert_eq!(
        fs::read(dir.join("out/README")).unwrap(),
        b"the user's readme"
    );
    let check = dir.create_dir("check");
    copy_dir(&dir.join("out"), &check);
    fs::remove_file(check.join("README")).unwrap();
    assert_same_output(&dir.join("ref"), &check, &[]);
    nothing_at_a_staging_name(&dir);
}
