//! An input read from object storage is fetched from the store once per run: the index phase
//! spools each shard it streams, in memory within a share of `--mem-limit`, else on node-local
//! scratch (`--scratch`, else `$TMPDIR`), the exchange reads the samples from there, and the spool is gone when the run ends, whether it
//! published or failed. An object replaced after it was spooled is still refused.

use std::path::Path;

use crate::util::runs::run;
use crate::util::s3::{server, Server};
use crate::util::stores::Store;
use crate::util::verifier::assert_same_output;
use crate::util::{Dir, TestCommand};

/// Six shards of uneven samples (two of them larger than the 8 MiB read window), generated
/// locally as `in` and uploaded to `s3://BUCKET/in/`.
fn uploaded(dir: &Dir, s3: &Server, test: &str) -> String {
    dir.generate(
        "in",
        &[
            "--shards",
            "6",
            "--samples",
            "90",
            "--mean-size",
            "120KiB",
            "--sigma",
            "1.6",
            "--seed",
            "11",
        ],
    );
    let bucket = s3.bucket(dir, test);
    s3.put(dir, &dir.join("in"), &bucket, "in");
    bucket
}

/// `reshard run` of `s3://BUCKET/in` to `out` under `mpirun -np NP`, with `$TMPDIR` set to
/// `tmp` (the spool's default place) and the server's environment.
fn from_s3(dir: &Dir, s3: &Server, np: usize, bucket: &str, out: &str) -> TestCommand {
    let tmp = dir.create_dir("tmp");
    let mut cmd = dir.mpi(np);
    cmd.args([
        "run",
        "--input",
        &format!("s3://{bucket}/in"),
        "--output",
        out,
    ])
    .args(["--shards", "5", "--seed", "9"])
    .env("TMPDIR", &tmp);
    s3.with_env(&mut cmd);
    cmd
}

/// The spool directories reshard left in `dir`.
fn spools(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|name| name.starts_with("reshard-spool"))
                .collect()
        })
        .unwrap_or_default()
}

/// The report's bytes fetched from the store (GET bytes) and the input's bytes.
fn fetched(report: &Path) -> (u64, u64) {
    let text = std::fs::read_to_string(report).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let got = v["s3"]["get_bytes"].as_u64().expect("s3.get_bytes");
    (got, v["input_bytes"].as_u64().expect("input_bytes"))
}

#[test]
fn s3_input_bytes_are_fetched_once_and_the_spool_goes() {
    let test = "s3_input_bytes_are_fetched_once_and_the_spool_goes";
    let dir = Dir::new("s3-once");
    let Some(s3) = server(test) else {
        return;
    };
    let bucket = uploaded(&dir, s3, test);
    run(&dir, Some(2), &["in"], "local", 5, 9, &[]);
    for np in [1, 2] {
        let out = format!("from-s3-{np}");
        let report = dir.join(format!("{out}.json"));
        let got = from_s3(&dir, s3, np, &bucket, &out)
            .arg("--report")
            .arg(&report)
            .assert_success();
        let (get_bytes, input) = fetched(&report);
        got.check(
            get_bytes == input,
            &format!("np={np}: {get_bytes} bytes fetched for an input of {input}"),
        );
        got.check(
            got.stdout.contains("s3 requests: "),
            "the summary's request line",
        );
        // Within a quarter of the memory budget (1 GiB): held in memory, no spool file.
        got.stderr_has("fetched the object-store input once: 9.76 MiB held in memory, 0 B in");
        assert_same_output(&dir.join("local"), &dir.join(&out), &["ranks", "inputs"]);
        let left = spools(&dir.join("tmp"));
        got.check(left.is_empty(), &format!("spool left behind: {left:?}"));
    }
    // On the scratch directory named, at two ranks, a memory budget too small to hold a shard:
    // each fetched into a spool file, and once all the same.
    let scratch = dir.create_dir("scratch");
    let report = dir.join("scratch.json");
    let got = from_s3(&dir, s3, 2, &bucket, "on-scratch")
        .args(["--mem-limit", "2MiB", "--scratch"])
        .arg(&scratch)
        .arg("--report")
        .arg(&report)
        .assert_success();
    let (get_bytes, input) = fetched(&report);
    got.check(get_bytes == input, "fetched once with --scratch");
    got.stderr_has("0 B held in memory, 9.76 MiB in spool files");
    assert_same_output(
        &dir.join("local"),
        &dir.join("on-scratch"),
        &["ranks", "inputs"],
    );
    let left = spools(&scratch);
    got.check(left.is_empty(), &format!("spool left behind: {left:?}"));
}

/// Paused before the exchange (every shard spooled), one input object is replaced: the
/// exchange reads the spooled bytes, and the finish phase refuses the run because the object
/// is not the one indexed; the spool is gone all the same. A shard that is no tar fails the
/// index phase, after other shards were spooled: gone too.
#[test]
fn an_s3_input_replaced_after_it_was_spooled_is_refused_and_the_spool_goes() {
    let test = "an_s3_input_replaced_after_it_was_spooled_is_refused_and_the_spool_goes";
    let dir = Dir::new("s3-once-flip");
    let Some(s3) = server(test) else {
        return;
    };
    let bucket = uploaded(&dir, s3, test);
    dir.generate(
        "other",
        &["--shards", "1", "--samples", "20", "--seed", "4"],
    );
    let np = 2;
    let markers: Vec<_> = (0..np)
        .map(|r| dir.join(format!(".out.reshard-tmp/.paused-exchange-{r}")))
        .collect();
    let tmp = dir.join("tmp");
    let failed = std::thread::scope(|scope| {
        let watcher = scope.spawn(|| {
            let start = std::time::Instant::now();
            while !markers.iter().all(|m| m.exists()) {
                assert!(
                    start.elapsed() < std::time::Duration::from_secs(120),
                    "the run never paused"
                );
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            let spooled = spools(&tmp);
            let other = std::fs::read(dir.join("other/train-000000.tar")).unwrap();
            s3.put_bytes(&dir, &bucket, "in/train-000004.tar", &other);
            for m in &markers {
                let _ = std::fs::remove_file(m);
            }
            spooled
        });
        // Spooled in files: no shard fits a quarter of 2 MiB.
        let failed = from_s3(&dir, s3, np, &bucket, "out")
            .args(["--mem-limit", "2MiB"])
            .env("RESHARD_TEST_PAUSE_EXCHANGE", "120")
            .assert_code(1);
        (failed, watcher.join().unwrap())
    });
    let (failed, spooled) = failed;
    failed.check(
        spooled.len() == np,
        &format!("a spool per rank while paused: {spooled:?}"),
    );
    failed.stderr_has(&format!("s3://{bucket}/in/train-000004.tar"));
    failed.stderr_has("changed during the run");
    failed.check(!dir.join("out").exists(), "an output was published");
    let left = spools(&tmp);
    failed.check(left.is_empty(), &format!("spool left behind: {left:?}"));

    // A shard that is no tar, among good ones.
    s3.put_bytes(&dir, &bucket, "in/train-000004.tar", &[b'x'; 100_000]);
    let bad = from_s3(&dir, s3, np, &bucket, "out")
        .args(["--mem-limit", "2MiB"])
        .assert_code(1);
    bad.stderr_has(&format!("s3://{bucket}/in/train-000004.tar"));
    bad.check(!dir.join("out").exists(), "an output was published");
    let left = spools(&tmp);
    bad.check(left.is_empty(), &format!("spool left behind: {left:?}"));
}
