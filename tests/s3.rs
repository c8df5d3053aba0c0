//! `s3://` input against a real S3 server (SeaweedFS on loopback, see `util::s3`): the same
//! bytes as from the local copy at every rank count, brace patterns, bare prefixes and list
//! files, and clear refusals before any work for a missing bucket, a missing key and a wrong secret.

use crate::util::runs::run;
use crate::util::s3::{server, Server};
use crate::util::stores::Store;
use crate::util::verifier::assert_same_output;
use crate::util::{Dir, RunOutput};

/// A dataset of uneven samples, generated locally and uploaded to `s3://BUCKET/in/`.
fn dataset(dir: &Dir, test: &str) -> Option<String> {
    let s3 = server(test)?;
    dir.generate(
        "in",
        &[
            "--shards",
            "4",
            "--samples",
            "120",
            "--mean-size",
            "40KiB",
            "--sigma",
            "1",
            "--seed",
            "3",
        ],
    );
    let bucket = s3.bucket(dir, test);
    s3.put(dir, &dir.join("in"), &bucket, "in");
    Some(bucket)
}

/// `reshard run` under `mpirun -np NP` with the server's environment.
fn run_s3(dir: &Dir, np: usize, input: &str, out: &str) -> RunOutput {
    let s3 = server("run_s3").unwrap();
    let mut cmd = dir.mpi(np);
    cmd.args(["run", "--input", input, "--output", out])
        .args(["--shards", "5", "--seed", "9"]);
    s3.with_env(&mut cmd).assert_success()
}

#[test]
fn s3_input_gives_the_local_bytes_at_every_rank_count() {
    let dir = Dir::new("s3-in");
    let Some(bucket) = dataset(&dir, "s3_input_gives_the_local_bytes_at_every_rank_count") else {
        return;
    };
    run(&dir, Some(2), &["in"], "local", 5, 9, &[]);
    for np in [1, 2, 3] {
        let out = format!("from-s3-{np}");
        let got = run_s3(&dir, np, &format!("s3://{bucket}/in"), &out);
        got.check(got.stdout.contains("120 samples"), "expected 120 samples");
        assert_same_output(&dir.join("local"), &dir.join(&out), &["ranks", "inputs"]);
    }
    // A brace pattern over the bucket's keys, and the prefix with a trailing slash.
    let pattern = format!("s3://{bucket}/in/train-{{000000..000003}}.tar");
    run_s3(&dir, 2, &pattern, "pattern");
    assert_same_output(
        &dir.join("local"),
        &dir.join("pattern"),
        &["ranks", "inputs"],
    );
    run_s3(&dir, 1, &format!("s3://{bucket}/in/"), "slash");
    assert_same_output(&dir.join("local"), &dir.join("slash"), &["ranks", "inputs"]);
    // A local list file naming the objects.
    let names: Vec<String> = (0..4)
        .map(|i| format!("s3://{bucket}/in/train-{i:06}.tar\n"))
        .collect();
    dir.create_bytes("list.txt", names.concat().as_bytes());
    run_s3(&dir, 1, "@list.txt", "listed");
    assert_same_output(
        &dir.join("local"),
        &dir.join("listed"),
        &["ranks", "inputs"],
    );
}

/// Shards of several read windows (8 MiB) each, with samples across window ends and some larger
/// than a window: read with windows requested ahead (and large samples in parallel ranged
/// GETs), to the bytes of the local run; the summary counts the requests.
#[test]
fn s3_input_of_many_windows_gives_the_local_bytes() {
    let test = "s3_input_of_many_windows_gives_the_local_bytes";
    let dir = Dir::new("s3-windows");
    let Some(s3) = server(test) else {
        return;
    };
    // 30 and 40 MiB; the largest sample 11 MiB.
    let args = ["--shards", "2", "--samples", "48", "--mean-size", "1500KiB"];
    dir.generate(
        "in",
        &[&args[..], &["--sigma", "1.3", "--seed", "5"]].concat(),
    );
    let bucket = s3.bucket(&dir, test);
    s3.put(&dir, &dir.join("in"), &bucket, "in");
    run(&dir, Some(2), &["in"], "local", 5, 9, &[]);
    for np in [1, 2] {
        let out = format!("from-s3-{np}");
        let got = run_s3(&dir, np, &format!("s3://{bucket}/in"), &out);
        got.check(got.stdout.contains("s3 requests: "), "no request count");
        assert_same_output(&dir.join("local"), &dir.join(&out), &["ranks", "inputs"]);
    }
}

