//! What a user meets on `s3://` beyond the bytes (issue 38): `--keep` over a series whose
//! shards are multipart-sized, and one line that says what is wrong and what to set when the
//! credentials or the endpoint are.

use crate::util::s3::server;
use crate::util::stores::Store;
use crate::util::Dir;

/// `--keep 1` over three epochs of an `s3://` series whose shards (about 20 MiB) go up as
/// multipart uploads: each run removes the epoch before it (an emptied `.reshard-multipart/`
/// folder, which SeaweedFS keeps, is no object to remove), and a run finishes the removal an
/// earlier version left half-done (its marker there, its `index.json` gone). The upload reports
/// its progress shard by shard.
#[test]
fn s3_keep_removes_older_epochs_of_multipart_sized_shards() {
    let test = "s3_keep_removes_older_epochs_of_multipart_sized_shards";
    let Some(s3) = server(test) else {
        return;
    };
    let dir = Dir::new("s3-keep-large");
    dir.generate(
        "in",
        &[
            "--shards",
            "2",
            "--samples",
            "30",
            "--mean-size",
            "2MiB",
            "--seed",
            "3",
        ],
    );
    let bucket = s3.bucket(&dir, test);
    let epoch = |e: u64| {
        let mut cmd = dir.mpi(2);
        cmd.args(["run", "--input", "in", "--output"])
            .arg(format!("s3://{bucket}/out/epoch-{{epoch}}"))
            .args(["--shards", "3", "--seed", "9", "--keep", "1", "--scratch"])
            .arg(dir.join("scratch"))
            .args(["--epoch", &e.to_string()])
            .args(["--progress", "lines", "--progress-interval", "0"]);
        s3.with_env(&mut cmd).assert_success()
    };
    let tars = |e: u64| -> Vec<String> {
        let keys = s3.keys(&dir, &bucket, &format!("out/epoch-{e}/"));
        keys.into_iter().filter(|k| k.ends_with(".tar")).collect()
    };
    // The upload says how far it is, as the exchange does.
    let first = epoch(0);
    first.stderr_has("reshard: upload 3 / 3 shards, ");
    assert_eq!(tars(0).len(), 3);
    for e in 1..=2 {
        let out = epoch(e);
        out.stderr_has(&format!(
            "--keep 1: removing the older output s3://{bucket}/out/epoch-{}",
            e - 1
        ));
        assert_eq!(
            s3.keys(&dir, &bucket, &format!("out/epoch-{}/", e - 1)),
            Vec::<String>::new()
        );
        assert_eq!(tars(e).len(), 3);
    }
    // What an earlier version left when its removal of epoch 2 failed: the marker, no
    // index.json, the shards and an emptied journal folder.
    s3.put_bytes(&dir, &bucket, "out/epoch-2/.reshard-removing", b"");
    s3.put_bytes(&dir, &bucket, "out/epoch-2/.reshard-multipart/x", b"1");
    s3.remove(&dir, &bucket, "out/epoch-2/.reshard-multipart/x");
    s3.remove(&dir, &bucket, "out/epoch-2/index.json");
    let out = epoch(3);
    out.stderr_has(&format!(
        "--keep: finishing the removal of s3://{bucket}/out/epoch-2 (an earlier run began it)"
    ));
    assert_eq!(s3.keys(&dir, &bucket, "out/epoch-2/"), Vec::<String>::new());
    assert_eq!(tars(3).len(), 3);
}

