//! The exchange's round protocol: rounds overlap on the network, and what each round did is
//! visible with `RESHARD_TRACE_ROUNDS`.

use std::fs;

use crate::util::runs::run;
use crate::util::tar::{compress, rewrite_keeping_mtime};
use crate::util::verifier::{assert_same_output, input_samples};
use crate::util::{Dir, RunOutput, TestCommand, FAIL_FAST};

/// One traced round of one rank: (round, exchange start, exchange end), in ms.
fn exchanges(res: &RunOutput, rank: usize) -> Vec<(u64, f64, f64)> {
    let prefix = format!("reshard: rank {rank} round ");
    let mut rounds: Vec<(u64, f64, f64)> = res
        .stderr
        .lines()
        .filter_map(|l| l.strip_prefix(&prefix))
        .map(|l| {
            let (n, rest) = l
                .split_once(": ")
                .unwrap_or_else(|| res.fail("a round line"));
            let span = rest
                .split(", ")
                .find_map(|part| part.strip_prefix("exchange "))
                .and_then(|s| s.strip_suffix(" ms"))
                .and_then(|s| s.split_once('-'))
                .unwrap_or_else(|| res.fail(&format!("no exchange span in: {l}")));
            let ms = |s: &str| s.parse::<f64>().unwrap_or_else(|_| res.fail(l));
            let n = n.parse().unwrap_or_else(|_| res.fail(l));
            (n, ms(span.0), ms(span.1))
        })
        .collect();
    rounds.sort_by_key(|r| r.0);
    rounds
}

/// Rank 1 waits before it starts each round (`RESHARD_TEST_SLOW_ROUNDS=ms:1`), so every round
/// ends late for rank 0 too. Rank 0 does not wait for it: it has the next round on its way
/// before the one in flight arrived. With one round at a time (an all-to-all per round) no
/// round of rank 0 could start before the previous one ended. The output is the same bytes as
/// without the wait, and as one rank writes.
#[test]
fn a_rank_sends_the_next_round_while_the_last_is_in_flight() {
    let dir = Dir::new("rounds-overlap");
    dir.generate(
        "in",
        &["--shards", "2", "--samples", "40", "--mean-size", "48KiB"],
    );
    let budget = ["--mem-limit", "1MiB"];
    let slow = [
        ("RESHARD_TEST_SLOW_ROUNDS", "300:1"),
        ("RESHARD_TRACE_ROUNDS", "1"),
    ];
    let mut cmd = dir.reshard(Some(2));
    cmd.args(["run", "--input", "in", "--output", "slow", "--shards", "3"])
        .args(["--seed", "4"])
        .args(budget);
    for (k, v) in slow {
        cmd.env(k, v);
    }
    let traced = cmd.assert_success();
    let rounds = exchanges(&traced, 0);
    traced.check(
        rounds.len() >= 4,
        &format!("{} rounds traced: too few to see overlap", rounds.len()),
    );
    traced.check(
        rounds.iter().map(|r| r.0).eq(1..=rounds.len() as u64),
        "rank 0 traced rounds 1, 2, 3... in order",
    );
    let overlapped = rounds.windows(2).filter(|w| w[1].1 < w[0].2).count();
    traced.check(
        overlapped > 0,
        "rank 0 never started a round before the previous one arrived",
    );
    run(&dir, None, &["in"], "alone", 3, 4, &budget);
    assert_same_output(&dir.join("slow"), &dir.join("alone"), &["ranks"]);
}

/// Generates `in/`: `[shards, total size, skew, seed]`, samples of a few hundred bytes to about
/// 1 MiB (lognormal around 24 KiB, sigma 1.5).
fn wide_sizes(dir: &Dir, [shards, size, skew, seed]: [&str; 4]) {
    let args = [
        "--shards",
        shards,
        "--total-size",
        size,
        "--skew",
        skew,
        "--seed",
        seed,
    ];
    let spread = ["--mean-size", "24KiB", "--sigma", "1.5"];
    dir.generate("in", &[&args[..], &spread[..]].concat());
}

/// Inputs whose samples range from a few hundred bytes to 1 MiB (lognormal, sigma 1.5) in
/// shards of unequal sizes, the largest gzipped. Under a 1 MiB budget a large sample travels in
/// chunks over many rounds, two of them in flight; a rank copies its own large plain samples
/// inside the kernel and sends its own small ones, and its own gzipped ones of any size, through
/// its own segment.
fn mixed(dir: &Dir) {
    wide_sizes(dir, ["5", "6MiB", "2", "7"]);
    let plain = dir.join("in/train-000001.tar");
    fs::write(dir.join("in/train-000001.tar.gz"), compress(&plain, "gz")).unwrap();
    fs::remove_file(plain).unwrap();
}

/// `reshard run` of [`mixed`] inputs: small rounds, a checkpoint asked for in every round.
fn mixed_job(dir: &Dir, np: usize, out: &str, extra: &[&str]) -> TestCommand {
    let mut cmd = dir.reshard(Some(np));
    cmd.args(["run", "--input", "in", "--output", out, "--shards", "5"])
        .args([
            "--seed",
            "3",
            "--mem-limit",
            "1MiB",
            "--checkpoint-every",
            "0",
        ])
        .args(extra);
    cmd
}

