//! `az://` and `gs://` against local emulators (see `util::cloud`): the stores that share the
//! S3 backend's code through the storage seam give the bytes of the same run on a file system,
//! at one and two ranks, as input and (where the emulator takes writes) as output.

use crate::util::cloud::{azurite, gcs};
use crate::util::data::sized;
use crate::util::lock::wait_until;
use crate::util::runs::run;
use crate::util::stores::Store;
use crate::util::verifier::assert_same_output;
use crate::util::{Dir, RunOutput};

/// A dataset of uneven samples (about 19 MiB), generated locally, uploaded to
/// `STORE://BUCKET/in/` by the emulator's own client, and reshuffled on the file system into
/// `local` (5 shards) and `one` (1 shard, over a multipart upload's first part).
fn dataset(dir: &Dir, store: &impl Store, test: &str) -> String {
    dir.generate(
        "in",
        &[
            "--shards",
            "4",
            "--samples",
            "120",
            "--mean-size",
            "160KiB",
            "--sigma",
            "1",
            "--seed",
            "3",
        ],
    );
    let bucket = store.bucket(dir, test);
    store.put(dir, &dir.join("in"), &bucket, "in");
    run(dir, Some(2), &["in"], "local", 5, 9, &[]);
    run(dir, Some(1), &["in"], "one", 1, 9, &[]);
    bucket
}

/// `reshard run` under `mpirun -np NP` with the emulator's environment (an output in the store
/// staged in the test's own scratch directory).
fn run_on(
    dir: &Dir,
    store: &impl Store,
    np: usize,
    input: &str,
    out: &str,
    shards: &str,
) -> RunOutput {
    let mut cmd = dir.mpi(np);
    cmd.args(["run", "--input", input, "--output", out])
        .args(["--shards", shards, "--seed", "9"]);
    if out.contains("://") {
        cmd.arg("--scratch").arg(dir.join("scratch"));
    }
    store.with_env(&mut cmd).assert_success()
}

#[test]
fn az_input_and_output_are_the_posix_bytes_at_one_and_two_ranks() {
    let test = "az_input_and_output_are_the_posix_bytes_at_one_and_two_ranks";
    let Some(az) = azurite(test) else {
        return;
    };
    let dir = Dir::new("az");
    let container = dataset(&dir, az, test);
    for np in [1, 2] {
        // Store to store: read from Azurite, uploaded back to it.
        let prefix = format!("out/np{np}");
        let out = run_on(
            &dir,
            az,
            np,
            &format!("az://{container}/in"),
            &format!("az://{container}/{prefix}"),
            "5",
        );
        let to = format!("to az://{container}/{prefix} in");
        out.check(
            out.stdout.contains(&to),
            "the summary names the az:// output",
        );
        let got = dir.join(format!("got-{np}"));
        az.get(&dir, &container, &prefix, &got);
        assert_same_output(&dir.join("local"), &got, &["ranks", "inputs"]);
        // Store to file system.
        let local = format!("from-az-{np}");
        run_on(&dir, az, np, &format!("az://{container}/in/"), &local, "5");
        assert_same_output(&dir.join("local"), &dir.join(&local), &["ranks", "inputs"]);
    }
    // One shard of about 19 MiB: a multipart upload (Azure's blocks), from the file system.
    run_on(&dir, az, 2, "in", &format!("az://{container}/out/one"), "1");
    az.get(&dir, &container, "out/one", &dir.join("got-one"));
    let size = std::fs::metadata(dir.join("got-one/shard-000000.tar"))
        .unwrap()
        .len();
    assert!(
        size > 16 << 20,
        "{size} bytes: one part, not a multipart upload"
    );
    assert_same_output(&dir.join("one"), &dir.join("got-one"), &["ranks", "inputs"]);
    // Nothing else is left: no lock, no multipart journal, no staged copy.
    let keys = az.keys(&dir, &container, "out/");
    let stray = |k: &&String| k.contains("reshard-lock") || k.contains(".reshard-multipart");
    assert_eq!(keys.iter().filter(stray).count(), 0, "{keys:?}");
    let scratch = crate::util::listing(&dir.join("scratch"));
    assert!(
        !scratch.contains(".tar"),
        "the staged copy stays: {scratch}"
    );
}

/// An input, the variables set over the emulator's, and the message that refuses it.
type Refusal<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a str);