/// A wrong secret, an unknown key, no credentials and no endpoint each stop the run before any
/// work with one line that says what is wrong and what to set: no XML of the store's, no
/// request to the metadata service, no hint about the output's parent, no secret.
#[test]
fn s3_credential_and_endpoint_mistakes_say_what_to_set() {
    let test = "s3_credential_and_endpoint_mistakes_say_what_to_set";
    let Some(s3) = server(test) else {
        return;
    };
    let dir = Dir::new("s3-says");
    dir.generate("in", &["--shards", "2", "--samples", "20", "--seed", "3"]);
    let bucket = s3.bucket(&dir, test);
    s3.put(&dir, &dir.join("in"), &bucket, "in");
    // No profile file of the machine's takes part.
    let none = dir.join("no-such-aws-file");
    let refused = |input: &str, output: &str, env: &[(&str, &str)], drop: &[&str]| {
        let mut cmd = dir.mpi(2);
        cmd.args(["run", "--input", input, "--output", output])
            .args(["--shards", "2", "--seed", "1"]);
        if output.starts_with("s3://") {
            cmd.arg("--scratch").arg(dir.join("scratch"));
        }
        s3.with_env(&mut cmd)
            .env("AWS_SHARED_CREDENTIALS_FILE", &none)
            .env("AWS_CONFIG_FILE", &none)
            .env("AWS_MAX_ATTEMPTS", "1");
        for (k, v) in env {
            cmd.env(k, v);
        }
        for k in drop {
            cmd.env_remove(k);
        }
        let res = cmd.assert_code(1);
        let errors: Vec<&str> = res.stderr.lines().filter(|l| l.contains("error")).collect();
        res.check(errors.len() == 1, "expected one line of error");
        for bad in [
            "<?xml",
            "<Error>",
            "169.254",
            "parent",
            s3.secret(),
            "wrong-secret",
        ] {
            res.check(!res.stderr.contains(bad), &format!("says {bad:?}"));
        }
        res.check(!res.stderr.contains("indexing"), "refused after work began");
        res
    };
    let listing = format!("s3://{bucket}/in/");
    let to_s3 = format!("s3://{bucket}/out");
    for (input, output) in [(listing.as_str(), "local"), ("in", to_s3.as_str())] {
        let wrong = [("AWS_SECRET_ACCESS_KEY", "wrong-secret")];
        let res = refused(input, output, &wrong, &[]);
        res.stderr_has("AWS_SECRET_ACCESS_KEY is not the secret of AWS_ACCESS_KEY_ID");
        let res = refused(input, output, &[("AWS_ACCESS_KEY_ID", "no-such-key")], &[]);
        res.stderr_has("the store does not know the key in AWS_ACCESS_KEY_ID");
        // The metadata service is the test server itself, which refuses its token request at
        // once (the cloud's address would be tried for a minute where nothing answers).
        let keys = ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"];
        let metadata = [("AWS_METADATA_ENDPOINT", s3.endpoint.as_str())];
        let res = refused(input, output, &metadata, &keys);
        res.stderr_has("no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY");
        // Without an endpoint, AWS's own: unreachable here, or one that knows no such key.
        let res = refused(input, output, &[], &["AWS_ENDPOINT_URL"]);
        res.stderr_has("no endpoint is set (AWS_ENDPOINT_URL), so the store is AWS's own");
    }
    // An endpoint where nothing listens.
    let dead = [("AWS_ENDPOINT_URL", "http://127.0.0.1:9")];
    let res = refused(&listing, "local", &dead, &[]);
    res.stderr_has("cannot reach the store at http://127.0.0.1:9: is it running");
}

/// An `s3://` output that holds an input is refused before any work, as on a file system:
/// `--input s3://B/out --output s3://B/out --force` would replace the input's objects with its
/// own reshuffle; so would `--input-files s3://B/out/`. Every object there stays as it was.
/// Before, both runs were accepted and their `--force` replaced the input (exit 0), where a file
/// system's output is refused.
#[test]
fn an_s3_output_that_holds_an_input_is_refused() {
    let test = "an_s3_output_that_holds_an_input_is_refused";
    let Some(s3) = server(test) else {
        return;
    };
    let dir = Dir::new("s3-output-over-input");
    crate::util::data::sized(&dir, "in", "1MiB", "16KiB", 2);
    let bucket = s3.bucket(&dir, test);
    let output = format!("s3://{bucket}/out");
    let run = |input: &str, extra: &[&str]| {
        let mut cmd = dir.mpi(1);
        cmd.args(["run", "--input", input, "--output", &output])
            .args(["--shards", "2", "--seed", "4", "--scratch"])
            .arg(dir.join("scratch"))
            .args(extra);
        s3.with_env(&mut cmd).output()
    };
    let first = run("in", &[]);
    first.check(first.code() == Some(0), "the output is published");
    let before = s3.stamps(&dir, &bucket, "out/");
    let res = run(&output, &["--force"]);
    res.check(res.code() == Some(1), "refused");
    res.stderr_has(&format!(
        "--output {output} would replace the input {output}/shard-000000.tar"
    ));
    assert_eq!(
        s3.stamps(&dir, &bucket, "out/"),
        before,
        "the input is left as it was"
    ); // Its objects read as loose files, the same.
    let mut cmd = dir.mpi(1);
    cmd.args([
        "run",
        "--input-files",
        &format!("{output}/"),
        "--output",
        &output,
    ])
    .args(["--shards", "1", "--seed", "4", "--force", "--scratch"])
    .arg(dir.join("scratch"));
    let res = s3.with_env(&mut cmd).output();
    res.check(res.code() == Some(1), "refused");
    res.stderr_has("overlap");
    assert_eq!(
        s3.stamps(&dir, &bucket, "out/"),
        before,
        "the input is left as it was"
    );
}
