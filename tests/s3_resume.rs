//! The bucket `--resume` of an `s3://` output (issue 37): what a killed run recorded in the
//! bucket is kept by a resumed run that has none of its staged files (another scratch, as on
//! another node), the very objects, and the output is the uninterrupted run's bytes. Here: the
//! shards of a `--split` output's splits (a shard created again before its manifest: on Azurite,
//! whose ETags are not of the content, in `cloud`).

use crate::util::data::sized;
use crate::util::lock::wait_until;
use crate::util::runs::run;
use crate::util::s3::Server;
use crate::util::stores::Store as _;
use crate::util::verifier::assert_same_output;
use crate::util::{reshard_processes, signal_if_alive, Dir, RunOutput};

/// `reshard run --input in --output s3://BUCKET/out --seed 7` under `mpirun -np np`, staged on
/// `scratch` (a directory of the test's), with `extra`.
fn to_s3(
    dir: &Dir,
    s3: &Server,
    np: usize,
    output: &str,
    scratch: &str,
    extra: &[&str],
) -> RunOutput {
    let mut cmd = dir.mpi(np);
    cmd.args(["run", "--input", "in", "--output", output, "--seed", "7"])
        .arg("--scratch")
        .arg(dir.join(scratch))
        .args(extra);
    s3.with_env(&mut cmd).output()
}

/// The records under `.out.reshard-records.TOKEN/` in `bucket`, as shard names (a split's
/// shard under its split's name).
fn recorded(dir: &Dir, s3: &Server, bucket: &str) -> Vec<String> {
    s3.keys(dir, bucket, ".out.reshard-records.")
        .into_iter()
        .filter_map(|k| k.split_once('/').map(|(_, shard)| shard.to_string()))
        .collect()
}

/// The stamp (size, time, ETag) of each of `shards` under `out/`.
fn stamps(dir: &Dir, s3: &Server, bucket: &str, shards: &[String]) -> Vec<String> {
    shards
        .iter()
        .map(|s| {
            let got = s3.stamps(dir, bucket, &format!("out/{s}"));
            got.into_iter().next().unwrap_or_default()
        })
        .collect()
}

/// The output downloaded equals `reference` byte for byte, no multipart upload is open and
/// nothing is beside it; `split`: it is a `--split` output, whose own `.reshard/` is empty (a
/// store holds no empty directory).
fn only_the_output(dir: &Dir, s3: &Server, bucket: &str, reference: &str, split: bool) {
    if !split {
        s3.assert_only_the_output(dir, bucket, reference, &["inputs"]);
        return;
    }
    assert_eq!(
        s3.uploads(dir, bucket),
        Vec::<String>::new(),
        "open uploads"
    );
    let beside: Vec<String> = s3
        .keys(dir, bucket, "")
        .into_iter()
        .filter(|k| !k.starts_with("out/"))
        .collect();
    assert_eq!(beside, Vec::<String>::new(), "objects beside the output");
    s3.get(dir, bucket, "out", &dir.join("got"));
    std::fs::create_dir_all(dir.join("got/.reshard")).unwrap();
    assert_same_output(&dir.join(reference), &dir.join("got"), &["inputs"]);
}

