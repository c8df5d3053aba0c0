//! `--resume` and one run per output: a run whose rank was killed mid-exchange continues from
//! its last checkpoint to byte-identical output; a rerun that asks for something else is
//! refused; two runs on one output never race.

use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::util::data::sized;
use crate::util::verifier::assert_same_output;
use crate::util::{reshard_processes, signal, snapshot, Dir, RunOutput, FAIL_FAST};

/// The arguments every run here shares, as (flag, value): small rounds (a 1 MiB budget) so that
/// the exchange has many, and a checkpoint after every round. A test's own value for a flag
/// replaces the shared one.
const ARGS: [(&str, &str); 4] = [
    ("--shards", "5"),
    ("--seed", "3"),
    ("--mem-limit", "1MiB"),
    ("--checkpoint-every", "0"),
];

/// Inputs of ~8 MiB: 10-20 exchange rounds at np 2..4 with a 1 MiB budget.
fn inputs(dir: &Dir) {
    sized(dir, "in", "8MiB", "16KiB", 6);
}

fn job(dir: &Dir, np: Option<usize>, out: &str, extra: &[&str]) -> crate::util::TestCommand {
    let mut cmd = dir.reshard(np);
    cmd.args(["run", "--input", "in", "--output", out]);
    for (flag, value) in ARGS {
        // --gpus sizes instead of --shards.
        let replaced = extra.contains(&flag) || (flag == "--shards" && extra.contains(&"--gpus"));
        if !replaced {
            cmd.args([flag, value]);
        }
    }
    cmd.args(extra);
    cmd
}

