//! Issue 5: orders beyond the shuffle — by key, by member content, stratified by label, routed
//! by a key map — byte-identical for any rank count, with the error cases.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::bad_input::tar_of;
use crate::util::{Dir, RunOutput, NPS};
use crate::verify::{assert_same_output, input_samples, walk_file, Kind};

/// 240 samples in 5 uneven shards; the generator's `.cls` members hold class numbers with
/// many repeats (ties).
fn dataset(dir: &Dir) -> Vec<PathBuf> {
    dir.generate(
        "in",
        &[
            "--shards",
            "5",
            "--samples",
            "240",
            "--mean-size",
            "1KiB",
            "--skew",
            "2",
            "--seed",
            "4",
        ],
    )
}

fn run(dir: &Dir, np: usize, out: &str, args: &[&str]) -> RunOutput {
    let mut c = dir.mpi(np);
    c.args(["run", "--input", "in", "--output", out]).args(args);
    c.assert_success()
}

fn index(out: &Path) -> Value {
    serde_json::from_slice(&fs::read(out.join("index.json")).unwrap()).unwrap()
}

/// One sample as the test reads it: key, bytes, and each member's content by extension.
#[derive(Debug, Clone, PartialEq)]
struct Got {
    key: String,
    bytes: Vec<u8>,
    members: BTreeMap<String, Vec<u8>>,
}

/// The samples of a tar file, with member contents read from the headers (the test's own
/// reader: ustar size field, GNU `L` and PAX `x` records skipped).
fn samples_of(path: &Path) -> Vec<Got> {
    let shard = input_samples(path);
    let walk = walk_file(path);
    let bytes = &walk.bytes;
    let mut contents: HashMap<usize, (String, Vec<u8>)> = HashMap::new();
    for r in walk.records.iter().filter(|r| r.kind == Kind::File) {
        let mut at = r.start;
        loop {
            let h = &bytes[at..at + 512];
            let size_text: String = h[124..136]
                .iter()
                .filter(|b| b.is_ascii_digit())
                .map(|&b| b as char)
                .collect();
            let size = usize::from_str_radix(&size_text, 8).unwrap();
            if matches!(h[156], b'L' | b'x') {
                at += 512 + size.div_ceil(512) * 512;
                continue;
            }
            let name = String::from_utf8_lossy(&r.path).into_owned();
            let base = name.rsplit('/').next().unwrap();
            let ext = base.split_once('.').map_or("", |(_, e)| e).to_string();
            contents.insert(r.start, (ext, bytes[at + 512..at + 512 + size].to_vec()));
            break;
        }
    }
    shard
        .samples
        .iter()
        .map(|s| {
            let members = walk
                .records
                .iter()
                .filter(|r| r.start >= s.start && r.end <= s.end)
                .filter_map(|r| contents.get(&r.start).cloned())
                .collect();
            Got {
                key: s.key.clone(),
                bytes: shard.sample_bytes(s).to_vec(),
                members,
            }
        })
        .collect()
}

/// The input's samples in canonical order.
fn input(inputs: &[PathBuf]) -> Vec<Got> {
    inputs.iter().flat_map(|p| samples_of(p)).collect()
}

/// The output's shards in shardlist order, each as its samples.
fn output(out: &Path) -> Vec<(String, Vec<Got>)> {
    index(out)["shardlist"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let url = e["url"].as_str().unwrap().to_string();
            let got = samples_of(&out.join(&url));
            assert_eq!(got.len() as u64, e["nsamples"].as_u64().unwrap(), "{url}");
            (url, got)
        })
        .collect()
}

fn flat(shards: &[(String, Vec<Got>)]) -> Vec<Got> {
    shards.iter().flat_map(|s| s.1.clone()).collect()
}

/// The keys of an output directory's samples, shard by shard.
fn keys_in(out: &Path) -> Vec<String> {
    flat(&output(out)).into_iter().map(|g| g.key).collect()
}

fn cls(g: &Got) -> i64 {
    String::from_utf8_lossy(&g.members["cls"])
        .trim()
        .parse()
        .unwrap()
}

