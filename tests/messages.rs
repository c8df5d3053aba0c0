//! Issues 22 and 23: what reshard prints to stderr reaches it whole, once per job. Every line is
//! written with one write(2) (seen with strace), so that lines of several ranks never interleave
//! mid-line; a usage error, which every rank meets alike, is printed by one rank.

use std::fs;

use crate::util::{find_on_path, Dir, RunOutput};

/// `reshard generate`'s small input, three shards.
fn small_input(dir: &Dir) {
    dir.generate("in", &["--shards", "3", "--samples", "30", "--seed", "1"]);
}

#[test]
fn a_usage_error_is_printed_once_per_job() {
    let dir = Dir::new("usage-once");
    small_input(&dir);
    let cases: [(&[&str], &str); 3] = [
        // Refused while resolving the flags, before MPI.
        (
            &[
                "run", "-i", "in", "-o", "out", "--shards", "0", "--seed", "1",
            ],
            "--shards must be at least 1",
        ),
        // Refused by clap.
        (&["run", "-i", "in", "-o", "out", "--bogus"], "--bogus"),
        (&["plan", "-i", "in", "--shards", "2"], "--seed"),
    ];
    for (args, needle) in cases {
        let res = dir.mpi(4).args(args).assert_code(2);
        let said = res.stderr.lines().filter(|l| l.contains(needle)).count();
        res.check(
            said == 1,
            &format!("the usage error must be printed once, not {said} times"),
        );
        res.check(!dir.join("out").exists(), "an output was created");
    }
    // Processes that all exit before hydra has finished setting them up once killed mpirun
    // with SIGPIPE (exit 141, the message lost), about 1 run in 60 on a loaded machine: every
    // process now joins MPI before it ends. Repeated to give the race its chances.
    for _ in 0..25 {
        let res = dir.mpi(4).args(["run", "--bogus"]).assert_code(2);
        res.check(
            res.stderr.contains("--bogus"),
            "the usage error must reach stderr",
        );
    }
}

/// Every write reshard makes to stderr (fd 2) in the strace logs `trace.*` under `dir`: the
/// written text, as strace escapes it.
fn stderr_writes(dir: &Dir) -> Vec<String> {
    let mut writes = Vec::new();
    for e in fs::read_dir(dir.path()).unwrap() {
        let path = e.unwrap().path();
        if !path
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("trace.")
        {
            continue;
        }
        let log = fs::read(&path).unwrap();
        for line in String::from_utf8_lossy(&log).lines() {
            if let Some(rest) = line.strip_prefix("write(2, \"") {
                let text = rest.rsplit_once("\", ").map_or(rest, |(t, _)| t);
                writes.push(text.to_string());
            }
        }
        fs::remove_file(&path).unwrap();
    }
    writes
}

/// Runs `args` under `mpirun -np np strace …` and checks that every write to stderr is whole
/// lines: it ends with a newline (strace shows `\n`) and starts a line.
fn lines_are_single_writes(
    dir: &Dir,
    np: usize,
    args: &[&str],
    envs: &[(&str, &str)],
) -> RunOutput {
    let wrapper = [
        "strace",
        "-f",
        "-qq",
        "-e",
        "trace=write",
        "-e",
        "signal=none",
        "-s",
        "8192",
        "-ff",
        "-o",
        "trace",
    ];
    let mut cmd = dir.mpi_through(np, &wrapper);
    cmd.args(args);
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let res = cmd.output();
    let writes = stderr_writes(dir);
    res.check(!writes.is_empty(), "strace saw no write to stderr");
    for w in &writes {
        res.check(
            w.ends_with("\\n") && !w.ends_with("...") && w.len() < 8192,
            &format!("a write to stderr that is not whole lines: {w:?}"),
        );
    }
    res
}

#[test]
fn every_line_is_one_write() {
    if find_on_path("strace").is_none() {
        // The check needs strace: a missing one is a missing test tool, not a pass.
        panic!("strace not found on PATH: apt-get install strace");
    }
    let dir = Dir::new("one-write");
    small_input(&dir);
    // Progress lines, the summary, and every rank's finalize-deadline message at once.
    let res = lines_are_single_writes(
        &dir,
        3,
        &[
            "run",
            "-i",
            "in",
            "-o",
            "out",
            "--shards",
            "3",
            "--seed",
            "1",
            "--progress",
            "lines",
        ],
        &[
            ("RESHARD_TEST_HANG_FINALIZE", "all"),
            ("RESHARD_FINALIZE_TIMEOUT", "1"),
        ],
    );
    res.check(res.code() == Some(0), "the run must succeed");
    res.stderr_has("MPI_Finalize did not return within 1 s");
    // A usage error (several lines from clap, with a hint) and an error of the job.
    let res = lines_are_single_writes(&dir, 2, &["run", "-i", "in", "-o", "out", "--bogus"], &[]);
    res.check(res.code() == Some(2), "a usage error exits 2");
    let res = lines_are_single_writes(
        &dir,
        2,
        &[
            "run", "-i", "missing", "-o", "out2", "--shards", "3", "--seed", "1",
        ],
        &[],
    );
    res.check(res.code() == Some(1), "a missing input fails the job");
    res.stderr_has("reshard: error:");
}