/// A `--split` output at 2 ranks, writes slowed, is killed (SIGKILL, every rank) once a shard
/// of a split is recorded as uploaded in the bucket. `--resume` on another scratch (nothing of
/// the killed run staged there) keeps every recorded shard, the split's among them, the very
/// object (its ETag and time unchanged), and publishes the uninterrupted run's bytes with
/// nothing left beside them. Before, a split's shards were not recorded: the kill never came
/// (no record in a split) and a resume uploaded every split shard again.
#[test]
fn a_killed_split_output_resumes_from_the_bucket_keeping_its_recorded_split_shards() {
    let test = "a_killed_split_output_resumes_from_the_bucket_keeping_its_recorded_split_shards";
    let dir = Dir::new("s3-resume-split");
    sized(&dir, "in", "36MiB", "64KiB", 6);
    let split = [
        "--split",
        "a=0.5,b=rest",
        "--split-shards",
        "3",
        "--shards",
        "3",
    ];
    run(&dir, Some(2), &["in"], "ref", 3, 7, &split[..4]);
    let Some(s3) = crate::util::s3::server(test) else {
        return;
    };
    let bucket = s3.bucket(&dir, test);
    let output = format!("s3://{bucket}/out");
    let (out, scratch) = (output.clone(), "scratch-killed");
    let mut slow: Vec<&str> = split.to_vec();
    slow.extend(["--max-write-rate", "4MiB"]);
    let killed = std::thread::scope(|scope| {
        let job = scope.spawn(|| to_s3(&dir, s3, 2, &out, scratch, &slow));
        wait_until("a shard of a split is recorded as uploaded", || {
            recorded(&dir, s3, &bucket).iter().any(|s| s.contains('/'))
        });
        for (pid, _) in reshard_processes(dir.path()) {
            signal_if_alive(pid, libc::SIGKILL);
        }
        job.join().unwrap()
    });
    killed.check(killed.code() != Some(0), "the killed run must fail");
    let keys = s3.keys(&dir, &bucket, "out/");
    assert!(!keys.contains(&"out/index.json".to_string()), "{keys:?}");
    let kept = recorded(&dir, s3, &bucket);
    let shards = keys.iter().filter(|k| k.ends_with(".tar")).count();
    assert!(shards < 6, "killed after its upload: {keys:?}");
    let before = stamps(&dir, s3, &bucket, &kept);

    let mut again: Vec<&str> = split.to_vec();
    again.push("--resume");
    let resumed = to_s3(&dir, s3, 2, &output, "scratch-resumed", &again);
    resumed.check(resumed.code() == Some(0), "expected success");
    resumed.stderr_has(&format!(
        "kept {} shard(s) the earlier run uploaded completely",
        kept.len()
    ));
    assert_eq!(
        stamps(&dir, s3, &bucket, &kept),
        before,
        "a recorded shard was uploaded again: {kept:?}"
    );
    only_the_output(&dir, s3, &bucket, "ref", true);
    println!(
        "killed with {shards} of 6 shards up, {} recorded ({kept:?}): all kept",
        kept.len()
    );
}

/// `reshard run --input in --output OUT --shards 1 --seed SEED`: one shard of every sample, so
/// that two seeds give shards of one size whose samples lie at other offsets.
fn one_shard(out: &str, seed: &str) -> Vec<String> {
    let args = ["run", "--input", "in", "--output", out, "--shards", "1"];
    let mut v: Vec<String> = args.map(String::from).to_vec();
    v.extend(["--seed".to_string(), seed.to_string()]);
    v
}

/// The saved index of the output's one shard, downloaded into `dir`'s `into`.
fn saved_index_of(dir: &Dir, s3: &Server, bucket: &str, into: &str) -> Vec<u8> {
    s3.get(dir, bucket, "out", &dir.join(into));
    let layout = dir
        .join(into)
        .join(".reshard/shard-000000.tar.reshard-layout");
    std::fs::read(&layout).unwrap_or_else(|e| panic!("{}: {e}", layout.display()))
}

