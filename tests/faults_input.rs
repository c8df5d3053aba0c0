//! Faults in the input and in what `--resume` and saved indexes trust (issue 22, items 2, 3, 4,
//! 5 and 11): each one fails the job naming the file, or is read as asked, but never publishes
//! wrong bytes with exit 0.

use std::fs;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::util::tar::{rewrite_keeping_mtime, tar_of};
use crate::util::verifier::assert_same_output;
use crate::util::{says, Dir, RunOutput, FAIL_FAST};

/// Two ranks counts every fault case runs at.
const NPS: [usize; 2] = [1, 2];

/// Small plain shards in `in/`.
fn inputs(dir: &Dir) -> Vec<PathBuf> {
    dir.generate(
        "in",
        &[
            "--shards",
            "3",
            "--samples",
            "30",
            "--mean-size",
            "2KiB",
            "--seed",
            "3",
        ],
    )
}

/// `reshard run` of `input` into `out` under `mpirun -np np`.
fn job(dir: &Dir, np: usize, input: &str, out: &str, extra: &[&str]) -> crate::util::TestCommand {
    let mut cmd = dir.mpi(np);
    cmd.args([
        "run", "--input", input, "--output", out, "--shards", "2", "--seed", "5",
    ])
    .args(extra);
    cmd
}

/// The run failed with exit 1 naming every needle, published nothing and left no staging.
fn refused(dir: &Dir, res: &RunOutput, out: &str, needles: &[&str]) {
    for n in needles {
        res.stderr_has(n);
    }
    res.check(!dir.join(out).exists(), "nothing may be published");
    res.check(
        !dir.join(format!(".{out}.reshard-tmp")).exists(),
        "the staging directory must be removed",
    );
}

/// Flips one bit of the checksum a compressed file ends with: gzip's CRC-32 (8 bytes from the
/// end, before the length), zstd's content checksum (the last 4 bytes). The stream decodes to
/// the same bytes; only reading it to its end tells.
fn flip_checksum(bytes: &mut [u8], gzip: bool) {
    let at = if gzip {
        bytes.len() - 8
    } else {
        bytes.len() - 1
    };
    bytes[at] ^= 0x10;
}

#[test]
fn a_flipped_bit_in_a_compressed_input_fails_the_job_naming_it() {
    let dir = Dir::new("faults-crc");
    let plain = inputs(&dir);
    let packed = dir.create_dir("packed");
    for (i, p) in plain.iter().enumerate() {
        fs::copy(p, packed.join(format!("part-{i}.tar"))).unwrap();
    }
    // gzip and zstd as their command-line tools write them (zstd's with a content checksum).
    let tool = |args: &[&str]| {
        let st = std::process::Command::new(args[0])
            .args(&args[1..])
            .status()
            .unwrap();
        assert!(st.success(), "{args:?}");
    };
    let gz = packed.join("part-1.tar.gz");
    let zst = packed.join("part-2.tar.zst");
    tool(&["gzip", "-n", packed.join("part-1.tar").to_str().unwrap()]);
    tool(&[
        "zstd",
        "-q",
        "--rm",
        packed.join("part-2.tar").to_str().unwrap(),
    ]);
    for (damaged, gzip) in [(&gz, true), (&zst, false)] {
        let good = fs::read(damaged).unwrap();
        crate::util::tar::edit_bytes(damaged, |b| flip_checksum(b, gzip));
        let name = damaged.file_name().unwrap().to_str().unwrap();
        for np in NPS {
            let res = job(&dir, np, "packed", "out", &[]).assert_code(1);
            refused(&dir, &res, "out", &[name]);
        }
        fs::write(damaged, good).unwrap();
    }
    job(&dir, 2, "packed", "good", &["--compress", "gz"]).assert_success();
    // Read through a saved index (the index phase does not decompress it): the exchange reads
    // the stream to its end. The modification time is kept, so the saved index still matches.
    let shard = dir.join("good/shard-000001.tar.gz");
    rewrite_keeping_mtime(&shard, |b| flip_checksum(b, true));
    for np in NPS {
        let res = job(&dir, np, "good", "again", &[]).assert_code(1);
        res.stderr_has("reused the saved index of 2 of 2 input shards");
        refused(&dir, &res, "again", &["shard-000001.tar.gz", "damaged"]);
    }
}

