//! Running beside training: `--max-read-rate` and `--max-write-rate` hold (a lower bound on the
//! time only: a loaded machine makes runs slower, never faster), leave the output's bytes alone,
//! and refuse nonsense; `--io-priority` and `--nice` are what a paused rank runs with.

use std::fs;
use std::time::{Duration, Instant};

use crate::util::data::sized;
use crate::util::runs::run;
use crate::util::verifier::assert_same_output;
use crate::util::{Dir, FAIL_FAST};

/// 8 MiB at 4 MiB/s: 2 s at least, less the quarter second a bucket may save up; 1.5 s leaves
/// room for rounding and none for a limit that is not kept (unlimited, this takes ~0.3 s).
const RATE: &str = "4MiB/s";
const AT_LEAST: Duration = Duration::from_millis(1500);

#[test]
fn a_limited_run_never_beats_its_limit_and_writes_the_same_bytes() {
    let dir = Dir::new("rate-limit");
    sized(&dir, "in", "8MiB", "64KiB", 4);
    for np in [1, 2] {
        let free = format!("free-np{np}");
        run(&dir, Some(np), &["in"], &free, 3, 7, &[]);
        for flag in ["--max-read-rate", "--max-write-rate"] {
            let out = format!("limited{flag}-np{np}");
            let start = Instant::now();
            let progress = ["--progress", "lines", "--progress-interval", "0.2"];
            let res = run(
                &dir,
                Some(np),
                &["in"],
                &out,
                3,
                7,
                &[&[flag, RATE], &progress[..]].concat(),
            );
            let took = start.elapsed();
            assert!(
                took >= AT_LEAST,
                "np {np} {flag} {RATE} moved 8 MiB in {took:?}\n{}",
                res.report()
            );
            let what = flag.trim_start_matches("--max-").trim_end_matches("-rate");
            res.check(
                res.stdout
                    .contains(&format!("{what} limit 4.00 MiB/s: achieved")),
                "the summary names the limit and the rate achieved",
            );
            res.stderr_has(&format!("{what} limit 4.00 MiB/s (rank 0: "));
            res.stderr_has(&format!("/s of its {} share, waited", share(np)));
            assert_same_output(&dir.join(&free), &dir.join(&out), &[]);
        }
    }
}

/// A limit makes rounds slow, not stalled. At 64 KiB/s (32 KiB/s a rank) a round of the size
/// the data alone would give took longer than a 3 s `--stall-timeout`, and the ranks waiting
/// for it at the round's end ended the healthy job as stalled (exit 75). Rounds are now sized
/// to the limit and the timeout, and samples larger than a round are no longer copied whole.
#[test]
fn a_slow_limit_is_not_taken_for_a_stall() {
    let dir = Dir::new("rate-stall");
    sized(&dir, "in", "512KiB", "48KiB", 4);
    run(&dir, Some(2), &["in"], "free", 3, 7, &[]);
    for flag in ["--max-write-rate", "--max-read-rate"] {
        let out = format!("slow{flag}");
        run(
            &dir,
            Some(2),
            &["in"],
            &out,
            3,
            7,
            &[flag, "64KiB/s", "--stall-timeout", "3"],
        );
        assert_same_output(&dir.join("free"), &dir.join(&out), &[]);
    }
}

/// One rank's share of [`RATE`] among `np` ranks, as progress lines print it.
fn share(np: usize) -> String {
    format!("{:.2} MiB/s", 4.0 / np as f64)
}

/// The bytes of the files directly in `dir` whose names end with `ext`.
fn bytes_of(dir: &std::path::Path, ext: &str) -> u64 {
    let files = fs::read_dir(dir).unwrap().map(|e| e.unwrap().path());
    files
        .filter(|p| p.to_string_lossy().ends_with(ext))
        .map(|p| fs::metadata(p).unwrap().len())
        .sum()
}

