//! The Slurm recipes in `slurm/` and the consumer examples' scripts, and `reshard completions`.
//!
//! Against a real Slurm 22.05 (Debian 12's slurmctld, slurmd, munge): `util::slurm` starts one
//! cluster of two nodes on this machine for the whole test binary and gives it to one test at a
//! time. reshard runs under `srun --mpi=pmi2` (MPICH's PMI-2 client), the batch scripts through
//! `sbatch` (the test polls the job until it ends), the epoch loop's chain through real
//! dependencies. Only environment modules (`module`) are a stand-in: they are not part of Slurm.
//! Without Slurm (not root, packages missing) these tests print SKIPPED and why (under
//! RESHARD_NO_SKIP=1, as in CI, they fail).

use std::fs;
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::util::runs::run;
use crate::util::slurm::{dataset, python_scripts, shard_counts, shell_scripts, slurm_or_skip};
use crate::util::verifier::{assert_same_output, verify, Expected};
use crate::util::{
    find_on_path, have_python, index_json, reshard_exe, skip, tar_files, tree_state, Dir,
};

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
fn srun_pmi2_at_every_task_count_matches_one_rank() {
    let Some(slurm) = slurm_or_skip("srun_pmi2_at_every_task_count_matches_one_rank") else {
        return;
    };
    let dir = Dir::new("slurm-srun");
    let inputs = dataset(&dir);
    run(&dir, None, &["input"], "one", 7, 11, &[]);
    for tasks in 1..=4 {
        let out = format!("np{tasks}");
        let res = slurm
            .srun(
                &dir,
                "pmi2",
                tasks,
                &[
                    "run", "--input", "input", "--output", &out, "--shards", "7", "--seed", "11",
                ],
            )
            .assert_success();
        res.check(
            format!("{}{}", res.stdout, res.stderr).contains(&format!("on {tasks} rank")),
            &format!("one MPI world of {tasks} ranks"),
        );
        verify(
            &Expected::new(dir.path(), &inputs, 7, 11, tasks),
            &dir.join(&out),
        );
        assert_same_output(&dir.join("one"), &dir.join(&out), &["ranks"]);
    }
}

/// `srun --mpi=none` (or no `--mpi` where `MpiDefault=none`, as in this cluster) starts N worlds
/// of one: every task refuses at once, with exit code 2, and writes nothing.
#[test]
fn srun_without_a_matching_mpi_plugin_is_refused() {
    let Some(slurm) = slurm_or_skip("srun_without_a_matching_mpi_plugin_is_refused") else {
        return;
    };
    let dir = Dir::new("slurm-mpi-none");
    dir.generate(
        "input",
        &["--shards", "3", "--samples", "60", "--seed", "1"],
    );
    let before = tree_state(dir.path());
    for mpi in [Some("--mpi=none"), None] {
        let mut cmd = slurm.program(&dir, "srun");
        cmd.args(["-N", "1", "-n", "3"])
            .args(mpi)
            .arg(reshard_exe())
            .args(["run", "--input", "input", "--output", "out"])
            .args(["--shards", "4", "--seed", "2"]);
        let res = cmd.output();
        res.check(res.code() == Some(2), "refused with exit code 2 (usage)");
        res.stderr_has("srun started 3 tasks but MPI sees a world of 1");
        res.stderr_has("--mpi=pmi2 for MPICH");
        res.stderr_has("--mpi=pmix for Open MPI");
        res.stderr_has("slurm/README.md");
        // Every task refuses (exit code 2 above); the launcher's task 0 says why, once.
        res.check(
            res.stderr.matches("srun started 3 tasks").count() == 1,
            "the refusal is printed once per job",
        );
        // The quiet tasks give task 0 a 3 s head start (src/main.rs SPEAKER_HEAD_START).
        res.check(
            res.elapsed < Duration::from_secs(15),
            "refused within seconds",
        );
        res.check(
            tree_state(dir.path()) == before,
            "nothing written: no output, no staging directory",
        );
    }
    // The batch script with SRUN_MPI=none: the job fails and says why.
    let job = slurm.script_job(
        &dir,
        "slurm/reshard.sbatch",
        &["--nodes=1", "--ntasks-per-node=2"],
        &[
            ("INPUT", "input"),
            ("OUTPUT", "out"),
            ("SHARDS", "4"),
            ("SRUN_MPI", "none"),
            ("REPORT", ""),
            // Task 0 is the last to reach its refusal: the script's --kill-on-bad-exit must
            // not kill it before it says why.
            ("RESHARD_TEST_SLOW_SPEAKER", "1000"),
        ],
    );
    job.check(job.code == Some(2), "the job exits 2");
    job.check(
        job.log
            .contains("srun started 2 tasks but MPI sees a world of 1")
            && !job.log.contains("done in"),
        "the job log says why",
    );
    job.check(!dir.join("out").exists(), "nothing published");
}