/// Runs with rank `victim` killed (SIGKILL) from outside as soon as a checkpoint exists: the job
/// fails and leaves its staging directory with that checkpoint, nothing published. Checkpoints
/// are asynchronous, so under load the first may land late in the exchange; the ranks pause
/// before finishing (for up to a minute) so that the job cannot end before it does.
fn killed(dir: &Dir, np: usize, out: &str, victim: usize) -> RunOutput {
    let mut cmd = job(dir, Some(np), out, &[]);
    cmd.env("RESHARD_TEST_PAUSE_FINISH", "60");
    let run = std::thread::spawn(move || cmd.output());
    let checkpoint = dir.join(format!(".{out}.reshard-tmp/.resume/checkpoint.json"));
    let start = Instant::now();
    while !checkpoint.exists() {
        assert!(
            !run.is_finished() && start.elapsed() < 2 * FAIL_FAST,
            "no checkpoint was recorded while the job ran"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let pid = reshard_processes(dir.path())
        .into_iter()
        .find_map(|(pid, rank)| (rank == Some(victim)).then_some(pid))
        .unwrap_or_else(|| panic!("rank {victim} is not running"));
    signal(pid, libc::SIGKILL);
    let res = run.join().unwrap();
    res.check(res.code() != Some(0), "the killed job must fail");
    res.check(!dir.join(out).exists(), "nothing may be published");
    res.check(
        checkpoint.exists(),
        "the checkpoint must outlive the killed job",
    );
    res
}

/// The rerun with `--resume` succeeds, reuses samples, and leaves nothing of the attempt.
fn resumed(dir: &Dir, np: Option<usize>, out: &str) -> RunOutput {
    let res = job(dir, np, out, &["--resume"]).assert_success();
    res.stderr_has("--resume: continuing the run");
    res.check(
        res.stdout.contains("resumed: reused"),
        "the summary must say what was reused",
    );
    res.check(
        !dir.join(format!(".{out}.reshard-tmp")).exists()
            && !dir.join(format!(".{out}.reshard-lock")).exists(),
        "the staging directory and the lock must be gone",
    );
    res
}

#[test]
fn a_rank_killed_mid_exchange_resumes_to_identical_output() {
    let dir = Dir::new("resume-kill");
    inputs(&dir);
    job(&dir, Some(1), "ref", &[]).assert_success();
    // A rank other than 0, and rank 0 itself (its lock is then left by a dead process).
    for (np, victim) in [(2, 1), (3, 0), (4, 2)] {
        let out = format!("out-{np}");
        killed(&dir, np, &out, victim);
        resumed(&dir, Some(np), &out);
        assert_same_output(&dir.join("ref"), &dir.join(&out), &["ranks"]);
        // Resuming the same plan with another rank count and budget works too (np 4 -> 2).
        if np == 4 {
            let report = dir.join("report.json");
            killed(&dir, 4, "again", 1);
            let res = job(&dir, Some(2), "again", &["--resume", "--mem-limit", "2MiB"])
                .args(["--report", report.to_str().unwrap()])
                .assert_success();
            res.check(res.stdout.contains("resumed: reused"), "reused");
            let json: serde_json::Value =
                serde_json::from_slice(&fs::read(&report).unwrap()).unwrap();
            assert!(json["reused_bytes"].as_u64().unwrap() > 0, "{json}");
            assert_same_output(&dir.join("ref"), &dir.join("again"), &["ranks"]);
        }
    }
}

/// Killed once every shard is complete and synced, as publishing starts: the rerun moves no data
/// at all, and says every shard was complete.
#[test]
fn a_run_killed_before_publishing_resumes_without_moving_data() {
    let dir = Dir::new("resume-publish");
    inputs(&dir);
    job(&dir, Some(1), "ref", &[]).assert_success();
    let res = job(&dir, Some(2), "out", &[])
        .env("RESHARD_TEST_KILL", "0:publish")
        .output();
    res.check(res.code() != Some(0), "the killed job must fail");
    res.check(!dir.join("out").exists(), "nothing may be published");
    let res = resumed(&dir, Some(3), "out");
    res.check(
        res.stdout.contains("5 of 5 shards complete") && res.stdout.contains("exchange rounds: 0"),
        "every shard must be reused, no data moved",
    );
    assert_same_output(&dir.join("ref"), &dir.join("out"), &["ranks"]);
}

/// Writes the plan record `recorded` back to `plan` with another digest, sealed (as the plan a
/// changed file gave would be recorded); first unsealed, which is refused as damaged, naming it.
fn write_other_digest(dir: &Dir, plan: &Path, recorded: &[u8]) {
    let body = reshard::output::seal::open(recorded).unwrap();
    let mut json: serde_json::Value = serde_json::from_slice(body).unwrap();
    let digest = json["digest"].as_str().unwrap().to_string();
    assert_eq!(digest.len(), 64, "{digest}");
    json["digest"] = format!(
        "{}{}",
        &digest[..63],
        if digest.ends_with('0') { '1' } else { '0' }
    )
    .into();
    fs::write(plan, json.to_string()).unwrap();
    let res = job(dir, Some(2), "out", &["--resume"]).assert_code(1);
    res.stderr_has("plan.json: cannot --resume from this record: no checksum trailer");
    res.check(!dir.join("out").exists(), "nothing may be published");
    fs::write(
        plan,
        reshard::output::seal::seal(json.to_string().into_bytes()),
    )
    .unwrap();
}

#[test]
fn resume_refuses_other_arguments_or_inputs() {
    let dir = Dir::new("resume-refuse");
    inputs(&dir);
    killed(&dir, 2, "out", 1);
    let staging = dir.join(".out.reshard-tmp");
    let before = snapshot(&staging);
    let refused = |extra: &[&str], needle: &str| {
        let res = job(&dir, Some(2), "out", extra).assert_code(2);
        res.stderr_has("cannot --resume");
        res.stderr_has(needle);
        res.no_debug_text();
        res.check(res.elapsed < FAIL_FAST, "refusing must be quick");
        res.check(
            snapshot(&staging) == before,
            "the staging directory changed",
        );
        res.check(!dir.join("out").exists(), "nothing may be published");
    };
    refused(&["--resume", "--seed", "4"], "--seed was 3, now 4");
    refused(&["--resume", "--epoch", "1"], "--epoch was 0, now 1");
    // Every other argument that shapes the output, shown in the flags' own syntax.
    refused(
        &[
            "--resume",
            "--gpus",
            "1",
            "--workers",
            "5",
            "--shard-size",
            "1MiB",
        ],
        "was --shards 5, now --gpus 1 --workers 5 --shard-size 1048576",
    );
    refused(
        &["--resume", "--equalize", "drop"],
        "--equalize was none, now drop",
    );
    refused(
        &["--resume", "--balance", "bytes"],
        "--balance was count, now bytes",
    );
    refused(
        &["--resume", "--order", "key"],
        "now --order key --missing error",
    );
    refused(
        &["--resume", "--require-ext", "jpg"],
        "now --require-ext jpg --on-incomplete abort --on-duplicate abort",
    );
    refused(
        &["--resume", "--split", "a=0.5,b=rest", "--split-shards", "2"],
        "--split/--split-shards was none, now --split a=0.5,b=rest --split-shards b=2",
    );
    // An input changed since (its modification time): refused, naming it.
    let input = crate::util::tar_files(&dir.join("in"))[2].clone();
    let mtime = fs::metadata(&input).unwrap().modified().unwrap();
    let f = fs::File::options().write(true).open(&input).unwrap();
    f.set_modified(mtime + Duration::from_secs(7)).unwrap();
    refused(&["--resume"], input.file_name().unwrap().to_str().unwrap());
    f.set_modified(mtime).unwrap();
    // A plan that differs although the arguments and inputs match (here: the record's digest
    // edited, as a changed file the plan reads would change the plan): refused after planning.
    let plan = staging.join(".resume/plan.json");
    let recorded = fs::read(&plan).unwrap();
    write_other_digest(&dir, &plan, &recorded);
    let res = job(&dir, Some(2), "out", &["--resume"]).assert_code(2);
    res.stderr_has("the plan differs from that run's although the arguments and inputs match");
    res.no_debug_text();
    res.check(!dir.join("out").exists(), "nothing may be published");
    res.check(
        staging.join(".resume/checkpoint.json").exists(),
        "the refused run must keep what the killed one left",
    );
    fs::write(&plan, &recorded).unwrap();
    // --resume only where a run writes.
    job(&dir, None, "out", &["--resume", "--dry-run"]).assert_code(2);
    // As it was: resumed.
    job(&dir, Some(1), "ref", &[]).assert_success();
    resumed(&dir, Some(3), "out");
    assert_same_output(&dir.join("ref"), &dir.join("out"), &["ranks"]);
    // Without --resume, a leftover staging directory is removed and the run starts over; with
    // --resume and nothing left, it starts from the beginning.
    killed(&dir, 2, "over", 1);
    let res = job(&dir, Some(2), "over", &[]).assert_success();
    res.stderr_has("--resume would have continued it");
    assert_same_output(&dir.join("ref"), &dir.join("over"), &["ranks"]);
    let res = job(&dir, Some(2), "fresh", &["--resume"]).assert_success();
    res.stderr_has("starting from the beginning");
    assert_same_output(&dir.join("ref"), &dir.join("fresh"), &["ranks"]);
}

/// A staging an earlier build of this version made, before what resume records hold changed
/// form (a loose unit's listing digest): refused by the version, not as changed inputs.
#[test]
fn resume_refuses_a_staging_whose_records_have_another_form() {
    let dir = Dir::new("resume-format");
    inputs(&dir);
    killed(&dir, 2, "out", 1);
    let plan = dir.join(".out.reshard-tmp/.resume/plan.json");
    let recorded = fs::read(&plan).unwrap();
    let version = env!("CARGO_PKG_VERSION");
    let text = std::str::from_utf8(reshard::output::seal::open(&recorded).unwrap()).unwrap();
    let now = format!("{version} (resume records 2)");
    assert!(text.contains(&now), "the plan records {now}: {text}");
    let earlier = text.replace(&now, version).into_bytes();
    fs::write(&plan, reshard::output::seal::seal(earlier)).unwrap();
    let res = job(&dir, Some(2), "out", &["--resume"]).assert_code(2);
    res.stderr_has(&format!("reshard version was {version}, now {now}"));
    res.no_debug_text();
    fs::write(&plan, &recorded).unwrap();
    resumed(&dir, Some(2), "out");
}

#[test]
fn two_runs_on_one_output_one_refuses() {
    let dir = Dir::new("two-worlds");
    inputs(&dir);
    job(&dir, None, "ref", &[]).assert_success();
    // The first run pauses before finishing, holding the output, and is stopped (SIGSTOP) there
    // for as long as the second world takes: alive, so its lock is not stale.
    let mut first = job(&dir, None, "out", &[]);
    first.env("RESHARD_TEST_PAUSE_FINISH", "5");
    let first = std::thread::spawn(move || first.output());
    let marker = dir.join(".out.reshard-tmp/.paused-0");
    let start = Instant::now();
    while !marker.exists() {
        assert!(start.elapsed() < FAIL_FAST, "the first run never paused");
        std::thread::sleep(Duration::from_millis(5));
    }
    let [(pid, None)] = reshard_processes(dir.path())[..] else {
        panic!("expected the first run alone");
    };
    signal(pid, libc::SIGSTOP);
    // The marker goes when the pause ends: still there, the run was stopped inside it.
    assert!(
        marker.exists(),
        "the first run left its pause before it could be stopped"
    );
    // A second world on the same output: without a launcher, and under mpirun.
    for np in [None, Some(2)] {
        let second = job(&dir, np, "out", &[]).assert_code(1);
        second.stderr_has("another reshard run is writing it");
        second.stderr_has(&format!("on {}", hostname()));
        second.check(second.elapsed < FAIL_FAST, "refusing must be quick");
    }
    signal(pid, libc::SIGCONT);
    let first = first.join().unwrap();
    first.check(first.code() == Some(0), "the first run must succeed");
    assert_same_output(&dir.join("ref"), &dir.join("out"), &["ranks"]);
    assert!(
        !dir.join(".out.reshard-lock").exists(),
        "the lock is released"
    );
}

fn hostname() -> String {
    fs::read_to_string("/proc/sys/kernel/hostname")
        .unwrap()
        .trim()
        .to_string()
}