/// Runs reshard on `input` with `env` changed, expecting a failure that names every needle,
/// shows no secret, and left no output.
fn refused(dir: &Dir, input: &str, env: &[(&str, &str)], needles: &[&str]) {
    let s3 = server("refused").unwrap();
    let mut cmd = dir.mpi(2);
    cmd.args([
        "run", "--input", input, "--output", "out", "--shards", "2", "--seed", "1",
    ]);
    s3.with_env(&mut cmd);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output();
    out.check(out.code() != Some(0), "expected a failure");
    for n in needles {
        out.stderr_has(n);
    }
    out.check(
        !out.stderr.contains(s3.secret()) && !out.stdout.contains(s3.secret()),
        "the secret key is shown",
    );
    out.check(
        !out.stderr.contains("wrong-secret"),
        "the secret key is shown",
    );
    out.no_debug_text();
    out.check(!dir.join("out").exists(), "an output was made");
}

#[test]
fn s3_input_errors_name_bucket_and_key_and_hide_the_secret() {
    let dir = Dir::new("s3-refused");
    let test = "s3_input_errors_name_bucket_and_key_and_hide_the_secret";
    let Some(bucket) = dataset(&dir, test) else {
        return;
    };
    refused(
        &dir,
        "s3://no-such-bucket-here/in",
        &[],
        &["bucket no-such-bucket-here does not exist"],
    );
    let missing = format!("s3://{bucket}/in/train-000009.tar");
    refused(&dir, &missing, &[], &[&missing, "no such object"]);
    let denied = format!("s3://{bucket}/in/train-000000.tar");
    refused(
        &dir,
        &denied,
        &[("AWS_SECRET_ACCESS_KEY", "wrong-secret")],
        &[
            &denied,
            &format!("access denied to bucket {bucket}"),
            "AWS_SECRET_ACCESS_KEY",
        ],
    );
}

/// Credentials, region and endpoint from a named profile of the AWS shared files (no `AWS_*`
/// key, region or endpoint variable set): the local bytes; a profile that is not there is
/// refused before any work, naming it, without showing a secret.
#[test]
fn s3_credentials_come_from_a_named_profile() {
    let test = "s3_credentials_come_from_a_named_profile";
    let dir = Dir::new("s3-profile");
    let Some(bucket) = dataset(&dir, test) else {
        return;
    };
    let s3 = server(test).unwrap();
    run(&dir, Some(2), &["in"], "local", 5, 9, &[]);
    let env: std::collections::HashMap<_, _> = s3.env().into_iter().collect();
    let credentials = dir.create_bytes(
        "aws/credentials",
        format!(
            "[default]\naws_access_key_id = nobody\naws_secret_access_key = wrong-secret\n\n[lab]\naws_access_key_id = {}\naws_secret_access_key = {}\n",
            env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"]
        )
        .as_bytes(),
    );
    let config = dir.create_bytes(
        "aws/config",
        format!(
            "[profile lab]\nregion = us-east-1\nendpoint_url = {}\n",
            env["AWS_ENDPOINT_URL"]
        )
        .as_bytes(),
    );
    let with_profile = |profile: &str, out: &str| {
        let mut cmd = dir.mpi(2);
        cmd.args([
            "run",
            "--input",
            &format!("s3://{bucket}/in"),
            "--output",
            out,
        ])
        .args(["--shards", "5", "--seed", "9"]);
        s3.with_env(&mut cmd);
        for k in [
            "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY",
            "AWS_ENDPOINT_URL",
            "AWS_REGION",
        ] {
            cmd.env_remove(k);
        }
        cmd.env("AWS_PROFILE", profile)
            .env("AWS_SHARED_CREDENTIALS_FILE", &credentials)
            .env("AWS_CONFIG_FILE", &config);
        cmd.output()
    };
    let got = with_profile("lab", "from-profile");
    got.check(got.code() == Some(0), "expected success");
    assert_same_output(
        &dir.join("local"),
        &dir.join("from-profile"),
        &["ranks", "inputs"],
    );
    let missing = with_profile("nobody", "none");
    missing.check(missing.code() != Some(0), "expected a refusal");
    missing.stderr_has("AWS_PROFILE nobody: no such profile in");
    missing.stderr_has(&credentials.display().to_string());
    missing.check(
        !missing.stderr.contains(s3.secret()) && !missing.stderr.contains("wrong-secret"),
        "a secret is shown",
    );
    missing.no_debug_text();
    missing.check(!dir.join("none").exists(), "an output was made");
}

