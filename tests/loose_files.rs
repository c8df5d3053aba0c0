//! `--input-files`: trees of loose files packed into shards, byte-identical at every rank count,
//! pinned by a golden digest, read back file by file; and the bad inputs of a tree.

use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::time::{Duration, Instant};

use crate::util::files::{flat_tree, members, tree, MTIME};
use crate::util::loaders::check_with_python;
use crate::util::splits::{key_sets, splits_of};
use crate::util::verifier::output_digest;
use crate::util::{Dir, RunOutput, TestCommand};

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
        let path = dir.join("tree").join(victim);
        changed_while_paused(&dir, np, victim, says, move || change(&path));
    }
}

/// [`pack`] at `np` into `out-NP`, paused before any rank reads a file while `change` runs:
/// the run must fail naming `tree/VICTIM` and saying `says`, and publish nothing.
fn changed_while_paused(
    dir: &Dir,
    np: usize,
    victim: &str,
    says: &str,
    change: impl FnOnce() + Send + 'static,
) {
    let out = format!("out-{np}");
    let markers: Vec<_> = (0..np)
        .map(|r| dir.join(format!(".{out}.reshard-tmp/.paused-exchange-{r}")))
        .collect();
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
        change();
        for m in &markers {
            let _ = fs::remove_file(m);
        }
    });
    let res = pack(dir, np, &out, &[])
        .env("RESHARD_TEST_PAUSE_EXCHANGE", "30")
        .assert_code(1);
    watcher.join().unwrap();
    res.stderr_has(&format!("tree/{victim}"));
    res.stderr_has(says);
    res.check(!dir.join(&out).exists(), "nothing may be published");
}

/// `argv` (`cp`, `touch`, `mv`) run in `root`, which must succeed.
fn tool(root: &std::path::Path, argv: &[&str]) {
    let status = std::process::Command::new(argv[0])
        .args(&argv[1..])
        .current_dir(root)
        .status()
        .unwrap();
    assert!(status.success(), "{argv:?}: {status}");
}

