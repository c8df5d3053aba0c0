//! `--input-files s3://bucket/prefix/` against a real S3 server (SeaweedFS, see `util::s3`):
//! a prefix of loose objects packed to the same bytes at every rank count, and to the bytes of
//! a local copy whose files carry what the listing says (mode 0644, mtime the last-modified
//! second); `verify` against the prefix; objects that vanish or are replaced mid-run refused.

use std::time::{Duration, Instant};

use crate::util::files::{flat_tree, tree};
use crate::util::s3::server;
use crate::util::stores::Store;
use crate::util::verifier::{assert_same_output, output_digest};
use crate::util::{Dir, RunOutput, TestCommand};

/// `reshard run --input-files ROOT` under `mpirun -np NP` with the server's environment.
fn pack(dir: &Dir, np: usize, root: &str, out: &str) -> TestCommand {
    let s3 = server("pack").unwrap();
    let mut cmd = dir.mpi(np);
    cmd.args(["run", "--input-files", root, "--output", out])
        .args(["--shards", "3", "--seed", "5", "--label-from-dir", "cls"]);
    s3.with_env(&mut cmd);
    cmd
}

#[test]
fn a_prefix_of_objects_packs_to_the_same_bytes_at_np_1_to_3_as_its_local_copy() {
    let test = "a_prefix_of_objects_packs_to_the_same_bytes_at_np_1_to_3_as_its_local_copy";
    let dir = Dir::new("files-s3");
    let Some(s3) = server(test) else { return };
    let (_, files) = tree(&dir, "tree");
    let bucket = s3.bucket(&dir, test);
    // What boto3 uploads of the tree: its files (a link to a file as the file), hidden ones too.
    s3.put(&dir, &dir.join("tree"), &bucket, "data/set");
    s3.get_as_listed(&dir, &bucket, "data/set", &dir.join("copy"));
    let root = format!("s3://{bucket}/data/set/");
    let mut digests = Vec::new();
    for np in [1, 2, 3] {
        let out = format!("out-np{np}");
        let res = pack(&dir, np, &root, &out).assert_success();
        // The tree's files, its link to a file among them; FIFOs, sockets and dangling links
        // were never uploaded.
        res.stderr_has(&format!("walked {files} files"));
        // Hidden: four files of c0 and the prefix c2/.cache/ once; .git/ beside the classes is
        // left out where rank 0 cuts the root, uncounted.
        res.stderr_has("skipped: 5 hidden or editor's leftover, 1 without a key");
        // One GET per object but the empty one (nothing to read): the index phase walks the
        // synthesized headers without a GET.
        let gets = format!("s3 requests: {} GET", files - 1);
        res.check(res.stdout.contains(&gets), &gets);
        digests.push(output_digest(&dir.join(&out)));
    }
    assert!(
        digests.iter().all(|d| *d == digests[0]),
        "outputs differ by rank count: {digests:?}"
    );
    // The local copy, packed: the same shards, byte for byte (the manifests name other inputs).
    dir.mpi(2)
        .args(["run", "--input-files", "copy", "--output", "local"])
        .args(["--shards", "3", "--seed", "5", "--label-from-dir", "cls"])
        .assert_success();
    assert_same_output(
        &dir.join("local"),
        &dir.join("out-np1"),
        &["ranks", "inputs"],
    );
    // verify reads the prefix itself: every object once, its bytes equal.
    for np in [1, 3] {
        let mut cmd = dir.mpi(np);
        cmd.args(["verify", "--input-files", &root, "--label-from-dir", "cls"])
            .args(["--output", "out-np2"]);
        s3.with_env(&mut cmd).assert_success();
    }
    s3.put_bytes(&dir, &bucket, "data/set/c0/new_1.jpg", b"new");
    let mut cmd = dir.mpi(2);
    cmd.args(["verify", "--input-files", &root, "--label-from-dir", "cls"])
        .args(["--output", "out-np2"]);
    let res = s3.with_env(&mut cmd).output();
    res.check(
        res.code() == Some(1),
        "verify must fail on a sample the output lacks",
    );
    res.check(
        format!("{}{}", res.stdout, res.stderr).contains("missing"),
        "verify must say a sample is missing",
    );
}

