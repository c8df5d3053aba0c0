//! Issue 7: the Slurm recipes in `slurm/` and the consumer examples' scripts, and `reshard
//! completions`.
//!
//! There is no Slurm here: the batch scripts run under bash with a stand-in `srun` first on
//! `PATH` (it drops srun's own options and runs the command under `mpirun -np 2`), a stand-in
//! `module`, and a stand-in `sbatch` for the epoch loop, each recording how it was called.

use std::fs;

use serde_json::Value;

use crate::util::slurm::{
    epoch_loop, fake_slurm, job, python_scripts, repo, run_script, shard_counts, shell_scripts,
};
use crate::util::verifier::{verify, Expected};
use crate::util::{find_on_path, have_python, index_json, reshard_exe, skip, tar_files, Dir};

#[test]
fn every_script_parses() {
    let scripts = shell_scripts();
    let names: Vec<String> = scripts
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    for want in [
        "reshard.sbatch",
        "rescale.sbatch",
        "epoch-loop.sh",
        "run.sh",
    ] {
        assert!(names.iter().any(|n| n == want), "{want} missing: {names:?}");
    }
    let dir = Dir::new("slurm-syntax");
    for s in &scripts {
        dir.program("bash").arg("-n").arg(s).assert_success();
    }
    if have_python("syntax of the Python examples") {
        for s in python_scripts() {
            dir.program("python3")
                .args([
                    "-c",
                    "import ast, sys; ast.parse(open(sys.argv[1]).read(), sys.argv[1])",
                ])
                .arg(&s)
                .assert_success();
        }
    }
}

#[test]
fn scripts_pass_shellcheck() {
    if find_on_path("shellcheck").is_none() {
        skip(
            "scripts_pass_shellcheck",
            "shellcheck not found on PATH (apt-get install shellcheck)",
        );
        return;
    }
    let dir = Dir::new("slurm-shellcheck");
    dir.program("shellcheck")
        .args(shell_scripts())
        .assert_success();
}

#[test]
fn reshard_sbatch_runs_through_srun() {
    let dir = Dir::new("slurm-reshard");
    let inputs = dir.generate(
        "input",
        &[
            "--shards",
            "5",
            "--samples",
            "301",
            "--mean-size",
            "1KiB",
            "--skew",
            "1",
            "--seed",
            "4",
        ],
    );
    let bin = fake_slurm(&dir);
    let res = run_script(
        &dir,
        "slurm/reshard.sbatch",
        &bin,
        &[
            ("INPUT", "input"),
            ("OUTPUT", "out"),
            ("SHARDS", "6"),
            ("SEED", "11"),
            ("EPOCH", "3"),
            ("PREFIX", "part"),
            ("MEM_LIMIT", "4MiB"),
            ("MODULES", "mpich/4.0"),
            ("SRUN_MPI", "pmi2"),
            ("REPORT", "report.json"),
            ("SLURM_NTASKS", "2"),
        ],
    );

    let out = dir.join("out");
    res.check(tar_files(&out).len() == 6, "6 shards in out/");
    let mut exp = Expected::new(dir.path(), &inputs, 6, 11, 2);
    exp.epoch = 3;
    exp.prefix = "part".to_string();
    let v = verify(&exp, &out);
    res.check(v.order.len() == 301, "every sample written once");

    let calls = fs::read_to_string(dir.join("calls.log")).unwrap();
    res.check(
        calls.contains("module load mpich/4.0"),
        &format!("MODULES loaded: {calls}"),
    );
    res.check(
        calls.contains("srun --mpi=pmi2 --kill-on-bad-exit=1 "),
        &format!("srun with --mpi and --kill-on-bad-exit: {calls}"),
    );
    // The summary as JSON, and its per-rank table printed by slurm/rank-report.py.
    let report: Value = serde_json::from_slice(&fs::read(dir.join("report.json")).unwrap())
        .unwrap_or_else(|e| res.fail(&format!("report.json: {e}")));
    res.check(
        report["per_rank"].as_array().map(Vec::len) == Some(2),
        "two ranks in the report",
    );
    res.check(res.stdout.contains("done in "), "the script finished");
    res.check(
        res.stdout.contains("bytes_written") && res.stdout.contains("median"),
        "the per-rank table printed",
    );
    res.check(
        !res.stdout.contains("WARNING"),
        "2 tasks, 2 ranks: no plugin mismatch",
    );
}