/// Issue 37, fenced by construction: the saved index of a kept shard, written again by a
/// resumed run that lost the lock. A0 (seed 1) is killed once its shard is up (no manifest);
/// its saved index at the output is damaged, as a run that died between the shard and its index
/// leaves it. A1, `--resume` of A0's request on another scratch, in another PID namespace (only
/// its heartbeat tells whether it lives), keeps the shard by A0's record and stops itself
/// (SIGSTOP, by a test hook: no outside signal can aim at it) right after it checked that it
/// holds the lock and before it writes that index again. B (seed 2: a shard of the same size,
/// its samples at other offsets) takes the output over by A1's silence and publishes. A1 is
/// continued and fails: B's index must stay B's. The bug: A1 stamped its own index with a look
/// at B's shard and put it over B's, so a reader of B's output believed A's offsets.
#[test]
fn a_kept_shards_saved_index_written_late_is_never_believed_beside_a_successors_shard() {
    use crate::util::lock::{in_namespaces, stopped_in, Stopped};
    let test = "a_kept_shards_saved_index_written_late_is_never_believed_beside_a_successors_shard";
    let dir = Dir::new("s3-resume-late-index");
    sized(&dir, "in", "4MiB", "16KiB", 4);
    let Some(s3) = crate::util::s3::server(test) else {
        return;
    };
    let bucket = s3.bucket(&dir, test);
    let target = format!("s3://{bucket}/out");
    dir.reshard(None)
        .args(one_shard("ref-b", "2"))
        .assert_success();
    let scratch = |cmd: &mut crate::util::TestCommand, name: &str| {
        cmd.arg("--scratch").arg(dir.join(name));
        s3.with_env(cmd);
    };

    let mut a0 = dir.reshard(None);
    a0.args(one_shard(&target, "1"))
        .env("RESHARD_TEST_KILL", "0:uploaded");
    scratch(&mut a0, "scratch-a0");
    let a0 = a0.output();
    a0.check(a0.code() != Some(0), "A0 was killed once its shard was up");
    let layout = "out/.reshard/shard-000000.tar.reshard-layout";
    s3.put_bytes(&dir, &bucket, layout, b"not a saved index");

    let mut resume = one_shard(&target, "1");
    resume.extend(["--resume", "--lock-stale-after", "1"].map(String::from));
    let mut a1 = in_namespaces(&dir, &resume);
    a1.env("RESHARD_TEST_STOP", "0:layout");
    scratch(&mut a1, "scratch-a1");
    let a1 = std::thread::spawn(move || a1.output());
    wait_until("A1 stops right before it writes the saved index", || {
        !stopped_in(&dir).is_empty()
    });
    let stopped_a1 = Stopped::already(stopped_in(&dir));

    let mut b = dir.reshard(None);
    b.args(one_shard(&target, "2"))
        .args(["--lock-stale-after", "1"]);
    scratch(&mut b, "scratch-b");
    let b = b.output();
    b.check(b.code() == Some(0), "B takes the output over and publishes");
    b.stderr_has("taking over");
    let of_b = saved_index_of(&dir, s3, &bucket, "got-b");

    drop(stopped_a1);
    let a1 = a1.join().unwrap();
    a1.check(a1.code() == Some(1), "A1 lost the output: it must fail");
    a1.stderr_has("--resume: kept 1 shard(s)");
    let after = saved_index_of(&dir, s3, &bucket, "got");
    assert!(
        after == of_b,
        "A1 wrote the saved index of B's shard after it lost the lock ({} bytes, B's {})",
        after.len(),
        of_b.len()
    );
    assert_same_output(&dir.join("ref-b"), &dir.join("got"), &["inputs"]);
    // What a successor reads: the next epoch, from B's output, reuses B's index to B's bytes.
    let next = |input: &str, out: &str| {
        let mut cmd = dir.reshard(None);
        cmd.args([
            "run", "--input", input, "--output", out, "--shards", "1", "--seed", "3",
        ]);
        s3.with_env(&mut cmd);
        cmd.assert_success()
    };
    next("ref-b", "next-ref");
    next(&target, "next").stderr_has("reused the saved index of 1 of 1");
    assert_same_output(&dir.join("next-ref"), &dir.join("next"), &["inputs"]);
}

