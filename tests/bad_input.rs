//! Failures: bad input, unsafe or invalid outputs, impossible requests. Each must fail fast on
//! every rank with a clear message, publish nothing, leave no staging directory and leave the
//! input untouched.

use std::fs;
use std::path::Path;
use std::time::Duration;

use crate::util::data::plain_headers;
use crate::util::runs::{bad_shard, fails_cleanly, run};
use crate::util::tar::{header_offsets, tar_of};
use crate::util::verifier::{input_samples, verify, Expected};
use crate::util::{noise, says, snapshot, with_tmpfs, Dir, FAIL_FAST};

#[test]
fn not_a_tar() {
    bad_shard("not-a-tar", 0, |_| {
        (noise(7, 8192), vec!["byte offset 0".into()])
    });
}

#[test]
fn truncated_inside_member_data() {
    bad_shard("truncated", 1, |b| {
        // Cut in the middle of the fourth member's data: the message names its header.
        let h = header_offsets(b)[3];
        (
            b[..h + 512 + 100].to_vec(),
            vec![format!("byte offset {h}"), "truncated".into()],
        )
    });
}

#[test]
fn truncated_inside_a_header() {
    bad_shard("truncated-header", 2, |b| {
        let h = header_offsets(b)[4];
        (b[..h + 100].to_vec(), vec![format!("byte offset {h}")])
    });
}

#[test]
fn bad_header_checksum() {
    bad_shard("checksum", 2, |b| {
        let h = header_offsets(b)[2];
        let mut b = b.to_vec();
        b[h + 3] ^= 0x55; // inside the third member's name
        (b, vec![format!("byte offset {h}"), "checksum".into()])
    });
}

#[test]
fn keyless_member_between_members_of_one_sample() {
    // x.jpg (1 block of data) at 0, a.jpg at 1024, README at 2048, a.cls after it.
    let bytes = tar_of(&[
        ("x.jpg", b"xx"),
        ("a.jpg", b"12345"),
        ("README", b"no key"),
        ("a.cls", b"1"),
    ]);
    bad_shard("keyless", 1, |_| {
        (
            bytes.clone(),
            vec!["byte offset 2048".into(), "README".into()],
        )
    });
}

#[test]
fn missing_input_file() {
    let dir = Dir::new("missing");
    plain_headers(&dir);
    for np in [1, 3] {
        let res = fails_cleanly(&dir, np, &["in", "in/nope.tar"], "out");
        res.stderr_has("nope.tar");
    }
}

#[test]
fn existing_output_needs_force() {
    let dir = Dir::new("force");
    let inputs = plain_headers(&dir);
    dir.create_bytes("out/keep.txt", b"precious");
    let before = snapshot(&dir.join("out"));
    for np in [1, 3] {
        let res = dir
            .mpi(np)
            .args(["run", "--input", "in", "--output", "out", "--shards", "3"])
            .args(["--seed", "1"])
            .assert_code(1);
        res.stderr_has("reshard: error:");
        res.stderr_has("--force");
        res.check(res.elapsed < FAIL_FAST, "took too long to fail");
        res.check(snapshot(&dir.join("out")) == before, "the output changed");
        res.check(
            !dir.join(".out.reshard-tmp").exists(),
            "the staging directory was left behind",
        );
    }
    // --force replaces only an empty directory or a reshard output: refused, naming keep.txt.
    let res = dir
        .mpi(2)
        .args(["run", "--input", "in", "--output", "out", "--shards", "3"])
        .args(["--seed", "1", "--force"])
        .assert_code(1);
    res.stderr_has("a directory holding keep.txt but no index.json written by reshard");
    res.check(snapshot(&dir.join("out")) == before, "the output changed");
    fs::remove_file(dir.join("out/keep.txt")).unwrap();
    run(&dir, Some(3), &["in"], "out", 3, 1, &["--force"]);
    verify(
        &Expected::new(dir.path(), &inputs, 3, 1, 3),
        &dir.join("out"),
    );
    // ...and replaces an earlier output too.
    run(&dir, Some(2), &["in"], "out", 4, 2, &["--force"]);
    verify(
        &Expected::new(dir.path(), &inputs, 4, 2, 2),
        &dir.join("out"),
    );

    // A staging directory left by a run that was killed is cleared, not published.
    dir.create_bytes(".again.reshard-tmp/shard-000000.tar", b"half written");
    run(&dir, Some(2), &["in"], "again", 3, 1, &[]);
    verify(
        &Expected::new(dir.path(), &inputs, 3, 1, 2),
        &dir.join("again"),
    );

    // An existing empty directory is not in the way.
    dir.create_dir("empty");
    run(&dir, Some(2), &["in"], "empty", 3, 1, &[]);
    verify(
        &Expected::new(dir.path(), &inputs, 3, 1, 2),
        &dir.join("empty"),
    );
}

