//! `--energon` and `--dali-index`: the loader indexes written with the output.

use std::fs;

use crate::util::loaders::{
    check_tar_idx, check_with_python, energon, energon_python, read_energon, sqlite_rows,
};
use crate::util::runs::identical_for_any_np;
use crate::util::tar::tar_of;
use crate::util::{copy_dir, have_python, skip, tar_files, Dir};

const INDEXED: [&str; 6] = ["--shards", "5", "--seed", "7", "--energon", "--dali-index"];

/// Inputs of 120 samples, some with PAX long names (extension records a sample starts with).
fn inputs(dir: &Dir) {
    dir.generate(
        "in",
        &[
            "--shards",
            "6",
            "--samples",
            "120",
            "--mean-size",
            "1KiB",
            "--sigma",
            "1",
            "--long-names-every",
            "4",
            "--format",
            "pax",
        ],
    );
}

#[test]
fn loader_indexes_are_byte_identical_for_any_rank_count_and_match_the_tars() {
    let dir = Dir::new("loader-np");
    inputs(&dir);
    // Every file, .nv-meta/ included, compared byte for byte between np 1 and np 2..4.
    let out = identical_for_any_np(&dir, "out", &INDEXED);
    for f in [
        "split.yaml",
        "dataset.yaml",
        ".info.json",
        "index.sqlite",
        "index.uuid",
    ] {
        assert!(out.join(".nv-meta").join(f).is_file(), "{f} missing");
    }
    assert_eq!(check_tar_idx(&out), 120);
    if have_python("loader index fields against Python's tarfile") {
        assert_eq!(check_with_python(&dir, &out, true, true), 120);
    }
    let split = fs::read_to_string(out.join(".nv-meta/split.yaml")).unwrap();
    assert_eq!(
        split,
        "split_parts:\n  train:\n  - shard-{000000..000004}.tar\n  val: []\n  test: []\nexclude: []\n"
    );
    // reshard verify still sees only the shards.
    dir.command()
        .args(["verify", "--input", "in", "--output", "out-1"])
        .assert_success();
    // Another seed: another index, another uuid.
    dir.mpi(2)
        .args(["run", "--input", "in", "--output", "seed8"])
        .args(["--shards", "5", "--seed", "8", "--energon"])
        .assert_success();
    let uuid = |d: &str| fs::read_to_string(dir.join(d).join(".nv-meta/index.uuid")).unwrap();
    assert_ne!(uuid("out-1"), uuid("seed8"));
    assert_eq!(uuid("out-1").len(), 36);
}