/// A rank killed (SIGKILL) right after it started a multipart upload, before the upload's
/// journal named its id (`RESHARD_TEST_KILL=1:multipart`): the journal holds only the intent.
/// The next run finds that key's upload by listing the key's open uploads
/// (ListMultipartUploads), aborts it, and publishes the uninterrupted run's bytes; uploads
/// at the same prefix that reshard did not start (one at another key, one at a key that starts
/// with a shard's) are left open. Before, the upload was journalled only once it had its id:
/// no later run could find it, and it stayed open (billed) until a lifecycle rule.
#[test]
fn an_upload_started_by_a_rank_killed_before_it_journalled_its_id_is_aborted_by_the_next_run() {
    let test =
        "an_upload_started_by_a_rank_killed_before_it_journalled_its_id_is_aborted_by_the_next_run";
    let dir = Dir::new("s3-unjournalled");
    // Two output shards of about 24 MiB: multipart uploads of 16 MiB parts, one on each rank.
    let generate = ["--shards", "2", "--samples", "400", "--mean-size", "120KiB"];
    dir.generate("in", &[&generate[..], &["--seed", "4"]].concat());
    run(&dir, Some(2), &["in"], "ref", 2, 7, &[]);
    let Some(s3) = crate::util::s3::server(test) else {
        return;
    };
    let bucket = s3.bucket(&dir, test);
    let output = format!("s3://{bucket}/out");
    let shard = "out/shard-000001.tar";
    assert!(
        dir.join("ref/shard-000001.tar").exists(),
        "the shard's name"
    );
    let mut users = vec![format!("{shard}.mine"), "out/mine.bin".to_string()];
    for key in &users {
        s3.start_upload(&dir, &bucket, key);
    }
    let mut cmd = dir.mpi(2);
    cmd.args(["run", "--input", "in", "--output", &output, "--seed", "7"])
        .args(["--shards", "2", "--scratch"])
        .arg(dir.join("scratch-killed"))
        .env("RESHARD_TEST_KILL", "1:multipart");
    let killed = s3.with_env(&mut cmd).output();
    killed.check(killed.code() != Some(0), "the killed run must fail");
    killed.stderr_has("RESHARD_TEST_KILL=1:multipart: rank 1 now dies (SIGKILL) at multipart");
    let open = s3.uploads(&dir, &bucket);
    let dead: Vec<&String> = open.iter().filter(|k| !users.contains(k)).collect();
    assert!(
        !dead.is_empty(),
        "the killed rank's upload is open: {open:?}"
    );
    // Its journal names no id: only the intent.
    let journals: Vec<String> = s3
        .keys(&dir, &bucket, "out/.reshard-multipart/")
        .into_iter()
        .filter(|k| s3.cat(&dir, &bucket, k).is_empty())
        .collect();
    assert!(!journals.is_empty(), "an intent is journalled: {open:?}");
    // Two uploads of the other shard, each journalled by its id: one in a journal of its own
    // (`.reshard-multipart/NAME.PID-NANOS-N`), one in the journal per key of earlier versions.
    // The next run reads both journals of that key and aborts both uploads. Before, one
    // journal per key was shared by every run's upload of it, and a late run's intent or
    // completion could overwrite or remove the journal naming its successor's upload.
    let other = "out/shard-000000.tar";
    for journal in [
        "out/.reshard-multipart/shard-000000.tar.4242-1764395400000000000-0",
        "out/.reshard-multipart/shard-000000.tar",
    ] {
        let id = s3.start_upload(&dir, &bucket, other);
        assert!(!id.is_empty());
        s3.put_bytes(&dir, &bucket, journal, id.as_bytes());
    }

    let mut again = dir.mpi(2);
    again
        .args(["run", "--input", "in", "--output", &output, "--seed", "7"])
        .args(["--shards", "2", "--scratch"])
        .arg(dir.join("scratch-again"));
    let again = s3.with_env(&mut again).output();
    again.check(again.code() == Some(0), "expected success");
    again.stderr_has("unfinished multipart upload(s) an earlier run left");
    let mut open = s3.uploads(&dir, &bucket);
    open.sort();
    users.sort();
    assert_eq!(
        open, users,
        "only the uploads reshard did not start stay open"
    );
    let beside: Vec<String> = s3
        .keys(&dir, &bucket, "")
        .into_iter()
        .filter(|k| !k.starts_with("out/"))
        .collect();
    assert_eq!(beside, Vec::<String>::new(), "objects beside the output");
    s3.get(&dir, &bucket, "out", &dir.join("got"));
    assert_same_output(&dir.join("ref"), &dir.join("got"), &["inputs"]);
    println!("open after the kill: {dead:?}; intents journalled: {journals:?}");
}

