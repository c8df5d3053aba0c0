//! Memory bounds: each rank's peak RSS, sampled from outside (`VmHWM` in `/proc`), stays within
//! `--mem-limit` plus what the same run needs with almost no data, and follows the limit: the same
//! data under a 1 GiB budget takes far more memory and far fewer rounds.

use crate::util::{output_with_peaks, Dir, RunOutput};

/// What a rank may hold beyond its budget and its footprint on a tiny dataset: allocator slack,
/// MPI's own buffers, the O(N/P) sample metadata.
const ALLOWANCE: u64 = 16 << 20;

/// The budget under test, small next to what 16 rounds of this data would hold.
const LIMIT: u64 = 4 << 20;

/// `reshard run` of `input` under `mpirun -np NP` with `--mem-limit LIMIT`; the output, the
/// externally sampled peak of every rank, and the `--report` summary.
fn sampled(dir: &Dir, np: usize, input: &str, limit: &str) -> (RunOutput, u64, serde_json::Value) {
    let out = format!("out-{input}-{np}-{limit}");
    let report = format!("{out}.json");
    let mut cmd = dir.mpi(np);
    cmd.args(["run", "--input", input, "--output", &out, "--shards", "8"])
        .args(["--seed", "1", "--mem-limit", limit, "--report", &report]);
    let (res, peaks) = output_with_peaks(&cmd, dir.path());
    res.check(res.code() == Some(0), "expected success");
    res.check(
        peaks.len() == np,
        &format!("sampled {} rank processes, expected {np}", peaks.len()),
    );
    let text = std::fs::read_to_string(dir.join(&report)).unwrap();
    let summary = serde_json::from_str(&text).unwrap();
    (res, peaks.into_iter().max().unwrap(), summary)
}

#[test]
fn peak_rss_of_every_rank_follows_the_budget() {
    let dir = Dir::new("memory");
    // 2 MiB samples in 8 shards: with np 2, 16 rounds (the least the exchange makes) move 8 MiB
    // a round per rank, twice the budget, so only a budget that is obeyed bounds the rounds.
    dir.generate(
        "in",
        &[
            "--shards",
            "8",
            "--total-size",
            "256MiB",
            "--mean-size",
            "2MiB",
            "--skew",
            "2",
            "--seed",
            "5",
        ],
    );
    dir.generate(
        "tiny",
        &["--shards", "2", "--samples", "8", "--mean-size", "4KiB"],
    );
    // Two ranks: one rank alone moves its data without exchange buffers (25 MiB whatever the
    // budget), and with more ranks each one's share of 16 rounds no longer dwarfs the budget.
    {
        let np = 2;
        let (_, base, _) = sampled(&dir, np, "tiny", "4MiB");
        let (res, small, summary) = sampled(&dir, np, "in", "4MiB");
        let (big_res, big, _) = sampled(&dir, np, "in", "1GiB");
        let sample_bytes = summary["sample_bytes"].as_u64().unwrap();
        res.check(
            sample_bytes >= 32 * np as u64 * LIMIT,
            "each rank's 16 rounds must be twice the budget",
        );
        println!(
            "np {np}: peak RSS {} MiB on tiny data, {} MiB with --mem-limit 4MiB, {} MiB with 1GiB",
            base >> 20,
            small >> 20,
            big >> 20
        );
        res.check(
            small <= base + LIMIT + ALLOWANCE,
            &format!(
                "peak RSS {} MiB exceeds the {} MiB of a tiny run + the 4 MiB budget + {} MiB",
                small >> 20,
                base >> 20,
                ALLOWANCE >> 20
            ),
        );
        // Under a 1 GiB budget the rounds are 16 of the data each: buffers of several times
        // the small budget. An ignored limit gives both runs the same footprint.
        big_res.check(
            big >= small + 4 * LIMIT,
            &format!(
                "peak RSS {} MiB under 1GiB against {} MiB under 4MiB: the budget changed nothing",
                big >> 20,
                small >> 20
            ),
        );
        // Each round a rank receives at most its budget, so the busiest writer needs at least
        // this many rounds, whatever reshard reports about itself.
        let ranks = summary["per_rank"].as_array().unwrap();
        res.check(ranks.len() == np, "one entry per rank");
        let busiest = ranks
            .iter()
            .map(|r| r["bytes_written"].as_u64().unwrap())
            .max()
            .unwrap();
        let rounds = summary["rounds"].as_u64().unwrap();
        res.check(
            rounds >= busiest.div_ceil(LIMIT),
            &format!(
                "{rounds} rounds moved {} MiB to one rank under a 4 MiB budget",
                busiest >> 20
            ),
        );
    }
}