/// What the `--report` at `report` says each limit moved: (read, written), `None` for a
/// direction without a limit.
fn moved(dir: &Dir, report: &str) -> (Option<u64>, Option<u64>) {
    let text = fs::read_to_string(dir.join(report)).unwrap();
    let summary: serde_json::Value = serde_json::from_str(&text).unwrap();
    let limits = summary["rate_limits"].as_array().unwrap();
    let bytes = |what: &str| {
        let limit = limits.iter().find(|l| l["what"] == what);
        limit.map(|l| l["bytes"].as_u64().unwrap())
    };
    (bytes("read"), bytes("write"))
}

/// Every phase's bytes go through the storage seam's pacing wrapper, each once: the summary's
/// counts (limits too high to wait on) hold the input and the output once, plus the index's
/// header reads and small metadata, never twice (an in-kernel copy counted by both its input
/// and its output, or a hook left beside the wrapper, would double them).
#[test]
fn every_byte_through_the_storage_seam_counts_once() {
    let dir = Dir::new("rate-once");
    sized(&dir, "in", "2MiB", "64KiB", 3);
    let input = bytes_of(&dir.join("in"), ".tar");
    let high = [
        "--max-read-rate",
        "100GiB/s",
        "--max-write-rate",
        "100GiB/s",
    ];
    for np in [1, 2] {
        let out = format!("out-np{np}");
        let report = format!("{out}.json");
        run(
            &dir,
            Some(np),
            &["in"],
            &out,
            3,
            7,
            &[&high[..], &["--report", &report]].concat(),
        );
        // The shards' end-of-archive blocks are the zeros they were created with, never written.
        let samples = bytes_of(&dir.join(&out), ".tar") - 3 * 1024;
        let (Some(read), Some(written)) = moved(&dir, &report) else {
            panic!("np {np}: no figures for both limits in {report}");
        };
        assert!(
            (input..input + input / 2).contains(&read),
            "np {np}: read {read} bytes of a {input}-byte input"
        );
        assert!(
            (samples..samples + samples / 4).contains(&written),
            "np {np}: wrote {written} bytes for {samples} bytes of samples"
        );
    }
}

/// A path that was not paced while the hooks sat beside the phases' calls is paced through the
/// seam: `--checksum` reads the finished output back to digest it, and with a read limit those
/// reads wait for it too, so the run reads input and output at the limit (the hooks paced only
/// the input: half the time).
#[test]
fn the_checksums_read_back_keeps_to_the_read_limit() {
    let dir = Dir::new("rate-checksum");
    sized(&dir, "in", "4MiB", "64KiB", 3);
    let input = bytes_of(&dir.join("in"), ".tar");
    run(&dir, Some(2), &["in"], "free", 3, 7, &["--checksum"]);
    let start = Instant::now();
    let flags = ["--checksum", "--max-read-rate", RATE, "--report", "r.json"];
    let res = run(&dir, Some(2), &["in"], "limited", 3, 7, &flags);
    let took = start.elapsed();
    let output = bytes_of(&dir.join("limited"), ".tar");
    // 4 MiB in and 4 MiB back at 4 MiB/s: as long as the 8 MiB of the test above.
    assert!(
        took >= AT_LEAST,
        "read {input} + {output} bytes at {RATE} in {took:?}\n{}",
        res.report()
    );
    let read = moved(&dir, "r.json").0.unwrap();
    assert!(
        read >= input + output,
        "read {read} bytes: the {input}-byte input and the {output}-byte output read back"
    );
    assert_same_output(&dir.join("free"), &dir.join("limited"), &[]);
}

#[test]
fn nonsensical_limits_are_usage_errors_naming_the_flag() {
    let dir = Dir::new("rate-refused");
    sized(&dir, "in", "256KiB", "16KiB", 2);
    for flag in ["--max-read-rate", "--max-write-rate"] {
        for bad in ["0", "0GiB/s", "-1MiB/s", "fast", "3 parsecs/s", ""] {
            let res = dir
                .command()
                .args([
                    "run", "-i", "in", "-o", "out", "--shards", "2", "--seed", "1",
                ])
                .args([flag, bad])
                .assert_code(2);
            res.stderr_has(flag);
            res.no_debug_text();
        }
    }
    let res = dir
        .command()
        .args([
            "plan", "-i", "in", "--shards", "2", "--seed", "1", "--nice", "40",
        ])
        .assert_code(2);
    res.stderr_has("--nice 40");
    assert!(!dir.join("out").exists());
}