/// The marker of the upload under way is the run's first write at its output, made before any
/// work: a run killed right after its steps before the commit (`RESHARD_TEST_KILL=0:index`,
/// before a byte is uploaded) leaves it in the bucket, naming that run's token and nothing
/// uploaded. The next run reads it and clears it, writes its own, and publishes the
/// uninterrupted run's bytes with nothing left beside them. Before, such a run left nothing in
/// the bucket: the marker was written only by the upload phase.
#[test]
fn a_run_killed_right_after_it_began_leaves_its_marker_for_the_next_to_clear() {
    let test = "a_run_killed_right_after_it_began_leaves_its_marker_for_the_next_to_clear";
    let dir = Dir::new("s3-resume-begun");
    sized(&dir, "in", "2MiB", "32KiB", 3);
    run(&dir, Some(1), &["in"], "ref", 3, 7, &[]);
    let Some(s3) = crate::util::s3::server(test) else {
        return;
    };
    let bucket = s3.bucket(&dir, test);
    let output = format!("s3://{bucket}/out");
    let mut cmd = dir.mpi(1);
    cmd.args(["run", "--input", "in", "--output", &output, "--seed", "7"])
        .args(["--shards", "3", "--scratch"])
        .arg(dir.join("scratch"))
        .env("RESHARD_TEST_KILL", "0:index");
    let killed = s3.with_env(&mut cmd).output();
    killed.check(killed.code() != Some(0), "the killed run must fail");
    killed.stderr_has("now dies (SIGKILL) at index");
    let keys = s3.keys(&dir, &bucket, "out/");
    let [key] = &keys[..] else {
        panic!("only the marker is up: {keys:?}")
    };
    let token = key
        .strip_prefix("out/.reshard-incomplete.")
        .unwrap_or_default();
    assert_eq!(token.len(), 32, "the killed run's own marker: {key}");
    let marker: serde_json::Value = serde_json::from_str(&s3.cat(&dir, &bucket, key)).unwrap();
    assert_eq!(marker["uploads"], serde_json::json!([]), "{marker}");
    assert_eq!(marker["records"], token, "{marker}");
    let lock = s3.cat(&dir, &bucket, ".out.reshard-lock");
    assert!(lock.contains(token), "the lock's token {token}: {lock}");

    let again = to_s3(&dir, s3, 1, &output, "scratch", &["--shards", "3"]);
    again.check(again.code() == Some(0), "expected success");
    again.check(
        !again.stderr.contains("without publishing them"),
        "the marker named no object: nothing to say removed",
    );
    only_the_output(&dir, s3, &bucket, "ref", false);
}

/// Rank 0 killed (SIGKILL) right after the staged copy was renamed on the scratch directory,
/// before the staging pointer that led to it went (`0:published` of the copy's own rename,
/// before its upload), over an older output with `--force`, at 2 ranks: the older output stays
/// whole, and `--resume --force` continues the staged copy and publishes the uninterrupted
/// run's bytes. Before, the resumed run failed (exit 1) moving the copy back over the pointer
/// left dangling: `cannot move the staged copy back … Not a directory`.
#[test]
fn a_run_killed_right_after_its_staged_rename_is_resumed() {
    let test = "a_run_killed_right_after_its_staged_rename_is_resumed";
    let dir = Dir::new("s3-resume-staged-rename");
    sized(&dir, "in", "2MiB", "32KiB", 3);
    run(&dir, Some(2), &["in"], "ref", 3, 7, &[]);
    let Some(s3) = crate::util::s3::server(test) else {
        return;
    };
    let bucket = s3.bucket(&dir, test);
    let output = format!("s3://{bucket}/out");
    let older = to_s3(&dir, s3, 1, &output, "scratch", &["--shards", "2"]);
    older.check(older.code() == Some(0), "the older output is published");
    let mut cmd = dir.mpi(2);
    cmd.args(["run", "--input", "in", "--output", &output, "--seed", "7"])
        .args(["--shards", "3", "--force", "--scratch"])
        .arg(dir.join("scratch"))
        .env("RESHARD_TEST_KILL", "0:published");
    let killed = s3.with_env(&mut cmd).output();
    killed.check(killed.code() != Some(0), "the killed run must fail");
    killed.stderr_has("now dies (SIGKILL) at published");

    let again = to_s3(
        &dir,
        s3,
        2,
        &output,
        "scratch",
        &["--shards", "3", "--force", "--resume"],
    );
    again.check(again.code() == Some(0), "the resumed run publishes");
    only_the_output(&dir, s3, &bucket, "ref", false);
}