/// A missing container, a missing blob and a wrong account key stop the run before any work,
/// each naming the container (as Azure calls a bucket), and the last the Azure variables to
/// check; no message shows the key.
#[test]
fn az_errors_name_the_container_and_the_azure_variables() {
    let test = "az_errors_name_the_container_and_the_azure_variables";
    let Some(az) = azurite(test) else {
        return;
    };
    let dir = Dir::new("az-errors");
    let container = az.bucket(&dir, test);
    let endpoint = format!("{}/devstoreaccount1", az.var("AZURITE_BLOB_STORAGE_URL"));
    let wrong_key = [
        ("AZURE_STORAGE_USE_EMULATOR", "false"),
        ("AZURE_STORAGE_ACCOUNT_NAME", "devstoreaccount1"),
        ("AZURE_STORAGE_ACCOUNT_KEY", "d3JvbmcgYWNjb3VudCBrZXk="),
        ("AZURE_STORAGE_ENDPOINT", endpoint.as_str()),
    ];
    let cases: [Refusal; 3] = [
        ("az://nosuchcontainer/in", &[], "container nosuchcontainer does not exist"),
        (
            &format!("az://{container}/in/x.tar"),
            &[],
            &format!("no such object or prefix in container {container}"),
        ),
        (
            &format!("az://{container}/in/x.tar"),
            &wrong_key,
            &format!("access denied to container {container} key in/x.tar: check the credentials (AZURE_STORAGE_ACCOUNT_NAME, AZURE_STORAGE_ACCOUNT_KEY, AZURE_STORAGE_SAS_KEY)"),
        ),
    ];
    for (input, env, message) in cases {
        let mut cmd = dir.mpi(2);
        cmd.args(["run", "--input", input, "--output", "out"])
            .args(["--shards", "2", "--seed", "1"]);
        az.with_env(&mut cmd);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let out = cmd.output();
        out.check(out.code() != Some(0), "expected a failure");
        out.stderr_has(&format!("input {input}: {message}"));
        out.check(!out.stderr.contains("d3Jvbmc"), "the key is shown");
        out.no_debug_text();
        out.check(!dir.join("out").exists(), "an output was made");
    }
}

/// fake-gcs-server serves object_store's XML API reads (HEAD, ranged GET, ListObjectsV2) but
/// not its writes (a plain XML PUT is refused "invalid uploadType"; see docs/storage.md), so
/// `gs://` is tested as input here.
#[test]
fn gs_input_is_the_posix_bytes_at_one_and_two_ranks() {
    let test = "gs_input_is_the_posix_bytes_at_one_and_two_ranks";
    let Some(gs) = gcs(test) else {
        return;
    };
    let dir = Dir::new("gs");
    let bucket = dataset(&dir, gs, test);
    for np in [1, 2] {
        let local = format!("from-gs-{np}");
        let out = run_on(&dir, gs, np, &format!("gs://{bucket}/in"), &local, "5");
        out.check(out.stdout.contains("120 samples"), "expected 120 samples");
        assert_same_output(&dir.join("local"), &dir.join(&local), &["ranks", "inputs"]);
    }
    // A brace pattern over the bucket's keys (one HEAD each), to one shard.
    let pattern = format!("gs://{bucket}/in/train-{{000000..000003}}.tar");
    run_on(&dir, gs, 2, &pattern, "pattern", "1");
    assert_same_output(&dir.join("one"), &dir.join("pattern"), &["ranks", "inputs"]);
}