/// Every output sample is an input sample byte for byte, each exactly once.
fn assert_same_samples(input: &[Got], output: &[Got]) {
    let mut a: Vec<&Vec<u8>> = input.iter().map(|g| &g.bytes).collect();
    let mut b: Vec<&Vec<u8>> = output.iter().map(|g| &g.bytes).collect();
    a.sort();
    b.sort();
    assert!(
        a == b,
        "the output does not hold exactly the input's samples"
    );
}

/// Runs at every np and requires byte-identical outputs; returns the np=1 output's directory.
fn identical_for_any_np(dir: &Dir, name: &str, args: &[&str]) -> PathBuf {
    for np in NPS {
        run(dir, np, &format!("{name}-{np}"), args);
        if np > 1 {
            assert_same_output(
                &dir.join(format!("{name}-1")),
                &dir.join(format!("{name}-{np}")),
                &["ranks"],
            );
        }
    }
    dir.join(format!("{name}-1"))
}

#[test]
fn key_order_sorts_keys_and_is_the_same_for_any_rank_count() {
    let dir = Dir::new("order_key");
    let inputs = dataset(&dir);
    let want = input(&inputs);
    let out = identical_for_any_np(&dir, "asc", &["--shards", "3", "--order", "key"]);
    let got = flat(&output(&out));
    assert_same_samples(&want, &got);
    let keys: Vec<&String> = got.iter().map(|g| &g.key).collect();
    let mut sorted = keys.clone();
    sorted.sort();
    assert_eq!(keys, sorted);
    assert_eq!(index(&out)["reshard"]["order"], "key");

    let out = identical_for_any_np(
        &dir,
        "desc",
        &["--shards", "3", "--order", "key", "--descending"],
    );
    let got = keys_in(&out);
    let mut reversed = got.clone();
    reversed.sort();
    reversed.reverse();
    assert_eq!(got, reversed);
}

#[test]
fn content_order_sorts_by_value_with_ties_in_input_order() {
    let dir = Dir::new("order_content");
    let inputs = dataset(&dir);
    let want = input(&inputs);
    let place: HashMap<String, usize> = want
        .iter()
        .enumerate()
        .map(|(i, g)| (g.key.clone(), i))
        .collect();
    for (name, desc) in [("asc", false), ("desc", true)] {
        let mut args = vec!["--shards", "4", "--order", "content:cls:int"];
        if desc {
            args.push("--descending");
        }
        let out = identical_for_any_np(&dir, name, &args);
        let got = flat(&output(&out));
        assert_same_samples(&want, &got);
        let mut ties = 0;
        for w in got.windows(2) {
            let (a, b) = (cls(&w[0]), cls(&w[1]));
            if a == b {
                ties += 1;
                assert!(
                    place[&w[0].key] < place[&w[1].key],
                    "tie out of input order"
                );
            } else {
                assert_eq!(a < b, !desc, "{a} then {b}");
            }
        }
        assert!(ties > 50, "the test data should have many ties ({ties})");
    }
    // Numbers, not text: 10 after 9.
    let out = dir.join("asc-1");
    let values: Vec<i64> = flat(&output(&out)).iter().map(cls).collect();
    assert!(values.windows(2).all(|w| w[0] <= w[1]) && values.last() > Some(&9));
}

/// Six samples in one shard; `cls` gives each one's label (None: no .cls member).
fn labelled(dir: &Dir, cls: &[Option<&str>]) {
    let names: Vec<(String, Vec<u8>)> = cls
        .iter()
        .enumerate()
        .flat_map(|(i, c)| {
            let mut m = vec![(format!("s{i:03}.jpg"), vec![b'x'; 100 + i])];
            if let Some(c) = c {
                m.push((format!("s{i:03}.cls"), c.as_bytes().to_vec()));
            }
            m
        })
        .collect();
    let members: Vec<(&str, &[u8])> = names
        .iter()
        .map(|(n, d)| (n.as_str(), d.as_slice()))
        .collect();
    dir.create_bytes("in/a.tar", &tar_of(&members));
}