#[test]
fn objects_that_vanish_or_are_replaced_during_the_run_are_refused_by_name() {
    let test = "objects_that_vanish_or_are_replaced_during_the_run_are_refused_by_name";
    let dir = Dir::new("files-s3-change");
    let Some(s3) = server(test) else { return };
    tree(&dir, "tree");
    let bucket = s3.bucket(&dir, test);
    let root = format!("s3://{bucket}/t");
    // The same size, other bytes: only the ETag tells.
    let replaced: &[u8] = &[b'x'; 700];
    for (np, victim, replace, says) in [
        (1, "c0/s003.json", false, "it vanished since it was listed"),
        (2, "c1/s004.seg.png", true, "its ETag differs"),
        (3, "c2/s006.jpg", false, "it vanished since it was listed"),
    ] {
        s3.put(&dir, &dir.join("tree"), &bucket, "t");
        let out = format!("out-{np}");
        let markers: Vec<_> = (0..np)
            .map(|r| dir.join(format!(".{out}.reshard-tmp/.paused-exchange-{r}")))
            .collect();
        let res = std::thread::scope(|scope| {
            scope.spawn(|| {
                let start = Instant::now();
                // Every rank paused: none has read an object yet.
                while !markers.iter().all(|m| m.exists()) {
                    assert!(
                        start.elapsed() < Duration::from_secs(90),
                        "the run never paused"
                    );
                    std::thread::sleep(Duration::from_millis(20));
                }
                let key = format!("t/{victim}");
                if replace {
                    s3.put_bytes(&dir, &bucket, &key, replaced);
                } else {
                    s3.remove(&dir, &bucket, &key);
                }
                for m in &markers {
                    let _ = std::fs::remove_file(m);
                }
            });
            pack(&dir, np, &root, &out)
                .env("RESHARD_TEST_PAUSE_EXCHANGE", "60")
                .assert_code(1)
        });
        res.stderr_has(&format!("{root}/{victim}"));
        res.stderr_has(says);
        res.check(!dir.join(&out).exists(), "nothing may be published");
    }
}

/// A flat prefix of 9,000 objects, listed once by one rank, is cut into units of 4,096 keys
/// once listed and read by several ranks, to the same bytes at np 1 and 2 (the objects are
/// many: uploading them takes most of the test).
#[test]
fn a_large_flat_prefix_is_read_by_several_ranks_to_the_same_bytes() {
    let test = "a_large_flat_prefix_is_read_by_several_ranks_to_the_same_bytes";
    let dir = Dir::new("files-s3-flat");
    let Some(s3) = server(test) else { return };
    flat_tree(&dir, "flat");
    let bucket = s3.bucket(&dir, test);
    s3.put(&dir, &dir.join("flat"), &bucket, "flat");
    let root = format!("s3://{bucket}/flat/");
    let run = |np: usize, root: &str, out: &str| -> RunOutput {
        let report = format!("{out}.json");
        let mut cmd = dir.mpi(np);
        cmd.args(["run", "--input-files", root, "--output", out])
            .args(["--shards", "4", "--seed", "7", "--report", &report]);
        s3.with_env(&mut cmd).assert_success()
    };
    let mut digests = Vec::new();
    for np in [1, 2] {
        let out = format!("out{np}");
        let res = run(np, &root, &out);
        // big/ in three units of at most 4,096 keys, small/ in one.
        res.stderr_has("walked 9006 files (2.");
        res.stderr_has("in 4 units of 1 root");
        digests.push(output_digest(&dir.join(&out)));
        let report: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join(format!("{out}.json"))).unwrap())
                .unwrap();
        let read: Vec<u64> = report["per_rank"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["bytes_read"].as_u64().unwrap())
            .collect();
        let most = *read.iter().max().unwrap();
        let sharing = read.iter().filter(|&&r| r * 5 >= most).count();
        assert!(sharing >= np.min(2), "np {np}: bytes read by rank {read:?}");
    }
    assert_eq!(digests[0], digests[1]);
}