#[test]
fn reshard_sbatch_runs_under_slurm() {
    let Some(slurm) = slurm_or_skip("reshard_sbatch_runs_under_slurm") else {
        return;
    };
    let dir = Dir::new("slurm-reshard");
    let inputs = dataset(&dir);
    let job = slurm.script_job(
        &dir,
        "slurm/reshard.sbatch",
        &["--nodes=1", "--ntasks-per-node=3"],
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
        ],
    );
    job.check(job.code == Some(0), "the job succeeded");

    let out = dir.join("out");
    job.check(tar_files(&out).len() == 6, "6 shards in out/");
    let mut exp = Expected::new(dir.path(), &inputs, 6, 11, 3);
    exp.epoch = 3;
    exp.prefix = "part".to_string();
    let v = verify(&exp, &out);
    job.check(v.order.len() == 301, "every sample written once");

    let calls = fs::read_to_string(dir.join("calls.log")).unwrap_or_default();
    job.check(
        calls.contains("module load mpich/4.0"),
        &format!("MODULES loaded: {calls}"),
    );
    // The summary as JSON, and its per-rank table printed by slurm/rank-report.py.
    let report: Value = serde_json::from_slice(&fs::read(dir.join("report.json")).unwrap())
        .unwrap_or_else(|e| panic!("report.json: {e}\n{job:?}"));
    job.check(
        report["per_rank"].as_array().map(Vec::len) == Some(3),
        "three ranks in the report",
    );
    for want in [
        "reshard on 1 nodes x 3 tasks (3 ranks)",
        "done in ",
        "bytes_written",
        "median",
    ] {
        job.check(job.log.contains(want), &format!("{want:?} in the job log"));
    }
    job.check(
        !job.log.contains("WARNING"),
        "3 tasks, 3 ranks: no plugin mismatch",
    );
}

#[test]
fn reshard_sbatch_failure_is_an_error() {
    let Some(slurm) = slurm_or_skip("reshard_sbatch_failure_is_an_error") else {
        return;
    };
    let dir = Dir::new("slurm-reshard-fail");
    dir.generate(
        "input",
        &["--shards", "2", "--samples", "10", "--seed", "1"],
    );
    dir.create_bytes("out/occupied", b"x");
    let job = slurm.script_job(
        &dir,
        "slurm/reshard.sbatch",
        &["--nodes=1", "--ntasks-per-node=2"],
        &[
            ("INPUT", "input"),
            ("OUTPUT", "out"),
            ("SHARDS", "3"),
            ("SRUN_MPI", "pmi2"),
            ("REPORT", ""),
        ],
    );
    job.check(
        job.code.is_some_and(|c| c != 0),
        "a failed job fails the batch job",
    );
    job.check(
        job.log.contains("exists and is not empty") && !job.log.contains("done in "),
        "the reason, and no success message",
    );
}