/// `reshard run` from `input` to `s3://BUCKET/PREFIX` under `mpirun -np NP`, staged in the
/// test's own scratch directory, with `extra` arguments.
fn run_to_s3(
    dir: &Dir,
    s3: &Server,
    np: usize,
    input: &str,
    output: &str,
    extra: &[&str],
) -> RunOutput {
    let mut cmd = dir.mpi(np);
    cmd.args(["run", "--input", input, "--output", output])
        .args(["--seed", "9", "--scratch"])
        .arg(dir.join("scratch"))
        .args(extra);
    if !extra.contains(&"--shards") {
        cmd.args(["--shards", "5"]);
    }
    s3.with_env(&mut cmd).output()
}

#[test]
fn s3_output_is_the_local_bytes_and_webdataset_reads_it() {
    let test = "s3_output_is_the_local_bytes_and_webdataset_reads_it";
    let dir = Dir::new("s3-out");
    let Some(bucket) = dataset(&dir, test) else {
        return;
    };
    let s3 = server(test).unwrap();
    run(&dir, Some(2), &["in"], "local", 5, 9, &[]);
    for np in [1, 3] {
        let prefix = format!("out/np{np}");
        let out = run_to_s3(
            &dir,
            s3,
            np,
            &format!("s3://{bucket}/in"),
            &format!("s3://{bucket}/{prefix}"),
            &[],
        );
        out.check(out.code() == Some(0), "expected success");
        let to = format!("to s3://{bucket}/{prefix} in");
        out.check(
            out.stdout.contains(&to),
            "the summary names the s3:// output",
        );
        let got = dir.join(format!("got-{np}"));
        s3.get(&dir, &bucket, &prefix, &got);
        assert_same_output(&dir.join("local"), &got, &["ranks", "inputs"]);
    }
    // Local input to S3 too; nothing else is left: no lock, no unfinished upload, no staged
    // copy on the scratch directory.
    let out = run_to_s3(
        &dir,
        s3,
        2,
        "in",
        &format!("s3://{bucket}/out/from-local"),
        &[],
    );
    out.check(out.code() == Some(0), "expected success");
    s3.get(&dir, &bucket, "out/from-local", &dir.join("got-local"));
    assert_same_output(
        &dir.join("local"),
        &dir.join("got-local"),
        &["ranks", "inputs"],
    );
    let keys = s3.keys(&dir, &bucket, "out/");
    assert!(keys.iter().all(|k| !k.contains("reshard-lock")), "{keys:?}");
    assert_eq!(s3.uploads(&dir, &bucket), Vec::<String>::new());
    let scratch = crate::util::listing(&dir.join("scratch"));
    assert!(
        !scratch.contains(".tar"),
        "the staged copy stays: {scratch}"
    );
    // webdataset, following the manifest, reads every sample over S3.
    let read = s3.webdataset_keys(&dir, &bucket, "out/np3");
    assert_eq!(read.len(), 120, "{read:?}");
}

/// An output on S3 read back as the next run's input: the saved indexes written beside its
/// shards (stamped with the objects' own size, modification time and ETag when uploaded) stand
/// in for the tar headers, so no shard is streamed twice, and the bytes are those of the same
/// two runs on a file system.
#[test]
fn s3_output_is_the_next_input_and_its_saved_indexes_are_reused() {
    let test = "s3_output_is_the_next_input_and_its_saved_indexes_are_reused";
    let dir = Dir::new("s3-reuse");
    let Some(bucket) = dataset(&dir, test) else {
        return;
    };
    let s3 = server(test).unwrap();
    run(&dir, Some(2), &["in"], "local", 5, 9, &[]);
    let local = run(&dir, Some(2), &["local"], "local-2", 5, 9, &[]);
    local.stderr_has("reused the saved index of 5 of 5");
    let epoch1 = format!("s3://{bucket}/epoch-1");
    let out = run_to_s3(&dir, s3, 2, &format!("s3://{bucket}/in"), &epoch1, &[]);
    out.check(out.code() == Some(0), "expected success");
    for np in [1, 2] {
        let to = format!("from-s3-{np}");
        let again = run_s3(&dir, np, &epoch1, &to);
        again.stderr_has("reused the saved index of 5 of 5");
        again.check(
            !again.stderr.contains("re-indexing"),
            "a saved index was stale",
        );
        assert_same_output(&dir.join("local-2"), &dir.join(&to), &["ranks", "inputs"]);
    }
    // With the saved indexes the index phase reads no shard: the report's GET bytes tell.
    let get_bytes = |input: &str, report: &str| {
        let mut cmd = dir.mpi(2);
        cmd.args(["run", "--input", input, "--output", report])
            .args(["--shards", "5", "--seed", "9", "--report"])
            .arg(dir.join(format!("{report}.json")));
        s3.with_env(&mut cmd).assert_success();
        let text = std::fs::read_to_string(dir.join(format!("{report}.json"))).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let got = v["s3"]["get_bytes"]
            .as_u64()
            .expect("s3.get_bytes in the report");
        (got, v["input_bytes"].as_u64().unwrap())
    };
    let (reused, input) = get_bytes(&epoch1, "report-reused");
    assert!(
        reused >= input && reused < input * 5 / 4,
        "GET bytes {reused} with saved indexes, of {input}"
    );
    for i in 0..5 {
        let layout = format!("epoch-1/.reshard/shard-{i:06}.tar.reshard-layout");
        s3.remove(&dir, &bucket, &layout);
    }
    // Without them the index phase reads every shard, spooled for the exchange: each byte is
    // still fetched once (and the manifest, a few KiB).
    let (indexed, _) = get_bytes(&epoch1, "report-indexed");
    assert!(
        indexed >= input && indexed < input + input / 100,
        "GET bytes {reused} with saved indexes, {indexed} without, of {input}"
    );
}