#[test]
fn output_over_input_is_refused() {
    let dir = Dir::new("overwrite");
    plain_headers(&dir);
    for np in [1, 3] {
        for (spec, out) in [("in", "in"), ("in/train-000000.tar", "in")] {
            let before = snapshot(&dir.join("in"));
            let res = dir
                .mpi(np)
                .args(["run", "--input", spec, "--output", out, "--force"])
                .args(["--shards", "2", "--seed", "1"])
                .assert_code(1);
            res.stderr_has("reshard: error:");
            res.check(res.elapsed < FAIL_FAST, "took too long to fail");
            res.check(snapshot(&dir.join("in")) == before, "the input changed");
            res.check(
                !dir.join(".in.reshard-tmp").exists(),
                "the staging directory was left behind",
            );
        }
    }
    // The output would be a directory that holds the input directory.
    fs::create_dir(dir.join("outer")).unwrap();
    fs::rename(dir.join("in"), dir.join("outer/in")).unwrap();
    let before = snapshot(&dir.join("outer"));
    let res = dir
        .mpi(2)
        .args(["run", "--input", "outer/in", "--output", "outer", "--force"])
        .args(["--shards", "2", "--seed", "1"])
        .assert_code(1);
    res.stderr_has("reshard: error:");
    res.check(snapshot(&dir.join("outer")) == before, "the input changed");
}

#[test]
fn usage_errors_exit_2() {
    let dir = Dir::new("usage");
    plain_headers(&dir);
    let base = ["run", "--input", "in", "--output", "out"];
    let cases: [(&[&str], &str); 5] = [
        (&["--shards", "0", "--seed", "1"], "--shards"),
        (&["--shards", "2"], "--seed"),
        (
            &["--shards", "2", "--seed", "1", "--mem-limit", "lots"],
            "--mem-limit",
        ),
        (
            &["--shards", "2", "--seed", "1", "--prefix", "a/b"],
            "--prefix",
        ),
        (
            &["--shards", "2", "--seed", "1", "--no-such-flag"],
            "--no-such-flag",
        ),
    ];
    for np in [None, Some(1), Some(3)] {
        for (args, needle) in cases {
            let res = dir
                .reshard(np)
                .args(base)
                .args(args)
                .timeout(2 * FAIL_FAST)
                .assert_code(2);
            res.stderr_has(needle);
            res.check(res.elapsed < FAIL_FAST, "took too long to fail");
            res.check(!dir.join("out").exists(), "output created");
            res.check(!dir.join(".out.reshard-tmp").exists(), "staging created");
        }
    }
}

