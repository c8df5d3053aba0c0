//! Issue 7: epoch reshuffles of a previous output reuse its saved index, `--output` with
//! `{epoch}`, `--link` switched atomically, `--keep` removing only reshard's own older outputs.

use std::fs;
use std::path::{Path, PathBuf};

use crate::util::data::small;
use crate::util::runs::{epoch_expected, epoch_recipe, epoch_run, run};
use crate::util::verifier::{verify, Expected};
use crate::util::{snapshot, tar_files, tree_state, Dir};

#[test]
fn epochs_reuse_the_index_switch_the_link_and_keep_the_newest() {
    let dir = Dir::new("epochs");
    let inputs = small(&dir);
    fs::create_dir_all(dir.join("out/notes")).unwrap();
    // Not made by reshard (no .reshard directory): --keep must never touch it.
    fs::write(
        dir.join("out/notes/index.json"),
        br#"{"__kind__":"wids-shard-index-v1","reshard":{}}"#,
    )
    .unwrap();

    let res = epoch_run(&dir, 2, "in", 0, &[]);
    res.check(
        !res.stderr.contains("reused the saved index"),
        "epoch 0 reads plain shards",
    );
    verify(
        &epoch_expected(&dir, &inputs, 2, 0),
        &dir.join("out/epoch-0"),
    );
    assert_eq!(
        fs::read_link(dir.join("current")).unwrap(),
        Path::new("out/epoch-0")
    );

    // Epoch 1 reads epoch 0's output through the link and skips indexing entirely.
    let prev = tar_files(&dir.join("out/epoch-0"));
    let res = epoch_run(&dir, 3, "current", 1, &[]);
    res.stderr_has("reused the saved index of 4 of 4 input shards");
    // Read through the link, which now leads to epoch 1: the inputs were epoch 0's shards, and
    // index.json names them (not current/..., which names epoch 1's own shards by now).
    let current: Vec<PathBuf> = prev
        .iter()
        .map(|p| dir.join("out/epoch-0").join(p.file_name().unwrap()))
        .collect();
    verify(
        &epoch_expected(&dir, &current, 3, 1),
        &dir.join("out/epoch-1"),
    );
    assert_eq!(
        fs::read_link(dir.join("current")).unwrap(),
        Path::new("out/epoch-1")
    );

    // Epoch 2: --keep 2 removes epoch 0 only.
    let prev = tar_files(&dir.join("out/epoch-1"));
    let res = epoch_run(&dir, 1, "out/epoch-1", 2, &[]);
    res.stderr_has("reused the saved index of 4 of 4 input shards");
    let inputs1: Vec<PathBuf> = prev
        .iter()
        .map(|p| dir.join("out/epoch-1").join(p.file_name().unwrap()))
        .collect();
    verify(
        &epoch_expected(&dir, &inputs1, 1, 2),
        &dir.join("out/epoch-2"),
    );
    assert!(
        !dir.join("out/epoch-0").exists(),
        "--keep 2 must remove the oldest output"
    );
    assert!(dir.join("out/epoch-1").exists() && dir.join("out/epoch-2").exists());
    assert!(
        dir.join("out/notes/index.json").exists(),
        "--keep removed a directory reshard did not make"
    );
    assert_eq!(
        fs::read_link(dir.join("current")).unwrap(),
        Path::new("out/epoch-2")
    );
}