/// A file rewritten at its size with its modification time put back, by `touch -r` or
/// `cp -p`, or replaced by `mv` of a file of that size and time, keeps every field of its tar
/// header: only its status-change time (which no user can set) and its inode tell. The run
/// fails naming it at every rank count.
#[test]
fn files_rewritten_with_their_times_put_back_during_the_run_are_refused_by_name() {
    let dir = Dir::new("files-change-ctime");
    tree(&dir, "tree");
    type Change = fn(&std::path::Path, &str);
    let changes: [(&str, Change, &str); 3] = [
        (
            "c1/s004.seg.png",
            // In place, then `touch -r` from a copy taken before.
            |root, victim| {
                tool(root, &["cp", "-p", victim, "before"]);
                fs::write(root.join(victim), vec![b'x'; 700]).unwrap();
                tool(root, &["touch", "-r", "before", victim]);
            },
            "its status-change time (ctime) moved since it was listed",
        ),
        (
            "c0/s001.jpg",
            // `cp -p` over it (in place, its inode kept) of other bytes with its time.
            |root, victim| {
                let size = fs::metadata(root.join(victim)).unwrap().len() as usize;
                fs::write(root.join("other"), vec![b'y'; size]).unwrap();
                tool(root, &["touch", "-r", victim, "other"]);
                tool(root, &["cp", "-p", "other", victim]);
            },
            "its status-change time (ctime) moved since it was listed",
        ),
        (
            "c2/s006.jpg",
            // Replaced by rename of a file of its size and time.
            |root, victim| {
                let size = fs::metadata(root.join(victim)).unwrap().len() as usize;
                fs::write(root.join("other"), vec![b'z'; size]).unwrap();
                tool(root, &["touch", "-r", victim, "other"]);
                tool(root, &["mv", "other", victim]);
            },
            "it was replaced since it was listed: another file",
        ),
    ];
    for (np, (victim, change, says)) in [2, 3, 4].into_iter().zip(changes) {
        let (root, path) = (dir.path().to_path_buf(), format!("tree/{victim}"));
        changed_while_paused(&dir, np, victim, says, move || change(&root, &path));
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

/// A key regex that gives WebDataset's keys: the tree's directory units walked, regrouped by
/// key into ranges of the root and labelled there, give the members of the default rule (in
/// another canonical order: the root's by key, not its units' one after another), the same
/// bytes at np 1 and 3.
#[test]
fn a_key_regex_of_webdatasets_keys_packs_a_labelled_tree_to_the_same_members() {
    let dir = Dir::new("files-regex-same");
    tree(&dir, "tree");
    let cls = ["--label-from-dir", "cls"];
    pack(&dir, 2, "plain", &cls).assert_success();
    let mut digests = Vec::new();
    for np in [1, 3] {
        let out = format!("regex{np}");
        let regex = ["--key-regex", "^((?:[^/]*/)*[^/.]+)\\."];
        pack(&dir, np, &out, &[&cls[..], &regex].concat()).assert_success();
        assert_eq!(
            members(&dir.join(&out)),
            members(&dir.join("plain")),
            "np {np}"
        );
        digests.push(output_digest(&dir.join(&out)));
    }
    assert_eq!(digests[0], digests[1]);
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

/// A tree of 2,000 files of about 4 KiB (one sample each) in 20 directories.
fn many_files(dir: &Dir, rel: &str) {
    for i in 0..2000u64 {
        let bytes = crate::util::noise(i, 3000 + (i as usize * 37) % 2000);
        dir.create_bytes(format!("{rel}/d{:02}/f{i:05}.bin", i % 20), &bytes);
    }
}

/// `--input-files` under `mpirun -np NP`, slowed, in rounds of at most 1 MiB.
fn slow_pack(dir: &Dir, np: usize, out: &str, extra: &[&str]) -> crate::util::TestCommand {
    let mut cmd = dir.mpi(np);
    cmd.args(["run", "--input-files", "many", "--output", out])
        .args(["--shards", "5", "--seed", "3", "--mem-limit", "1MiB"])
        .args(extra)
        .env("RESHARD_TEST_SLOW_ROUNDS", "150");
    cmd
}

/// SIGTERM to mpirun mid-exchange: the run stops in order (mpirun's own status aside: Hydra
/// once answered 0 at np 2 while every rank exited 143 and nothing was published).
fn stopped(dir: &Dir, np: usize, out: &str) {
    use crate::signals::{processes, send, start, stopped_in_order_said, wait_for_exchange};
    let job = start(slow_pack(dir, np, out, &[]));
    wait_for_exchange(dir, out, &job);
    let launchers = processes(dir.path(), "mpiexec");
    assert_eq!(launchers.len(), 1, "one mpirun: {launchers:?}");
    send("TERM", launchers[0]);
    stopped_in_order_said(&job.join().unwrap(), dir.path(), out, "SIGTERM");
}

#[test]
fn an_interrupted_tree_resumes_to_identical_bytes_and_a_changed_one_is_refused() {
    let dir = Dir::new("files-resume");
    many_files(&dir, "many");
    dir.command()
        .args(["run", "--input-files", "many", "--output", "ref"])
        .args(["--shards", "5", "--seed", "3", "--mem-limit", "1MiB"])
        .assert_success();
    stopped(&dir, 3, "out");
    let res = slow_pack(&dir, 2, "out", &["--resume"]).assert_success();
    res.check(
        res.stdout.contains("resumed: reused") && !res.stdout.contains("reused 0 samples"),
        "the rerun reused what the stopped run had made durable",
    );
    crate::util::verifier::assert_same_output(&dir.join("ref"), &dir.join("out"), &["ranks"]);
    // Rewritten in place at the same size, its modification time put back (`touch -r`): only
    // its status-change time tells, and the resume names the directory.
    stopped(&dir, 3, "again");
    let victim = "many/d07/f00007.bin";
    tool(dir.path(), &["cp", "-p", victim, "before"]);
    let size = fs::metadata(dir.join(victim)).unwrap().len() as usize;
    fs::write(dir.join(victim), vec![b'x'; size]).unwrap();
    tool(dir.path(), &["touch", "-r", "before", victim]);
    let res = slow_pack(&dir, 2, "again", &["--resume"]).assert_code(2);
    res.stderr_has("the loose files under many/d07 changed since that run");
}

/// In rounds of about 140 KiB (`--mem-limit 1MiB`) a sample is split between two rounds wherever
/// a segment fills, and each part is read from its files at its own offset, straight into the
/// send buffer (alone too: a rank's own loose files go through its segment, not a copy):
/// every file arrives whole (verify reads the tree itself) and the shards are those of large
/// rounds, at np 1 (no launcher), 2 and 3.
#[test]
fn loose_files_split_between_small_rounds_arrive_whole_at_every_rank_count() {
    let dir = Dir::new("files-rounds");
    many_files(&dir, "many");
    let mut digests = Vec::new();
    for (np, limit) in [
        (None, "1GiB"),
        (None, "1MiB"),
        (Some(2), "1MiB"),
        (Some(3), "1MiB"),
    ] {
        let out = format!("out-{}-{limit}", np.unwrap_or(1));
        let extra = ["--shards", "5", "--seed", "3", "--mem-limit", limit];
        run_files(&dir, np, "many", &out, &extra).assert_success();
        digests.push(output_digest(&dir.join(&out)));
        dir.mpi(np.unwrap_or(1))
            .args(["verify", "--input-files", "many", "--output", &out])
            .assert_success();
    }
    assert!(digests.iter().all(|d| *d == digests[0]), "{digests:?}");
}

/// `reshard run --input-files ROOT --output OUT --shards 4 --seed 7 --report OUT.json` and
/// `extra` under `mpirun -np N`, which must succeed.
fn pack_spread(dir: &Dir, np: usize, root: &str, out: &str, extra: &[&str]) -> RunOutput {
    let report = format!("{out}.json");
    let args = ["--shards", "4", "--seed", "7", "--report", &report];
    run_files(dir, Some(np), root, out, &[&args[..], extra].concat()).assert_success()
}

/// Every rank's figures, from the report of [`pack_spread`]'s run into `out`.
fn per_rank(dir: &Dir, out: &str) -> Vec<serde_json::Value> {
    let report: serde_json::Value =
        serde_json::from_slice(&fs::read(dir.join(format!("{out}.json"))).unwrap()).unwrap();
    report["per_rank"].as_array().unwrap().clone()
}

/// The input bytes each rank read, from the report of [`pack_spread`]'s run into `out`.
fn read_by_rank(dir: &Dir, out: &str) -> Vec<u64> {
    per_rank(dir, out)
        .iter()
        .map(|r| r["bytes_read"].as_u64().unwrap())
        .collect()
}

/// At least two ranks (at np 2 and more) read a fifth of the most any rank read. Units are
/// whole (4,096 keys, about 4 MiB here): at np 3 the byte-balanced contiguous assignment may
/// give one rank none.
fn assert_shared(read: &[u64], np: usize) {
    let most = *read.iter().max().unwrap();
    let sharing = read.iter().filter(|&&r| r * 5 >= most).count();
    assert!(sharing >= np.min(2), "np {np}: bytes read by rank {read:?}");
}

#[test]
fn a_large_flat_directory_is_read_by_every_rank_to_the_same_bytes() {
    let dir = Dir::new("files-flat");
    flat_tree(&dir, "flat");
    // A key regex that gives WebDataset's keys here: the same samples in the same canonical
    // order, in other units (the directories regrouped by key into ranges of the root's keys).
    pack_spread(&dir, 1, "flat", "whole", &["--key-regex", "^([^.]*)\\."]);
    let mut digests = Vec::new();
    for np in [1, 2, 3] {
        let out = format!("out{np}");
        let res = pack_spread(&dir, np, "flat", &out, &[]);
        // big/ in three units of at most 4,096 keys, small/ in one.
        res.stderr_has("walked 9006 files (2.");
        res.stderr_has("in 4 units of 1 root");
        digests.push(output_digest(&dir.join(&out)));
        // The shards are the same, byte for byte; the manifests list other inputs, but count
        // the same input bytes (a tar per directory unit, whatever its key ranges).
        crate::util::verifier::assert_same_output(
            &dir.join("whole"),
            &dir.join(&out),
            &["ranks", "inputs"],
        );
        // big/ is read by two ranks at least (one read it all, the other small/'s 5 files, when
        // it was one unit).
        assert_shared(&read_by_rank(&dir, &out), np);
    }
    assert!(digests.iter().all(|d| *d == digests[0]), "{digests:?}");
    // verify walks the same units: every file once, its bytes equal.
    dir.mpi(2)
        .args(["verify", "--input-files", "flat", "--output", "out2"])
        .assert_success();
}

/// Below the three levels rank 0 lists, a directory is part of a deep unit, walked by one
/// rank: a flat one there is cut into units of 4,096 keys once walked, and read by several.
#[test]
fn a_flat_directory_below_the_top_levels_is_read_by_several_ranks_to_the_same_bytes() {
    let dir = Dir::new("files-flat-deep");
    flat_tree(&dir, "deep/a/b/c");
    let mut digests = Vec::new();
    for np in 1..=4 {
        let out = format!("out{np}");
        let res = pack_spread(&dir, np, "deep", &out, &[]);
        // a/b/c (the deep unit, with big/ and small/: 9,005 keys) in three of 4,096 keys.
        res.stderr_has("walked 9006 files (2.");
        res.stderr_has("in 3 units of 1 root");
        digests.push(output_digest(&dir.join(&out)));
        assert_shared(&read_by_rank(&dir, &out), np);
    }
    assert!(digests.iter().all(|d| *d == digests[0]), "{digests:?}");
    // Cut otherwise (regrouped by a key regex that gives WebDataset's keys), the same shards.
    pack_spread(&dir, 2, "deep", "regex", &["--key-regex", "^([^.]*)\\."]);
    crate::util::verifier::assert_same_output(
        &dir.join("regex"),
        &dir.join("out1"),
        &["ranks", "inputs"],
    );
    dir.mpi(3)
        .args(["verify", "--input-files", "deep", "--output", "out3"])
        .assert_success();
}

/// With `--key-regex`, a sample's files may lie in any directories: four directories of the
/// same 3,000 keys (one member each) are walked by every rank, regrouped by key into ranges of
/// about 4,096 files, and read by several ranks; every key is one sample of four members.
#[test]
fn key_regex_samples_across_directories_are_read_by_several_ranks_to_the_same_bytes() {
    let dir = Dir::new("files-regex-spread");
    let exts = ["jpg", "txt", "json", "seg"];
    for (d, ext) in exts.iter().enumerate() {
        for k in 0..3000u64 {
            let bytes = crate::util::noise(k * 7 + d as u64, 60 + (k as usize * 17) % 400);
            dir.create_bytes(format!("t/{ext}s/k{k:04}.{ext}"), &bytes);
        }
    }
    let regex = ["--key-regex", "^[^/]*/([^/.]*)", "--on-duplicate", "abort"];
    let mut digests = Vec::new();
    for np in 1..=4 {
        let out = format!("out{np}");
        let res = pack_spread(&dir, np, "t", &out, &regex);
        res.stderr_has("walked 12000 files");
        // One range of all 3,000 keys (every directory proposes k0000) gathers 12,000 files:
        // cut at every 1,024th key of each directory.
        res.stderr_has("in 3 units of 1 root");
        digests.push(output_digest(&dir.join(&out)));
        assert_shared(&read_by_rank(&dir, &out), np);
        let index: serde_json::Value =
            serde_json::from_slice(&fs::read(dir.join(&out).join("index.json")).unwrap()).unwrap();
        assert_eq!(index["reshard"]["samples"], 3000, "np {np}");
    }
    assert!(digests.iter().all(|d| *d == digests[0]), "{digests:?}");
    let got = members(&dir.join("out1"));
    assert_eq!(got.len(), 12_000);
    for k in (0..3000).step_by(7) {
        for ext in exts {
            assert!(got.contains_key(&format!("k{k:04}.{ext}")), "k{k:04}.{ext}");
        }
    }
    // verify walks and regroups the root as run does: its input is read by several ranks too
    // (it was one unit, read by one rank).
    for np in [2, 3] {
        let mut cmd = dir.mpi(np);
        cmd.args(["verify", "--input-files", "t", "--output", "out1", "--json"])
            .args(&regex[..2]);
        let res = cmd.assert_success();
        let report = crate::util::runs::report_json(&res);
        assert_eq!(report["input_samples"], 3000, "np {np}");
        let read: Vec<u64> = report["input_bytes_per_rank"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b.as_u64().unwrap())
            .collect();
        assert_eq!(read.len(), np);
        assert_shared(&read, np);
    }
}

/// Each rank's (directories listed, files examined) in the walk, from the report of
/// [`pack_spread`]'s run into `out`.
fn walk_calls_by_rank(dir: &Dir, out: &str) -> Vec<(u64, u64)> {
    per_rank(dir, out)
        .iter()
        .map(|r| {
            let n = |f: &str| r[f].as_u64().unwrap_or_else(|| panic!("{f} in {r}"));
            (n("dirs_listed"), n("files_examined"))
        })
        .collect()
}

/// A large flat directory's metadata is every rank's: listed once (by one rank, also where
/// rank 0 cut it into units of 4,096 keys), its files examined once each, dealt over the ranks
/// in even shares, whether it lies in the levels rank 0 cuts (`m/x/big`) or inside a deep
/// unit (`m/d/a/b/big`); the units and shards are the same at every rank count. Cut into other
/// units (regrouped by a key regex that gives WebDataset's keys: no range for `p/`, which
/// packs nothing), the same output, and the same `input_bytes` (a tar per directory unit of
/// rank 0's cut, whatever its key ranges).
#[test]
fn a_large_flat_directory_is_listed_once_and_its_files_examined_by_every_rank() {
    let dir = Dir::new("files-flat-meta");
    flat_tree(&dir, "m/x");
    flat_tree(&dir, "m/d/a/b");
    // A directory with no file to pack: a unit of no member (two end blocks) that a key
    // regex's ranges do not have.
    fs::create_dir(dir.join("m/p")).unwrap();
    let fifo = std::process::Command::new("mkfifo")
        .arg(dir.join("m/p/pipe.jpg"))
        .status();
    assert!(fifo.unwrap().success(), "mkfifo");
    let files = 2 * 9006;
    let mut digests = Vec::new();
    for np in 1..=4 {
        let out = format!("out{np}");
        let res = pack_spread(&dir, np, "m", &out, &[]);
        res.stderr_has(&format!("walked {files} files"));
        // x/big in three units and x/small in one, as rank 0 cut them; d/a/b (9,005 keys) in
        // three once walked.
        res.stderr_has("in 8 units of 1 root");
        digests.push(output_digest(&dir.join(&out)));
        let calls = walk_calls_by_rank(&dir, &out);
        // x/big, x/small, p, d/a/b, d/a/b/big, d/a/b/small: each listed once.
        let listed: u64 = calls.iter().map(|c| c.0).sum();
        assert_eq!(listed, 6, "np {np}: directories listed by rank {calls:?}");
        let examined: Vec<u64> = calls.iter().map(|c| c.1).collect();
        assert_eq!(examined.iter().sum::<u64>(), files, "np {np}: {examined:?}");
        // The two big directories' 18,002 files dealt evenly; the small ones' 5 files each
        // examined by the rank that listed them.
        let even = files / np as u64;
        for e in &examined {
            assert!(
                e.abs_diff(even) <= 16,
                "np {np}: files examined by rank {examined:?}"
            );
        }
    }
    assert!(digests.iter().all(|d| *d == digests[0]), "{digests:?}");
    let res = pack_spread(&dir, 2, "m", "regex", &["--key-regex", "^([^.]*)\\."]);
    res.stderr_has("in 7 units of 1 root");
    let out1 = dir.join("out1");
    crate::util::verifier::assert_same_output(&dir.join("regex"), &out1, &["ranks", "inputs"]);
}

/// A large directory of rank 0's cut is listed as a stream and its names spread as they come:
/// each rank holds the names of its own units (`--report`'s `names_held`), about N/P (units
/// are whole: 4,096 keys), never the directory's 9,001; every name is held once.
#[test]
fn a_large_flat_directory_s_names_are_held_by_every_rank_not_by_its_lister() {
    let dir = Dir::new("files-flat-held");
    flat_tree(&dir, "flat");
    let files = 9006;
    let mut digests = Vec::new();
    for np in 1..=4 {
        let out = format!("out{np}");
        let res = pack_spread(&dir, np, "flat", &out, &[]);
        res.stderr_has(&format!("walked {files} files"));
        digests.push(output_digest(&dir.join(&out)));
        let held: Vec<u64> = per_rank(&dir, &out)
            .iter()
            .map(|r| r["names_held"].as_u64().unwrap_or_else(|| panic!("{r}")))
            .collect();
        assert_eq!(held.iter().sum::<u64>(), files, "np {np}: {held:?}");
        // big/'s three units over the ranks (small/'s 5 files with one of them): a rank's
        // share of the names and one unit at most beyond it.
        let most = files / np as u64 + 4097;
        assert!(
            held.iter().all(|&h| h <= most),
            "np {np}: names held by rank {held:?}, more than {most}"
        );
    }
    assert!(digests.iter().all(|d| *d == digests[0]), "{digests:?}");
}

/// A flat directory of 5,000 files, cut by rank 0 into two key ranges, with a dangling link in
/// each: both counted, once, at every rank count (the second unit's found when its files are
/// examined, by whichever rank the deal gives them to).
#[test]
fn skips_found_when_examined_count_once_in_every_key_range() {
    let dir = Dir::new("files-flat-skips");
    for i in 0..5000u64 {
        dir.create_bytes(format!("flat/f{i:05}.bin"), &i.to_le_bytes());
    }
    for name in ["f00002.lnk", "f04600.lnk"] {
        std::os::unix::fs::symlink("nothing", dir.join("flat").join(name)).unwrap();
    }
    for np in [1, 2] {
        let res = pack_spread(&dir, np, "flat", &format!("out{np}"), &[]);
        res.stderr_has("in 2 units of 1 root (1 directory unit of rank 0's cut)");
        res.stderr_has("walked 5000 files");
        res.stderr_has("skipped: 2 link to a directory or dangling");
    }
}