#[test]
fn an_input_rewritten_in_place_with_the_same_size_is_refused() {
    let dir = Dir::new("faults-rewrite");
    let plain = inputs(&dir);
    for np in NPS {
        let marker = dir.join(".out.reshard-tmp/.paused-0");
        let victim = plain[1].clone();
        let watcher = std::thread::spawn(move || {
            // Once the data has moved (the run pauses before finishing), the input is written
            // over with bytes of the same size: only its times tell.
            let start = Instant::now();
            while !marker.exists() {
                assert!(start.elapsed() < FAIL_FAST, "the run never paused");
                std::thread::sleep(Duration::from_millis(20));
            }
            let bytes = fs::read(&victim).unwrap();
            fs::write(&victim, bytes).unwrap();
        });
        let res = job(&dir, np, "in", "out", &[])
            .env("RESHARD_TEST_PAUSE_FINISH", "3")
            .assert_code(1);
        watcher.join().unwrap();
        let name = plain[1].file_name().unwrap().to_str().unwrap();
        refused(&dir, &res, "out", &[name, "changed during the run"]);
    }
}

#[test]
fn a_sample_that_is_not_where_the_index_said_fails_naming_file_and_offset() {
    let dir = Dir::new("faults-offset");
    inputs(&dir);
    job(&dir, 2, "in", "first", &[]).assert_success();
    // The shard rotated by one block, same size and modification time: its saved index still
    // matches, but no sample starts with a header any more.
    let shard = dir.join("first/shard-000000.tar");
    rewrite_keeping_mtime(&shard, |b| b.rotate_right(512));
    for np in NPS {
        let res = job(&dir, np, "first", "out", &[]).assert_code(1);
        res.stderr_has("reused the saved index");
        refused(&dir, &res, "out", &["shard-000000.tar: byte offset"]);
        // The saved layout is checked against the tar before a byte is copied (a sample's first
        // header); a sample packed whole is checked again by the exchange (a tar header).
        res.check(
            says(&res.stderr, "expected a sample's first header")
                || says(&res.stderr, "expected a tar header"),
            "the refusal must say what was expected at that offset",
        );
    }
}

/// `a.tar` and `b.tar` of distinct samples, and what they make glued.
fn two_archives(dir: &Dir) -> (Vec<u8>, Vec<u8>) {
    let files = |prefix: &str, n: usize| -> Vec<(String, Vec<u8>)> {
        (0..n)
            .flat_map(|i| {
                let body = vec![b'a' + (i % 26) as u8; 300 + 97 * i];
                [
                    (format!("{prefix}{i:03}.jpg"), body),
                    (format!("{prefix}{i:03}.cls"), i.to_string().into_bytes()),
                ]
            })
            .collect()
    };
    let tar = |members: &[(String, Vec<u8>)]| {
        let refs: Vec<(&str, &[u8])> = members
            .iter()
            .map(|(n, b)| (n.as_str(), b.as_slice()))
            .collect();
        tar_of(&refs)
    };
    let (a, b) = (tar(&files("a", 12)), tar(&files("b", 9)));
    dir.create_bytes("two/a.tar", &a);
    dir.create_bytes("two/b.tar", &b);
    (a, b)
}