#[test]
fn a_changed_shard_is_reindexed_and_an_explicit_index_is_used() {
    let dir = Dir::new("stale-index");
    let inputs = small(&dir);
    run(&dir, Some(2), &["in"], "first", 4, 5, &[]);
    let first = tar_files(&dir.join("first"));

    // A shard touched after the index was saved: re-indexed with a warning, output still right.
    let touched = &first[1];
    let f = fs::OpenOptions::new().append(true).open(touched).unwrap();
    f.set_modified(std::time::SystemTime::now() + std::time::Duration::from_secs(5))
        .unwrap();
    drop(f);
    let res = run(&dir, Some(2), &["first"], "second", 4, 6, &[]);
    res.stderr_has("re-indexing");
    res.stderr_has("reused the saved index of 3 of 4 input shards");
    verify(
        &Expected::new(dir.path(), &first, 4, 6, 2),
        &dir.join("second"),
    );

    // Copies of the shards (modification times kept) with the index elsewhere: --index.
    let copy = dir.create_dir("copy");
    for p in &tar_files(&dir.join("second")) {
        let to = copy.join(p.file_name().unwrap());
        fs::copy(p, &to).unwrap();
        let mtime = fs::metadata(p).unwrap().modified().unwrap();
        fs::File::options()
            .write(true)
            .open(&to)
            .unwrap()
            .set_modified(mtime)
            .unwrap();
    }
    let res = run(
        &dir,
        Some(2),
        &["copy"],
        "third",
        4,
        7,
        &["--index", "second/.reshard"],
    );
    res.stderr_has("reused the saved index of 4 of 4 input shards");
    let copies = tar_files(&copy);
    verify(
        &Expected::new(dir.path(), &copies, 4, 7, 2),
        &dir.join("third"),
    );
    let _ = inputs;
}

#[test]
fn link_refuses_to_replace_a_real_directory() {
    let dir = Dir::new("link-dir");
    small(&dir);
    fs::create_dir(dir.join("current")).unwrap();
    let mut cmd = dir.mpi(1);
    cmd.args([
        "run", "--input", "in", "--output", "out", "--shards", "2", "--seed", "1", "--link",
        "current",
    ]);
    let res = cmd.assert_code(1);
    res.stderr_has("not a symbolic link");
    res.check(
        Path::new(&dir.join("current")).is_dir(),
        "the directory must stay",
    );
}