#[test]
fn rescale_sbatch_gives_equal_shares_per_gpu() {
    let Some(slurm) = slurm_or_skip("rescale_sbatch_gives_equal_shares_per_gpu") else {
        return;
    };
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
    let (gpus, workers) = (2u64, 3u64);
    let job = slurm.script_job(
        &dir,
        "slurm/rescale.sbatch",
        &["--nodes=1", "--ntasks-per-node=2"],
        &[
            ("INPUT", "input"),
            ("OUTPUT", "out"),
            ("GPUS", &gpus.to_string()),
            ("WORKERS", &workers.to_string()),
            ("SHARD_SIZE", "40KiB"),
            ("BATCH_SIZE", "8"),
            ("SRUN_MPI", "pmi2"),
        ],
    );
    job.check(job.code == Some(0), "the job succeeded");
    let out = dir.join("out");
    let files = tar_files(&out);
    let index = index_json(&out);
    let counts = shard_counts(&index);
    job.check(counts.len() == files.len(), "index.json lists every shard");
    job.check(
        !counts.is_empty() && counts.len() as u64 % (gpus * workers) == 0,
        &format!("{} shards: a multiple of {gpus} x {workers}", counts.len()),
    );
    job.check(counts.len() > 6, "--shard-size 40KiB: more than one group");
    // --equalize drop is the default: every shard, hence every GPU, has the same count.
    job.check(
        counts.iter().all(|&c| c == counts[0]),
        &format!("equal shards: {counts:?}"),
    );
    job.check(index["reshard"]["equalize"] == "drop", "equalize drop");
    job.check(index["reshard"]["gpus"]["equal"] == true, "equal per GPU");
    job.check(
        index["reshard"]["gpus"]["batch_size"] == 8,
        "BATCH_SIZE passed",
    );
    job.check(
        !dir.join("calls.log").exists(),
        "no MODULES: no module call",
    );
    let per_gpu = counts[0] * counts.len() as u64 / gpus;
    job.check(
        job.log
            .contains(&format!("samples per GPU: min {per_gpu} max {per_gpu}")),
        "the per-GPU summary printed",
    );
}

/// Two Slurm nodes on this one machine (two slurmd, `slurmd -N NAME`, each on its own port): the
/// batch script's ranks are placed on both, and the output is the one rank's. (The nodes share
/// the host's network, so MPI still talks shared memory between them; `tests/cluster.rs` covers
/// ranks across a network.)
#[test]
fn reshard_sbatch_across_two_nodes() {
    let Some(slurm) = slurm_or_skip("reshard_sbatch_across_two_nodes") else {
        return;
    };
    let dir = Dir::new("slurm-two-nodes");
    let inputs = dataset(&dir);
    run(&dir, None, &["input"], "one", 6, 9, &[]);
    let job = slurm.script_job(
        &dir,
        "slurm/reshard.sbatch",
        &["--nodes=2", "--ntasks-per-node=2"],
        &[
            ("INPUT", "input"),
            ("OUTPUT", "out"),
            ("SHARDS", "6"),
            ("SEED", "9"),
            ("SRUN_MPI", "pmi2"),
            ("REPORT", "report.json"),
        ],
    );
    job.check(job.code == Some(0), "the job succeeded");
    job.check(
        job.log.contains("reshard on 2 nodes x 2 tasks (4 ranks)"),
        "2 nodes x 2 tasks",
    );
    verify(
        &Expected::new(dir.path(), &inputs, 6, 9, 4),
        &dir.join("out"),
    );
    assert_same_output(&dir.join("one"), &dir.join("out"), &["ranks"]);
    // slurm/rank-report.py's table: ranks 0, 1 on n1 and 2, 3 on n2.
    let node_of = |rank: &str| {
        job.log
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .find(|w| w.len() > 2 && w[0] == rank)
            .map(|w| w[1].to_string())
    };
    let nodes: Vec<Option<String>> = ["0", "1", "2", "3"].iter().map(|r| node_of(r)).collect();
    job.check(
        nodes == [Some("n1"), Some("n1"), Some("n2"), Some("n2")].map(|n| n.map(String::from)),
        &format!("ranks placed on n1, n1, n2, n2: {nodes:?}"),
    );
}

