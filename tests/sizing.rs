//! Issue 4: shard counts chosen for the GPU count, equal samples per shard (`--equalize`),
//! byte-balanced shards, and `reshard plan` agreeing with what `run` writes.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::util::data::prime_count;
use crate::util::runs::{plan_json, seeded};
use crate::util::samples::{input_by_key, output_shards, strings};
use crate::util::verifier::assert_same_output;
use crate::util::{index_json, tar_files, Dir, NPS};

#[test]
fn drop_and_pad_give_every_shard_the_same_count_on_any_rank_count() {
    let dir = Dir::new("equalize");
    let inputs = prime_count(&dir);
    let input = input_by_key(&inputs);
    for (mode, per_shard) in [("drop", 101 / 8), ("pad", 101usize.div_ceil(8))] {
        let mut first: Option<PathBuf> = None;
        for np in NPS {
            let out = dir.join(format!("{mode}-np{np}"));
            seeded(
                &dir,
                np,
                "run",
                &[
                    "--output",
                    out.to_str().unwrap(),
                    "--shards",
                    "8",
                    "--equalize",
                    mode,
                ],
            );
            let shards = output_shards(&out);
            let idx = index_json(&out);
            let r = &idx["reshard"];
            let mut seen: HashMap<String, usize> = HashMap::new();
            for (i, shard) in shards.iter().enumerate() {
                assert_eq!(
                    shard.len(),
                    per_shard,
                    "{mode} np{np}: shard {i} holds {} samples",
                    shard.len()
                );
                assert_eq!(
                    idx["shardlist"][i]["nsamples"].as_u64().unwrap() as usize,
                    per_shard
                );
                for (key, bytes) in shard {
                    assert_eq!(
                        input.get(key),
                        Some(bytes),
                        "{mode}: sample {key} is not a verbatim input sample"
                    );
                    *seen.entry(key.clone()).or_default() += 1;
                }
            }
            let (dropped, repeated) = (strings(&r["dropped"]), strings(&r["repeated"]));
            if mode == "drop" {
                assert_eq!(dropped.len(), 101 % 8);
                assert!(repeated.is_empty());
                for k in input.keys() {
                    let want = usize::from(!dropped.contains(k));
                    assert_eq!(
                        seen.get(k).copied().unwrap_or(0),
                        want,
                        "drop: {k} written {want} times expected"
                    );
                }
            } else {
                assert_eq!(repeated.len(), 8 * 13 - 101);
                assert!(dropped.is_empty());
                for k in input.keys() {
                    let want = 1 + usize::from(repeated.contains(k));
                    assert_eq!(
                        seen.get(k).copied().unwrap_or(0),
                        want,
                        "pad: {k} written {want} times expected"
                    );
                }
            }
            assert_eq!(
                r["output_samples"].as_u64().unwrap() as usize,
                8 * per_shard
            );
            match &first {
                None => first = Some(out),
                Some(f) => assert_same_output(f, &out, &["ranks"]),
            }
        }
    }
}

#[test]
fn byte_balance_is_rank_independent_and_evens_shard_bytes() {
    let dir = Dir::new("balance");
    let inputs = prime_count(&dir);
    let input = input_by_key(&inputs);
    let count_out = dir.join("count");
    seeded(
        &dir,
        2,
        "run",
        &["--output", count_out.to_str().unwrap(), "--shards", "6"],
    );
    let mut first: Option<PathBuf> = None;
    for np in NPS {
        let out = dir.join(format!("bytes-np{np}"));
        seeded(
            &dir,
            np,
            "run",
            &[
                "--output",
                out.to_str().unwrap(),
                "--shards",
                "6",
                "--balance",
                "bytes",
            ],
        );
        let mut seen = 0;
        for shard in output_shards(&out) {
            assert!(!shard.is_empty());
            for (key, bytes) in shard {
                assert_eq!(input.get(&key), Some(&bytes));
                seen += 1;
            }
        }
        assert_eq!(seen, input.len(), "every sample exactly once");
        match &first {
            None => first = Some(out),
            Some(f) => assert_same_output(f, &out, &["ranks"]),
        }
    }
    // Evenness from the shard files themselves, never from reshard's own statistics.
    let spread = |out: &Path| {
        let sizes: Vec<f64> = tar_files(out)
            .iter()
            .map(|p| fs::metadata(p).unwrap().len() as f64)
            .collect();
        assert_eq!(sizes.len(), 6, "{}", out.display());
        let mean = sizes.iter().sum::<f64>() / sizes.len() as f64;
        let var = sizes.iter().map(|s| (s - mean).powi(2)).sum::<f64>() / sizes.len() as f64;
        let range = sizes.iter().cloned().fold(f64::MIN, f64::max)
            - sizes.iter().cloned().fold(f64::MAX, f64::min);
        (var.sqrt(), range)
    };
    let (by_count, by_bytes) = (spread(&count_out), spread(first.as_ref().unwrap()));
    assert!(
        by_bytes.0 < by_count.0 / 2.0 && by_bytes.1 < by_count.1,
        "bytes balance: (stddev, max - min) {by_bytes:?} vs {by_count:?} by count"
    );
}