/// Issue 37, the marker fenced by construction, on SeaweedFS: F (seed 1) is killed as it
/// indexes, leaving its marker. A (seed 1, in another PID namespace: only its heartbeat tells
/// whether it lives) takes the lock over and stops itself at `point`, right after a lock
/// check and before it removes a marker: `unmark-failed` (in its clearing, F's marker, its own
/// written first) or `unmark` (after its manifest, its own). B (seed 2, `--force`) takes the
/// output over by A's silence and is killed once its shard is up: its marker names it. A is
/// continued and fails. B's marker must survive A, so that C (seed 3, `--force`) removes B's
/// objects and publishes its own bytes with nothing left beside them. Before, every run shared
/// one marker object: A removed B's, and C found B's shard without a manifest, not reshard's
/// output, and was refused.
#[test]
fn a_run_stopped_before_it_removes_a_marker_leaves_its_successors() {
    for point in ["unmark-failed", "unmark"] {
        a_stopped_before_it_removes_a_marker(point);
    }
}

fn a_stopped_before_it_removes_a_marker(point: &str) {
    use crate::util::lock::{in_namespaces, stopped_in, Stopped};
    let test = format!("a_run_stopped_before_it_removes_a_marker_leaves_its_successors_{point}");
    let dir = Dir::new(&format!("s3-resume-{point}"));
    sized(&dir, "in", "4MiB", "16KiB", 4);
    let Some(s3) = crate::util::s3::server(&test) else {
        return;
    };
    let bucket = s3.bucket(&dir, &test);
    let target = format!("s3://{bucket}/out");
    dir.reshard(None)
        .args(one_shard("ref-c", "3"))
        .assert_success();
    let run = |seed: &str, scratch: &str, extra: &[&str]| {
        let mut cmd = dir.reshard(None);
        cmd.args(one_shard(&target, seed)).args(extra);
        cmd.arg("--scratch").arg(dir.join(scratch));
        s3.with_env(&mut cmd);
        cmd
    };
    let f = run("1", "scratch-f", &[])
        .env("RESHARD_TEST_KILL", "0:index")
        .output();
    f.check(f.code() != Some(0), "F was killed as it indexed");

    let mut args = one_shard(&target, "1");
    args.extend(["--lock-stale-after", "1", "--scratch"].map(String::from));
    args.push(dir.join("scratch-a").to_string_lossy().into_owned());
    let mut a = in_namespaces(&dir, &args);
    a.env("RESHARD_TEST_STOP", format!("0:{point}"));
    s3.with_env(&mut a);
    let a = std::thread::spawn(move || a.output());
    wait_until("A stops right before it removes a marker", || {
        !stopped_in(&dir).is_empty()
    });
    let stopped_a = Stopped::already(stopped_in(&dir));

    let b = run("2", "scratch-b", &["--force", "--lock-stale-after", "1"])
        .env("RESHARD_TEST_KILL", "0:uploaded")
        .output();
    b.check(b.code() != Some(0), "B was killed once its shard was up");
    b.stderr_has("taking over");
    drop(stopped_a);
    let a = a.join().unwrap();
    a.check(a.code() != Some(0), "A lost the output: it must fail");
    let markers = s3.keys(&dir, &bucket, "out/.reshard-incomplete");
    let [marker] = &markers[..] else {
        panic!("one marker is left, B's: {markers:?}")
    };
    let marker = s3.cat(&dir, &bucket, marker);
    assert!(marker.contains("shard-000000.tar"), "B's marker: {marker}");

    let c = run("3", "scratch-c", &["--force"]).output();
    c.check(c.code() == Some(0), "C clears what B left and publishes");
    c.stderr_has("without publishing them");
    s3.assert_only_the_output(&dir, &bucket, "ref-c", &["inputs"]);
}