#[test]
fn more_shards_than_samples() {
    let dir = Dir::new("too-many");
    let inputs = dir.generate(
        "in",
        &["--shards", "2", "--samples", "10", "--mean-size", "100"],
    );
    for np in [1, 3] {
        let mut cmd = dir.mpi(np);
        cmd.args(["run", "--input", "in", "--output", "out", "--shards", "11"])
            .args(["--seed", "1"]);
        let res = cmd.assert_code(1);
        res.stderr_has("reshard: error:");
        res.stderr_has("11");
        res.stderr_has("10 samples");
        res.check(res.elapsed < FAIL_FAST, "took too long to fail");
        res.check(!dir.join("out").exists(), "output published");
        res.check(!dir.join(".out.reshard-tmp").exists(), "staging left");
    }
    // Exactly one sample per shard is fine.
    run(&dir, Some(3), &["in"], "out", 10, 1, &[]);
    let v = verify(
        &Expected::new(dir.path(), &inputs, 10, 1, 3),
        &dir.join("out"),
    );
    assert_eq!(v.counts, vec![1; 10]);
}

#[test]
fn empty_input() {
    let dir = Dir::new("empty");
    // A tar holding only a directory entry.
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Directory);
    h.set_size(0);
    h.set_mode(0o755);
    b.append_data(&mut h, "dir/", &b""[..]).unwrap();
    dir.create_bytes("in/dir-only.tar", &b.into_inner().unwrap());
    // An empty archive as GNU tar writes it (ten zero blocks), and an empty file.
    dir.create_bytes("in/zeros.tar", &[0u8; 10240]);
    dir.create_bytes("in/zero-length.tar", b"");
    for p in ["in/dir-only.tar", "in/zeros.tar", "in/zero-length.tar"] {
        assert!(input_samples(Path::new(&dir.join(p))).samples.is_empty());
    }
    for np in [1, 3] {
        for spec in [
            "in/dir-only.tar",
            "in/zeros.tar",
            "in/zero-length.tar",
            "in",
        ] {
            let res = fails_cleanly(&dir, np, &[spec], "out");
            res.stderr_has("no samples");
        }
    }
}

#[test]
fn a_panic_on_one_rank_aborts_every_rank() {
    let dir = Dir::new("panic");
    plain_headers(&dir);
    let before = snapshot(&dir.join("in"));
    let run = |panic_rank: Option<&str>| {
        let mut cmd = dir.mpi(3);
        cmd.args([
            "run", "--input", "in", "--output", "out", "--shards", "3", "--seed", "1",
        ]);
        if let Some(r) = panic_rank {
            cmd.env("RESHARD_TEST_PANIC_RANK", r);
        }
        cmd.timeout(2 * FAIL_FAST).output()
    };
    // Rank 1 panics while the others wait in a collective: MPI_Abort must end them all.
    let res = run(Some("1"));
    res.check(
        res.code() == Some(70),
        "a panic must end the job with status 70",
    );
    res.check(
        res.elapsed < FAIL_FAST,
        "a panic must not leave ranks hanging",
    );
    res.stderr_has("injected panic");
    res.check(!dir.join("out").exists(), "nothing may be published");
    res.check(snapshot(&dir.join("in")) == before, "the input changed");
    // The rerun clears the abandoned staging directory and succeeds.
    let res = run(None);
    res.check(res.code() == Some(0), "the rerun must succeed");
    res.check(
        dir.join("out/index.json").exists(),
        "the rerun must publish",
    );
}

