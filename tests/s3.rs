//! `s3://` input against a real S3 server (SeaweedFS on loopback, see `util::s3`): the same
//! bytes as from the local copy at every rank count, brace patterns, bare prefixes and list
//! files, and clear refusals before any work for a missing bucket, a missing key and a wrong secret.

use crate::util::runs::run;
use crate::util::s3::server;
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
