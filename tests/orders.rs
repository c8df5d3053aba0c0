//! Issue 5: orders beyond the shuffle — by key, by member content, stratified by label, routed
//! by a key map — byte-identical for any rank count, with the error cases.

use std::collections::HashMap;

use crate::util::data::{labelled, skewed_labels, with_class_ties};
use crate::util::runs::{identical_for_any_np, run_in};
use crate::util::samples::{
    assert_same_samples, cls, flat, input, keys_in, output, worst_deviation, Got,
};
use crate::util::{index_json, tar_files, Dir};

#[test]
fn key_order_sorts_keys_and_is_the_same_for_any_rank_count() {
    let dir = Dir::new("order_key");
    let inputs = with_class_ties(&dir);
    let want = input(&inputs);
    let out = identical_for_any_np(&dir, "asc", &["--shards", "3", "--order", "key"]);
    let got = flat(&output(&out));
    assert_same_samples(&want, &got);
    let keys: Vec<&String> = got.iter().map(|g| &g.key).collect();
    let mut sorted = keys.clone();
    sorted.sort();
    assert_eq!(keys, sorted);
    assert_eq!(index_json(&out)["reshard"]["order"], "key");

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
    let inputs = with_class_ties(&dir);
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

    run_in(
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
    run_in(
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
    run_in(
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

#[test]
fn stratified_shards_hold_every_label_in_proportion_and_stay_shuffled() {
    let dir = Dir::new("order_stratify");
    let label_of = skewed_labels(&dir);
    let inputs = tar_files(&dir.join("in"));
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
    let report = &index_json(&out)["reshard"]["stratify"];
    assert_eq!(report["labels"], 5);
    assert!((report["worst_deviation"].as_f64().unwrap() - worst).abs() < 1e-9);
    // Shuffled within shards: labels are not in runs, and the order follows the seed.
    for (_, s) in &shards {
        let labels: Vec<&String> = s.iter().map(|g| &label_of[&g.key]).collect();
        let mut sorted = labels.clone();
        sorted.sort();
        assert_ne!(labels, sorted, "a shard is sorted by label");
    }
    run_in(
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
    let dropped = index_json(&out)["reshard"]["dropped"].clone();
    assert_eq!(dropped.as_array().unwrap().len(), 3);
    for (_, s) in &shards {
        let mut keys: Vec<&String> = s.iter().map(|g| &g.key).collect();
        keys.sort();
        keys.dedup();
        assert_eq!(keys.len(), s.len(), "a sample twice in one shard");
    }

    // The plain shuffle of the same data is far off on the rare labels (the point of it).
    run_in(&dir, 1, "plain", &["--shards", "7", "--seed", "5"]);
    let plain = worst_deviation(&output(&dir.join("plain")), &label_of);
    assert!(plain > 1.0, "plain shuffle deviation {plain}");
}

#[test]
fn key_map_routes_samples_to_groups_sized_on_their_own() {
    let dir = Dir::new("order_key_map");
    let inputs = with_class_ties(&dir);
    let want = input(&inputs);
    // Generated keys are cNNN/NNNNNNNN: classes 000-039 to "low", 040-079 to "mid".
    dir.create_bytes(
        "map.json",
        br#"{"low-%04d.tar": ["^c0[0-3]"], "mid-%d.tar": ["^c0[4-7]"]}"#,
    );
    key_map_refuses_unmatched_samples(&dir);
    key_map_groups(&dir, &want);
    key_map_refuses_names_that_clash(&dir);
    key_map_skips_unmatched_samples(&dir, &want);
    key_map_lines(&dir, &want);
}

/// The class of a generated key `cNNN/NNNNNNNN`.
fn class_of(g: &Got) -> u32 {
    g.key[1..4].parse::<u32>().unwrap()
}

/// By default a sample that matches no group fails the run.
fn key_map_refuses_unmatched_samples(dir: &Dir) {
    let mut c = dir.mpi(2);
    c.args([
        "run", "-i", "in", "-o", "out", "--shards", "2", "--seed", "1",
    ]);
    c.args(["--key-map", "map.json"]);
    let res = c.assert_code(1);
    res.stderr_has("matches no group");
    res.stderr_has("train-0000");
    res.check(!dir.join("out").exists(), "nothing is published");
}

/// `--unmatched group:`: three groups, each balanced on its own.
fn key_map_groups(dir: &Dir, want: &[Got]) {
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
    let out = identical_for_any_np(dir, "groups", &args);
    let shards = output(&out);
    assert_same_samples(want, &flat(&shards));
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
    for (name, s) in &shards {
        let ok = |g: &Got| match &name[..3] {
            "low" => class_of(g) < 40,
            "mid" => (40..80).contains(&class_of(g)),
            _ => class_of(g) >= 80,
        };
        assert!(s.iter().all(ok), "{name} holds a sample of another group");
    }
    // Each group balanced on its own.
    for pair in shards.chunks(2) {
        assert!(pair[0].1.len().abs_diff(pair[1].1.len()) <= 1);
    }
    let groups = &index_json(&out)["reshard"]["key_map"]["groups"];
    assert_eq!(groups.as_array().unwrap().len(), 3);
}

fn key_map_refuses_names_that_clash(dir: &Dir) {
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
}

fn key_map_skips_unmatched_samples(dir: &Dir, want: &[Got]) {
    // skip: the unmatched samples are left out and counted, and `verify` accepts exactly that.
    run_in(
        dir,
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
    let unmatched = want.iter().filter(|g| class_of(g) >= 80).count();
    assert_eq!(kept.len() + unmatched, want.len());
    assert_eq!(
        index_json(&dir.join("skip"))["reshard"]["key_map"]["unmatched"],
        unmatched as u64
    );
}

fn key_map_lines(dir: &Dir, want: &[Got]) {
    // The lines form: exact keys, ordered by key within each group.
    let lines: String = want
        .iter()
        .enumerate()
        .map(|(i, g)| format!("{}\t{}\n", g.key, if i % 3 == 0 { "a-%d" } else { "b-%d" }))
        .collect();
    dir.create_bytes("map.txt", lines.as_bytes());
    let out = identical_for_any_np(
        dir,
        "lines",
        &["--shards", "2", "--key-map", "map.txt", "--order", "key"],
    );
    let shards = output(&out);
    assert_same_samples(want, &flat(&shards));
    let group_a: Vec<String> = shards[..2]
        .iter()
        .flat_map(|s| s.1.iter().map(|g| g.key.clone()))
        .collect();
    let mut expect_a: Vec<String> = want.iter().step_by(3).map(|g| g.key.clone()).collect();
    expect_a.sort();
    assert_eq!(shards[0].0, "a-0.tar");
    assert_eq!(group_a, expect_a);
    // The ranks read the map together, each a part: its first problem in file order is said
    // once, with its line, at any rank count. Line 2 is malformed, a later line maps a key again.
    let mut bad = lines.clone();
    bad.insert_str(bad.find('\n').unwrap() + 1, "no tab here\n");
    bad.push_str(&format!("{}\tc-%d\n", want[0].key));
    dir.create_bytes("bad.txt", bad.as_bytes());
    let mut clash = lines.clone();
    clash.push_str(&format!("{}\tc-%d\n", want[1].key));
    dir.create_bytes("clash.txt", clash.as_bytes());
    let again = format!(
        "clash.txt:{}: key {:?} is mapped again (first on line 2)",
        want.len() + 1,
        want[1].key
    );
    for np in [1, 3] {
        for (map, says) in [
            ("bad.txt", "bad.txt:2: expected `key<TAB>template`"),
            ("clash.txt", again.as_str()),
        ] {
            let mut c = dir.mpi(np);
            c.args([
                "run", "--input", "in", "--output", "refused", "--shards", "2",
            ])
            .args(["--key-map", map, "--order", "key"]);
            let res = c.assert_code(1);
            let said = res.stderr.matches(says).count();
            res.check(
                said == 1,
                &format!("{says:?} must be said once, not {said} times"),
            );
        }
    }
}

#[test]
fn order_flags_that_do_not_fit_are_refused() {
    let dir = Dir::new("order_flags");
    with_class_ties(&dir);
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