#[test]
fn without_the_flags_no_loader_index_is_written() {
    let dir = Dir::new("loader-none");
    inputs(&dir);
    dir.command()
        .args([
            "run", "--input", "in", "--output", "out", "--shards", "2", "--seed", "1",
        ])
        .assert_success();
    let names: Vec<String> = fs::read_dir(dir.join("out"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        names
            .iter()
            .all(|n| n.ends_with(".tar") || n == "index.json" || n == ".reshard"),
        "{names:?}"
    );
}

#[test]
fn dali_index_alone_and_a_typed_energon_dataset() {
    let dir = Dir::new("loader-dali");
    inputs(&dir);
    dir.mpi(3)
        .args([
            "run", "--input", "in", "--output", "dali", "--shards", "4", "--seed", "2",
        ])
        .arg("--dali-index")
        .assert_success();
    assert!(!dir.join("dali/.nv-meta").exists());
    assert!(dir.join("dali/shard-000003.idx").is_file());
    if have_python("DALI index fields against Python's tarfile") {
        assert_eq!(check_with_python(&dir, &dir.join("dali"), false, true), 120);
    }
    dir.mpi(2)
        .args([
            "run", "--input", "in", "--output", "typed", "--shards", "2", "--seed", "2",
        ])
        .args(["--energon", "--energon-sample-type", "CaptioningSample"])
        .args([
            "--energon-field-map",
            r#"{"image": "jpg", "caption": "json"}"#,
        ])
        .assert_success();
    assert_eq!(
        fs::read_to_string(dir.join("typed/.nv-meta/dataset.yaml")).unwrap(),
        "sample_type:\n  __module__: megatron.energon\n  __class__: CaptioningSample\nfield_map: {\"caption\":\"json\",\"image\":\"jpg\"}\n"
    );
}

#[test]
fn the_real_energon_prepare_writes_the_same_indexes_and_reads_the_output() {
    let test = "the real energon";
    let Some(py) = energon_python() else {
        skip(
            test,
            "!!! megatron-energon is not installed in the test venv: the comparison with `energon prepare` DID NOT RUN (pip install --no-deps -r examples/consumers/energon-requirements.txt)",
        );
        return;
    };
    let dir = Dir::new("loader-energon");
    inputs(&dir);
    dir.mpi(3)
        .args(["run", "--input", "in", "--output", "out"])
        .args(INDEXED)
        .assert_success();
    // energon prepare on the shards alone.
    dir.create_dir("prep");
    for f in tar_files(&dir.join("out")) {
        fs::copy(&f, dir.join("prep").join(f.file_name().unwrap())).unwrap();
    }
    energon(
        &dir,
        &py,
        &[
            "prepare",
            "--non-interactive",
            "--split-ratio",
            "1,0,0",
            "--sample-type",
            "CrudeWebdataset",
            "--no-progress",
            "--num-workers",
            "1",
            "prep",
        ],
    );
    for f in tar_files(&dir.join("out")) {
        let name = format!("{}.idx", f.file_name().unwrap().to_string_lossy());
        assert_eq!(
            fs::read(dir.join("out").join(&name)).unwrap(),
            fs::read(dir.join("prep").join(&name)).unwrap(),
            "{name} differs from energon prepare's"
        );
    }
    for f in [".info.json", "split.yaml", "dataset.yaml"] {
        assert_eq!(
            fs::read_to_string(dir.join("out/.nv-meta").join(f)).unwrap(),
            fs::read_to_string(dir.join("prep/.nv-meta").join(f)).unwrap(),
            "{f} differs from energon prepare's"
        );
    }
    assert_eq!(
        sqlite_rows(&dir, &dir.join("out/.nv-meta/index.sqlite")),
        sqlite_rows(&dir, &dir.join("prep/.nv-meta/index.sqlite")),
        "index.sqlite rows differ from energon prepare's"
    );
    // energon's own readers load the output as it is, and a copy of it elsewhere (energon
    // reads paths relative to the dataset).
    copy_dir(&dir.join("out"), &dir.join("moved"));
    for out in ["out", "moved"] {
        let read = read_energon(&dir, &py, out, None);
        read.check(
            read.stdout.contains(" 120 samples"),
            "energon read 120 samples",
        );
    }
}

/// `reshard run` with `args` under `mpirun -np np` must fail with exit 1 naming `needles`,
/// publishing nothing and leaving no staging directory.
fn refused(dir: &Dir, np: usize, args: &[&str], needles: &[&str]) {
    let res = dir
        .mpi(np)
        .args([
            "run", "--input", "in", "--output", "out", "--shards", "2", "--seed", "1",
        ])
        .args(args)
        .assert_code(1);
    for n in needles {
        res.stderr_has(n);
    }
    res.check(!dir.join("out").exists(), "something was published");
    res.check(
        !dir.join(".out.reshard-tmp").exists(),
        "staging left behind",
    );
}

#[test]
fn with_energon_a_duplicate_key_is_an_error_whatever_on_duplicate_says() {
    let dir = Dir::new("loader-dup");
    dir.create_bytes("in/a.tar", &tar_of(&[("dup.jpg", b"1"), ("k1.jpg", b"2")]));
    dir.create_bytes("in/b.tar", &tar_of(&[("k2.jpg", b"3"), ("dup.jpg", b"4")]));
    // Kept without --energon.
    dir.command()
        .args([
            "run", "--input", "in", "--output", "kept", "--shards", "2", "--seed", "1",
        ])
        .args(["--on-duplicate", "keep"])
        .assert_success();
    for np in [1, 3] {
        refused(
            &dir,
            np,
            &["--energon", "--on-duplicate", "keep"],
            &["\"dup\"", "energon requires unique sample keys"],
        );
    }
}

#[test]
fn member_names_a_loader_would_read_differently_are_refused() {
    let dir = Dir::new("loader-names");
    dir.create_bytes(
        "in/a.tar",
        &tar_of(&[
            ("k1.jpg", b"1"),
            ("__meta__/x.json", b"2"),
            ("k 2.jpg", b"3"),
        ]),
    );
    for np in [1, 2] {
        let energon = [
            "a.tar",
            "byte offset 1024",
            "__meta__/x.json",
            "energon skips",
        ];
        refused(&dir, np, &["--energon"], &energon);
        let dali = ["a.tar", "byte offset 2048", "k 2.jpg", "white space"];
        refused(&dir, np, &["--dali-index"], &dali);
    }
    // An output with saved indexes: with a loader index its headers are read all the same, so
    // the names are refused while indexing, before any data moves (not in the finish phase).
    dir.command()
        .args([
            "run", "--input", "in", "--output", "plain", "--shards", "1", "--seed", "1",
        ])
        .assert_success();
    let res = dir
        .command()
        .args([
            "run", "--input", "plain", "--output", "out", "--shards", "1", "--seed", "2",
        ])
        .arg("--dali-index")
        .assert_code(1);
    res.check(
        !res.stderr.contains("reused the saved index"),
        "the saved index must not be used",
    );
    res.stderr_has("shard-000000.tar: byte offset");
    res.stderr_has("k 2.jpg");
    res.check(!dir.join("out").exists(), "something was published");
}

#[test]
fn loader_index_flags_that_cannot_work_are_usage_errors() {
    let dir = Dir::new("loader-usage");
    dir.create_bytes("in/a.tar", &tar_of(&[("k1.jpg", b"1")]));
    let cases: [(&[&str], &str); 7] = [
        (&["--energon", "--compress", "gz"], "not with --compress"),
        (&["--energon-field-map", "{}"], "use them with --energon"),
        (
            &["--dali-index", "--compress", "zst"],
            "not with --compress",
        ),
        (&["--energon", "--equalize", "pad"], "unique keys"),
        (&["--energon", "--prefix", "a{b"], "brace-expands"),
        (
            &["--energon", "--energon-sample-type", "CaptioningSample"],
            "needs --energon-field-map",
        ),
        (
            &[
                "--energon",
                "--energon-sample-type",
                "X",
                "--energon-field-map",
                "[1]",
            ],
            "JSON object",
        ),
    ];
    for (args, needle) in cases {
        dir.command()
            .args([
                "run", "--input", "in", "--output", "out", "--shards", "1", "--seed", "1",
            ])
            .args(args)
            .assert_code(2)
            .stderr_has(needle);
    }
}

#[test]
fn a_split_output_gets_one_energon_dataset_whose_parts_are_the_splits() {
    let dir = Dir::new("loader-split");
    inputs(&dir);
    let args = [
        "--shards",
        "4",
        "--seed",
        "7",
        "--split",
        "train=0.8,val=0.1,test=0.1",
        "--split-shards",
        "1",
        "--energon",
        "--dali-index",
    ];
    let out = identical_for_any_np(&dir, "out", &args);
    let yaml = fs::read_to_string(out.join(".nv-meta/split.yaml")).unwrap();
    assert_eq!(
        yaml,
        "split_parts:\n  train:\n  - train/shard-{000000..000003}.tar\n  val:\n  - val/shard-000000.tar\n  test:\n  - test/shard-000000.tar\nexclude: []\n",
        "split.yaml names each split's shards"
    );
    let per_split: usize = ["train", "val", "test"]
        .iter()
        .map(|s| check_tar_idx(&out.join(s)))
        .sum();
    assert_eq!(
        per_split, 120,
        "every sample indexed once across the splits"
    );
    // DALI's NAME.idx next to each split's shards, field by field against Python's tarfile.
    let dali: usize = ["train", "val", "test"]
        .iter()
        .map(|s| {
            let split = out.join(s);
            assert!(
                split.join("shard-000000.idx").is_file(),
                "{s}: no DALI index"
            );
            check_with_python(&dir, &split, false, true)
        })
        .sum();
    assert_eq!(dali, 120, "every sample in the DALI indexes once");
    let Some(py) = energon_python() else {
        skip(
            "a split output read by energon",
            "!!! megatron-energon is not installed in the test venv: reading each split with energon DID NOT RUN",
        );
        return;
    };
    let mut seen = 0;
    for (split, n) in [("train", 96), ("val", 12), ("test", 12)] {
        let read = read_energon(&dir, &py, out.to_str().unwrap(), Some(split));
        read.check(
            read.stdout.contains(&format!(" {n} samples")),
            &format!("energon read {n} samples of {split}"),
        );
        seen += n;
    }
    assert_eq!(seen, 120);
}