#[test]
fn missing_or_unparsable_content_names_file_and_key_unless_placed_last() {
    let dir = Dir::new("order_missing");
    labelled(
        &dir,
        &[
            Some("3"),
            Some("1"),
            None,
            Some("2\n"),
            Some("0"),
            Some("1"),
        ],
    );
    let mut c = dir.mpi(2);
    c.args(["run", "-i", "in", "-o", "out", "--shards", "2"]);
    c.args(["--order", "content:cls:int"]);
    let res = c.assert_code(1);
    res.stderr_has("a.tar");
    res.stderr_has("\"s002\"");
    res.stderr_has("has no .cls member");
    res.stderr_has("--missing last");
    res.check(!dir.join("out").exists(), "nothing is published");

    run(
        &dir,
        2,
        "last",
        &[
            "--shards",
            "2",
            "--order",
            "content:cls:int",
            "--missing",
            "last",
        ],
    );
    let keys = keys_in(&dir.join("last"));
    assert_eq!(keys, ["s004", "s001", "s005", "s003", "s000", "s002"]);
    // Descending too: the missing sample stays last.
    run(
        &dir,
        3,
        "last-desc",
        &[
            "--shards",
            "1",
            "--order",
            "content:cls:int",
            "--missing",
            "last",
            "--descending",
        ],
    );
    let keys = keys_in(&dir.join("last-desc"));
    assert_eq!(keys, ["s000", "s003", "s001", "s005", "s004", "s002"]);

    let dir = Dir::new("order_unparsable");
    labelled(&dir, &[Some("3"), Some("x7"), Some("1")]);
    let mut c = dir.mpi(2);
    c.args(["run", "-i", "in", "-o", "out", "--shards", "1"]);
    c.args(["--order", "content:cls:int"]);
    let res = c.assert_code(1);
    res.stderr_has("\"s001\"");
    res.stderr_has("\"x7\" is not an integer");
    // As text it sorts fine.
    run(
        &dir,
        1,
        "text",
        &["--shards", "1", "--order", "content:cls"],
    );
    let keys = keys_in(&dir.join("text"));
    assert_eq!(keys, ["s002", "s000", "s001"]);

    // A label member larger than --label-limit is refused before anything is read into memory.
    let mut c = dir.mpi(1);
    c.args(["run", "-i", "in", "-o", "out", "--shards", "1"]);
    c.args(["--order", "content:jpg", "--label-limit", "64"]);
    let res = c.assert_code(1);
    res.stderr_has("a.tar");
    res.stderr_has("byte offset");
    res.stderr_has("--label-limit");
}

/// 640 samples over 4 shards with skewed labels: 50%, 25%, 15%, 7%, 3% (rounded).
fn skewed(dir: &Dir) -> BTreeMap<String, String> {
    let labels = ["cat", "dog", "emu", "fox", "gnu"];
    let shares = [0.50, 0.75, 0.90, 0.97, 1.0];
    let mut label_of = BTreeMap::new();
    let mut members: Vec<(String, Vec<u8>)> = Vec::new();
    let mut shard = 0;
    for i in 0..640u64 {
        // A fixed pseudo-random draw, so labels are interleaved in the input.
        let u = ((i * 2_654_435_761) % 1000) as f64 / 1000.0;
        let l = labels[shares.iter().position(|&s| u < s).unwrap()];
        let key = format!("k{i:04}");
        members.push((
            format!("{key}.bin"),
            vec![i as u8; 50 + (i as usize * 37) % 400],
        ));
        members.push((format!("{key}.cls"), l.as_bytes().to_vec()));
        label_of.insert(key, l.to_string());
        if i % 160 == 159 {
            let m: Vec<(&str, &[u8])> = members
                .iter()
                .map(|(n, d)| (n.as_str(), d.as_slice()))
                .collect();
            dir.create_bytes(format!("in/part-{shard}.tar"), &tar_of(&m));
            members.clear();
            shard += 1;
        }
    }
    label_of
}

/// The worst |count − ideal| over labels and shards, the ideal being the label's share of all
/// samples times the shard's size.
fn worst_deviation(shards: &[(String, Vec<Got>)], label_of: &BTreeMap<String, String>) -> f64 {
    let total: usize = shards.iter().map(|s| s.1.len()).sum();
    let mut n: BTreeMap<&str, usize> = BTreeMap::new();
    for s in shards {
        for g in &s.1 {
            *n.entry(&label_of[&g.key]).or_default() += 1;
        }
    }
    let mut worst: f64 = 0.0;
    for s in shards {
        for (&l, &nl) in &n {
            let count = s.1.iter().filter(|g| label_of[&g.key] == l).count();
            let ideal = nl as f64 * s.1.len() as f64 / total as f64;
            worst = worst.max((count as f64 - ideal).abs());
        }
    }
    worst
}

