//! The exchange's round protocol: rounds overlap on the network, and what each round did is
//! visible with `RESHARD_TRACE_ROUNDS`.

use crate::util::runs::run;
use crate::util::verifier::assert_same_output;
use crate::util::{Dir, RunOutput};

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
