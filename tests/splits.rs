//! Issue 16, parts 3 and 4: `--split train=…,val=…,test=…` — samples dealt to splits by the
//! seed alone, each split sized and written on its own under OUTPUT/NAME/ with its own
//! index.json; the same at any rank count and any epoch; checked by `reshard verify`; saved
//! indexes, `--link` and `--keep` on split outputs.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use crate::util::data::{skewed_labels, with_class_ties};
use crate::util::runs::{identical_for_any_np, run_in, verify_cmd};
use crate::util::samples::{assert_same_samples, flat, input, output, worst_deviation};
use crate::util::splits::{append_sample, key_sets, splits_of, writers_seen_by_strace};
use crate::util::{copy_dir, index_json, skip, tar_files, test_python, Dir};

const SPLIT: &str = "train=0.8,val=0.1,test=0.1";

#[test]
fn splits_are_disjoint_complete_and_identical_for_any_rank_count() {
    let dir = Dir::new("split_np");
    let inputs = with_class_ties(&dir);
    let want = input(&inputs);
    let out = identical_for_any_np(
        &dir,
        "split",
        &["--shards", "4", "--split", SPLIT, "--seed", "3"],
    );
    let splits = splits_of(&out);
    let names: Vec<&str> = splits.iter().map(|s| s.0.as_str()).collect();
    assert_eq!(names, ["train", "val", "test"]);
    let sizes: Vec<usize> = splits.iter().map(|s| s.1.len()).collect();
    assert_eq!(sizes, [192, 24, 24]);
    // Together exactly the input, each sample in one split only.
    let all: Vec<_> = splits.iter().flat_map(|s| s.1.clone()).collect();
    assert_same_samples(&want, &all);
    let sets = key_sets(&splits);
    let union: BTreeSet<&String> = sets.values().flatten().collect();
    assert_eq!(union.len(), 240, "a sample is in two splits");
    // The output's own index.json lists every split's shards; train has the 4 --shards asks
    // for, val and test the default: train's mean shard size, here one shard each.
    let top = index_json(&out);
    let urls: Vec<&str> = top["shardlist"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["url"].as_str().unwrap())
        .collect();
    assert_eq!(urls.len(), 6);
    assert!(urls[..4].iter().all(|u| u.starts_with("train/shard-")));
    assert_eq!(urls[4..], ["val/shard-000000.tar", "test/shard-000000.tar"]);
    assert_eq!(index_json(&out.join("val"))["reshard"]["split"], "val");
    assert!(out
        .join("train/.reshard/shard-000003.tar.reshard-layout")
        .is_file());
    // Shuffled inside each split, not in input order.
    let train_keys: Vec<&String> = splits[0].1.iter().map(|g| &g.key).collect();
    let mut sorted = train_keys.clone();
    sorted.sort();
    assert_ne!(train_keys, sorted);
    split_shards_and_equalize(&dir);
    too_many_split_shards_are_refused(&dir);
    sorted_orders_sort_each_split(&dir, &sets);
    gpus_size_the_later_splits(&dir);
    splits_sized_by_counts(&dir);
}