#[test]
fn reshard_sbatch_failure_is_an_error() {
    let dir = Dir::new("slurm-reshard-fail");
    dir.generate(
        "input",
        &["--shards", "2", "--samples", "10", "--seed", "1"],
    );
    dir.create_bytes("out/occupied", b"x");
    let bin = fake_slurm(&dir);
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut paths = vec![bin];
    paths.extend(std::env::split_paths(&path));
    let res = dir
        .program("bash")
        .arg(repo().join("slurm/reshard.sbatch"))
        .env("PATH", std::env::join_paths(paths).unwrap())
        .env("RESHARD", reshard_exe())
        .env("INPUT", "input")
        .env("OUTPUT", "out")
        .env("SHARDS", "3")
        .env("REPORT", "")
        .output();
    res.check(res.code() != Some(0), "a failed job fails the batch script");
    res.check(!res.stdout.contains("done in "), "no success message");
}

#[test]
fn rescale_sbatch_gives_equal_shares_per_gpu() {
    let dir = Dir::new("slurm-rescale");
    let inputs = dir.generate(
        "input",
        &[
            "--shards",
            "4",
            "--samples",
            "403",
            "--mean-size",
            "1KiB",
            "--skew",
            "2",
            "--seed",
            "6",
        ],
    );
    assert_eq!(inputs.len(), 4);
    let bin = fake_slurm(&dir);
    let (gpus, workers) = (2u64, 3u64);
    let res = run_script(
        &dir,
        "slurm/rescale.sbatch",
        &bin,
        &[
            ("INPUT", "input"),
            ("OUTPUT", "out"),
            ("GPUS", &gpus.to_string()),
            ("WORKERS", &workers.to_string()),
            ("SHARD_SIZE", "40KiB"),
            ("BATCH_SIZE", "8"),
            ("SRUN_MPI", ""),
        ],
    );
    let out = dir.join("out");
    let files = tar_files(&out);
    let index = index_json(&out);
    let counts = shard_counts(&index);
    res.check(counts.len() == files.len(), "index.json lists every shard");
    res.check(
        !counts.is_empty() && counts.len() as u64 % (gpus * workers) == 0,
        &format!("{} shards: a multiple of {gpus} x {workers}", counts.len()),
    );
    res.check(counts.len() > 6, "--shard-size 40KiB: more than one group");
    // --equalize drop is the default: every shard, hence every GPU, has the same count.
    res.check(
        counts.iter().all(|&c| c == counts[0]),
        &format!("equal shards: {counts:?}"),
    );
    res.check(index["reshard"]["equalize"] == "drop", "equalize drop");
    res.check(index["reshard"]["gpus"]["equal"] == true, "equal per GPU");
    res.check(
        index["reshard"]["gpus"]["batch_size"] == 8,
        "BATCH_SIZE passed",
    );
    let calls = fs::read_to_string(dir.join("calls.log")).unwrap();
    res.check(
        !calls.contains("--mpi") && !calls.contains("module"),
        &format!("SRUN_MPI= and no MODULES: plain srun, no module: {calls}"),
    );
    let per_gpu = counts[0] * counts.len() as u64 / gpus;
    res.check(
        res.stdout
            .contains(&format!("samples per GPU: min {per_gpu} max {per_gpu}")),
        "the per-GPU summary printed",
    );
}

