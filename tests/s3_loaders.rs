//! Issue 25: a user trains from an output reshard wrote to a bucket with the loaders themselves,
//! reading over S3 as they do: wids fetches `index.json` and the shards with its own `s3://`
//! handler (the AWS CLI, `aws s3 cp`), and Megatron-Energon reads `.nv-meta/`, the `.tar.idx`
//! offsets and `index.sqlite` through its Multi-Storage Client (`msc://PROFILE/PREFIX`). Both
//! go through the scripts of `examples/consumers/`, against the real S3 server of `util::s3`.

use std::ffi::OsString;
use std::path::Path;

use crate::util::loaders::{energon_python, torch_standin};
use crate::util::s3::{server, Server};
use crate::util::stores::Store;
use crate::util::{skip, Dir, RunOutput};

const TEST: &str = "s3_output_trains_with_wids_and_energon_over_s3";

/// `examples/consumers/SCRIPT ARGS` through `py`, with the server's environment, `env`, and the
/// venv's `bin/` (the AWS CLI) first on PATH.
fn consumer(
    dir: &Dir,
    (s3, env): (&Server, &[(&str, &Path)]),
    py: &Path,
    script: &str,
    args: &[&str],
) -> RunOutput {
    let bin = py.parent().expect("the venv's bin directory");
    let mut path = OsString::from(bin);
    if let Some(rest) = std::env::var_os("PATH") {
        path.push(":");
        path.push(rest);
    }
    let mut cmd = dir.program(py);
    cmd.env("PATH", path)
        .env("PYTHONPATH", torch_standin())
        .arg(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("examples/consumers")
                .join(script),
        )
        .args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    s3.with_env(&mut cmd).assert_success()
}

#[test]
fn s3_output_trains_with_wids_and_energon_over_s3() {
    let Some(s3) = server(TEST) else {
        return;
    };
    let Some(py) = energon_python() else {
        skip(TEST, "the test venv cannot import megatron.energon");
        return;
    };
    // Found, not imported: wids imports torch, which read_wids.py stands in for itself.
    for (what, module) in [("wids", "wids"), ("the AWS CLI", "awscli")] {
        let find = format!(
            "import importlib.util, sys; sys.exit(not importlib.util.find_spec('{module}'))"
        );
        let ok = std::process::Command::new(&py)
            .args(["-c", &find])
            .output()
            .is_ok_and(|o| o.status.success());
        if !ok {
            skip(TEST, &format!("{what} is not installed in the test venv"));
            return;
        }
    }
    let dir = Dir::new("s3-loaders");
    dir.generate(
        "in",
        &[
            "--shards",
            "3",
            "--samples",
            "60",
            "--mean-size",
            "20KiB",
            "--seed",
            "4",
        ],
    );
    let bucket = s3.bucket(&dir, TEST);
    let mut cmd = dir.mpi(2);
    cmd.args(["run", "--input", "in", "--output"])
        .arg(format!("s3://{bucket}/train"))
        .args(["--shards", "4", "--seed", "5", "--energon", "--scratch"])
        .arg(dir.join("scratch"));
    s3.with_env(&mut cmd).assert_success();

    // wids, as a user with the AWS CLI installed: every sample once, in its sampler's order
    // and at random indices.
    let wids = consumer(
        &dir,
        (s3, &[]),
        &py,
        "read_wids.py",
        &[&format!("s3://{bucket}/train")],
    );
    wids.check(
        wids.stdout
            .contains("read 60 samples in ShardedSampler order")
            && wids.stdout.contains("60 distinct keys"),
        "wids reads every sample once",
    );

    // Energon through an MSC profile that names the bucket and the server.
    let config = dir.create_bytes(
        "msc.yaml",
        format!(
            "profiles:\n  data:\n    storage_provider:\n      type: s3\n      options:\n        \
             base_path: {bucket}\n        endpoint_url: {}\n        region_name: us-east-1\n",
            s3.endpoint
        )
        .as_bytes(),
    );
    let energon = consumer(
        &dir,
        (s3, &[("MSC_CONFIG", &config)]),
        &py,
        "read_energon.py",
        &["msc://data/train"],
    );
    energon.check(
        energon
            .stdout
            .contains("4 shards, 60 samples, each read by position (.tar.idx) and by key"),
        "energon reads every sample by position and by key",
    );
}