/// The epoch loop under Slurm: reshuffle(0), train(0), reshuffle(1), train(1) chained with
/// `--dependency=afterok`, then run: each training reads its epoch's complete data, after its
/// reshuffle ended, and `LINK` points at the newest epoch.
#[test]
fn epoch_loop_chains_training_and_reshuffles() {
    let Some(slurm) = slurm_or_skip("epoch_loop_chains_training_and_reshuffles") else {
        return;
    };
    let dir = Dir::new("slurm-epoch-loop");
    let inputs = dir.generate(
        "input",
        &["--shards", "3", "--samples", "120", "--seed", "2"],
    );
    let jobs = slurm.submit_epoch_loop(&dir, &[("EPOCHS", "2"), ("LINK", "data/current")]);
    let names: Vec<&str> = jobs.iter().map(|j| j.1.as_str()).collect();
    assert_eq!(
        names,
        ["reshuffle-0", "train-0", "reshuffle-1", "train-1"],
        "{jobs:?}"
    );
    let id = |i: usize| jobs[i].0;
    let deps: Vec<&[u64]> = jobs.iter().map(|j| j.2.as_slice()).collect();
    let want: [&[u64]; 4] = [&[], &[id(0)], &[id(0)], &[id(2), id(1)]];
    assert_eq!(deps, want, "afterok dependencies: {jobs:?}");

    let ids: Vec<u64> = jobs.iter().map(|j| j.0).collect();
    let list: Vec<String> = ids.iter().map(u64::to_string).collect();
    slurm
        .program(&dir, "scontrol")
        .args(["release", &list.join(",")])
        .assert_success();
    let logs = || {
        let mut text = crate::util::listing(dir.path());
        for e in fs::read_dir(dir.path()).unwrap().filter_map(Result::ok) {
            if e.file_name().to_string_lossy().ends_with(".out") {
                text += &format!("--- {:?} ---\n", e.file_name());
                text += &fs::read_to_string(e.path()).unwrap_or_default();
            }
        }
        text
    };
    let ended = slurm.wait_jobs(&ids, Duration::from_secs(120));
    let states: Vec<(String, String, String)> = ids
        .iter()
        .map(|&id| {
            let f = |k| slurm.job_field(id, k);
            (f("JobName"), f("JobState"), f("Reason"))
        })
        .collect();
    assert!(
        ended,
        "jobs still active after 120 s: {states:?}\n{}",
        logs()
    );
    for &(id, ref name, _) in &jobs {
        let (state, code) = (
            slurm.job_field(id, "JobState"),
            slurm.job_field(id, "ExitCode"),
        );
        assert!(
            state == "COMPLETED" && code == "0:0",
            "{name} (job {id}): {state}, exit {code}\n{}",
            logs()
        );
    }
    // Each training started after its reshuffle ended (ISO times compare as strings).
    for (train, shuffle) in [(1, 0), (3, 2)] {
        let started = slurm.job_field(id(train), "StartTime");
        let ended = slurm.job_field(id(shuffle), "EndTime");
        assert!(
            started >= ended,
            "{} started {started}, before {ended}",
            jobs[train].1
        );
    }
    let trained = fs::read_to_string(dir.join("trained.log")).unwrap_or_default();
    assert_eq!(
        trained,
        "0 data/epoch-0 4\n1 data/epoch-1 4\n",
        "what the trainings read\n{}",
        logs()
    );
    for epoch in [0, 1] {
        let mut exp = Expected::new(dir.path(), &inputs, 4, 5, 2);
        exp.epoch = epoch;
        verify(&exp, &dir.join(format!("data/epoch-{epoch}")));
    }
    let link = fs::read_link(dir.join("data/current")).expect("data/current is a symbolic link");
    assert!(
        link.ends_with("epoch-1"),
        "data/current -> {}",
        link.display()
    );
}