/// Loose objects under an `az://` prefix (`--input-files`): Azure's listing spells an ETag bare
/// and a GET's answer quoted, and a read checks the object against its listing: the two must
/// agree. The same files pack to the same shards at one and two ranks.
#[test]
fn az_loose_files_pack_alike_at_one_and_two_ranks() {
    let test = "az_loose_files_pack_alike_at_one_and_two_ranks";
    let Some(az) = azurite(test) else {
        return;
    };
    let dir = Dir::new("az-loose");
    for (i, class) in ["cat", "dog"].iter().enumerate() {
        let d = dir.join(format!("tree/{class}"));
        std::fs::create_dir_all(&d).unwrap();
        for n in 0..5 {
            let body = vec![b'a' + (i * 5 + n) as u8; 1000 + 300 * n];
            std::fs::write(d.join(format!("x{n}.jpg")), &body).unwrap();
            std::fs::write(d.join(format!("x{n}.txt")), format!("{class} {n}")).unwrap();
        }
    }
    let container = az.bucket(&dir, test);
    az.put(&dir, &dir.join("tree"), &container, "tree");
    for np in [1, 2] {
        let mut cmd = dir.mpi(np);
        cmd.args(["run", "--input-files", &format!("az://{container}/tree/")])
            .args([
                "--output",
                &format!("loose-{np}"),
                "--shards",
                "2",
                "--seed",
                "9",
            ]);
        let out = az.with_env(&mut cmd).assert_success();
        out.check(
            out.stdout.contains("20 files became 2 shards"),
            "every object packed",
        );
    }
    assert_same_output(&dir.join("loose-1"), &dir.join("loose-2"), &["ranks"]);
}

/// A run to `az://` (1 rank, 2 shards of multipart uploads) pauses in its last shard's upload;
/// meanwhile another writer puts a blob over its first shard, already created and recorded in
/// the container. The run finds it before its manifest, removes it and creates its shard again
/// (an Azure ETag is new at every write, whatever the bytes), then dies (SIGKILL,
/// `RESHARD_TEST_KILL=0:uploaded`) before its manifest. `--resume` on another scratch (nothing
/// of it staged there) keeps both shards, the one created again too (its record was written
/// again with its new ETag), and publishes the clean run's bytes. Before, the record of the
/// first create stayed, its ETag no longer the blob's: the resumed run uploaded it again.
#[test]
fn az_a_shard_created_again_before_its_manifest_is_kept_by_a_resume() {
    let test = "az_a_shard_created_again_before_its_manifest_is_kept_by_a_resume";
    let Some(az) = azurite(test) else {
        return;
    };
    let dir = Dir::new("az-recreated");
    sized(&dir, "in", "40MiB", "64KiB", 2);
    run(&dir, Some(1), &["in"], "ref", 2, 7, &[]);
    let container = az.bucket(&dir, test);
    let output = format!("az://{container}/out");
    let job = |scratch: &str, extra: &[&str]| {
        let mut cmd = dir.mpi(1);
        cmd.args(["run", "--input", "in", "--output", &output, "--seed", "7"])
            .args(["--shards", "2", "--scratch"])
            .arg(dir.join(scratch))
            .args(extra);
        az.with_env(&mut cmd);
        cmd
    };
    let records = || az.keys(&dir, &container, ".out.reshard-records.");
    let scratch = dir.join("scratch-killed");
    let paused = || {
        crate::util::staged_bucket(&scratch, &container)
            .map(|b| b.join(".paused-upload-0"))
            .filter(|m| m.exists())
    };
    std::fs::create_dir_all(dir.join("other")).unwrap();
    std::fs::write(dir.join("other/shard-000000.tar"), b"not the run's").unwrap();
    let killed = std::thread::scope(|scope| {
        let mut cmd = job("scratch-killed", &[]);
        cmd.env("RESHARD_TEST_PAUSE_UPLOAD", "300")
            .env("RESHARD_TEST_KILL", "0:uploaded");
        let run = scope.spawn(move || cmd.output());
        wait_until("the run pauses in its last shard's upload", || {
            paused().is_some()
        });
        let first = records();
        assert!(
            first.len() == 1 && first[0].ends_with("/shard-000000.tar"),
            "{first:?}"
        );
        az.put(&dir, &dir.join("other"), &container, "out");
        std::fs::remove_file(paused().unwrap()).unwrap();
        run.join().unwrap()
    });
    killed.check(killed.code() != Some(0), "the run was killed");
    killed.stderr_has("was there before this run created it");
    killed.stderr_has("now dies (SIGKILL) at uploaded");
    let resumed = job("scratch-resumed", &["--resume"]).assert_success();
    resumed.stderr_has("kept 2 shard(s) the earlier run uploaded completely");
    az.get(&dir, &container, "out", &dir.join("got"));
    assert_same_output(&dir.join("ref"), &dir.join("got"), &["ranks", "inputs"]);
    let left: Vec<String> = az
        .keys(&dir, &container, "")
        .into_iter()
        .filter(|k| !k.starts_with("out/"))
        .collect();
    assert_eq!(left, Vec::<String>::new(), "blobs beside the output");
}
