//! A command line that cannot work exits 2 with one `reshard: error:` line naming the flag, the
//! same way for every subcommand, before MPI starts and before anything is read or written.

use crate::util::{find_on_path, skip, Dir};

#[test]
fn every_subcommand_exits_2_for_a_bad_argument() {
    let dir = Dir::new("usage-every-command");
    let cases: [(&[&str], &str); 7] = [
        (
            &[
                "run", "-i", "in", "-o", "out", "--shards", "0", "--seed", "1",
            ],
            "--shards",
        ),
        (
            &["plan", "-i", "in", "--shards", "0", "--seed", "1"],
            "--shards",
        ),
        (&["generate", "-o", "out", "--shards", "0"], "--shards"),
        (&["generate", "-o", "out", "--format", "zip"], "--format"),
        (
            &["generate", "-o", "out", "--shards", "3", "--samples", "2"],
            "at least one sample",
        ),
        (
            &["verify", "-i", "in", "-o", "out", "--shards", "2"],
            "--shards",
        ),
        (&["verify", "-i", "in"], "--output"),
    ];
    for np in [None, Some(2)] {
        for (args, flag) in cases {
            let res = dir.reshard(np).args(args).assert_code(2);
            res.stderr_has("error:");
            res.stderr_has(flag);
            res.check(!dir.join("out").exists(), "an output was created");
        }
    }
}

/// Issue 23: `run --help` groups its flags under headings, and its usage line names what is
/// required: the flags that a command line without any are told are missing.
#[test]
fn run_help_is_grouped_and_its_usage_names_the_required_flags() {
    let dir = Dir::new("usage-help");
    let help = dir.command().args(["run", "--help"]).assert_success();
    let headings = [
        "Input:",
        "Sizing:",
        "Order:",
        "Output and loaders:",
        "Epochs:",
        "Resume:",
        "Performance:",
        "Diagnostics:",
    ];
    for heading in headings {
        help.check(
            help.stdout.lines().any(|l| l == heading),
            &format!("run --help has no heading {heading:?}"),
        );
    }
    help.check(
        help.stdout.contains(".tar.zst") && help.stdout.contains(".tgz"),
        "--input's help names the compressed shards it reads",
    );
    let usage = help
        .stdout
        .lines()
        .find(|l| l.starts_with("Usage:"))
        .unwrap_or_else(|| help.fail("no usage line"));
    // All missing flags at once, in one message, each also on the usage line.
    let res = dir.reshard(Some(2)).arg("run").assert_code(2);
    for flag in [
        "--input",
        "--output",
        "--shards",
        "--shard-size",
        "--gpus",
        "--seed",
    ] {
        res.stderr_has(flag);
        res.check(
            usage.contains(&format!("{flag} <")),
            &format!("the usage line does not show {flag}: {usage}"),
        );
    }
    res.check(
        res.stderr.contains("missing 4 flags"),
        "the missing flags were not named together",
    );
}

/// Issue 23: clap's own refusals name what is missing and what is allowed.
#[test]
fn clap_refusals_name_what_is_missing_and_allowed() {
    let dir = Dir::new("usage-clap");
    let base = [
        "run", "-i", "in", "-o", "out", "--shards", "2", "--seed", "1",
    ];
    let res = dir
        .command()
        .args(base)
        .args(["--split-shards", "2"])
        .assert_code(2);
    res.stderr_has("--split <NAME=SHARE,...>");
    let res = dir
        .command()
        .args(base)
        .args(["--progress", "fancy"])
        .assert_code(2);
    res.stderr_has("auto, bar, lines, none");
}

/// Issue 23: `reshard man [COMMAND]` prints man pages made from the flag definitions; each
/// renders with man(1), without complaint, and lists every flag the command's `--help` lists.
#[test]
fn man_pages_render_and_list_every_flag() {
    let dir = Dir::new("usage-man");
    if find_on_path("man").is_none() {
        return skip(
            "man_pages_render_and_list_every_flag",
            "man(1) is not installed",
        );
    }
    let pages = [
        "",
        "run",
        "plan",
        "verify",
        "generate",
        "completions",
        "man",
    ];
    for page in pages {
        let name = format!("reshard{}{page}.1", if page.is_empty() { "" } else { "-" });
        let roff = dir
            .command()
            .arg("man")
            .args(Some(page).filter(|p| !p.is_empty()))
            .assert_success();
        dir.create_bytes(&name, roff.stdout.as_bytes());
        // Wide enough that no flag is hyphenated across lines.
        let shown = dir
            .program("man")
            .args(["-l", &name])
            .env("MANWIDTH", "1000")
            .assert_success();
        shown.check(shown.stderr.trim().is_empty(), "man complained");
        let help = dir
            .command()
            .args(Some(page).filter(|p| !p.is_empty()))
            .arg("--help")
            .assert_success();
        let flags = help_flags(&help.stdout);
        help.check(flags.len() > 1, "no flags found in --help");
        for flag in flags {
            shown.check(
                shown.stdout.split([' ', ',', '\n']).any(|w| w == flag),
                &format!("{name} does not list {flag}"),
            );
        }
    }
    // The top page names every command's page, and `--help` says what each command is for.
    let help = dir.command().arg("--help").assert_success();
    for page in &pages[1..] {
        help.check(
            help.stdout.lines().any(|l| {
                l.strip_prefix(&format!("  {page} "))
                    .is_some_and(|about| !about.trim().is_empty())
            }),
            &format!("reshard --help does not say what {page} is for"),
        );
    }
    let top = dir.command().arg("man").assert_success();
    for page in &pages[1..] {
        top.check(
            top.stdout.contains(&format!("reshard\\-{page}(1)")),
            &format!("reshard(1) does not name reshard-{page}(1)"),
        );
    }
}