#[test]
fn epoch_loop_chains_training_and_reshuffles() {
    let dir = Dir::new("slurm-epoch-loop");
    let (res, calls) = epoch_loop(&dir, &[("EPOCHS", "3")]);
    res.check(res.code() == Some(0), "epoch-loop.sh succeeds");
    let jobs: Vec<(String, String)> = calls.iter().map(job).collect();
    // Ids 101.. in submission order; "101;cluster1" is parsed to 101.
    let want = [
        ("reshuffle-0", ""),
        ("train-0", "101"),
        ("reshuffle-1", "101"),
        ("train-1", "103:102"),
        ("reshuffle-2", "103:102"),
        ("train-2", "105:104"),
    ];
    let want: Vec<(String, String)> = want
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    res.check(
        jobs == want,
        &format!("job chain {jobs:?}, expected {want:?}"),
    );
    for (i, e) in [(0, "0"), (2, "1"), (4, "2")] {
        res.check(
            calls[i][1] == format!("data/epoch-{e}") && calls[i][2] == e,
            &format!("reshuffle {e} writes data/epoch-{e}: {:?}", calls[i]),
        );
        res.check(
            calls[i][0].ends_with("slurm/reshard.sbatch"),
            "the reshuffle script",
        );
    }
    for (i, e) in [(1, "0"), (3, "1"), (5, "2")] {
        res.check(
            calls[i][3] == format!("data/epoch-{e}") && calls[i][2] == e,
            &format!("training {e} reads data/epoch-{e}: {:?}", calls[i]),
        );
        res.check(calls[i][0].ends_with("train.sbatch"), "the training script");
    }

    // An existing first epoch is not reshuffled again; OVERLAP=0 waits for each training.
    let dir = Dir::new("slurm-epoch-loop-existing");
    dir.create_bytes("data/epoch-0/index.json", b"{}");
    let (res, calls) = epoch_loop(&dir, &[("EPOCHS", "2"), ("OVERLAP", "0")]);
    res.check(res.code() == Some(0), "epoch-loop.sh succeeds");
    let jobs: Vec<(String, String)> = calls.iter().map(job).collect();
    let want: Vec<(String, String)> = [
        ("train-0", ""),
        ("reshuffle-1", "101"),
        ("train-1", "102:101"),
    ]
    .iter()
    .map(|(a, b)| (a.to_string(), b.to_string()))
    .collect();
    res.check(
        jobs == want,
        &format!("job chain {jobs:?}, expected {want:?}"),
    );
}

#[test]
fn epoch_loop_link_needs_reshard_support() {
    let dir = Dir::new("slurm-epoch-loop-link");
    let (res, calls) = epoch_loop(&dir, &[("EPOCHS", "2"), ("LINK", "data/current")]);
    let help = dir.command().args(["run", "--help"]).assert_success();
    if help.stdout.contains("--link") {
        res.check(res.code() == Some(0), "LINK with a reshard that has --link");
        res.check(
            calls
                .iter()
                .filter(|c| job(c).0.starts_with("reshuffle"))
                .all(|c| c[4].contains("--link data/current")),
            &format!("--link passed to every reshuffle: {calls:?}"),
        );
    } else {
        res.check(
            res.code() == Some(2) && calls.is_empty(),
            "LINK refused before submitting anything while reshard has no --link",
        );
        res.stderr_has("no --link option");
    }
}

#[test]
fn completions_for_each_shell() {
    let dir = Dir::new("completions");
    let bash = dir.command().args(["completions", "bash"]).assert_success();
    bash.check(
        bash.stdout.contains("reshard") && bash.stdout.contains("complete"),
        "a bash completion script",
    );
    for sub in ["run", "plan", "generate"] {
        bash.check(
            bash.stdout.contains(sub),
            &format!("subcommand {sub} completed"),
        );
    }
    bash.check(
        bash.stdout.contains("--shard-size"),
        "run's flags completed",
    );
    // bash accepts it and registers a completion for reshard.
    let script = dir.create_bytes("reshard.bash", bash.stdout.as_bytes());
    dir.program("bash")
        .arg("-c")
        .arg(format!(
            "source '{}' && complete -p reshard",
            script.display()
        ))
        .assert_success();

    let zsh = dir.command().args(["completions", "zsh"]).assert_success();
    zsh.check(
        zsh.stdout.contains("#compdef reshard"),
        "a zsh completion script",
    );
    let fish = dir.command().args(["completions", "fish"]).assert_success();
    fish.check(
        fish.stdout.contains("complete -c reshard"),
        "a fish completion script",
    );
    let bad = dir.command().args(["completions", "tcsh"]).assert_code(2);
    bad.stderr_has("invalid value");
}