#[test]
fn s3_output_is_one_run_at_a_time_and_replaces_only_reshard_outputs() {
    let test = "s3_output_is_one_run_at_a_time_and_replaces_only_reshard_outputs";
    let dir = Dir::new("s3-owned");
    let Some(bucket) = dataset(&dir, test) else {
        return;
    };
    let s3 = server(test).unwrap();
    let input = format!("s3://{bucket}/in");
    // A lock a live run holds (this test's own process, on this host): refused before any
    // work, naming the lock and its holder, however long it has been silent.
    let lock = |boot: &str| {
        let pidns = std::fs::read_link("/proc/self/ns/pid").unwrap();
        format!(
            "reshard staging lock\ntoken {}\nhost elsewhere\nboot {boot}\npidns {}\npid {}\nstart 0\nsince 1\nbeat {:020}\n",
            "ab".repeat(16),
            pidns.display(),
            std::process::id(),
            0
        )
    };
    let here = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    s3.put_bytes(
        &dir,
        &bucket,
        "out/.a.reshard-lock",
        lock(here.trim()).as_bytes(),
    );
    let stale = ["--lock-stale-after", "2"];
    let a = format!("s3://{bucket}/out/a");
    let out = run_to_s3(&dir, s3, 2, &input, &a, &stale);
    out.check(out.code() != Some(0), "expected a refusal");
    out.stderr_has("another reshard run is writing it");
    out.stderr_has(&format!("pid {} on elsewhere", std::process::id()));
    out.stderr_has(&format!("s3://{bucket}/out/.a.reshard-lock"));
    assert_eq!(s3.keys(&dir, &bucket, "out/a/"), Vec::<String>::new());
    // The lock of a run on another machine (its pid cannot be checked from here) whose
    // heartbeat has not moved for --lock-stale-after: taken over.
    s3.put_bytes(
        &dir,
        &bucket,
        "out/.a.reshard-lock",
        lock("another-boot").as_bytes(),
    );
    let out = run_to_s3(&dir, s3, 2, &input, &a, &stale);
    out.check(
        out.code() == Some(0),
        "the dead run's lock was not taken over",
    );
    out.stderr_has(&format!("taking over s3://{bucket}/out/.a.reshard-lock"));
    out.stderr_has("has not moved its heartbeat for 2 s");
    let keys = s3.keys(&dir, &bucket, "out/");
    assert!(keys.contains(&"out/a/index.json".to_string()), "{keys:?}");
    assert!(!keys.iter().any(|k| k.contains("reshard-lock")), "{keys:?}");
    // An output prefix holding someone else's object: refused, with --force too; it stays.
    s3.put_bytes(&dir, &bucket, "out/b/notes.txt", b"mine");
    for force in [&[][..], &["--force"][..]] {
        let out = run_to_s3(&dir, s3, 1, &input, &format!("s3://{bucket}/out/b"), force);
        out.check(out.code() != Some(0), "expected a refusal");
        out.stderr_has(&format!("--output s3://{bucket}/out/b"));
    }
    assert_eq!(s3.keys(&dir, &bucket, "out/b/"), ["out/b/notes.txt"]);
    // A reshard output is replaced with --force: of its objects, those the new manifest does
    // not name go; an object the old manifest did not list stays.
    let c = format!("s3://{bucket}/out/c");
    let first = run_to_s3(&dir, s3, 2, &input, &c, &["--shards", "6"]);
    first.check(first.code() == Some(0), "expected success");
    s3.put_bytes(&dir, &bucket, "out/c/README", b"kept");
    let again = run_to_s3(&dir, s3, 2, &input, &c, &[]);
    again.check(again.code() != Some(0), "replaced without --force");
    let forced = run_to_s3(&dir, s3, 2, &input, &c, &["--force"]);
    forced.check(forced.code() == Some(0), "expected success");
    let keys: Vec<String> = s3
        .keys(&dir, &bucket, "out/c/")
        .into_iter()
        .filter(|k| !k.contains("/.reshard/"))
        .collect();
    let shards: Vec<String> = (0..5).map(|i| format!("out/c/shard-{i:06}.tar")).collect();
    let mut want = vec!["out/c/README".to_string(), "out/c/index.json".to_string()];
    want.extend(shards);
    assert_eq!(keys, want);
}

