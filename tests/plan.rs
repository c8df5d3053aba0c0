//! Issue 13: `reshard plan` and `run --dry-run` write nothing at all, `plan` refuses the flags
//! only `run` acts on, and an unquoted brace pattern gets a hint.

use crate::util::runs::with_previous_output;
use crate::util::{tree_state, Dir};

#[test]
fn plan_and_dry_run_write_nothing() {
    let dir = Dir::new("plan-nothing");
    with_previous_output(&dir);
    let before = tree_state(dir.path());
    let cases: [&[&str]; 5] = [
        &["plan", "--input", "in"],
        &["plan", "--input", "prev", "--json"],
        &["run", "--dry-run", "--input", "in", "--output", "out"],
        &[
            "run",
            "--dry-run",
            "--input",
            "prev",
            "--output",
            "prev2",
            "--json",
        ],
        &[
            "run",
            "--dry-run",
            "--input",
            "prev",
            "--output",
            "data/epoch-{epoch}",
            "--epoch",
            "3",
            "--link",
            "current",
            "--keep",
            "2",
            "--force",
        ],
    ];
    for np in [1, 2] {
        for args in cases {
            let mut cmd = dir.mpi(np);
            cmd.args(args).args(["--shards", "2", "--seed", "1"]);
            let res = cmd.assert_success();
            res.no_debug_text();
            res.check(
                !res.stderr.contains("assembling"),
                "a plan announced a staging directory",
            );
            res.check(
                tree_state(dir.path()) == before,
                "a plan created, removed or changed files",
            );
        }
    }
    // Reading the previous output's saved index is what it was for.
    let mut cmd = dir.command();
    cmd.args(["plan", "--input", "prev", "--shards", "2", "--seed", "1"]);
    let res = cmd.assert_success();
    res.stderr_has("reused the saved index of 3 of 3 input shards");
    res.check(
        res.stdout.contains("(--balance count)"),
        "the plan names the balance in the flag's syntax",
    );
}

#[test]
fn plan_refuses_flags_only_run_acts_on() {
    let dir = Dir::new("plan-run-only");
    with_previous_output(&dir);
    let before = tree_state(dir.path());
    // Every flag that acts only on a written output or on the data exchange (issue 23: `plan`
    // silently accepted -o, --compress, --checkpoint-every, --stall-timeout).
    let flags: [&[&str]; 19] = [
        &["--output", "out"],
        &["-o", "out"],
        &["--force"],
        &["--verify"],
        &["--compress", "zst"],
        &["--checksum"],
        &["--energon"],
        &["--energon-sample-type", "CaptioningSample"],
        &["--energon-field-map", "{}"],
        &["--dali-index"],
        &["--link", "current"],
        &["--keep", "1"],
        &["--resume"],
        &["--checkpoint-every", "5"],
        &["--stall-timeout", "60"],
        &["--mem-limit", "1GiB"],
        &["--max-round-bytes", "1MiB"],
        &["--report", "report.json"],
        &["--dry-run"],
    ];
    let help = dir.command().args(["plan", "--help"]).assert_success();
    for flag in flags {
        let mut cmd = dir.mpi(1);
        cmd.args(["plan", "--input", "in"])
            .args(["--shards", "2", "--seed", "1"])
            .args(flag);
        let res = cmd.assert_code(2);
        let long = if flag[0] == "-o" { "--output" } else { flag[0] };
        res.stderr_has(&format!("{long} is for `reshard run`"));
        res.stderr_has("Usage: reshard plan ");
        res.check(
            tree_state(dir.path()) == before,
            "a refused plan wrote files",
        );
        help.check(
            !lists_flag(&help.stdout, long),
            &format!("plan --help lists {long}, which plan refuses"),
        );
    }
    // --report would write a file: not with --dry-run either.
    let mut cmd = dir.command();
    cmd.args([
        "run",
        "--dry-run",
        "--input",
        "in",
        "--shards",
        "2",
        "--seed",
        "1",
    ])
    .args(["--report", "report.json"]);
    cmd.assert_code(2).stderr_has("--report");
    assert!(!dir.join("report.json").exists());
}

/// Whether `--help` text lists `flag` as an option (its entry line, indented less than the
/// descriptions, which may mention other flags).
pub fn lists_flag(help: &str, flag: &str) -> bool {
    help.lines().any(|l| {
        let entry = l.trim_start();
        // "  -o, --output <DIR>", "      --force"
        l.len() - entry.len() <= 6 && entry.split([' ', ',']).take(3).any(|w| w == flag)
    })
}

#[test]
fn plan_needs_a_seed_only_where_it_changes_the_plan() {
    let dir = Dir::new("plan-seed");
    with_previous_output(&dir);
    // One shard holds everything whatever the seed.
    let mut cmd = dir.command();
    cmd.args(["plan", "--input", "in", "--shards", "1", "--json"]);
    let res = cmd.assert_success();
    let plan: serde_json::Value = serde_json::from_str(&res.stdout).unwrap();
    assert_eq!(plan["per_shard"][0]["nsamples"], 40);
    // With more shards the seed decides the bytes per shard: required, and said why.
    let mut cmd = dir.command();
    cmd.args(["plan", "--input", "in", "--shards", "2"]);
    cmd.assert_code(2).stderr_has("bytes per shard");
    // Orders that are not random never needed it.
    let mut cmd = dir.command();
    cmd.args(["plan", "--input", "in", "--shards", "2", "--order", "key"]);
    cmd.assert_success();
    // `run` always does: the seed fixes the order inside the shard too.
    let mut cmd = dir.command();
    cmd.args(["run", "--input", "in", "--output", "one", "--shards", "1"]);
    cmd.assert_code(2).stderr_has("--seed");
}

#[test]
fn an_unquoted_brace_pattern_gets_a_hint() {
    let dir = Dir::new("brace-hint");
    with_previous_output(&dir);
    // What the shell makes of --input 'in/train-{000000..000002}.tar' without the quotes.
    let expanded = [
        "in/train-000000.tar",
        "in/train-000001.tar",
        "in/train-000002.tar",
    ];
    for (cmdline, rest) in [
        (
            &["run", "--input"][..],
            &["--output", "o", "--shards", "2", "--seed", "1"][..],
        ),
        (&["plan", "-i"][..], &["--shards", "2", "--seed", "1"][..]),
    ] {
        let mut cmd = dir.command();
        cmd.args(cmdline).args(expanded).args(rest);
        let res = cmd.assert_code(2);
        res.stderr_has("unexpected argument 'in/train-000001.tar'");
        res.stderr_has("hint:");
        res.stderr_has("Quote the pattern");
        res.stderr_has("repeat --input");
        res.check(!dir.join("o").exists(), "nothing is written");
    }
    let mut cmd = dir.command();
    cmd.args(["plan", "--input=in/train-000000.tar", "in/train-000001.tar"])
        .args(["--shards", "2", "--seed", "1"]);
    cmd.assert_code(2).stderr_has("hint:");
    // A stray word that is no path gets clap's message alone.
    let mut cmd = dir.command();
    cmd.args([
        "plan", "--input", "in", "banana", "--shards", "2", "--seed", "1",
    ]);
    let res = cmd.assert_code(2);
    res.stderr_has("unexpected argument 'banana'");
    res.check(
        !res.stderr.contains("hint:"),
        "no hint for a word that is no path",
    );
}