/// The `RESHARD_TRACE_PHASES` lines of rank `rank`: (phase, peak KiB), in the order printed.
fn traced(res: &RunOutput, rank: usize) -> Vec<(String, u64)> {
    let head = format!("reshard: trace: rank {rank} phase ");
    res.stderr
        .lines()
        .filter_map(|l| l.strip_prefix(&head))
        .map(|l| {
            let (phase, rest) = l.split_once(": wall ").expect("a phase's figures");
            let peak = rest
                .split(", ")
                .find_map(|f| f.strip_prefix("peak "))
                .and_then(|f| f.strip_suffix(" KiB"))
                .and_then(|f| f.parse().ok())
                .unwrap_or_else(|| res.fail(&format!("no peak in {l:?}")));
            (phase.to_string(), peak)
        })
        .collect()
}

#[test]
fn every_rank_traces_each_phase_with_its_own_peak_and_the_run_keeps_the_whole_peak() {
    let dir = Dir::new("trace-phases");
    // Enough data for the exchange to fill its read window (8 MiB under the default budget),
    // which it frees at its end: a peak the later phases do not share.
    dir.generate(
        "in",
        &[
            "--shards",
            "2",
            "--total-size",
            "32MiB",
            "--mean-size",
            "256KiB",
        ],
    );
    let np = 2;
    let mut cmd = dir.mpi(np);
    cmd.args(["run", "--input", "in", "--output", "out", "--shards", "4"])
        .args(["--seed", "1", "--report", "rep.json"])
        .env("RESHARD_TRACE_PHASES", "1");
    let res = cmd.output();
    res.check(res.code() == Some(0), "expected success");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("rep.json")).unwrap()).unwrap();
    let phases = [
        "expand", "index", "place", "layout", "staging", "exchange", "finish", "publish",
    ];
    for rank in 0..np {
        let lines = traced(&res, rank);
        let names: Vec<&str> = lines.iter().map(|l| l.0.as_str()).collect();
        res.check(
            names == phases,
            &format!("rank {rank} traced {names:?}, expected {phases:?}"),
        );
        res.check(
            lines.iter().all(|l| l.1 > 0),
            &format!("rank {rank}: every phase has a peak"),
        );
        let peak_of = |phase: &str| lines.iter().find(|l| l.0 == phase).unwrap().1;
        res.check(
            peak_of("exchange") > peak_of("publish") + 4096,
            &format!("rank {rank}: the exchange's buffers must not count in the publish phase's own peak"),
        );
        // Restarting the kernel's peak per phase must not lose the run's peak from the report.
        let whole = report["per_rank"][rank]["peak_rss"].as_u64().unwrap();
        let highest = lines.iter().map(|l| l.1).max().unwrap() * 1024;
        res.check(
            whole >= highest,
            &format!("rank {rank}: report's peak {whole} below a phase's peak {highest}"),
        );
    }
    // verify traces its own phases.
    let mut verify = dir.mpi(np);
    verify
        .args(["verify", "--input", "in", "--output", "out"])
        .env("RESHARD_TRACE_PHASES", "1");
    let res = verify.output();
    res.check(res.code() == Some(0), "verify must pass");
    for rank in 0..np {
        let names: Vec<String> = traced(&res, rank).into_iter().map(|l| l.0).collect();
        let expected = [
            "verify setup",
            "verify inputs",
            "verify outputs",
            "verify compare",
            "verify report",
        ];
        res.check(
            names == expected,
            &format!("verify rank {rank} traced {names:?}"),
        );
    }
}

#[test]
fn verify_lets_go_of_its_records_before_the_exchange() {
    let dir = Dir::new("verify-peak");
    // Header-only samples: the records, not the data, are what verify holds.
    let samples = 200_000u64;
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/header_only_set.py");
    dir.program("python3")
        .arg(&script)
        .args(["in", &samples.to_string(), "4"])
        .assert_success();
    dir.command()
        .args([
            "run", "--input", "in", "--output", "out", "--shards", "4", "--seed", "1",
        ])
        .assert_success();
    let mut verify = dir.command();
    verify
        .args(["verify", "--input", "in", "--output", "out"])
        .env("RESHARD_TRACE_PHASES", "1");
    let res = verify.output();
    res.check(res.code() == Some(0), "verify must pass");
    let lines = traced(&res, 0);
    let peak_of = |phase: &str| lines.iter().find(|l| l.0 == phase).unwrap().1;
    let per_sample = (peak_of("verify compare") - peak_of("verify setup")) * 1024 / samples;
    println!("verify compare: {per_sample} bytes per sample at the peak");
    // Each sample's two records: 96 bytes in memory, 80 sent, 80 received, 96 decoded. Holding
    // the records through the exchange (and concatenating the two sides) peaked at 272 bytes.
    res.check(
        per_sample < 225,
        &format!("verify held {per_sample} bytes per sample at its peak; 176 once the records go before the exchange"),
    );
}