#[test]
fn a_plan_says_how_long_the_data_takes_at_the_limits() {
    let dir = Dir::new("rate-plan");
    sized(&dir, "in", "2MiB", "16KiB", 2);
    let res = dir
        .command()
        .args(["plan", "-i", "in", "--shards", "2", "--seed", "1"])
        .args(["--max-read-rate", "500KB/s", "--max-write-rate", "1.5MiB/s"])
        .assert_success();
    // The bytes read at 500 kB/s: the write limit is the faster.
    let line = res
        .stdout
        .lines()
        .find(|l| l.contains("at the rate limits (read 488.28 KiB/s, write 1.50 MiB/s)"))
        .unwrap_or_else(|| res.fail("no line for the rate limits"));
    let number_after = |marker: &str| -> f64 {
        let word = line.split(marker).nth(1).and_then(|t| t.split(' ').next());
        word.and_then(|t| t.parse().ok())
            .unwrap_or_else(|| res.fail(&format!("no number after {marker:?}")))
    };
    let (secs, read_mib) = (number_after("takes at least "), number_after(" s ("));
    let expected = read_mib * 1048576.0 / 500e3;
    assert!(
        (secs - expected).abs() < 0.1,
        "{line}: expected {expected:.1} s"
    );
    let dry = dir
        .command()
        .args([
            "run", "-i", "in", "-o", "out", "--shards", "2", "--seed", "1",
        ])
        .args(["--dry-run", "--max-write-rate", "1MiB/s"])
        .assert_success();
    dry.check(
        dry.stdout
            .contains("at the rate limits (read none, write 1.00 MiB/s)"),
        "--dry-run says it too",
    );
}

/// The read limit paces every byte read, the header-only index's too (with small samples it
/// reads most of the input), so `plan`'s least time counts the index's reads: the bytes a
/// limited run reads are those the plan said, and the time is all of them at the limit.
#[test]
fn a_plan_at_the_read_limit_counts_the_index_reads() {
    let dir = Dir::new("rate-plan-index");
    // 2 KiB samples: the index reads through the headers 128 KiB at a time.
    sized(&dir, "in", "2MiB", "2KiB", 2);
    let input = bytes_of(&dir.join("in"), ".tar");
    let args = ["-i", "in", "--shards", "2", "--seed", "1"];
    let plan = dir
        .mpi(2)
        .arg("plan")
        .args(args)
        .args(["--max-read-rate", "4MiB/s", "--json"])
        .assert_success();
    let v: serde_json::Value = serde_json::from_str(&plan.stdout).unwrap();
    let at = &v["at_limits"];
    let figure = |name: &str| at[name].as_f64().unwrap_or_else(|| plan.fail(name));
    let (index, read, secs) = (
        figure("index_bytes"),
        figure("read_bytes"),
        figure("seconds"),
    );
    let samples = v["sample_bytes"].as_f64().unwrap();
    plan.check(
        index > input as f64 / 2.0 && read == index + samples,
        "the plan counts the index's reads, most of the input here, before the samples'",
    );
    plan.check(
        (secs - read / (4.0 * 1048576.0)).abs() < 0.01,
        "the least time is every byte read at the limit",
    );
    let text = dir
        .mpi(2)
        .arg("plan")
        .args(args)
        .args(["--max-read-rate", "4MiB/s"])
        .assert_success();
    text.check(
        text.stdout.contains(" of it by the index; "),
        "the plan's line says what the index reads",
    );
    let help = dir.command().args(["run", "--help"]).assert_success();
    let words = help.stdout.split_whitespace().collect::<Vec<_>>().join(" ");
    help.check(
        words.contains("limits bytes, not requests: every byte read from storage counts, the header-only index's too"),
        "--max-read-rate's help says the index's reads count",
    );
    let report = "limited.json";
    dir.mpi(2)
        .args(["run", "-o", "limited", "--report", report])
        .args(args)
        .args(["--max-read-rate", "100GiB/s"])
        .assert_success();
    let ran = moved(&dir, report).0.unwrap() as f64;
    assert!(
        (read..read * 1.05).contains(&ran),
        "the run read {ran} bytes; the plan said {read}"
    );
}

