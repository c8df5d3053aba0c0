//! Runs of reshard that several tests share: `reshard run` with the usual arguments, runs at
//! every rank count compared byte for byte, clean failures, `reshard verify`, and the fixture
//! outputs tests damage.

use std::fs;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::data::{check_generated, plain_headers, uneven};
use super::verifier::{assert_indexer_agrees, assert_same_output, verify, Expected, Verified};
use super::{copy_dir, snapshot, Dir, RunOutput, FAIL_FAST, NPS};

/// `reshard run` with the given specs, `--output out --shards N --seed S` and `extra`, under
/// `mpirun -np N` (or no launcher); requires success.
pub fn run(
    dir: &Dir,
    np: Option<usize>,
    specs: &[&str],
    out: &str,
    shards: usize,
    seed: u64,
    extra: &[&str],
) -> RunOutput {
    let mut cmd = dir.reshard(np);
    cmd.arg("run");
    for s in specs {
        cmd.args(["--input", s]);
    }
    cmd.args(["--output", out, "--shards", &shards.to_string()])
        .args(["--seed", &seed.to_string()])
        .args(extra);
    let output = cmd.assert_success();
    output.check(
        output.stdout.contains("samples"),
        "expected a summary on stdout",
    );
    output
}

/// The name part of an output for `np` ranks: `np3`, or `plain` with no launcher.
pub fn label(np: Option<usize>) -> String {
    np.map_or_else(|| "plain".to_string(), |n| format!("np{n}"))
}

/// Verifies outputs for every rank count (and no launcher), and that they are byte-identical.
pub fn same_bytes_for_every_rank_count(format: &str, ext: u8) {
    let dir = Dir::new(&format!("np-{format}"));
    let inputs = uneven(&dir, "in", format, 240, 11);
    check_generated(&inputs, ext);

    let shards = 7;
    let mut first: Option<(PathBuf, Verified)> = None;
    for np in NPS.iter().copied().map(Some).chain([None]) {
        let out = format!("out-{}", label(np));
        run(&dir, np, &["in"], &out, shards, 5, &[]);
        let exp = Expected::new(dir.path(), &inputs, shards, 5, np.unwrap_or(1));
        let v = verify(&exp, &dir.join(&out));
        assert_eq!(v.order.len(), 240);
        assert_ne!(v.order, v.input_order, "the output is in input order");
        match &first {
            None => first = Some((dir.join(&out), v)),
            Some((path, v0)) => {
                assert_eq!(
                    v0.order,
                    v.order,
                    "{out}: another order than {}",
                    path.display()
                );
                assert_same_output(path, &dir.join(&out), &["ranks"]);
            }
        }
    }
}

/// Reads the "exchange rounds: N" line of the summary, when the summary has one.
pub fn exchange_rounds(out: &RunOutput) -> Option<u64> {
    out.stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix("exchange rounds:"))
        .and_then(|n| n.trim().parse().ok())
}

/// Runs `reshard run --input SPEC... --output OUT --shards 3 --seed 1` under `mpirun -np NP`
/// and requires a clean failure: exit code 1 within seconds, nothing at OUT, no staging
/// directory, `in/` unchanged.
pub fn fails_cleanly(dir: &Dir, np: usize, specs: &[&str], out: &str) -> RunOutput {
    let watched = dir.join("in");
    let before = snapshot(&watched);
    let mut cmd = dir.mpi(np);
    cmd.arg("run");
    for s in specs {
        cmd.args(["--input", s]);
    }
    // A hang is a failure: give it twice the time it may take, then kill it.
    let res = cmd
        .args(["--output", out, "--shards", "3", "--seed", "1"])
        .timeout(2 * FAIL_FAST)
        .assert_code(1);
    res.stderr_has("reshard: error:");
    res.check(
        res.elapsed < FAIL_FAST,
        &format!("took {:.1} s to fail", res.elapsed.as_secs_f64()),
    );
    let target = dir.join(out);
    res.check(!target.exists(), "something was published at the output");
    res.check(
        !dir.join(format!(".{out}.reshard-tmp")).exists(),
        "the staging directory was left behind",
    );
    res.check(snapshot(&watched) == before, "the input directory changed");
    res
}

/// Replaces input shard `which` (of three) with what `make` turns its bytes into, and requires
/// np 1 and np 3 to fail on it, naming the file, "byte offset" and the needles `make` returns.
/// Which rank indexes the bad shard varies with `which`, so failures of rank 0 and of the others
/// are both covered.
pub fn bad_shard(name: &str, which: usize, make: impl Fn(&[u8]) -> (Vec<u8>, Vec<String>)) {
    let dir = Dir::new(name);
    let inputs = plain_headers(&dir);
    let bad = &inputs[which];
    let (bytes, needles) = make(&fs::read(bad).unwrap());
    fs::write(bad, bytes).unwrap();
    let file = bad.file_name().unwrap().to_string_lossy().into_owned();
    for np in [1, 3] {
        let res = fails_cleanly(&dir, np, &["in"], &format!("out-np{np}"));
        res.stderr_has(&file);
        res.stderr_has("byte offset");
        for n in &needles {
            res.stderr_has(n);
        }
    }
}

