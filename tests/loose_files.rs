//! `--input-files`: trees of loose files packed into shards, byte-identical at every rank count,
//! pinned by a golden digest, read back file by file; and the bad inputs of a tree.

use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::time::{Duration, Instant};

use crate::util::files::{members, tree, MTIME};
use crate::util::loaders::check_with_python;
use crate::util::splits::{key_sets, splits_of};
use crate::util::verifier::output_digest;
use crate::util::{Dir, TestCommand};

/// The output of `--input-files tree --label-from-dir cls --shards 3 --seed 5` on
/// [`tree`]'s tree, pinned.
const GOLDEN: &str = "4170c90b0a903670e582df58bcd172b6";

/// `reshard run --input-files ROOT --output OUT ARGS` under `mpirun -np N` (`None`: alone).
fn run_files(dir: &Dir, np: Option<usize>, root: &str, out: &str, args: &[&str]) -> TestCommand {
    let mut cmd = dir.reshard(np);
    cmd.args(["run", "--input-files", root, "--output", out])
        .args(args);
    cmd
}

/// The tree of [`tree`] into 3 shards with seed 5, and `extra`.
fn pack(dir: &Dir, np: usize, out: &str, extra: &[&str]) -> TestCommand {
    let shards = ["--shards", "3", "--seed", "5"];
    run_files(dir, Some(np), "tree", out, &[&shards[..], extra].concat())
}

/// `bad` into one shard with seed 1 and `extra`, which must exit `code` saying each of `says`.
fn refused(dir: &Dir, np: Option<usize>, out: &str, extra: &[&str], code: i32, says: &[&str]) {
    let mut cmd = run_files(dir, np, "bad", out, &["--shards", "1", "--seed", "1"]);
    let res = cmd.args(extra).assert_code(code);
    for s in says {
        res.stderr_has(s);
    }
}

#[test]
fn a_tree_packs_to_the_same_bytes_at_np_1_to_4_with_every_file_once() {
    let dir = Dir::new("files-golden");
    let (want, files) = tree(&dir, "tree");
    let mut digests = Vec::new();
    for np in 1..=4 {
        let out = format!("out-np{np}");
        let res = pack(&dir, np, &out, &["--label-from-dir", "cls"]).assert_success();
        res.stderr_has(&format!("walked {files} files"));
        let summary = format!("loose files: {files} files became 3 shards");
        res.check(res.stdout.contains(&summary), &summary);
        // Hidden: four files of c0 and the directory c2/.cache; .git, beside the class
        // directories, is left out where rank 0 cuts the root, uncounted.
        res.stderr_has("skipped: 5 hidden or editor's leftover, 2 link to a directory or dangling, 2 FIFO, socket or device, 1 without a key");
        digests.push(output_digest(&dir.join(&out)));
    }
    assert!(
        digests.iter().all(|d| *d == digests[0]),
        "outputs differ by rank count: {digests:?}"
    );
    assert_eq!(digests[0], GOLDEN, "the golden digest moved");
    let got = members(&dir.join("out-np1"));
    let names: Vec<&String> = got.keys().collect();
    assert_eq!(names, want.keys().collect::<Vec<_>>());
    for (name, (bytes, mode, mtime, uid, gid, owners)) in &got {
        assert_eq!(bytes, &want[name], "{name}");
        assert_eq!((*uid, *gid, owners.as_str()), (0, 0, "[]/[]"), "{name}");
        if name.ends_with(".cls") {
            assert_eq!((*mode, *mtime), (0o644, 0), "{name}");
        } else {
            assert_eq!(*mode, 0o644, "{name}");
            assert!(
                *mtime > MTIME && *mtime <= MTIME + files as u64,
                "{name}: {mtime}"
            );
        }
    }
    assert_eq!(
        fs::read(dir.join("out-np1/classes.txt")).unwrap(),
        b"c0\nc1\nc2\n"
    );
}

#[test]
fn verify_and_python_readers_take_the_packed_tree() {
    let dir = Dir::new("files-readers");
    tree(&dir, "tree");
    pack(&dir, 2, "out", &["--label-from-dir", "cls"]).assert_success();
    // GNU tar lists every shard without a complaint, PAX records included.
    for shard in crate::util::tar_files(&dir.join("out")) {
        dir.program("tar").arg("-tf").arg(&shard).assert_success();
    }
    let verify = |np: usize| {
        let mut cmd = dir.mpi(np);
        cmd.args([
            "verify",
            "--input-files",
            "tree",
            "--label-from-dir",
            "cls",
            "--output",
            "out",
        ]);
        cmd
    };
    for np in [1, 3] {
        verify(np).assert_success();
    }
    // A file the output lacks, and one whose bytes differ: verify reads the tree itself.
    fs::write(dir.join("tree/c0/new_1.jpg"), b"new").unwrap();
    let res = verify(2).output();
    res.check(
        res.code() == Some(1),
        "verify must fail on a sample the output lacks",
    );
    let all = format!("{}{}", res.stdout, res.stderr);
    res.check(
        all.contains("missing"),
        "verify must say a sample is missing",
    );
}