#[test]
fn every_rank_runs_with_the_io_priority_and_nice_value_asked_for() {
    if crate::util::find_on_path("ionice").is_none() {
        return crate::util::skip("rate io priority", "no ionice");
    }
    let dir = Dir::new("rate-priority");
    sized(&dir, "in", "512KiB", "16KiB", 2);
    let markers: Vec<_> = (0..2)
        .map(|r| dir.join(format!(".out.reshard-tmp/.paused-{r}")))
        .collect();
    let watcher = std::thread::spawn(move || {
        let start = Instant::now();
        let mut seen = Vec::new();
        for marker in &markers {
            let pid = loop {
                assert!(start.elapsed() < FAIL_FAST, "the run never paused");
                match fs::read_to_string(marker) {
                    Ok(pid) if !pid.is_empty() => break pid,
                    _ => std::thread::sleep(Duration::from_millis(20)),
                }
            };
            let ionice = std::process::Command::new("ionice")
                .args(["-p", &pid])
                .output()
                .unwrap();
            let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
            // Field 19 (nice), counted after the command name's closing parenthesis.
            let nice = stat.rsplit(')').next().unwrap().split_whitespace().nth(16);
            seen.push((
                String::from_utf8_lossy(&ionice.stdout).trim().to_string(),
                nice.unwrap().to_string(),
            ));
            fs::remove_file(marker).unwrap();
        }
        seen
    });
    dir.mpi(2)
        .args([
            "run", "-i", "in", "-o", "out", "--shards", "2", "--seed", "1",
        ])
        .args(["--io-priority", "idle", "--nice", "7"])
        .env("RESHARD_TEST_PAUSE_FINISH", "60")
        .assert_success();
    let seen = watcher.join().unwrap();
    assert_eq!(seen, vec![("idle".to_string(), "7".to_string()); 2]);
}

#[test]
fn the_epoch_loop_limits_only_the_reshuffles_that_overlap_training() {
    let dir = Dir::new("rate-epoch-loop");
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("slurm/epoch-loop.sh");
    let loop_with = |vars: &[(&str, &str)]| {
        let mut cmd = dir.program("bash");
        cmd.arg(&script).env("DRY_RUN", "1").env("EPOCHS", "2");
        for (k, v) in vars {
            cmd.env(k, v);
        }
        cmd
    };
    let res = loop_with(&[("STORAGE_BANDWIDTH", "4GiB/s")]).assert_success();
    let submitted: Vec<&str> = res
        .stderr
        .lines()
        .filter(|l| l.contains("reshuffle-"))
        .collect();
    assert_eq!(submitted.len(), 2, "{}", res.report());
    // The first epoch's reshuffle runs alone; the next one beside train(0), reading and writing
    // at a quarter of the bandwidth each.
    assert!(!submitted[0].contains("--io-priority"), "{}", submitted[0]);
    let quarter = "--max-read-rate\\ 1073741824/s\\ --max-write-rate\\ 1073741824/s";
    assert!(submitted[1].contains("--io-priority\\ low\\ ") && submitted[1].contains(quarter));
    assert!(!submitted[1].contains("--nice"), "{}", submitted[1]);
    let res = loop_with(&[("OVERLAP_NICE", "10")]).assert_success();
    let niced: Vec<&str> = res
        .stderr
        .lines()
        .filter(|l| l.contains("reshuffle-"))
        .collect();
    assert!(!niced[0].contains("--nice"), "{}", niced[0]);
    assert!(niced[1].contains("--nice\\ 10"), "{}", res.report());
    let res = loop_with(&[("OVERLAP", "0"), ("STORAGE_BANDWIDTH", "4GiB/s")]).assert_success();
    res.check(
        !res.stderr.contains("--io-priority"),
        "OVERLAP=0 runs alone, unlimited",
    );
    let res = loop_with(&[("STORAGE_BANDWIDTH", "fast")]).assert_code(2);
    res.stderr_has("STORAGE_BANDWIDTH must be a rate");
}