/// An existing first epoch is not reshuffled again; OVERLAP=0 starts each reshuffle only after
/// the training before it.
#[test]
fn epoch_loop_without_overlap_waits_for_training() {
    let Some(slurm) = slurm_or_skip("epoch_loop_without_overlap_waits_for_training") else {
        return;
    };
    let dir = Dir::new("slurm-epoch-loop-existing");
    dir.create_bytes("data/epoch-0/index.json", b"{}");
    let jobs = slurm.submit_epoch_loop(&dir, &[("EPOCHS", "2"), ("OVERLAP", "0")]);
    let found: Vec<(&str, Vec<usize>)> = jobs
        .iter()
        .map(|(_, name, after)| {
            let pos = after
                .iter()
                .map(|a| {
                    jobs.iter()
                        .position(|j| j.0 == *a)
                        .expect("a job of the loop")
                })
                .collect();
            (name.as_str(), pos)
        })
        .collect();
    let want = vec![
        ("train-0", vec![]),
        ("reshuffle-1", vec![0]),
        ("train-1", vec![1, 0]),
    ];
    slurm.cancel_all();
    assert_eq!(found, want, "job chain: {jobs:?}");
}

/// `scancel` of a reshard step that is in its finish phase (held there by
/// RESHARD_TEST_PAUSE_FINISH) ends it with nothing published; the rerun succeeds.
#[test]
fn scancel_of_a_running_step_publishes_nothing_and_resume_continues() {
    let Some(slurm) =
        slurm_or_skip("scancel_of_a_running_step_publishes_nothing_and_resume_continues")
    else {
        return;
    };
    let dir = Dir::new("slurm-scancel");
    // 16 MiB in rounds of a few hundred KiB (--mem-limit 2MiB below): the step checkpoints many
    // times before its finish phase.
    dir.generate(
        "input",
        &[
            "--shards",
            "5",
            "--samples",
            "4000",
            "--mean-size",
            "4KiB",
            "--seed",
            "4",
        ],
    );
    run(&dir, None, &["input"], "one", 5, 3, &[]);
    let args = [
        "run",
        "--input",
        "input",
        "--output",
        "out",
        "--shards",
        "5",
        "--seed",
        "3",
        "--checkpoint-every",
        "0",
        "--mem-limit",
        "2MiB",
    ];
    let mut step = slurm.srun(&dir, "pmi2", 2, &args);
    step.env("RESHARD_TEST_PAUSE_FINISH", "60");
    let handle = thread::spawn(move || step.output());
    let started = Instant::now();
    while !dir.join(".out.reshard-tmp/.paused-1").exists() {
        assert!(
            !handle.is_finished(),
            "the step ended before its finish phase"
        );
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the step did not reach its finish phase within 60 s"
        );
        thread::sleep(Duration::from_millis(50));
    }
    let jobs = slurm.queue();
    assert_eq!(jobs.len(), 1, "one job running: {jobs:?}");
    let cancelled = Instant::now();
    slurm
        .program(&dir, "scancel")
        .arg(jobs[0].to_string())
        .assert_success();
    let res = handle.join().expect("the step's thread");
    res.check(res.code() != Some(0), "a cancelled step fails");
    res.check(
        cancelled.elapsed() < Duration::from_secs(20),
        "the step ended within seconds of scancel",
    );
    res.check(!dir.join("out").exists(), "nothing published");
    assert!(
        slurm.wait_jobs(&jobs, Duration::from_secs(20)),
        "the job ended"
    );

    // The cancelled step checkpointed every round, so the rerun continues from its staging
    // directory instead of starting over.
    let resumed: Vec<&str> = args.iter().copied().chain(["--resume"]).collect();
    let rerun = slurm.srun(&dir, "pmi2", 2, &resumed).assert_success();
    let said = format!("{}{}", rerun.stdout, rerun.stderr);
    rerun.check(
        said.contains("resumed: reused") && !said.contains("reused 0 samples"),
        "the rerun reused what the cancelled step had placed",
    );
    rerun.check(
        !dir.join(".out.reshard-tmp").exists(),
        "no staging directory left",
    );
    assert_same_output(&dir.join("one"), &dir.join("out"), &["ranks"]);
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
