//! Memory bounds: whatever the dataset size, each rank's peak RSS stays within `--mem-limit`
//! plus a fixed allowance, read from the ranks' own VmHWM in the `--report` summary.

use crate::util::runs::run;
use crate::util::Dir;

const ALLOWANCE: u64 = 64 << 20;

#[test]
fn peak_rss_of_every_rank_stays_within_the_budget() {
    let dir = Dir::new("memory");
    let limit: u64 = 16 << 20;
    // Eight times the total budget of both ranks, in samples larger than a round's share so
    // that they travel in chunks.
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
    for np in [1, 2] {
        let out = format!("out-{np}");
        let report = format!("report-{np}.json");
        let res = run(
            &dir,
            Some(np),
            &["in"],
            &out,
            8,
            1,
            &["--mem-limit", "16MiB", "--report", &report],
        );
        let text = std::fs::read_to_string(dir.join(&report)).unwrap();
        let summary: serde_json::Value = serde_json::from_str(&text).unwrap();
        let ranks = summary["per_rank"].as_array().unwrap();
        res.check(ranks.len() == np, "one entry per rank");
        let sample_bytes = summary["sample_bytes"].as_u64().unwrap();
        res.check(
            sample_bytes >= 8 * np as u64 * limit,
            "the dataset must exceed the budget eightfold",
        );
        let mut written = 0;
        for (r, rank) in ranks.iter().enumerate() {
            let rss = rank["peak_rss"].as_u64().unwrap();
            res.check(rss > 0, "VmHWM must be reported");
            res.check(
                rss <= limit + ALLOWANCE,
                &format!(
                    "rank {r}: peak RSS {} MiB exceeds the 16 MiB budget + 64 MiB",
                    rss >> 20
                ),
            );
            written += rank["bytes_written"].as_u64().unwrap();
        }
        res.check(
            written == sample_bytes,
            "the ranks' written bytes must add up to the dataset",
        );
        res.check(
            summary["rounds"].as_u64().unwrap() > 8,
            "a small budget means many rounds",
        );
    }
}