#[test]
fn stratified_shards_hold_every_label_in_proportion_and_stay_shuffled() {
    let dir = Dir::new("order_stratify");
    let label_of = skewed(&dir);
    let inputs = crate::util::tar_files(&dir.join("in"));
    let want = input(&inputs);
    let out = identical_for_any_np(
        &dir,
        "strat",
        &["--shards", "7", "--stratify-by", "cls", "--seed", "5"],
    );
    let shards = output(&out);
    assert_same_samples(&want, &flat(&shards));
    let worst = worst_deviation(&shards, &label_of);
    assert!(worst <= 1.0, "a label is off its share by {worst}");
    let report = &index(&out)["reshard"]["stratify"];
    assert_eq!(report["labels"], 5);
    assert!((report["worst_deviation"].as_f64().unwrap() - worst).abs() < 1e-9);
    // Shuffled within shards: labels are not in runs, and the order follows the seed.
    for (_, s) in &shards {
        let labels: Vec<&String> = s.iter().map(|g| &label_of[&g.key]).collect();
        let mut sorted = labels.clone();
        sorted.sort();
        assert_ne!(labels, sorted, "a shard is sorted by label");
    }
    run(
        &dir,
        2,
        "other-seed",
        &["--shards", "7", "--stratify-by", "cls", "--seed", "6"],
    );
    let other = output(&dir.join("other-seed"));
    assert_ne!(flat(&other), flat(&shards));
    assert!(worst_deviation(&other, &label_of) <= 1.0);

    // Equal shards with --equalize drop: still within one, every shard the same size, and the
    // three samples left out are random ones (by the permutation), not the last label's.
    let out = identical_for_any_np(
        &dir,
        "drop",
        &[
            "--shards",
            "7",
            "--stratify-by",
            "cls",
            "--seed",
            "5",
            "--equalize",
            "drop",
        ],
    );
    let shards = output(&out);
    assert!(shards.iter().all(|s| s.1.len() == 91), "640 cut to 7 x 91");
    assert!(worst_deviation(&shards, &label_of) <= 1.0);
    let dropped = index(&out)["reshard"]["dropped"].clone();
    assert_eq!(dropped.as_array().unwrap().len(), 3);
    for (_, s) in &shards {
        let mut keys: Vec<&String> = s.iter().map(|g| &g.key).collect();
        keys.sort();
        keys.dedup();
        assert_eq!(keys.len(), s.len(), "a sample twice in one shard");
    }

    // The plain shuffle of the same data is far off on the rare labels (the point of it).
    run(&dir, 1, "plain", &["--shards", "7", "--seed", "5"]);
    let plain = worst_deviation(&output(&dir.join("plain")), &label_of);
    assert!(plain > 1.0, "plain shuffle deviation {plain}");
}