/// The flags `--help` lists: its entry lines ("  -o, --output <DIR>", "      --force").
fn help_flags(help: &str) -> Vec<String> {
    help.lines()
        .filter(|l| l.starts_with("  -") || l.starts_with("      -"))
        .flat_map(|l| l.split([' ', ',']))
        .filter(|w| w.starts_with('-'))
        .map(str::to_string)
        .collect()
}

/// Issue 38: `run -h` fits a screen (the flags a first run needs; `--help` has every flag), and
/// `verify`'s usage line shows that `--input` repeats.
#[test]
fn short_help_fits_a_screen_and_usage_lines_show_repeats() {
    let dir = Dir::new("usage-short");
    for command in ["run", "plan"] {
        let short = dir.command().args([command, "-h"]).assert_success();
        let long = dir.command().args([command, "--help"]).assert_success();
        let lines = short.stdout.lines().count();
        short.check(lines <= 50, &format!("{command} -h is {lines} lines"));
        short.check(
            short.stdout.contains("--help"),
            "-h does not point to --help",
        );
        for flag in ["--input", "--shards", "--seed", "--epoch", "--equalize"] {
            short.check(short.stdout.contains(flag), &format!("-h lacks {flag}"));
        }
        long.check(
            long.stdout.contains("--max-read-rate") && !short.stdout.contains("--max-read-rate"),
            "--help shows every flag, -h the first ones",
        );
    }
    let res = dir.command().args(["verify", "--bogus"]).assert_code(2);
    res.stderr_has("Usage: reshard verify --input <SPEC>... --output <DIR>");
}

/// A malformed endpoint variable is a usage error (exit 2) naming it and what a valid value
/// looks like, before any I/O: the S3 client panicked on each of these (exit 70). An input list
/// file naming `s3://` shards is read first; its endpoint is refused as clearly when the client
/// is made.
#[test]
fn a_malformed_s3_endpoint_is_a_usage_error_naming_the_variable() {
    let dir = Dir::new("s3-endpoint");
    std::fs::write(dir.join("list.txt"), b"s3://bucket/in/a.tar\n").unwrap();
    // Only the variable under test is set (a removal applies after every variable set).
    let other = |name: &str| {
        if name == "AWS_ENDPOINT_URL" {
            "AWS_ENDPOINT_URL_S3"
        } else {
            "AWS_ENDPOINT_URL"
        }
    };
    for (name, value, why) in [
        ("AWS_ENDPOINT_URL", "127.0.0.1:8333", "no scheme"),
        ("AWS_ENDPOINT_URL", "http://127.0.0.1 :8333", "holds ' '"),
        (
            "AWS_ENDPOINT_URL",
            "http://127.0.0.1:99999",
            "from 1 to 65535",
        ),
        ("AWS_ENDPOINT_URL", "http://", "host is empty"),
        ("AWS_ENDPOINT_URL", "http://:8333", "host is empty"),
        ("AWS_ENDPOINT_URL_S3", "localhost:8333", "no scheme"),
    ] {
        let commands: [&[&str]; 4] = [
            &["run", "--input", "s3://bucket/in", "--output", "out"],
            &["run", "--input", "in", "--output", "s3://bucket/out"],
            &["plan", "--input", "s3://bucket/in"],
            &["verify", "--input", "s3://bucket/in", "--output", "out"],
        ];
        for args in commands {
            let mut cmd = dir.mpi(1);
            cmd.args(args).args(["--shards", "2", "--seed", "1"]);
            if args[0] == "verify" {
                cmd = dir.mpi(1);
                cmd.args(args);
            }
            cmd.env("AWS_ACCESS_KEY_ID", "id")
                .env("AWS_SECRET_ACCESS_KEY", "secret")
                .env_remove(other(name))
                .env("AWS_MAX_ATTEMPTS", "1")
                .env(name, value);
            let out = cmd.assert_code(2);
            out.stderr_has(&format!("{name}={value:?} is not a valid S3 endpoint: "));
            out.stderr_has(why);
            out.stderr_has("expected a URL such as http://");
            out.no_debug_text();
            out.check(!dir.join("out").exists(), "an output was made");
        }
        let mut cmd = dir.mpi(1);
        cmd.args(["run", "--input", "@list.txt", "--output", "out"])
            .args(["--shards", "2", "--seed", "1"])
            .env("AWS_ACCESS_KEY_ID", "id")
            .env("AWS_SECRET_ACCESS_KEY", "secret")
            .env_remove(other(name))
            .env("AWS_MAX_ATTEMPTS", "1")
            .env(name, value);
        let out = cmd.output();
        out.check(matches!(out.code(), Some(1 | 2)), "a refusal, not a panic");
        out.stderr_has(&format!("{name}={value:?} is not a valid S3 endpoint: "));
        out.no_debug_text();
    }
}