/// Epoch `e` of the epoch tests: `--output 'out/epoch-{epoch}' --link current --keep 2`, 4
/// shards, seed 11, from `input` under `mpirun -np NP`; requires success.
pub fn epoch_run(dir: &Dir, np: usize, input: &str, e: u64, extra: &[&str]) -> RunOutput {
    run(
        dir,
        Some(np),
        &[input],
        "out/epoch-{epoch}",
        4,
        11,
        &[
            &[
                "--epoch",
                &e.to_string(),
                "--link",
                "current",
                "--keep",
                "2",
            ],
            extra,
        ]
        .concat(),
    )
}

/// What [`epoch_run`] promises for epoch `e` of `inputs` at `np` ranks.
pub fn epoch_expected(dir: &Dir, inputs: &[PathBuf], np: usize, e: u64) -> Expected {
    let mut exp = Expected::new(dir.path(), inputs, 4, 11, np);
    exp.epoch = e;
    exp
}

/// The README's epoch recipe: `--output 'data/epoch-{epoch}' --link data/current --keep 2`.
pub fn epoch_recipe(dir: &Dir, np: usize, input: &str, e: u64, extra: &[&str]) -> RunOutput {
    let mut cmd = dir.mpi(np);
    cmd.args(["run", "--input", input, "--output", "data/epoch-{epoch}"])
        .args(["--epoch", &e.to_string(), "--shards", "4", "--seed", "7"])
        .args(["--link", "data/current", "--keep", "2"])
        .args(extra);
    cmd.assert_success()
}

/// A good output to damage: 40 generated samples in 3 shards.
pub fn good_output_to_damage(dir: &Dir) -> (Vec<PathBuf>, Expected) {
    let inputs = dir.generate(
        "in",
        &[
            "--shards",
            "2",
            "--samples",
            "40",
            "--mean-size",
            "600",
            "--long-names-every",
            "4",
            "--seed",
            "1",
        ],
    );
    run(dir, None, &["in"], "good", 3, 1, &[]);
    let exp = Expected::new(dir.path(), &inputs, 3, 1, 1);
    verify(&exp, &dir.join("good"));
    (inputs, exp)
}

/// Copies the good output to `name`, applies `damage` to it and requires the verifier to reject
/// it with a message containing `why`.
pub fn assert_verifier_rejects(
    dir: &Dir,
    exp: &Expected,
    name: &str,
    why: &str,
    damage: impl FnOnce(&Path),
) {
    let out = dir.create_dir(name);
    copy_dir(&dir.join("good"), &out);
    damage(&out);
    let result = catch_unwind(AssertUnwindSafe(|| verify(exp, &out)));
    let Err(panic) = result else {
        panic!("the verifier accepted a damaged output ({name})");
    };
    let msg = panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default();
    assert!(
        msg.contains(why),
        "{name}: rejected, but for another reason: {msg}"
    );
}

/// `reshard run --input in --output OUT --shards 2 --seed 1 EXTRA` under `mpirun -np NP`;
/// requires the exit code `code`.
pub fn run_two_shards(dir: &Dir, np: usize, out: &str, extra: &[&str], code: i32) -> RunOutput {
    let mut c = dir.mpi(np);
    c.args([
        "run", "--input", "in", "--output", out, "--shards", "2", "--seed", "1",
    ])
    .args(extra);
    c.assert_code(code)
}

/// Runs np 1 and np 3 over `inputs`, verifies both and requires identical bytes.
pub fn reshard_both(dir: &Dir, inputs: &[PathBuf], shards: usize) -> Verified {
    let specs: Vec<String> = inputs.iter().map(|p| p.display().to_string()).collect();
    let specs: Vec<&str> = specs.iter().map(String::as_str).collect();
    for p in inputs {
        assert_indexer_agrees(p);
    }
    let mut result = None;
    for np in [1, 3] {
        let out = format!("out-np{np}");
        // The shards repeat each other's keys on purpose (one sample in several formats).
        run(
            dir,
            Some(np),
            &specs,
            &out,
            shards,
            99,
            &["--on-duplicate", "keep"],
        );
        let v = verify(
            &Expected::new(dir.path(), inputs, shards, 99, np),
            &dir.join(&out),
        );
        result.get_or_insert(v);
    }
    assert_same_output(&dir.join("out-np1"), &dir.join("out-np3"), &["ranks"]);
    result.unwrap()
}