#[test]
fn keep_removes_only_older_epochs_of_its_own_series() {
    // Issue 13: --keep 2 removed every reshard output next to the new one.
    let dir = Dir::new("keep-series");
    small(&dir);
    dir.create_dir("data");
    // Unrelated datasets next to the series, all real reshard outputs (index.json and .reshard).
    run(
        &dir,
        Some(1),
        &["in"],
        "data/gz",
        2,
        1,
        &["--compress", "gz"],
    );
    run(&dir, None, &["in"], "data/small", 2, 2, &[]);
    run(&dir, Some(2), &["in"], "data/resharded", 3, 3, &[]);
    // Another template's series, and names that only look like this one's: a leading zero
    // (--epoch never writes one) and digits with a suffix.
    let other = ["--output", "data/other-epoch-{epoch}", "--epoch", "1"];
    let mut cmd = dir.command();
    cmd.args(["run", "--input", "in", "--shards", "2", "--seed", "5"])
        .args(other);
    cmd.assert_success();
    run(&dir, None, &["in"], "data/epoch-00", 2, 6, &[]);
    run(&dir, None, &["in"], "data/epoch-0.bak", 2, 6, &[]);
    // A plain directory whose name starts like the series.
    dir.create_bytes("data/epoch-notes/notes.txt", b"not a dataset\n");
    let unrelated = [
        "data/gz",
        "data/small",
        "data/resharded",
        "data/other-epoch-1",
        "data/epoch-00",
        "data/epoch-0.bak",
        "data/epoch-notes",
    ];
    let before: Vec<_> = unrelated.iter().map(|d| snapshot(&dir.join(d))).collect();

    let res = epoch_recipe(&dir, 2, "in", 0, &[]);
    res.check(
        !res.stderr.contains("removing"),
        "epoch 0 has nothing to remove",
    );
    let res = epoch_recipe(&dir, 1, "data/current", 1, &[]);
    res.check(!res.stderr.contains("removing"), "epoch 1 keeps epoch 0");
    // A dry run of epoch 2 says what --keep would remove, and removes nothing.
    let whole = tree_state(dir.path());
    let res = epoch_recipe(&dir, 2, "data/current", 2, &["--dry-run"]);
    res.stderr_has(&format!(
        "--keep 2 would remove the older output {}",
        dir.join("data/epoch-0").display()
    ));
    res.check(
        res.stderr.matches("would remove").count() == 1,
        "only epoch 0 is beyond --keep 2",
    );
    res.check(tree_state(dir.path()) == whole, "--dry-run changed files");

    let res = epoch_recipe(&dir, 2, "data/current", 2, &[]);
    res.stderr_has(&format!(
        "--keep 2: removing the older output {}",
        dir.join("data/epoch-0").display()
    ));
    res.check(
        res.stderr.matches("removing").count() == 1,
        "--keep 2 must remove epoch 0 and nothing else",
    );
    assert!(!dir.join("data/epoch-0").exists());
    assert!(dir.join("data/epoch-1/index.json").is_file());
    assert!(dir.join("data/epoch-2/index.json").is_file());
    assert_eq!(
        fs::read_link(dir.join("data/current")).unwrap(),
        Path::new("epoch-2"),
        "--link is relative, as `ln -sr` makes it"
    );
    for (d, was) in unrelated.iter().zip(&before) {
        assert!(
            snapshot(&dir.join(d)) == *was,
            "--keep changed {d}, which is not an older epoch of data/epoch-{{epoch}}"
        );
    }
    let mut left: Vec<String> = fs::read_dir(dir.join("data"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    let mut expected: Vec<String> = unrelated
        .iter()
        .map(|d| d.trim_start_matches("data/").to_string())
        .chain(["current", "epoch-1", "epoch-2"].map(String::from))
        .collect();
    expected.sort();
    assert_eq!(left, expected);
    // The link still leads to the dataset once the tree that holds both moved.
    fs::rename(dir.join("data"), dir.join("moved")).unwrap();
    let moved = dir.join("moved/current/index.json");
    assert!(moved.is_file(), "--link broke when its directory moved");
    fs::rename(dir.join("moved"), dir.join("data")).unwrap();
}

#[test]
fn keep_without_epoch_in_the_output_is_refused_before_any_work() {
    let dir = Dir::new("keep-no-epoch");
    small(&dir);
    dir.create_dir("data");
    run(&dir, None, &["in"], "data/old", 2, 1, &[]);
    let before = tree_state(dir.path());
    for (output, why) in [
        ("data/new", "names no series"),
        ("data/{epoch}/new", "in a parent directory"),
    ] {
        let mut cmd = dir.mpi(1);
        cmd.args(["run", "--input", "in", "--output", output])
            .args(["--shards", "2", "--seed", "1", "--keep", "1"]);
        let res = cmd.assert_code(2);
        res.stderr_has(why);
        res.stderr_has("{epoch}");
        res.check(
            !res.stderr.contains("indexing"),
            "--keep must be refused before any work",
        );
        res.check(
            tree_state(dir.path()) == before,
            "a refused run wrote files",
        );
    }
}

/// Issue 38: an epoch loop with `--equalize` reads the original input every epoch; each epoch
/// then holds exactly the original samples but those its `--equalize` dropped (never twice),
/// or all of them plus the repeats it lists, with another choice of dropped or repeated samples
/// each epoch. Reading an epoch's output as the next input is refused: it would lose the
/// dropped samples for good, or take the repeats for samples of their own.
#[test]
fn an_equalized_epoch_loop_keeps_every_original_sample() {
    use crate::util::samples::{input, keys_in};
    use crate::util::{index_json, sorted};
    let dir = Dir::new("epochs-equalize");
    let original = sorted(input(&small(&dir)).into_iter().map(|g| g.key).collect());
    let list = |v: &serde_json::Value| -> Vec<String> {
        let a = v.as_array().unwrap().iter();
        a.map(|k| k.as_str().unwrap().to_string()).collect()
    };
    for mode in ["drop", "pad"] {
        dir.create_dir(mode);
        let mut choices = Vec::new();
        for e in 0..3u64 {
            let out = format!("{mode}/epoch-{e}");
            let extra = ["--epoch", &e.to_string(), "--equalize", mode];
            run(&dir, Some(2), &["in"], &out, 7, 11, &extra);
            let index = index_json(&dir.join(&out));
            let (dropped, repeated) = (
                list(&index["reshard"]["dropped"]),
                list(&index["reshard"]["repeated"]),
            );
            let mut expected = original.clone();
            if mode == "drop" {
                assert!(!dropped.is_empty() && repeated.is_empty(), "{index}");
                expected.retain(|k| !dropped.contains(k));
            } else {
                assert!(dropped.is_empty() && !repeated.is_empty(), "{index}");
                expected.extend(repeated.iter().cloned());
            }
            assert_eq!(
                sorted(keys_in(&dir.join(&out))),
                sorted(expected),
                "{out}: not the original samples as its index.json's lists say"
            );
            choices.push(sorted(if mode == "drop" { dropped } else { repeated }));
        }
        assert!(
            choices[0] != choices[1] && choices[1] != choices[2] && choices[0] != choices[2],
            "--equalize {mode}: the same samples chosen in two epochs: {choices:?}"
        );
        // The loop that reads the last epoch's output instead is refused, before any work.
        let before = tree_state(dir.path());
        let mut cmd = dir.mpi(2);
        cmd.args(["run", "--input", &format!("{mode}/epoch-2")])
            .args(["--output", &format!("{mode}/epoch-3"), "--epoch", "3"])
            .args(["--shards", "7", "--seed", "11", "--equalize", mode]);
        let res = cmd.assert_code(1);
        res.stderr_has(&format!("is a reshard output whose --equalize {mode}"));
        res.stderr_has("read the original input");
        res.stderr_has("(in/train-000000.tar and 2 more)");
        res.check(!res.stderr.contains("indexing"), "refused after work began");
        res.check(
            tree_state(dir.path()) == before,
            "a refused run wrote files",
        );
    }
}

/// Issue 38: an epoch loop that reads the previous epoch through the `--link` it moves. The
/// manifest's `inputs` named `series/current/...`, which the run then pointed at its own output;
/// it names the directory the link led to, and a path without a link stays as written.
#[test]
fn inputs_read_through_the_link_are_recorded_where_the_link_led() {
    let dir = Dir::new("link-inputs");
    small(&dir);
    let link = ["--link", "series/current", "--shards", "2", "--seed", "3"];
    let run_epoch = |input: &str, epoch: &str| {
        dir.mpi(2)
            .args(["run", "--input", input, "--output"])
            .arg(format!("series/epoch-{epoch}"))
            .args(["--epoch", epoch])
            .args(link)
            .assert_success()
    };
    run_epoch("in", "0");
    run_epoch("series/current", "1");
    let inputs = |epoch: &str| -> Vec<String> {
        let text = fs::read(dir.join(format!("series/epoch-{epoch}/index.json"))).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&text).unwrap();
        let list = v["reshard"]["inputs"].as_array().unwrap();
        list.iter()
            .map(|p| p.as_str().unwrap().to_string())
            .collect()
    };
    let first = inputs("0");
    assert!(
        !first.is_empty() && first.iter().all(|p| p.starts_with("in/")),
        "inputs without a link stay as written: {first:?}"
    );
    let epoch0 = fs::canonicalize(dir.join("series/epoch-0")).unwrap();
    let second = inputs("1");
    assert_eq!(second.len(), 2, "{second:?}");
    for (k, path) in second.iter().enumerate() {
        assert_eq!(
            Path::new(path),
            epoch0.join(format!("shard-{k:06}.tar")),
            "{second:?}: the link now leads to {}",
            fs::read_link(dir.join("series/current")).unwrap().display()
        );
    }
}