#[test]
fn a_stalled_rank_is_detected_by_the_watchdog() {
    let dir = Dir::new("stall");
    plain_headers(&dir);
    let mut cmd = dir.mpi(3);
    cmd.args([
        "run", "--input", "in", "--output", "out", "--shards", "3", "--seed", "1",
    ])
    .args(["--stall-timeout", "2"])
    // Rank 1 stops (SIGSTOP) as the exchange starts, like a frozen node.
    .env("RESHARD_TEST_STALL_RANK", "1");
    let res = cmd.timeout(2 * FAIL_FAST).output();
    res.check(
        res.code() == Some(75),
        "the stall watchdog must end the job with status 75",
    );
    res.check(
        res.elapsed < FAIL_FAST,
        "the watchdog must end the job in bounded time",
    );
    res.stderr_has(".out.reshard-tmp");
    res.stderr_has("--stall-timeout");
    // Two watchdogs may see it first: the exchange's (no progress, and the heartbeats name the
    // rank that stopped: silent, or rounds behind the others) or the one of every phase (a
    // neighbour's heartbeat thread silent). Either names rank 1, which never reports itself.
    let exchange = says(&res.stderr, "no progress for")
        && (says(&res.stderr, "stopped answering: rank 1")
            || says(&res.stderr, "stuck behind: rank 1"));
    let phases = says(&res.stderr, "rank 1 on ") && says(&res.stderr, "stopped answering in phase");
    res.check(exchange || phases, "the watchdog must name rank 1");
    res.check(!dir.join("out").exists(), "nothing may be published");
}