#[test]
fn files_that_change_vanish_or_turn_into_fifos_during_the_run_are_refused_by_name() {
    let dir = Dir::new("files-change");
    tree(&dir, "tree");
    type Change = fn(&std::path::Path);
    let changes: [(&str, Change, &str); 3] = [
        (
            "c1/s004.seg.png",
            // The same size, other bytes: only the modification time tells.
            |p| fs::write(p, vec![b'x'; 700]).unwrap(),
            "it changed: its modification time moved",
        ),
        (
            "c0/s003.json",
            |p| fs::remove_file(p).unwrap(),
            "cannot open",
        ),
        (
            "c2/s006.jpg",
            |p| {
                fs::remove_file(p).unwrap();
                let ok = std::process::Command::new("mkfifo")
                    .arg(p)
                    .status()
                    .unwrap();
                assert!(ok.success());
            },
            "no longer a regular file",
        ),
    ];
    for (np, (victim, change, says)) in [1, 3, 4].into_iter().zip(changes) {
        let out = format!("out-{np}");
        let markers: Vec<_> = (0..np)
            .map(|r| dir.join(format!(".{out}.reshard-tmp/.paused-exchange-{r}")))
            .collect();
        let path = dir.join("tree").join(victim);
        let watcher = std::thread::spawn(move || {
            let start = Instant::now();
            // Every rank paused: none has read a file yet.
            while !markers.iter().all(|m| m.exists()) {
                assert!(
                    start.elapsed() < Duration::from_secs(60),
                    "the run never paused"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
            change(&path);
            for m in &markers {
                let _ = fs::remove_file(m);
            }
        });
        let res = pack(&dir, np, &out, &[])
            .env("RESHARD_TEST_PAUSE_EXCHANGE", "30")
            .assert_code(1);
        watcher.join().unwrap();
        res.stderr_has(&format!("tree/{victim}"));
        res.stderr_has(says);
        res.check(!dir.join(&out).exists(), "nothing may be published");
    }
}

#[test]
fn names_keys_and_labels_that_cannot_be_packed_are_refused_by_name() {
    let dir = Dir::new("files-refused");
    fs::create_dir_all(dir.join("bad/a")).unwrap();
    fs::write(dir.join("bad/a/x.jpg"), b"x").unwrap();
    let odd = std::ffi::OsStr::from_bytes(b"bad/a/\xffname.jpg");
    fs::write(dir.join(odd), b"y").unwrap();
    for np in [1, 2] {
        refused(&dir, Some(np), "o", &[], 1, &["is not UTF-8", "bad/a/"]);
    }
    fs::remove_file(dir.join(odd)).unwrap();
    fs::write(dir.join("bad/top.jpg"), b"z").unwrap();
    let no_class =
        "bad/top.jpg: --label-from-dir: a file directly in the root has no class directory";
    let cls = ["--label-from-dir", "cls"];
    refused(&dir, Some(2), "o", &cls, 1, &[no_class]);
    let dot = "holds a '.' in its last part";
    refused(&dir, Some(2), "o", &["--key-regex", "^(.*)$"], 1, &[dot]);
    let inside = "is inside the --input-files root";
    refused(&dir, None, "bad/o", &[], 1, &[inside]);
    let group = "needs a capture group";
    refused(&dir, None, "o", &["--key-regex", "^[^/]*"], 2, &[group]);
}

#[test]
fn a_key_regex_groups_files_of_several_directories_into_one_sample() {
    let dir = Dir::new("files-regex");
    for (rel, bytes) in [
        ("img/a1.jpg", "A"),
        ("txt/a1.txt", "a"),
        ("img/b2.jpg", "B"),
        ("txt/b2.txt", "b"),
    ] {
        dir.create_bytes(format!("t/{rel}"), bytes.as_bytes());
    }
    for np in [1, 3] {
        let out = format!("o{np}");
        let regex = ["--key-regex", "^[^/]*/([^/.]*)"];
        let strict = ["--order", "key", "--on-duplicate", "abort"];
        let one = ["--shards", "1", "--seed", "1"];
        run_files(
            &dir,
            Some(np),
            "t",
            &out,
            &[&one[..], &regex, &strict].concat(),
        )
        .assert_success();
        let got = members(&dir.join(&out));
        let names: Vec<&str> = got.keys().map(String::as_str).collect();
        // Cut into one unit per directory, a1's files would be two samples of one key.
        assert_eq!(names, ["a1.jpg", "a1.txt", "b2.jpg", "b2.txt"], "np {np}");
    }
}

#[test]
fn loader_indexes_gpus_and_splits_take_a_tree() {
    let dir = Dir::new("files-downstream");
    let (want, _) = tree(&dir, "tree");
    let samples = want.keys().filter(|n| n.ends_with(".cls")).count();
    for np in [2, 3] {
        let out = format!("idx{np}");
        let loaders = ["--seed", "5", "--gpus", "2", "--workers", "2"];
        let cls = ["--label-from-dir", "cls"];
        let indexes = ["--energon", "--dali-index"];
        run_files(
            &dir,
            Some(np),
            "tree",
            &out,
            &[&loaders[..], &cls, &indexes].concat(),
        )
        .assert_success();
        let seen = check_with_python(&dir, &dir.join(&out), true, true);
        assert_eq!(seen, samples, "np {np}");
        let out = format!("split{np}");
        let split = [
            "--seed",
            "5",
            "--shards",
            "2",
            "--split",
            "train=0.8,val=rest",
        ];
        run_files(&dir, Some(np), "tree", &out, &[&split[..], &cls].concat()).assert_success();
        let keys = key_sets(&splits_of(&dir.join(&out)));
        let (train, val) = (&keys["train"], &keys["val"]);
        assert!(train.is_disjoint(val), "np {np}");
        assert_eq!(train.len() + val.len(), samples, "np {np}");
    }
}