#[test]
fn concatenated_archives_and_lone_zero_blocks_are_refused_or_read_with_ignore_zeros() {
    let dir = Dir::new("faults-zeros");
    let (a, b) = two_archives(&dir);
    // `cat a.tar b.tar`, and a.tar with a zero block inserted between two samples.
    dir.create_bytes("cat/ab.tar", &[a.clone(), b.clone()].concat());
    let cut = crate::util::tar::header_offsets(&a)[4];
    let lone = [&a[..cut], &[0u8; 512][..], &a[cut..]].concat();
    dir.create_bytes("lone/a.tar", &lone);
    dir.create_bytes("alone/a.tar", &a);
    let cases = [
        ("cat", "two", "zero blocks", a.len() - 1024),
        ("lone", "alone", "a lone zero block", cut),
    ];
    for (input, same_as, what, at) in cases {
        let whole = format!("{same_as}-ref");
        job(&dir, 1, same_as, &whole, &[]).assert_success();
        for np in NPS {
            let res = job(&dir, np, input, "out", &[]).assert_code(1);
            let offset = format!("byte offset {at}: data after the end-of-archive marker: {what}");
            refused(&dir, &res, "out", &[&offset, "--ignore-zeros"]);
            // verify reads the input as run does.
            let res = dir
                .mpi(np)
                .args(["verify", "--input", input, "--output", &whole])
                .output();
            res.check(res.code() != Some(0), "verify must refuse it too");
            res.stderr_has(&offset);
            // Read past the zeros: every sample of both, the same shards as from the parts.
            let out = format!("{input}-np{np}");
            let res = job(&dir, np, input, &out, &["--ignore-zeros"]).assert_success();
            res.check(
                res.stdout.contains("--ignore-zeros: read past 1 "),
                "the summary must count the zero blocks read past",
            );
            assert_same_output(
                &dir.join(&whole),
                &dir.join(&out),
                &["inputs", "input_bytes", "ranks"],
            );
            dir.mpi(np)
                .args([
                    "verify",
                    "--input",
                    input,
                    "--output",
                    &out,
                    "--ignore-zeros",
                ])
                .assert_success();
        }
    }
}

#[test]
fn a_damaged_staging_shard_is_not_resumed() {
    let dir = Dir::new("faults-resume");
    inputs(&dir);
    job(&dir, 1, "in", "ref", &[]).assert_success();
    // One sample's first block replaced by another's, same size (what the issue saw), or the
    // shard cut short.
    let damages = [
        (
            false,
            "shard-000001.tar changed since the earlier attempt completed it",
        ),
        (true, "shard-000001.tar: the earlier run left it"),
    ];
    for np in NPS {
        for (truncate, message) in damages {
            // Killed as it publishes: every staging shard complete, recorded for --resume.
            let res = job(&dir, np, "in", "out", &[])
                .env("RESHARD_TEST_KILL", "0:publish")
                .output();
            res.check(res.code() != Some(0), "the killed job must fail");
            let shard = dir.join(".out.reshard-tmp/shard-000001.tar");
            crate::util::tar::edit_bytes(&shard, |b| {
                if truncate {
                    b.truncate(b.len() - 1024);
                } else {
                    let n = b.len() / 2 / 512 * 512;
                    b.copy_within(0..512, n);
                }
            });
            let res = job(&dir, np, "in", "out", &["--resume"]).output();
            res.check(
                res.code() != Some(0),
                "--resume must refuse the damaged shard",
            );
            res.stderr_has(message);
            res.check(!dir.join("out").exists(), "nothing may be published");
            // The advice holds: a run without --resume starts over and is right.
            job(&dir, np, "in", "out", &[]).assert_success();
            assert_same_output(&dir.join("ref"), &dir.join("out"), &["ranks"]);
            fs::remove_dir_all(dir.join("out")).unwrap();
        }
    }
}

#[test]
fn a_saved_index_reused_with_energon_is_checked_before_data_moves() {
    let dir = Dir::new("faults-energon");
    dir.create_bytes("in/a.tar", &tar_of(&[("dup.jpg", b"1"), ("k1.jpg", b"2")]));
    dir.create_bytes("in/b.tar", &tar_of(&[("k2.jpg", b"3"), ("dup.jpg", b"4")]));
    // An output with a key twice, and saved indexes.
    job(&dir, 2, "in", "kept", &["--on-duplicate", "keep"]).assert_success();
    for np in NPS {
        let res = job(&dir, np, "kept", "out", &["--energon"]).assert_code(1);
        refused(&dir, &res, "out", &["\"dup\""]);
        res.check(
            !res.stderr.contains("--resume") && !res.stderr.contains("reused the saved index"),
            "must fail while indexing, before data moves, without advice to --resume",
        );
    }
}