/// `reshard run --input in --output OUT ARGS` under `mpirun -np NP`; requires success.
pub fn run_in(dir: &Dir, np: usize, out: &str, args: &[&str]) -> RunOutput {
    let mut c = dir.mpi(np);
    c.args(["run", "--input", "in", "--output", out]).args(args);
    c.assert_success()
}

/// Runs at every np and requires byte-identical outputs; returns the np=1 output's directory.
pub fn identical_for_any_np(dir: &Dir, name: &str, args: &[&str]) -> PathBuf {
    for np in NPS {
        run_in(dir, np, &format!("{name}-{np}"), args);
        if np > 1 {
            assert_same_output(
                &dir.join(format!("{name}-1")),
                &dir.join(format!("{name}-{np}")),
                &["ranks"],
            );
        }
    }
    dir.join(format!("{name}-1"))
}

/// Inputs, and a previous output (with its saved index) to plan from.
pub fn with_previous_output(dir: &Dir) {
    dir.generate(
        "in",
        &["--shards", "3", "--samples", "40", "--mean-size", "1KiB"],
    );
    run(dir, None, &["in"], "prev", 3, 1, &[]);
    dir.create_dir("data");
}

/// `reshard CMD --input in --seed 3 ARGS` under `mpirun -np NP`; requires success.
pub fn seeded(dir: &Dir, np: usize, cmd: &str, args: &[&str]) -> RunOutput {
    let mut c = dir.mpi(np);
    c.args([cmd, "--input", "in", "--seed", "3"]).args(args);
    c.assert_success()
}

/// The `reshard plan --json` of `in` (seed 3) with `args`, parsed.
pub fn plan_json(dir: &Dir, np: usize, args: &[&str]) -> Value {
    let res = seeded(dir, np, "plan", &[args, &["--json"]].concat());
    serde_json::from_str(&res.stdout).unwrap_or_else(|e| res.fail(&format!("plan --json: {e}")))
}

/// A generated input (`in`, 6 uneven shards, 240 samples with long names) and a good output
/// (`good`, 7 shards, written by 2 ranks).
pub fn good_output_for_verify(dir: &Dir) {
    dir.generate(
        "in",
        &[
            "--shards",
            "6",
            "--samples",
            "240",
            "--mean-size",
            "700",
            "--skew",
            "2",
            "--long-names-every",
            "7",
            "--seed",
            "5",
        ],
    );
    run(dir, Some(2), &["in"], "good", 7, 11, &[]);
}

/// `reshard verify --input in --output OUT [extra]` under `mpirun -np N` (or no launcher).
pub fn verify_cmd(dir: &Dir, np: Option<usize>, out: &str, extra: &[&str]) -> RunOutput {
    let mut cmd = dir.reshard(np);
    cmd.args(["verify", "--input", "in", "--output", out])
        .args(extra);
    cmd.output()
}

/// Requires verify to fail on `out` with exit 1 on every rank count tried, naming every needle
/// in its report (stdout) and saying on stderr that verification failed.
pub fn assert_fails(dir: &Dir, out: &str, needles: &[&str]) {
    for np in [Some(1), Some(3)] {
        let got = verify_cmd(dir, np, out, &[]);
        if got.code() != Some(1) {
            got.fail("expected verify to fail with exit code 1");
        }
        got.check(
            got.stdout.contains("reshard verify: FAILED"),
            "expected a FAILED report on stdout",
        );
        for needle in needles {
            got.check(
                got.stdout.contains(needle),
                &format!("expected the report to name {needle:?}"),
            );
        }
        got.stderr_has("verification of");
    }
}

/// The JSON report `reshard verify --json` printed, parsed.
pub fn report_json(out: &RunOutput) -> Value {
    serde_json::from_str(&out.stdout)
        .unwrap_or_else(|e| out.fail(&format!("stdout is not a JSON report: {e}")))
}

/// Runs reshard over `inputs` at np 1 and np 2 and requires a refusal: a non-zero exit code,
/// every needle on stderr, nothing published and no staging directory left.
pub fn refused(dir: &Dir, inputs: &[&Path], needles: &[String]) {
    for np in [1, 2] {
        let out = format!("out-np{np}");
        let mut cmd = dir.mpi(np);
        cmd.arg("run");
        for i in inputs {
            cmd.arg("--input").arg(i);
        }
        let res = cmd
            .args(["--output", &out, "--shards", "2", "--seed", "1"])
            .timeout(2 * FAIL_FAST)
            .output();
        res.check(
            res.code().is_some_and(|c| c != 0),
            "expected a refusal: a non-zero exit code",
        );
        for n in needles {
            res.stderr_has(n);
        }
        res.check(
            !dir.join(&out).exists(),
            "something was published at the output",
        );
        res.check(
            !dir.join(format!(".{out}.reshard-tmp")).exists(),
            "the staging directory was left behind",
        );
    }
}