fn split_shards_and_equalize(dir: &Dir) {
    // --split-shards sizes the others; --equalize drop applies to each split on its own.
    let out = identical_for_any_np(
        dir,
        "sized",
        &[
            "--shards",
            "5",
            "--split",
            "train=0.8,val=0.1,test=rest",
            "--split-shards",
            "val=3,test=2",
            "--equalize",
            "drop",
            "--seed",
            "3",
        ],
    );
    let shards: Vec<usize> = splits_of(&out)
        .iter()
        .map(|s| {
            index_json(&out.join(&s.0))["shardlist"]
                .as_array()
                .unwrap()
                .len()
        })
        .collect();
    assert_eq!(shards, [5, 3, 2]);
    let per_shard = |split: &str| -> Vec<usize> {
        output(&out.join(split)).iter().map(|s| s.1.len()).collect()
    };
    assert_eq!(per_shard("train"), [38; 5], "192 cut to 5 x 38");
    assert_eq!(per_shard("val"), [8; 3]);
    assert_eq!(per_shard("test"), [12; 2]);
    let val = index_json(&out.join("val"));
    assert_eq!(val["reshard"]["sizing"], "--split-shards 3");
    let dropped = index_json(&out)["reshard"]["dropped"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(dropped, 2);
    let train_dropped = &index_json(&out.join("train"))["reshard"]["dropped"];
    assert_eq!(train_dropped.as_array().unwrap().len(), 2);
}

fn too_many_split_shards_are_refused(dir: &Dir) {
    // Too many shards for a split names the flag that asked for them.
    let mut c = dir.mpi(2);
    c.args([
        "run", "--input", "in", "--output", "many", "--shards", "2", "--seed", "3",
    ])
    .args(["--split", SPLIT, "--split-shards", "30"]);
    c.assert_code(1)
        .stderr_has("split \"val\": --split-shards 30 is more than the 24 samples");
}

fn sorted_orders_sort_each_split(dir: &Dir, sets: &BTreeMap<String, BTreeSet<String>>) {
    // Sorted orders sort each split on its own.
    let out = identical_for_any_np(
        dir,
        "by-key",
        &[
            "--shards", "2", "--split", SPLIT, "--order", "key", "--seed", "3",
        ],
    );
    for (name, got) in splits_of(&out) {
        let keys: Vec<&String> = got.iter().map(|g| &g.key).collect();
        assert!(
            keys.windows(2).all(|w| w[0] < w[1]),
            "{name} is not in key order"
        );
    }
    assert_eq!(
        key_sets(&splits_of(&out)),
        *sets,
        "--order changed the splits"
    );
}

fn gpus_size_the_later_splits(dir: &Dir) {
    // With --gpus, the splits after the first default to a multiple of the GPU count, and the
    // GPU figures describe the first split.
    let out = identical_for_any_np(
        dir,
        "gpus",
        &[
            "--gpus",
            "2",
            "--workers",
            "2",
            "--split",
            SPLIT,
            "--seed",
            "3",
        ],
    );
    let shards: Vec<u64> = ["train", "val", "test"]
        .iter()
        .map(|s| {
            index_json(&out.join(s))["reshard"]["shards"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert!(
        shards[0] % 4 == 0 && shards[1] % 2 == 0 && shards[2] % 2 == 0,
        "{shards:?}"
    );
    let gpus = &index_json(&out)["reshard"]["gpus"];
    assert_eq!(
        gpus["shards_per_gpu"].as_u64(),
        Some(shards[0] / 2),
        "{gpus}"
    );
}

fn splits_sized_by_counts(dir: &Dir) {
    // A split is reported and sized on its own; counts work too.
    let res = run_in(
        dir,
        2,
        "counts",
        &[
            "--shards",
            "2",
            "--split",
            "train=rest,val=10,test=20",
            "--seed",
            "3",
        ],
    );
    res.stderr_has("3 splits, each sized on its own");
    let sizes: Vec<usize> = splits_of(&dir.join("counts"))
        .iter()
        .map(|s| s.1.len())
        .collect();
    assert_eq!(sizes, [210, 10, 20]);
}

#[test]
fn an_epoch_reorders_each_split_but_never_moves_a_sample_between_splits() {
    let dir = Dir::new("split_epochs");
    with_class_ties(&dir);
    let args = |epoch: &str, seed: &str| {
        vec![
            "--shards", "3", "--split", SPLIT, "--seed", seed, "--epoch", epoch,
        ]
        .into_iter()
        .map(String::from)
        .collect::<Vec<String>>()
    };
    let mut runs = Vec::new();
    for (np, epoch, seed) in [(1, "0", "9"), (3, "1", "9"), (2, "2", "9"), (2, "0", "10")] {
        let name = format!("e{epoch}-s{seed}");
        let a = args(epoch, seed);
        run_in(
            &dir,
            np,
            &name,
            &a.iter().map(String::as_str).collect::<Vec<_>>(),
        );
        runs.push(splits_of(&dir.join(&name)));
    }
    let order = |s: &[(String, Vec<crate::util::samples::Got>)]| -> Vec<Vec<String>> {
        s.iter()
            .map(|(_, g)| g.iter().map(|g| g.key.clone()).collect())
            .collect()
    };
    for later in &runs[1..3] {
        // The same samples in every split at every epoch (and rank count) ...
        assert_eq!(
            key_sets(later),
            key_sets(&runs[0]),
            "a sample changed split"
        );
        // ... in another order inside each split.
        for (a, b) in order(later).iter().zip(order(&runs[0]).iter()) {
            assert_ne!(a, b, "an epoch kept a split's order");
        }
    }
    assert_ne!(
        key_sets(&runs[3]),
        key_sets(&runs[0]),
        "another seed, the same split"
    );
}

#[test]
fn stratified_splits_keep_every_labels_share() {
    let dir = Dir::new("split_stratify");
    let label_of = skewed_labels(&dir);
    let inputs = tar_files(&dir.join("in"));
    let out = identical_for_any_np(
        &dir,
        "strat",
        &[
            "--shards",
            "4",
            "--split",
            SPLIT,
            "--stratify-by",
            "cls",
            "--seed",
            "5",
        ],
    );
    let splits = splits_of(&out);
    let all: Vec<_> = splits.iter().flat_map(|s| s.1.clone()).collect();
    assert_same_samples(&input(&inputs), &all);
    let mut total: BTreeMap<&str, f64> = BTreeMap::new();
    for l in label_of.values() {
        *total.entry(l).or_default() += 1.0;
    }
    let mut worst: f64 = 0.0;
    for (name, got) in &splits {
        let share = got.len() as f64 / 640.0;
        for (&l, &n) in &total {
            let count = got.iter().filter(|g| label_of[&g.key] == l).count() as f64;
            worst = worst.max((count - n * share).abs());
        }
        // Inside each split, every shard is representative as --stratify-by makes it.
        let shards = output(&out.join(name));
        let dev = worst_deviation(&shards, &label_of);
        assert!(
            dev <= 1.0,
            "{name}: a label is off its share in a shard by {dev}"
        );
    }
    assert!(
        worst < 2.0,
        "a label is off its share of a split by {worst}"
    );
    let report = &index_json(&out)["reshard"]["stratify"];
    assert_eq!(report["labels"], 5);
    let reported = report["split_deviation"].as_f64().unwrap();
    assert!(
        (reported - worst).abs() < 1e-9,
        "reported {reported}, found {worst}"
    );
    // The plain split of the same data strays further on some label: the point of it.
    run_in(
        &dir,
        2,
        "plain",
        &["--shards", "4", "--split", SPLIT, "--seed", "5"],
    );
    let mut plain: f64 = 0.0;
    for (_, got) in splits_of(&dir.join("plain")) {
        let share = got.len() as f64 / 640.0;
        for (&l, &n) in &total {
            let count = got.iter().filter(|g| label_of[&g.key] == l).count() as f64;
            plain = plain.max((count - n * share).abs());
        }
    }
    assert!(plain >= 2.0, "plain split deviation {plain}");
    // Epoch-stable here too.
    run_in(
        &dir,
        3,
        "strat-e1",
        &[
            "--shards",
            "4",
            "--split",
            SPLIT,
            "--stratify-by",
            "cls",
            "--seed",
            "5",
            "--epoch",
            "1",
        ],
    );
    assert_eq!(
        key_sets(&splits_of(&dir.join("strat-e1"))),
        key_sets(&splits)
    );
}

#[test]
fn split_flags_that_cannot_work_are_refused_before_any_data_moves() {
    let dir = Dir::new("split_refused");
    with_class_ties(&dir);
    for (args, needle) in [
        (vec!["--split", "train=0.9,val=0.05"], "add up to"),
        (vec!["--split", "train=1"], "at least two splits"),
        (vec!["--split", "train=0.5,train=0.5"], "named twice"),
        (vec!["--split", "train=0.5,val=10"], "not both"),
        (vec!["--split", "tr/ain=0.5,val=0.5"], "split name"),
        (
            vec!["--split", SPLIT, "--split-shards", "dev=2"],
            "no split is named",
        ),
        (
            vec!["--split", SPLIT, "--split-shards", "train=2"],
            "sized by --shards",
        ),
        (
            vec!["--split", SPLIT, "--balance", "bytes"],
            "--balance bytes",
        ),
        (vec!["--split-shards", "2"], "--split"),
    ] {
        let mut c = dir.mpi(2);
        c.args([
            "run", "--input", "in", "--output", "out", "--shards", "2", "--seed", "1",
        ])
        .args(&args);
        let res = c.assert_code(2);
        res.stderr_has(needle);
        res.check(!dir.join("out").exists(), "nothing may be written");
    }
    // Known only once the input is indexed: still before any data moves, nothing published.
    for (split, needle) in [
        (
            "train=0.999,val=0.001",
            "split \"val\" gets none of the input's 240 samples",
        ),
        ("train=100,val=10", "add up to 110, but the input has 240"),
    ] {
        for np in [1, 3] {
            let mut c = dir.mpi(np);
            c.args([
                "run", "--input", "in", "--output", "out", "--shards", "2", "--seed", "1",
            ])
            .args(["--split", split]);
            let res = c.assert_code(1);
            res.stderr_has(needle);
            res.check(!dir.join("out").exists(), "nothing may be published");
            res.check(!dir.join(".out.reshard-tmp").exists(), "no staging left");
        }
    }
}

#[test]
fn verify_checks_a_split_output_and_catches_a_sample_in_two_splits() {
    let dir = Dir::new("split_verify");
    with_class_ties(&dir);
    run_in(
        &dir,
        2,
        "out",
        &["--shards", "3", "--split", SPLIT, "--seed", "4"],
    );
    for np in [Some(1), Some(3)] {
        let res = verify_cmd(&dir, np, "out", &[]);
        if res.code() != Some(0) {
            res.fail("expected verify to pass on a split output");
        }
        res.check(
            res.stdout.contains("  split train: 3 shards, ")
                && res
                    .stdout
                    .lines()
                    .filter(|l| l.starts_with("  split "))
                    .count()
                    == 3,
            "the report has a line per split",
        );
    }
    // One split alone holds a share of the input: verify says so, and what to verify instead.
    let res = verify_cmd(&dir, Some(2), "out/val", &[]);
    res.check(res.code() == Some(1), "one split is not the whole input");
    res.check(
        res.stdout
            .contains("this is the split \"val\" of a --split output")
            && res.stdout.contains("verify the whole output"),
        "the report names the split and says to verify the whole output",
    );
    // Each split reads as a dataset of its own with webdataset, from its own index.json.
    match test_python() {
        None => skip(
            "split_verify (webdataset part)",
            "no Python with webdataset (RESHARD_TEST_PYTHON or target/pyenv)",
        ),
        Some(py) => {
            let script =
                Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/consumers/read_webdataset.py");
            for (split, n) in [("train", 192), ("val", 24), ("test", 24)] {
                let res = dir
                    .program(&py)
                    .arg(&script)
                    .arg(dir.join("out").join(split))
                    .assert_success();
                res.check(
                    res.stdout
                        .contains(&format!("iterated {n} samples, {n} distinct keys")),
                    "expected webdataset to read every sample of the split once",
                );
            }
        }
    }
    // A training sample copied into val: every size and count fixed, only the sample wrong.
    copy_dir(&dir.join("out"), &dir.create_dir("leak"));
    let leak = dir.join("leak");
    let train = flat(&output(&leak.join("train")));
    append_sample(&leak, "val", "shard-000000.tar", &train[0].bytes);
    let res = verify_cmd(&dir, Some(2), "leak", &[]);
    if res.code() != Some(1)
        || !res.stdout.contains("1 duplicated sample")
        || !res.stdout.contains("the splits are not disjoint")
    {
        res.fail("expected verify to fail on a sample in two splits");
    }
    // A split's own index.json that disagrees with the output's.
    copy_dir(&dir.join("out"), &dir.create_dir("stale"));
    let stale = dir.join("stale");
    let mut v = index_json(&stale.join("test"));
    v["shardlist"][0]["nsamples"] = 1.into();
    std::fs::write(
        stale.join("test/index.json"),
        serde_json::to_vec_pretty(&v).unwrap(),
    )
    .unwrap();
    let res = verify_cmd(&dir, Some(1), "stale", &[]);
    if res.code() != Some(1) || !res.stdout.contains("test/index.json") {
        res.fail("expected verify to name the split index.json that disagrees");
    }
}

#[test]
fn a_split_output_is_reshuffled_from_its_saved_index_and_keeps_its_splits() {
    let dir = Dir::new("split_epochs_link");
    with_class_ties(&dir);
    dir.create_dir("data");
    let epoch = |np: usize, input: &str, e: &str| {
        let mut c = dir.mpi(np);
        c.args([
            "run",
            "--input",
            input,
            "--output",
            "data/epoch-{epoch}",
            "--epoch",
            e,
        ])
        .args(["--shards", "3", "--split", SPLIT, "--seed", "8"])
        .args(["--link", "data/current", "--keep", "1"]);
        c.assert_success()
    };
    epoch(2, "in", "0");
    let first = key_sets(&splits_of(&dir.join("data/current")));
    // A split is an input of its own: its saved index is read, not its headers.
    let mut c = dir.mpi(3);
    c.args([
        "run",
        "--input",
        "data/current/train",
        "--output",
        "train-again",
    ])
    .args(["--shards", "2", "--seed", "1"]);
    c.assert_success()
        .stderr_has("reused the saved index of 3 of 3 input shards");
    // The whole split output as the next epoch's input: every split's saved index is read,
    // every sample stays in its split, the link moves and --keep 1 removes epoch 0.
    let res = epoch(3, "data/current", "1");
    res.stderr_has("reused the saved index of 5 of 5 input shards");
    assert!(!dir.join("data/epoch-0").exists(), "--keep 1 left epoch 0");
    assert_eq!(
        std::fs::canonicalize(dir.join("data/current")).unwrap(),
        std::fs::canonicalize(dir.join("data/epoch-1")).unwrap()
    );
    let again = splits_of(&dir.join("data/current"));
    assert_eq!(key_sets(&again), first, "a sample changed split");
    // From the original input, any epoch: the same splits again.
    epoch(1, "in", "2");
    assert_eq!(key_sets(&splits_of(&dir.join("data/current"))), first);
    // A split output read with other splits is refused: its samples cannot keep their split.
    let mut c = dir.mpi(2);
    c.args([
        "run",
        "--input",
        "data/current",
        "--output",
        "other",
        "--shards",
        "2",
    ])
    .args(["--split", "a=0.5,b=0.5", "--seed", "8"]);
    let res = c.assert_code(1);
    res.stderr_has("name the same splits");
    res.check(!dir.join("other").exists(), "nothing may be published");
}

/// Issue 27, part 2: the large training shards and the small validation and test shards are
/// spread over all writers by bytes. Which rank created which shard is read from strace's log
/// of each rank's files, the bytes from the published files; the run's per-rank report must
/// agree. Before, at np 2 rank 0 wrote every training shard (90% of the bytes).
#[test]
fn every_split_is_spread_over_the_writers_by_bytes() {
    let dir = Dir::new("split_writers");
    dir.generate(
        "in",
        &[
            "--shards",
            "4",
            "--samples",
            "2000",
            "--mean-size",
            "4KiB",
            "--seed",
            "5",
        ],
    );
    for np in [2, 3, 4] {
        let out = format!("out{np}");
        let report = format!("report{np}.json");
        let args = [
            "--input",
            "in",
            "--seed",
            "1",
            "--shards",
            "8",
            "--split-shards",
            "4",
            "--split",
            "train=0.9,val=0.05,test=0.05",
            "--report",
            &report,
        ];
        let Some((run, writers)) = writers_seen_by_strace(&dir, np, &out, &args) else {
            return;
        };
        let mut wrote = vec![0u64; np];
        let shards = index_json(&dir.join(&out))["shardlist"]
            .as_array()
            .unwrap()
            .clone();
        run.check(shards.len() == 16, "8 + 4 + 4 shards");
        for shard in &shards {
            let url = shard["url"].as_str().unwrap();
            let Some(&rank) = writers.get(url) else {
                run.fail(&format!("no rank created {url}"));
            };
            // A shard's sample bytes: the file less the two zero blocks that end it.
            let size = std::fs::metadata(dir.join(&out).join(url)).unwrap().len();
            wrote[rank] += size - 1024;
        }
        let reported: Vec<u64> =
            serde_json::from_slice::<serde_json::Value>(&std::fs::read(dir.join(&report)).unwrap())
                .unwrap()["per_rank"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r["bytes_written"].as_u64().unwrap())
                .collect();
        run.check(
            reported == wrote,
            &format!("report says {reported:?} bytes per rank, the files {wrote:?}"),
        );
        let mean = wrote.iter().sum::<u64>() as f64 / np as f64;
        let busiest = *wrote.iter().max().unwrap() as f64;
        run.check(
            busiest <= 1.1 * mean,
            &format!("np {np}: bytes per writer {wrote:?}: the busiest more than 10% above the mean {mean:.0}"),
        );
    }
}