/// Waits (bounded, generously) until `cond` holds.
fn wait_until(what: &str, cond: impl Fn() -> bool) {
    for _ in 0..600 {
        if cond() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    panic!("never: {what}");
}

/// Waits (bounded) until every file of `paths` exists.
fn wait_for(paths: &[std::path::PathBuf]) {
    for _ in 0..2400 {
        if paths.iter().all(|p| p.exists()) {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    panic!("no rank paused in its upload: {paths:?}");
}

/// `reshard run --force` of `in` to `target` (3 shards, np 2), with the server `s3` killed
/// while each rank pauses in its last shard's multipart upload (the rank with two shards has
/// uploaded its first completely) and the lock's heartbeat has been seen to move.
fn killed_mid_upload(dir: &Dir, s3: &mut Server, bucket: &str, target: &str) -> RunOutput {
    let mut cmd = dir.mpi(2);
    cmd.args(["run", "--input", "in", "--output", target, "--shards", "3"])
        .args(["--seed", "9", "--force", "--scratch"])
        .arg(dir.join("scratch"))
        .env("RESHARD_TEST_PAUSE_UPLOAD", "300")
        .env("AWS_MAX_ATTEMPTS", "2");
    s3.with_env(&mut cmd);
    let scratch = dir.join("scratch");
    std::thread::scope(|scope| {
        let run = scope.spawn(|| cmd.output());
        wait_until("the output is staged", || {
            crate::util::staged_bucket(&scratch, bucket).is_some()
        });
        let staged = crate::util::staged_bucket(&scratch, bucket).unwrap();
        let markers: Vec<_> = (0..2)
            .map(|r| staged.join(format!("out/.paused-upload-{r}")))
            .collect();
        // Each rank pauses in its last shard's multipart upload: the rank with two shards has
        // uploaded its first completely.
        wait_for(&markers);
        // The live run's lock object has a heartbeat (a conditional PUT on the ETag read) that
        // a run on another machine watches before it takes a silent lock for dead.
        let lock = || s3.cat(dir, bucket, "out/.x.reshard-lock");
        let first = lock();
        assert!(first.starts_with("reshard staging lock\n"), "{first}");
        wait_until("the lock's heartbeat moves", || lock() != first);
        s3.kill();
        for m in &markers {
            std::fs::remove_file(m).unwrap();
        }
        run.join().unwrap()
    })
}

#[test]
fn s3_server_killed_mid_upload_publishes_nothing_and_resume_uploads_the_rest() {
    let test = "s3_server_killed_mid_upload_publishes_nothing_and_resume_uploads_the_rest";
    let dir = Dir::new("s3-kill");
    let Some(mut s3) = crate::util::s3::Server::private(&dir, test) else {
        return;
    };
    // Three output shards of about 24 MiB: multipart uploads of 16 MiB parts, two on one rank.
    dir.generate(
        "in",
        &[
            "--shards",
            "3",
            "--samples",
            "600",
            "--mean-size",
            "120KiB",
            "--seed",
            "4",
        ],
    );
    run(&dir, Some(2), &["in"], "local", 3, 9, &[]);
    let bucket = s3.bucket(&dir, test);
    let target = format!("s3://{bucket}/out/x");
    // An output of four shards there, which the killed run replaces with --force.
    let old = run_to_s3(&dir, &s3, 2, "in", &target, &["--shards", "4"]);
    old.check(old.code() == Some(0), "expected success");
    let failed = killed_mid_upload(&dir, &mut s3, &bucket, &target);
    failed.check(failed.code() != Some(0), "expected a failure");
    failed.stderr_has(&format!("nothing is published at {target}"));
    failed.stderr_has("rerun with the same arguments and --resume to upload it");
    failed.no_debug_text();
    s3.restart();
    s3.wait_ready(&dir);
    s3.wait_serving(&dir, &bucket, "out/.x.reshard-lock");
    let keys = s3.keys(&dir, &bucket, "out/x/");
    // The replaced output stopped being one before any of its objects was overwritten.
    assert!(!keys.contains(&"out/x/index.json".to_string()), "{keys:?}");
    // The aborts could not reach the dead server: the uploads stay until the next run.
    assert_eq!(s3.uploads(&dir, &bucket).len(), 2, "{keys:?}");
    let before = s3.stamps(&dir, &bucket, "out/x/shard-");
    // The dead run's lock is taken over (its pid is gone); without --force, the output the
    // failed run was replacing is not replaced: refused before anything is removed or aborted.
    let refused = run_to_s3(&dir, &s3, 2, "in", &target, &["--shards", "3", "--resume"]);
    refused.check(refused.code() != Some(0), "expected a refusal");
    refused.stderr_has(&format!("taking over s3://{bucket}/out/.x.reshard-lock"));
    refused.stderr_has("is gone");
    refused.stderr_has("an earlier run with --force was replacing the reshard output there");
    refused.stderr_has("rerun with --force");
    assert_eq!(s3.uploads(&dir, &bucket).len(), 2);
    assert_eq!(s3.stamps(&dir, &bucket, "out/x/shard-"), before);
    // With --force the dead run's uploads are aborted, and --resume continues from the output
    // it staged: no data moves again, the shard it uploaded completely stays as it is, the
    // others are uploaded.
    let again = run_to_s3(
        &dir,
        &s3,
        2,
        "in",
        &target,
        &["--shards", "3", "--resume", "--force"],
    );
    again.check(again.code() == Some(0), "expected success");
    again.stderr_has("aborted 2 unfinished multipart upload(s)");
    again.stderr_has("kept 1 shard(s) the earlier run uploaded completely");
    again.stderr_has("was staged but not uploaded completely: continuing from it");
    again.stderr_has("continuing the run in");
    again.stderr_has("600 samples durably in place");
    assert_eq!(s3.uploads(&dir, &bucket), Vec::<String>::new());
    let after = s3.stamps(&dir, &bucket, "out/x/shard-");
    let same: Vec<&String> = after.iter().filter(|s| before.contains(s)).collect();
    assert_eq!(
        same.len(),
        1,
        "one shard kept as it was: {before:?} then {after:?}"
    );
    let keys = s3.keys(&dir, &bucket, "out/");
    assert!(
        keys.iter()
            .all(|k| !k.contains("/.reshard-") && !k.contains("reshard-lock")),
        "{keys:?}"
    );
    assert!(!keys.iter().any(|k| k.contains("/.resume")), "{keys:?}");
    // The old output's fourth shard, which the new manifest does not name, is gone.
    let shards: Vec<&String> = keys
        .iter()
        .filter(|k| k.starts_with("out/x/shard-"))
        .collect();
    assert_eq!(shards.len(), 3, "{keys:?}");
    s3.get(&dir, &bucket, "out/x", &dir.join("got"));
    assert_same_output(&dir.join("local"), &dir.join("got"), &["ranks", "inputs"]);
}

/// The end of the `--keep` test, with epochs 3 and 4 of the series there: a removal marker
/// beside an index.json (a removal that failed before it began) does not make epoch 4 a
/// removal to finish; a live run holding epoch 3's lock keeps it from removal.
fn keep_skips_a_held_epoch_and_a_marker_beside_its_manifest(
    dir: &Dir,
    s3: &Server,
    bucket: &str,
    epoch: &dyn Fn(u64, &[&str]) -> RunOutput,
    shards_of: &dyn Fn(u64) -> usize,
) {
    s3.put_bytes(dir, bucket, "out/epoch-4/.reshard-removing", b"");
    let pidns = std::fs::read_link("/proc/self/ns/pid").unwrap();
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    let holder = format!(
        "reshard staging lock\ntoken {}\nhost elsewhere\nboot {}\npidns {}\npid {}\nstart 0\nsince 1\nbeat {:020}\n",
        "cd".repeat(16),
        boot.trim(),
        pidns.display(),
        std::process::id(),
        0
    );
    s3.put_bytes(dir, bucket, "out/.epoch-3.reshard-lock", holder.as_bytes());
    let out = epoch(5, &[]);
    out.check(out.code() == Some(0), "expected success");
    out.stderr_has(&format!(
        "--keep: skipped s3://{bucket}/out/epoch-3: another run holds its lock"
    ));
    out.check(
        !out.stderr.contains("finishing"),
        "epoch 4 is no removal to finish",
    );
    assert_eq!((shards_of(3), shards_of(4), shards_of(5)), (5, 5, 5));
    // Its lock gone, epoch 3 goes with the next run, and epoch 4 with its marker; no lock of
    // an epoch is left behind.
    s3.remove(dir, bucket, "out/.epoch-3.reshard-lock");
    let out = epoch(6, &[]);
    out.check(out.code() == Some(0), "expected success");
    assert_eq!(s3.keys(dir, bucket, "out/epoch-3/"), Vec::<String>::new());
    assert_eq!(s3.keys(dir, bucket, "out/epoch-4/"), Vec::<String>::new());
    assert_eq!((shards_of(5), shards_of(6)), (5, 5));
    let locks: Vec<String> = s3
        .keys(dir, bucket, "out/")
        .into_iter()
        .filter(|k| k.contains("reshard-lock"))
        .collect();
    assert_eq!(locks, Vec::<String>::new());
}

#[test]
fn s3_keep_removes_only_older_reshard_outputs_of_the_series_and_finishes_what_it_began() {
    let test =
        "s3_keep_removes_only_older_reshard_outputs_of_the_series_and_finishes_what_it_began";
    let dir = Dir::new("s3-keep");
    let Some(bucket) = dataset(&dir, test) else {
        return;
    };
    let s3 = server(test).unwrap();
    let input = format!("s3://{bucket}/in");
    let series = format!("s3://{bucket}/out/epoch-{{epoch}}");
    // Not outputs of the series: a prefix of its name that is no reshard output, one of
    // another name, and a user's object beside the series.
    for key in [
        "out/epoch-0/notes.txt",
        "out/epochs/notes.txt",
        "out/README",
    ] {
        s3.put_bytes(&dir, &bucket, key, b"mine");
    }
    let epoch = |e: u64, extra: &[&str]| {
        let e = e.to_string();
        let mut args = vec!["--epoch", e.as_str(), "--keep", "2"];
        args.extend_from_slice(extra);
        run_to_s3(&dir, s3, 2, &input, &series, &args)
    };
    let shards_of = |e: u64| {
        s3.keys(&dir, &bucket, &format!("out/epoch-{e}/"))
            .into_iter()
            .filter(|k| k.ends_with(".tar"))
            .count()
    };
    for e in 1..=2 {
        let out = epoch(e, &[]);
        out.check(out.code() == Some(0), "expected success");
        out.check(
            !out.stderr.contains("--keep"),
            "nothing is beyond --keep 2 yet",
        );
    }
    // A dry run says what would go and removes nothing.
    let dry = epoch(3, &["--dry-run"]);
    dry.check(dry.code() == Some(0), "expected success");
    dry.stderr_has(&format!(
        "--keep 2 would remove the older output s3://{bucket}/out/epoch-1"
    ));
    assert_eq!(shards_of(1), 5);
    // Epoch 3's run dies while it removes epoch 1: epoch 3 is published, epoch 1 is no output
    // any more (no index.json) and still holds objects.
    let mut cmd = dir.mpi(2);
    cmd.args(["run", "--input", &input, "--output", &series, "--seed", "9"])
        .args(["--shards", "5", "--epoch", "3", "--keep", "2", "--scratch"])
        .arg(dir.join("scratch"))
        .env("RESHARD_TEST_KILL", "0:keep");
    let killed = s3.with_env(&mut cmd).output();
    killed.check(killed.code() != Some(0), "rank 0 was to die");
    let keys = s3.keys(&dir, &bucket, "out/epoch-1/");
    assert!(
        !keys.contains(&"out/epoch-1/index.json".to_string()),
        "{keys:?}"
    );
    assert_eq!(shards_of(1), 5, "{keys:?}");
    assert!(s3
        .keys(&dir, &bucket, "out/epoch-3/")
        .contains(&"out/epoch-3/index.json".to_string()));
    // Epoch 4 finishes that removal and removes epoch 2; nothing else goes.
    let out = epoch(4, &[]);
    out.check(out.code() == Some(0), "expected success");
    out.stderr_has(&format!(
        "--keep: finishing the removal of s3://{bucket}/out/epoch-1 (an earlier run began it)"
    ));
    out.stderr_has(&format!(
        "--keep 2: removing the older output s3://{bucket}/out/epoch-2"
    ));
    let left: Vec<String> = s3
        .keys(&dir, &bucket, "out/")
        .into_iter()
        .filter(|k| !k.starts_with("out/epoch-3/") && !k.starts_with("out/epoch-4/"))
        .filter(|k| !k.contains("reshard-lock"))
        .collect();
    assert_eq!(
        left,
        [
            "out/README",
            "out/epoch-0/notes.txt",
            "out/epochs/notes.txt"
        ]
    );
    assert_eq!((shards_of(3), shards_of(4)), (5, 5));
    keep_skips_a_held_epoch_and_a_marker_beside_its_manifest(&dir, s3, &bucket, &epoch, &shards_of);
}

#[test]
fn s3_throttling_and_cut_connections_are_retried_to_the_same_bytes() {
    let test = "s3_throttling_and_cut_connections_are_retried_to_the_same_bytes";
    let dir = Dir::new("s3-faults");
    let Some(bucket) = dataset(&dir, test) else {
        return;
    };
    let s3 = server(test).unwrap();
    run(&dir, Some(2), &["in"], "local", 5, 9, &[]);
    // Every 5th request throttled, every 7th cut mid-body: reading the input, its listing and
    // heads, the lock's heartbeats, the uploads and the manifest all meet both.
    // The answer to the lock's conditional create is lost once: the client sends it again and
    // finds the lock, with this run's own token, already there.
    let faulty = s3.behind_faults(&dir, 5, 7, true);
    let input = format!("s3://{bucket}/in");
    let out = run_to_s3(
        &dir,
        &faulty.server,
        2,
        &input,
        &format!("s3://{bucket}/out/x"),
        &[],
    );
    out.check(out.code() == Some(0), "expected success");
    let (slow, cut) = (faulty.count("slowdown"), faulty.count("cut"));
    assert!(slow >= 5 && cut >= 2, "{slow} throttled, {cut} cut");
    assert_eq!(faulty.count("lost"), 1);
    s3.get(&dir, &bucket, "out/x", &dir.join("got"));
    assert_same_output(&dir.join("local"), &dir.join("got"), &["ranks", "inputs"]);
    // A store that throttles every request: the run fails once its attempts are spent, saying
    // so, and publishes nothing.
    let throttled = s3.behind_faults(&dir, 1, 0, false);
    let mut cmd = dir.mpi(2);
    cmd.args([
        "run",
        "--input",
        &input,
        "--output",
        &format!("s3://{bucket}/out/y"),
    ])
    .args(["--seed", "9", "--shards", "5", "--scratch"])
    .arg(dir.join("scratch"))
    .env("AWS_MAX_ATTEMPTS", "2");
    let out = throttled.server.with_env(&mut cmd).output();
    out.check(out.code() != Some(0), "expected a failure");
    out.stderr_has("SlowDown");
    out.no_debug_text();
    assert_eq!(s3.keys(&dir, &bucket, "out/y"), Vec::<String>::new());
}

#[test]
fn an_s3_input_replaced_while_it_is_read_fails_the_read_naming_it() {
    let test = "an_s3_input_replaced_while_it_is_read_fails_the_read_naming_it";
    let dir = Dir::new("s3-replaced");
    let Some(s3) = server(test) else {
        return;
    };
    // One shard of about 100 MiB, read at 4 MiB/s: its windows of 8 MiB are fetched (4 ahead)
    // over some 25 s, each GET conditional on the ETag seen when the shard was opened.
    let shard = |name: &str, seed: &str| {
        let args = ["--shards", "1", "--samples", "100", "--mean-size", "1MiB"];
        dir.generate(name, &[&args[..], &["--seed", seed]].concat());
    };
    shard("in", "3");
    shard("other", "4");
    let bucket = s3.bucket(&dir, test);
    s3.put(&dir, &dir.join("in"), &bucket, "in");
    let mut cmd = dir.mpi(1);
    cmd.args([
        "run",
        "--input",
        &format!("s3://{bucket}/in"),
        "--output",
        "out",
    ])
    .args(["--shards", "2", "--seed", "9", "--max-read-rate", "4MiB"]);
    s3.with_env(&mut cmd);
    let staging = dir.join(".out.reshard-tmp");
    let failed = std::thread::scope(|scope| {
        let run = scope.spawn(|| cmd.output());
        // The index phase begins right after the staging directory is made: it opens the
        // input shard (its ETag seen) and fetches it into the spool window by window, for some
        // 25 s; 2 s into it, another object takes the shard's key.
        wait_until("the exchange begins", || staging.exists());
        std::thread::sleep(std::time::Duration::from_secs(2));
        s3.put(&dir, &dir.join("other"), &bucket, "in");
        run.join().unwrap()
    });
    failed.check(failed.code() == Some(1), "expected a failure");
    failed.stderr_has(&format!("s3://{bucket}/in/train-000000.tar"));
    failed.stderr_has("the object changed while reshard read it");
    failed.no_debug_text();
    failed.check(!dir.join("out").exists(), "an output was published");
}