/// Runs `killed` with rank `victim` killed (SIGKILL) as it starts round `round`, then
/// `resumed` (a `--resume` of it): the first fails, the second reuses what a checkpoint kept
/// and publishes `out` byte-identical to `ref`.
fn killed_then_resumed(
    dir: &Dir,
    killed: &mut TestCommand,
    resumed: &mut TestCommand,
    (victim, round): (usize, u64),
    out: &str,
) {
    let res = killed
        .env("RESHARD_TEST_KILL", format!("{victim}:{round}"))
        .output();
    res.check(res.code() != Some(0), "the killed job must fail");
    res.stderr_has(&format!("rank {victim} now dies (SIGKILL) at {round}"));
    let res = resumed.assert_success();
    res.check(
        res.stdout.contains("resumed: reused"),
        "a checkpoint must have been recorded before the kill",
    );
    assert_same_output(&dir.join("ref"), &dir.join(out), &["ranks"]);
}

/// A rank killed (SIGKILL) as it starts round n, with samples of every size in flight: the
/// checkpoint the job left claims only samples whose every chunk was placed and synced (a
/// sample split over rounds counts once its last chunk did), so the rerun with `--resume`, at
/// another rank count, is byte-identical to one rank's run. Rounds 9..25 of 29..56: by then
/// a checkpoint is surely recorded (a writer lags its rounds by two or three buffers at most).
#[test]
fn a_rank_killed_at_a_round_resumes_identically_with_samples_split_across_rounds() {
    let dir = Dir::new("rounds-kill-mixed");
    mixed(&dir);
    mixed_job(&dir, 1, "ref", &[]).assert_success();
    for (np, victim, round, again) in [(2, 1, 9, 3), (3, 0, 17, 4), (4, 3, 25, 2)] {
        let out = format!("out-{np}");
        let mut killed = mixed_job(&dir, np, &out, &[]);
        let mut resumed = mixed_job(&dir, again, &out, &["--resume"]);
        killed_then_resumed(&dir, &mut killed, &mut resumed, (victim, round), &out);
    }
}

/// More ranks than input shards: two of four ranks read nothing and send only empty rounds,
/// yet take part in every round, checkpoint with empty ranges, and one of them killed as it
/// starts a round leaves a checkpoint that resumes to the same bytes as one rank writes.
#[test]
fn ranks_without_samples_take_part_in_every_round_and_checkpoint() {
    let dir = Dir::new("rounds-idle-ranks");
    let args = |out: &str| -> Vec<String> {
        [
            "run", "--input", "in", "--output", out, "--shards", "3", "--seed", "3",
        ]
        .into_iter()
        .chain(["--mem-limit", "1MiB", "--checkpoint-every", "0"])
        .map(String::from)
        .collect()
    };
    wide_sizes(&dir, ["2", "3MiB", "3", "9"]);
    dir.reshard(None).args(args("ref")).assert_success();
    let report = dir.join("report.json");
    dir.mpi(4)
        .args(args("whole"))
        .args(["--report", report.to_str().unwrap()])
        .assert_success();
    assert_same_output(&dir.join("ref"), &dir.join("whole"), &["ranks"]);
    let json: serde_json::Value = serde_json::from_slice(&fs::read(&report).unwrap()).unwrap();
    let idle: Vec<usize> = (0..4)
        .filter(|&r| json["per_rank"][r]["bytes_read"].as_u64() == Some(0))
        .collect();
    assert!(
        idle.len() >= 2,
        "ranks that read nothing: {idle:?} in {json}"
    );
    let victim = *idle.last().unwrap();
    let mut killed = dir.mpi(4);
    killed.args(args("out"));
    let mut resumed = dir.mpi(3);
    resumed.args(args("out")).arg("--resume");
    killed_then_resumed(&dir, &mut killed, &mut resumed, (victim, 12), "out");
}

/// One sample's first header, in the middle of one input shard, is damaged after indexing (a
/// saved index is trusted, so only the exchange reads it): the rank that reads it fails in the
/// middle of its rounds while the others already have the next round in flight. Every rank
/// must leave (no rank waits for a round the failed one never sends; a hang ends in the
/// command's timeout), with exit 1, the message naming the file and the sample's byte offset,
/// and nothing published.
#[test]
fn a_read_failure_mid_exchange_ends_every_rank_with_rounds_in_flight() {
    let dir = Dir::new("rounds-fail-mid");
    mixed(&dir);
    dir.mpi(2)
        .args(["run", "--input", "in", "--output", "first", "--shards", "6"])
        .args(["--seed", "3"])
        .assert_success();
    // At np 4 each pair's share of a round also moves as several messages.
    let pieces: &[&str] = &["--max-round-bytes", "4KiB"];
    for (np, shard, extra) in [(3, 3, &[][..]), (4, 5, pieces), (2, 0, &[])] {
        let name = format!("shard-00000{shard}.tar");
        let path = dir.join("first").join(&name);
        let good = fs::read(&path).unwrap();
        let samples = input_samples(&path).samples;
        let at = samples[samples.len() * 3 / 4].start;
        rewrite_keeping_mtime(&path, |b| b[at] ^= 0x01);
        let mut cmd = dir.mpi(np);
        cmd.args([
            "run", "--input", "first", "--output", "out", "--shards", "4",
        ])
        .args([
            "--seed",
            "1",
            "--mem-limit",
            "1MiB",
            "--checkpoint-every",
            "0",
        ])
        .args(extra)
        .timeout(2 * FAIL_FAST);
        let res = cmd.assert_code(1);
        res.stderr_has("reused the saved index");
        res.stderr_has(&format!("{name}: byte offset {at}"));
        res.check(!dir.join("out").exists(), "nothing may be published");
        rewrite_keeping_mtime(&path, |b| *b = good);
    }
}