#[test]
fn key_map_routes_samples_to_groups_sized_on_their_own() {
    let dir = Dir::new("order_key_map");
    let inputs = dataset(&dir);
    let want = input(&inputs);
    // Generated keys are cNNN/NNNNNNNN: classes 000-039 to "low", 040-079 to "mid".
    dir.create_bytes(
        "map.json",
        br#"{"low-%04d.tar": ["^c0[0-3]"], "mid-%d.tar": ["^c0[4-7]"]}"#,
    );
    let mut c = dir.mpi(2);
    c.args([
        "run", "-i", "in", "-o", "out", "--shards", "2", "--seed", "1",
    ]);
    c.args(["--key-map", "map.json"]);
    let res = c.assert_code(1);
    res.stderr_has("matches no group");
    res.stderr_has("train-0000");
    res.check(!dir.join("out").exists(), "nothing is published");

    let args = [
        "--shards",
        "2",
        "--seed",
        "1",
        "--key-map",
        "map.json",
        "--unmatched",
        "group:rest-%03d.tar",
    ];
    let out = identical_for_any_np(&dir, "groups", &args);
    let shards = output(&out);
    assert_same_samples(&want, &flat(&shards));
    let names: Vec<&str> = shards.iter().map(|s| s.0.as_str()).collect();
    assert_eq!(
        names,
        [
            "low-0000.tar",
            "low-0001.tar",
            "mid-0.tar",
            "mid-1.tar",
            "rest-000.tar",
            "rest-001.tar"
        ]
    );
    let class = |g: &Got| g.key[1..4].parse::<u32>().unwrap();
    for (name, s) in &shards {
        let ok = |g: &Got| match &name[..3] {
            "low" => class(g) < 40,
            "mid" => (40..80).contains(&class(g)),
            _ => class(g) >= 80,
        };
        assert!(s.iter().all(ok), "{name} holds a sample of another group");
    }
    // Each group balanced on its own.
    for pair in shards.chunks(2) {
        assert!(pair[0].1.len().abs_diff(pair[1].1.len()) <= 1);
    }
    let groups = &index(&out)["reshard"]["key_map"]["groups"];
    assert_eq!(groups.as_array().unwrap().len(), 3);

    // Templates that name the same files are refused before anything is written.
    dir.create_bytes(
        "clash.json",
        br#"{"a-%d.tar": ["^c0[0-4]"], "a-1%d.tar": ["^c0[5-9]"]}"#,
    );
    let mut c = dir.mpi(2);
    c.args([
        "run", "-i", "in", "-o", "clash", "--shards", "12", "--seed", "1",
    ]);
    c.args(["--key-map", "clash.json", "--unmatched", "skip"]);
    let res = c.assert_code(1);
    res.stderr_has("would both be named \"a-10.tar\"");
    res.check(!dir.join("clash").exists(), "nothing is published");

    // skip: the unmatched samples are left out and counted, and `verify` accepts exactly that.
    run(
        &dir,
        3,
        "skip",
        &[
            "--shards",
            "1",
            "--seed",
            "1",
            "--key-map",
            "map.json",
            "--unmatched",
            "skip",
            "--verify",
        ],
    );
    let kept = flat(&output(&dir.join("skip")));
    let unmatched = want.iter().filter(|g| class(g) >= 80).count();
    assert_eq!(kept.len() + unmatched, want.len());
    assert_eq!(
        index(&dir.join("skip"))["reshard"]["key_map"]["unmatched"],
        unmatched as u64
    );

    // The lines form: exact keys, ordered by key within each group.
    let lines: String = want
        .iter()
        .enumerate()
        .map(|(i, g)| format!("{}\t{}\n", g.key, if i % 3 == 0 { "a-%d" } else { "b-%d" }))
        .collect();
    dir.create_bytes("map.txt", lines.as_bytes());
    let out = identical_for_any_np(
        &dir,
        "lines",
        &["--shards", "2", "--key-map", "map.txt", "--order", "key"],
    );
    let shards = output(&out);
    assert_same_samples(&want, &flat(&shards));
    let group_a: Vec<String> = shards[..2]
        .iter()
        .flat_map(|s| s.1.iter().map(|g| g.key.clone()))
        .collect();
    let mut expect_a: Vec<String> = want.iter().step_by(3).map(|g| g.key.clone()).collect();
    expect_a.sort();
    assert_eq!(shards[0].0, "a-0.tar");
    assert_eq!(group_a, expect_a);
}

#[test]
fn order_flags_that_do_not_fit_are_refused() {
    let dir = Dir::new("order_flags");
    dataset(&dir);
    for (args, says) in [
        (
            vec!["--order", "key", "--stratify-by", "cls"],
            "--stratify-by",
        ),
        (vec!["--descending", "--seed", "1"], "--descending"),
        (vec!["--order", "size"], "content:EXT"),
        (
            vec!["--stratify-by", "cls", "--seed", "1", "--balance", "bytes"],
            "--balance",
        ),
        (vec!["--unmatched", "skip", "--seed", "1"], "--key-map"),
        (
            vec!["--stratify-by", "cls", "--seed", "1", "--equalize", "pad"],
            "--equalize drop",
        ),
        (vec!["--stratify-by", ".", "--seed", "1"], "extension"),
        (vec![], "--seed"),
    ] {
        let mut c = dir.reshard(None);
        c.args(["run", "-i", "in", "-o", "out", "--shards", "2"])
            .args(&args);
        let res = c.assert_code(2);
        res.stderr_has(says);
    }
}