#[test]
fn sizing_flags_choose_the_count_and_plan_agrees_with_run() {
    let dir = Dir::new("sizing");
    prime_count(&dir);
    let base = plan_json(&dir, 1, &["--shards", "1"]);
    let bytes = base["sample_bytes"].as_u64().unwrap();
    let nearest = |target: u64, unit: u64| -> u64 {
        let miss = |k: u64| (bytes as f64 / (k * unit) as f64 - target as f64).abs();
        let lo = (bytes / (target * unit)).max(1);
        if miss(lo + 1) < miss(lo) {
            (lo + 1) * unit
        } else {
            lo * unit
        }
    };

    let p = plan_json(&dir, 2, &["--shard-size", "20KiB"]);
    assert_eq!(p["shards"].as_u64().unwrap(), nearest(20 << 10, 1));
    assert!(p["sizing"].as_str().unwrap().contains("--shard-size"));

    let p = plan_json(
        &dir,
        3,
        &[
            "--gpus",
            "3",
            "--workers",
            "2",
            "--shard-size",
            "30KiB",
            "--batch-size",
            "4",
            "--equalize",
            "drop",
        ],
    );
    let shards = p["shards"].as_u64().unwrap();
    assert_eq!(shards % 6, 0, "a multiple of GPUs x workers");
    assert_eq!(shards, nearest(30 << 10, 6));
    let g = &p["gpus"];
    assert_eq!(g["equal"], Value::Bool(true), "{g}");
    let per_gpu = g["samples_per_gpu_min"].as_u64().unwrap();
    assert_eq!(per_gpu, (101 / shards) * shards / 3);
    assert_eq!(g["batches_per_gpu"].as_u64().unwrap(), per_gpu / 4);

    // What plan prints is what run writes, for every rank count.
    for (np, args) in [
        (
            1,
            vec![
                "--gpus",
                "3",
                "--workers",
                "2",
                "--shard-size",
                "30KiB",
                "--equalize",
                "pad",
            ],
        ),
        (3, vec!["--shards", "7", "--balance", "bytes"]),
        (4, vec!["--shard-size", "50KiB", "--equalize", "drop"]),
    ] {
        let plan = plan_json(&dir, np, &args);
        let out = dir.join(format!("agree-np{np}"));
        seeded(
            &dir,
            np,
            "run",
            &[&args[..], &["--output", out.to_str().unwrap()]].concat(),
        );
        let idx = index_json(&out);
        assert_eq!(
            plan["per_shard"], idx["shardlist"],
            "plan vs run for {args:?}"
        );
        assert_eq!(plan["shard_bytes"], idx["reshard"]["shard_bytes"]);
        // --dry-run is the same as plan, and writes nothing.
        let dry = dir.join(format!("dry-np{np}"));
        let res = seeded(
            &dir,
            np,
            "run",
            &[
                &args[..],
                &["--dry-run", "--json", "--output", dry.to_str().unwrap()],
            ]
            .concat(),
        );
        let v: Value = serde_json::from_str(&res.stdout).unwrap();
        assert_eq!(v["per_shard"], plan["per_shard"]);
        assert!(!dry.exists(), "--dry-run wrote its output");
    }
}

#[test]
fn impossible_or_conflicting_sizing_is_refused() {
    let dir = Dir::new("sizing-errors");
    prime_count(&dir);
    let usage = [
        vec!["--shards", "4", "--shard-size", "1MiB"],
        vec!["--shards", "4", "--gpus", "2"],
        vec!["--gpus", "0"],
        vec!["--gpus", "2", "--workers", "0"],
        vec!["--workers", "2", "--shards", "3"],
        vec!["--shard-size", "0"],
        vec![],
        vec!["--shards", "3", "--equalize", "sometimes"],
        vec!["--shards", "3", "--json"],
    ];
    for args in usage {
        let mut c = dir.mpi(2);
        c.args(["run", "--input", "in", "--output", "out", "--seed", "1"])
            .args(&args);
        let res = c.assert_code(2);
        res.check(!dir.join("out").exists(), "nothing may be written");
    }
    for (args, needle) in [
        (vec!["--gpus", "60", "--workers", "2"], "120"),
        (vec!["--shards", "102"], "more than the 101 samples"),
    ] {
        let mut c = dir.mpi(2);
        c.args(["run", "--input", "in", "--output", "out", "--seed", "1"])
            .args(&args);
        let res = c.assert_code(1);
        res.stderr_has(needle);
        res.check(!dir.join("out").exists(), "nothing may be published");
        res.check(!dir.join(".out.reshard-tmp").exists(), "no staging left");
    }
}