/// One of each: no "1 shards", "1 ranks" or "1 input shards" in what a run says, and a
/// directory without shards is named as such (compressed shards count).
#[test]
fn counts_of_one_are_singular() {
    let dir = Dir::new("singular");
    dir.generate("in", &["--shards", "1", "--samples", "8", "--seed", "1"]);
    let res = dir
        .command()
        .args([
            "run", "-i", "in", "-o", "out", "--shards", "1", "--seed", "1",
        ])
        .assert_success();
    res.no_debug_text();
    let said = format!("{}{}", res.stdout, res.stderr);
    res.check(
        said.contains("wrote 1 shard (8 samples")
            && said.contains("indexing 1 input shard (")
            && said.contains("on 1 rank"),
        "singular counts",
    );
    for wrong in ["1 shards", "1 ranks", "1 input shards"] {
        res.check(!said.contains(wrong), &format!("said {wrong:?}"));
    }
    fs::create_dir(dir.join("empty")).unwrap();
    let res = dir
        .command()
        .args([
            "run", "-i", "empty", "-o", "out2", "--shards", "1", "--seed", "1",
        ])
        .assert_code(1);
    res.stderr_has("holds no shards (*.tar, *.tar.gz, *.tgz, *.tar.zst)");
}

/// `--help` speaks of the command line only: `--on-duplicate keep` is not "the default of the
/// library API".
#[test]
fn help_speaks_of_the_command_line_only() {
    let dir = Dir::new("help-text");
    let res = dir.command().args(["run", "--help"]).assert_success();
    res.check(res.stdout.contains("--on-duplicate"), "the flag is listed");
    res.check(
        !res.stdout.contains("library API"),
        "help mentions the library API",
    );
}

/// Issue 38: the words a first run prints. One process names no rank in its error; counts
/// agree with their nouns; a shard size nobody gave is called the default; saved indexes
/// reused say what they stand in for.
#[test]
fn first_run_words_agree_with_what_happened() {
    let dir = Dir::new("words");
    small_input(&dir);
    let res = dir
        .command()
        .args([
            "run", "-i", "missing", "-o", "out", "--shards", "2", "--seed", "1",
        ])
        .assert_code(1);
    res.stderr_has("reshard: error: input missing");
    res.check(
        !res.stderr.contains("rank 0 of 1"),
        "one process named a rank",
    );
    let res = dir
        .mpi(2)
        .args(["run", "-i", "missing", "-o", "out"])
        .args(["--shards", "2", "--seed", "1"])
        .assert_code(1);
    res.stderr_has("rank 0 of 2");
    let res = dir
        .command()
        .args(["plan", "-i", "in", "--gpus", "3", "--seed", "1"])
        .assert_success();
    let text = format!("{}{}", res.stdout, res.stderr);
    res.check(
        text.contains("3 GPUs x 1 worker: 1 shard per GPU"),
        "plurals",
    );
    res.check(
        text.contains("nearest the default --shard-size 512.00 MiB"),
        "the default shard size is no --shard-size given",
    );
    dir.command()
        .args([
            "run", "-i", "in", "-o", "first", "--shards", "2", "--seed", "1",
        ])
        .assert_success();
    let res = dir
        .command()
        .args([
            "run", "-i", "first", "-o", "second", "--shards", "2", "--seed", "1",
        ])
        .assert_success();
    res.stderr_has(
        "reused the saved index of 2 of 2 input shards instead of reading their tar headers",
    );
    // An output's missing parent is created, as --scratch is; a dry run only says so.
    let res = dir
        .command()
        .args([
            "run", "-i", "in", "-o", "new/x", "--shards", "2", "--seed", "1",
        ])
        .args(["--dry-run"])
        .assert_success();
    res.stderr_has("--dry-run: would create new for the output");
    res.check(!dir.join("new").exists(), "a dry run created the parent");
    let res = dir
        .command()
        .args([
            "run", "-i", "in", "-o", "new/x", "--shards", "2", "--seed", "1",
        ])
        .assert_success();
    res.stderr_has("created new for the output");
    res.check(dir.join("new/x/index.json").is_file(), "no output in new/x");
}