#[test]
fn an_input_that_changes_during_the_run_is_refused() {
    let dir = Dir::new("changing-input");
    let inputs = plain_headers(&dir);
    let grown = inputs[0].clone();
    let marker = dir.join(".out.reshard-tmp/.paused-0");
    let watcher = std::thread::spawn(move || {
        // Once the data has moved (the run pauses before finishing), an input grows.
        let start = std::time::Instant::now();
        while !marker.exists() {
            assert!(start.elapsed() < FAIL_FAST, "the run never paused");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let mut f = fs::OpenOptions::new().append(true).open(&grown).unwrap();
        std::io::Write::write_all(&mut f, &[0u8; 512]).unwrap();
    });
    let mut cmd = dir.mpi(2);
    cmd.args([
        "run", "--input", "in", "--output", "out", "--shards", "3", "--seed", "1",
    ])
    .env("RESHARD_TEST_PAUSE_FINISH", "2");
    let res = cmd.assert_code(1);
    watcher.join().unwrap();
    res.stderr_has("changed during the run (size");
    res.stderr_has(inputs[0].file_name().unwrap().to_str().unwrap());
    res.check(!dir.join("out").exists(), "nothing may be published");
    res.check(
        !dir.join(".out.reshard-tmp").exists(),
        "the staging directory must be removed",
    );
}

#[test]
fn a_full_disk_is_a_clear_error_and_nothing_is_published() {
    let dir = Dir::new("disk-full");
    plain_headers(&dir);
    let small = dir.join("small");
    with_tmpfs(&small, "64k", false, || {
        let mut cmd = dir.mpi(2);
        cmd.args([
            "run",
            "--input",
            "in",
            "--output",
            "small/out",
            "--shards",
            "3",
            "--seed",
            "1",
            // Past the space check before the exchange, into the disk filling up mid-run.
            "--no-space-check",
        ]);
        let res = cmd.timeout(2 * FAIL_FAST).assert_code(1);
        res.stderr_has("No space left on device");
        res.stderr_has("byte offset");
        res.check(res.elapsed < FAIL_FAST, "must fail promptly");
        res.check(!small.join("out").exists(), "nothing may be published");
        res.check(
            !small.join(".out.reshard-tmp").exists(),
            "the staging directory must be removed",
        );
    });
}

/// The plan knows the output's size: where the file system (a 64 KiB tmpfs) clearly cannot hold
/// it, `run --dry-run` says so (`plan` takes no output) and `run` refuses before any data moves.
#[test]
fn an_output_larger_than_the_free_space_is_refused_before_any_data_moves() {
    let dir = Dir::new("space-check");
    plain_headers(&dir);
    let small = dir.join("small");
    let mounted = with_tmpfs(&small, "64k", false, || {
        let args = [
            "--input",
            "in",
            "--output",
            "small/out",
            "--shards",
            "3",
            "--seed",
            "1",
        ];
        let plan = dir
            .mpi(2)
            .args(["run", "--dry-run"])
            .args(args)
            .assert_success();
        plan.check(
            plan.stdout.contains("free on the file system of")
                && plan.stdout.contains("`run` would refuse to start"),
            "the plan shows the free space and that it is too little",
        );
        let res = dir.mpi(2).arg("run").args(args).assert_code(1);
        res.stderr_has("not enough space: the output needs");
        res.stderr_has("--no-space-check");
        res.check(
            res.stderr.matches("not enough space").count() == 1,
            "said once",
        );
        res.check(
            !res.stderr.contains("No space left on device"),
            "refused before writing",
        );
        res.check(
            fs::read_dir(&small).unwrap().count() == 0,
            "nothing left on the small file system",
        );
    });
    assert!(mounted.is_some(), "a tmpfs is needed (run as root)");
}

#[test]
fn an_unwritable_output_fails_before_any_data_moves() {
    let dir = Dir::new("read-only");
    plain_headers(&dir);
    let ro = dir.join("ro");
    with_tmpfs(&ro, "1m", true, || {
        let mut cmd = dir.mpi(2);
        cmd.args([
            "run", "--input", "in", "--output", "ro/out", "--shards", "3", "--seed", "1",
        ]);
        let res = cmd.assert_code(1);
        res.stderr_has("cannot create the staging directory");
        res.check(!res.stderr.contains("indexing"), "refused before indexing");
    });
}

#[test]
fn a_sample_split_across_two_shards_names_both_files() {
    let dir = Dir::new("split-sample");
    dir.create_dir("in");
    dir.create_bytes(
        "in/a.tar",
        &tar_of(&[("k1.jpg", b"1"), ("k2.jpg", b"2"), ("k3.jpg", b"3")]),
    );
    dir.create_bytes("in/b.tar", &tar_of(&[("k3.cls", b"3"), ("k4.jpg", b"4")]));
    for np in [1, 2] {
        let res = fails_cleanly(&dir, np, &["in"], &format!("out-np{np}"));
        res.stderr_has("\"k3\" is split across two input shards");
        res.stderr_has("a.tar");
        res.stderr_has("b.tar");
    }
}

/// Where MPI_Finalize never returns (RESHARD_TEST_HANG_FINALIZE blocks there, as MPICH 4.0 over
/// UCX TCP does in about half of all runs), the finished job still ends within the finalize
/// deadline, with status 0 and its output published: on every rank, or on one rank while the
/// others wait for it in their own MPI_Finalize.
#[test]
fn a_finalize_that_never_returns_still_ends_the_job() {
    for (np, hang) in [(2, "all"), (3, "1")] {
        let dir = Dir::new(&format!("hang-finalize-{np}"));
        let inputs = plain_headers(&dir);
        let mut cmd = dir.mpi(np);
        cmd.args([
            "run", "--input", "in", "--output", "out", "--shards", "3", "--seed", "1",
        ])
        .args(["--report", "report.json"])
        .env("RESHARD_TEST_HANG_FINALIZE", hang)
        .env("RESHARD_FINALIZE_TIMEOUT", "1");
        let res = cmd.timeout(2 * FAIL_FAST).output();
        res.check(res.status.is_some(), "the job hung");
        res.check(
            res.code() == Some(0),
            "a finished job must exit 0 when MPI_Finalize hangs",
        );
        // A hang is caught by the timeout above; how long the job took depends on the machine's
        // load, so it is reported, not asserted. Every rank's deadline message is whole (one
        // write each), so the search below cannot miss it for a line torn by another rank's.
        res.stderr_says("MPI_Finalize did not return within 1 s");
        res.stderr_says("exiting with status 0");
        res.check(
            res.stdout.contains("samples"),
            "rank 0's summary must be printed before finalizing",
        );
        res.check(
            dir.join("report.json").exists(),
            "the report must be written",
        );
        verify(
            &Expected::new(dir.path(), &inputs, 3, 1, np),
            &dir.join("out"),
        );
        println!(
            "np {np}, RESHARD_TEST_HANG_FINALIZE={hang}: ended in {:.2} s with {}",
            res.elapsed.as_secs_f64(),
            res.status.unwrap()
        );
    }
}

/// Under hydra, a rank that leaves without MPI_Finalize first tells the launcher it finalized
/// (src/comm/hydra.rs). Rank 0's finalize deadline is 1 s, rank 1's 6 s (one mpirun, two
/// argument sets): rank 0 exits long before rank 1. Had rank 0 not sent PMI's `finalize`, hydra
/// would take it for a failed rank and kill rank 1 on the spot (both ranks share this node), so
/// rank 1 would never say that it left by itself (seen: the job's status then is 0 or 1,
/// depending on which event hydra handles first).
#[test]
fn hydra_is_told_that_a_rank_leaving_without_mpi_finalize_finalized() {
    let dir = Dir::new("hang-finalize-hydra");
    let inputs = plain_headers(&dir);
    let exe = crate::util::reshard_exe();
    let mut args: Vec<String> = Vec::new();
    for (rank, deadline) in [(0, "1"), (1, "6")] {
        if rank > 0 {
            args.push(":".into());
        }
        args.extend(["-np", "1", "-env", "RESHARD_FINALIZE_TIMEOUT", deadline].map(String::from));
        args.push(exe.to_string_lossy().into_owned());
        args.extend(
            [
                "run", "--input", "in", "--output", "out", "--shards", "3", "--seed", "1",
            ]
            .map(String::from),
        );
    }
    let mut cmd = dir.program(crate::util::mpirun());
    cmd.args(&args).env("RESHARD_TEST_HANG_FINALIZE", "all");
    let res = cmd.timeout(2 * FAIL_FAST).output();
    res.check(res.status.is_some(), "the job hung");
    res.stderr_has("rank 0: MPI_Finalize did not return within 1 s");
    res.stderr_has("rank 1: MPI_Finalize did not return within 6 s");
    res.check(
        res.code() == Some(0),
        "hydra must take a rank that told it so for a finalized one",
    );
    verify(
        &Expected::new(dir.path(), &inputs, 3, 1, 2),
        &dir.join("out"),
    );
}

/// A failed job whose MPI_Finalize hangs still ends within the deadline, and still fails.
#[test]
fn a_failed_job_whose_finalize_hangs_still_fails() {
    let dir = Dir::new("hang-finalize-failed");
    // An empty archive: the job fails with "no samples" on every rank.
    dir.create_bytes("in/zeros.tar", &[0u8; 10240]);
    let mut cmd = dir.mpi(2);
    cmd.args([
        "run", "--input", "in", "--output", "out", "--shards", "3", "--seed", "1",
    ])
    .env("RESHARD_TEST_HANG_FINALIZE", "all")
    .env("RESHARD_FINALIZE_TIMEOUT", "1");
    let res = cmd.timeout(2 * FAIL_FAST).assert_code(1);
    res.check(
        res.elapsed < Duration::from_secs(15),
        &format!("took {:.1} s to end", res.elapsed.as_secs_f64()),
    );
    res.stderr_has("no samples");
    res.stderr_says("exiting with status 1");
    res.check(!dir.join("out").exists(), "nothing may be published");
}

/// Rank 0 alone writes the report: when it cannot, every rank fails (and none waits in --verify's
/// collectives for it).
#[test]
fn a_report_that_cannot_be_written_fails_every_rank() {
    let dir = Dir::new("report-unwritable");
    plain_headers(&dir);
    let mut cmd = dir.mpi(3);
    cmd.args([
        "run", "--input", "in", "--output", "out", "--shards", "3", "--seed", "1",
    ])
    .args(["--report", "missing/report.json", "--verify"]);
    let res = cmd.timeout(2 * FAIL_FAST).assert_code(1);
    res.check(res.elapsed < FAIL_FAST, "took too long to fail");
    res.stderr_has("--report");
}
