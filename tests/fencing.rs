//! Fencing, attacked as issue 37 did: a run that lost the output's lock (suspended past
//! `--lock-stale-after`, then taken over) wakes and goes on writing. Whatever it writes must be
//! unreachable from its successor, so that nothing a later `--resume` trusts can come from it;
//! and the early refusals the attack found (`--output` a symbolic link, a `--link` that cannot
//! be made) come before any work.

use std::fs;

use crate::util::data::sized;
use crate::util::lock::{in_namespaces, lock_field, stopped_in, wait_until, Stopped};
use crate::util::stores::Store as _;
use crate::util::verifier::assert_same_output;
use crate::util::{reshard_processes, signal, Dir};

mod late;
mod links;
mod nodes;

/// Many small rounds (a 1 MiB budget), a checkpoint after every one: the exchange records
/// checkpoints for as long as it runs.
fn args(out: &str) -> Vec<String> {
    [
        "run",
        "--input",
        "in",
        "--output",
        out,
        "--shards",
        "6",
        "--seed",
        "11",
        "--mem-limit",
        "1MiB",
        "--checkpoint-every",
        "0",
    ]
    .map(String::from)
    .to_vec()
}

/// Run A, in another PID namespace (so that only its heartbeat can tell whether it lives), is
/// stopped (SIGSTOP, as `scontrol suspend` does) mid-exchange. Run B takes the output over once
/// A has been silent past its `--lock-stale-after` and stops itself as its exchange starts. A
/// wakes, goes on with its exchange (checkpoint records after every round) and fails. B's node is
/// then lost (SIGKILL). A run with `--resume` continues B's staging directory: it must publish
/// the clean run's bytes. The bug: A wrote its next checkpoint record by path into B's staging
/// directory, and the resumed run trusted it and published six shards with holes, exit 0.
#[test]
fn a_run_that_lost_its_lock_mid_exchange_writes_nothing_a_resumed_successor_trusts() {
    let dir = Dir::new("fence-fs-checkpoint");
    sized(&dir, "in", "16MiB", "16KiB", 6);
    dir.reshard(None).args(args("ref")).assert_success();

    let mut a = in_namespaces(&dir, &args("out"));
    a.env("RESHARD_TEST_SLOW_ROUNDS", "150");
    let a = std::thread::spawn(move || a.output());
    let checkpoint = dir.join(".out.reshard-tmp/.resume/checkpoint.json");
    wait_until("run A records a checkpoint", || checkpoint.exists());
    let a_token = lock_field(&dir, "token");
    let (a_pid, stopped_a) = stop_run_a(&dir);

    let mut b = dir.reshard(None);
    b.args(args("out"))
        .args(["--lock-stale-after", "1"])
        .env("RESHARD_TEST_STALL_RANK", "0");
    let b = std::thread::spawn(move || b.output());
    wait_until("run B takes the lock over and stops itself", || {
        stopped_in(&dir).iter().any(|&p| p != a_pid)
    });
    let b_pid = stopped_in(&dir)
        .into_iter()
        .find(|&p| p != a_pid)
        .expect("run B is stopped");
    assert_ne!(lock_field(&dir, "token"), a_token, "B holds the lock");

    drop(stopped_a);
    let a = a.join().unwrap();
    a.check(a.code() == Some(1), "A lost the output: it must fail");
    a.stderr_has("this run lost the output's lock");
    a.check(!dir.join("out").exists(), "A must publish nothing");

    // B's node is lost: its lock stays, held by a pid that is gone.
    signal(u32::try_from(b_pid).unwrap(), libc::SIGKILL);
    let b = b.join().unwrap();
    b.check(b.code() != Some(0), "B was killed");

    let c = dir
        .reshard(None)
        .args(args("out"))
        .arg("--resume")
        .assert_success();
    c.stderr_has("--resume");
    assert_same_output(&dir.join("ref"), &dir.join("out"), &["ranks"]);
    let left: Vec<String> = fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".out."))
        .collect();
    assert!(
        left.is_empty(),
        "nothing of the three runs is left: {left:?}"
    );
}

/// Stops run A, the one reshard process running in `dir` (SIGSTOP), as a scheduler suspends a
/// job: its pid, and what continues it when dropped.
fn stop_run_a(dir: &Dir) -> (i32, Stopped) {
    let a_pid = reshard_processes(dir.path())
        .first()
        .map(|&(pid, _)| i32::try_from(pid).unwrap())
        .expect("run A runs");
    let stopped = Stopped::stop(a_pid);
    wait_until("run A is stopped", || stopped_in(dir).contains(&a_pid));
    (a_pid, stopped)
}

/// The plain arguments of the refusal tests: a small input, two shards.
fn small_run(dir: &Dir, out: &str) -> crate::util::TestCommand {
    let mut cmd = dir.reshard(None);
    cmd.args([
        "run", "--input", "in", "--output", out, "--shards", "2", "--seed", "1",
    ]);
    cmd
}

/// An `--output` that is a symbolic link (to an empty directory, or to nothing) is refused
/// before any work, naming it (the bug: the whole job ran and its publishing rename failed).
/// The run would die once it indexed (a test hook), so a late refusal cannot pass.
#[test]
fn an_output_that_is_a_symbolic_link_is_refused_before_any_work() {
    let dir = Dir::new("fence-output-link");
    sized(&dir, "in", "512KiB", "16KiB", 2);
    dir.create_dir("real");
    for (link, to) in [("out", "real"), ("gone", "nowhere")] {
        std::os::unix::fs::symlink(to, dir.join(link)).unwrap();
        let res = small_run(&dir, link)
            .env("RESHARD_TEST_KILL", "0:index")
            .output();
        res.check(res.code() == Some(1), "refused, not killed after indexing");
        res.stderr_has(&format!("--output {link}: is a symbolic link"));
        res.check(
            fs::read_dir(dir.join("real")).unwrap().next().is_none(),
            "nothing is written where it leads",
        );
        res.check(
            fs::read_link(dir.join(link)).unwrap() == std::path::Path::new(to),
            "the link is left as it is",
        );
    }
}

/// A `--link` that could never be made after publishing (its directory does not exist, or it is
/// the output itself) is a usage error before any work (exit 2), not a failure after publishing
/// (exit 3, the output published).
#[test]
fn a_link_that_cannot_be_made_is_refused_before_any_work() {
    let dir = Dir::new("fence-link-early");
    sized(&dir, "in", "512KiB", "16KiB", 2);
    for (link, why) in [
        ("no/such/dir/current", "does not exist"),
        ("out", "is the --output"),
        ("out/current", "does not exist"),
    ] {
        let res = small_run(&dir, "out").args(["--link", link]).output();
        res.check(res.code() == Some(2), &format!("--link {link}: exit 2"));
        res.stderr_has(&format!("--link {link}: "));
        res.stderr_has(why);
        res.check(!dir.join("out").exists(), "nothing is published");
    }
}

/// `--keep` removes only outputs reshard wrote: a directory of the series holding a copied
/// index.json (its shards are not there), an empty `.reshard/` and the user's own file is not one
/// (the bug: it was removed with the user's file).
#[test]
fn keep_leaves_a_directory_with_a_copied_manifest_alone() {
    let dir = Dir::new("fence-keep-copied");
    sized(&dir, "in", "512KiB", "16KiB", 2);
    let series = |e: &str| {
        let mut cmd = dir.reshard(None);
        cmd.args([
            "run",
            "--input",
            "in",
            "--output",
            "out/epoch-{epoch}",
            "--shards",
            "2",
        ])
        .args(["--seed", "1", "--keep", "1", "--epoch", e]);
        cmd
    };
    dir.create_dir("out");
    series("1").assert_success();
    dir.create_dir("out/epoch-0/.reshard");
    fs::copy(
        dir.join("out/epoch-1/index.json"),
        dir.join("out/epoch-0/index.json"),
    )
    .unwrap();
    dir.create_bytes("out/epoch-0/mine.txt", b"the user's own");
    series("2").assert_success();
    assert!(
        !dir.join("out/epoch-1").exists(),
        "a real older output goes"
    );
    assert_eq!(
        fs::read(dir.join("out/epoch-0/mine.txt")).unwrap(),
        b"the user's own",
        "a directory with a copied index.json is not reshard's"
    );
    // --force refuses it by the same rule.
    let res = dir
        .reshard(None)
        .args(["run", "--input", "in", "--output", "out/epoch-0", "--force"])
        .args(["--shards", "2", "--seed", "1"])
        .output();
    res.check(res.code() == Some(1), "--force refuses it");
    res.stderr_has("which is not there");
    assert!(dir.join("out/epoch-0/mine.txt").exists());
}

/// Where the rules of outputs are tried: a directory beside the test's files, or a bucket.
enum Store<'a> {
    Fs,
    S3(&'a crate::util::s3::Server, String),
}

impl Store<'_> {
    /// The `--output` for `name` (a path relative to the test's directory, or a key prefix).
    fn output(&self, name: &str) -> String {
        match self {
            Store::Fs => name.to_string(),
            Store::S3(_, bucket) => format!("s3://{bucket}/{name}"),
        }
    }

    fn put(&self, dir: &Dir, name: &str, bytes: &[u8]) {
        match self {
            Store::Fs => {
                dir.create_bytes(name, bytes);
            }
            Store::S3(s3, bucket) => s3.put_bytes(dir, bucket, name, bytes),
        }
    }

    fn get(&self, dir: &Dir, name: &str) -> Option<Vec<u8>> {
        match self {
            Store::Fs => fs::read(dir.join(name)).ok(),
            Store::S3(s3, bucket) => s3
                .keys(dir, bucket, name)
                .contains(&name.to_string())
                .then(|| s3.cat(dir, bucket, name).into_bytes()),
        }
    }

    /// Whether anything is left of `name`: on a file system the directory or what `--keep`
    /// moved aside of it (`.NAME.reshard-removing`), on S3 any object under its prefix.
    fn anything_of(&self, dir: &Dir, name: &str) -> bool {
        match self {
            Store::Fs => {
                let (parent, base) = name.rsplit_once('/').unwrap();
                let aside = format!("{parent}/.{base}.reshard-removing");
                dir.join(name).exists() || dir.join(aside).exists()
            }
            Store::S3(s3, bucket) => !s3.keys(dir, bucket, &format!("{name}/")).is_empty(),
        }
    }

    /// Every file under `name`, relative to it, sorted (on S3 every object under its prefix).
    fn listing(&self, dir: &Dir, name: &str) -> Vec<String> {
        let mut names = match self {
            Store::Fs => {
                let root = dir.join(name);
                let mut found = Vec::new();
                let mut todo = vec![root.clone()];
                while let Some(d) = todo.pop() {
                    for e in fs::read_dir(&d).into_iter().flatten() {
                        let p = e.unwrap().path();
                        if p.is_dir() {
                            todo.push(p);
                        } else {
                            let rel = p.strip_prefix(&root).unwrap();
                            found.push(rel.to_string_lossy().into_owned());
                        }
                    }
                }
                found
            }
            Store::S3(s3, bucket) => {
                let prefix = format!("{name}/");
                let keys = s3.keys(dir, bucket, &prefix);
                keys.iter()
                    .map(|k| k.strip_prefix(&prefix).unwrap_or(k).to_string())
                    .collect()
            }
        };
        names.sort();
        names
    }

    fn run(&self, dir: &Dir, out: &str, extra: &[&str]) -> crate::util::RunOutput {
        self.run_with(dir, out, extra, &[])
    }

    fn run_with(
        &self,
        dir: &Dir,
        out: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> crate::util::RunOutput {
        let mut cmd = dir.reshard(None);
        cmd.args([
            "run",
            "--input",
            "in",
            "--output",
            &self.output(out),
            "--seed",
            "1",
        ]);
        if !extra.contains(&"--shards") {
            cmd.args(["--shards", "2"]);
        }
        cmd.args(extra);
        for (k, v) in env {
            cmd.env(k, v);
        }
        match self {
            Store::Fs => cmd.output(),
            Store::S3(s3, _) => {
                cmd.arg("--scratch").arg(dir.join("scratch"));
                s3.with_env(&mut cmd).output()
            }
        }
    }
}

/// The rules of outputs, one table on every store: what `--force` replaces and `--keep`
/// removes is decided by one rule (reshard's manifest, every shard it lists there with its
/// size), so a copied `index.json` beside the user's own file is never replaced or removed.
#[test]
fn the_rules_of_outputs_hold_on_every_store() {
    let test = "the_rules_of_outputs_hold_on_every_store";
    let dir = Dir::new("fence-rules");
    sized(&dir, "in", "512KiB", "16KiB", 2);
    dir.create_dir("series");
    let Some(s3) = crate::util::s3::server(test) else {
        return;
    };
    let bucket = s3.bucket(&dir, test);
    for store in [Store::Fs, Store::S3(s3, bucket)] {
        let ok = |out: crate::util::RunOutput| out.check(out.code() == Some(0), "expected success");
        ok(store.run(&dir, "series/epoch-1", &[]));
        let copied = store.get(&dir, "series/epoch-1/index.json").unwrap();
        // What a run writes where nothing was, to compare a replaced output with.
        ok(store.run(&dir, "fresh", &[]));
        let mut fresh = store.listing(&dir, "fresh");
        fresh.push("mine.txt".into());
        fresh.sort();
        // (what is at the output, flags, expected status, what the message says)
        let table: [(&str, &[&str], i32, &str); 6] = [
            ("a copied index.json", &["--force"], 1, "which is not there"),
            ("a copied index.json", &[], 1, "exists and is not empty"),
            ("a reshard output", &[], 1, "exists and is not empty"),
            ("a reshard output of more shards", &["--force"], 0, ""),
            (
                "the user's file alone",
                &["--force"],
                1,
                "--force replaces only",
            ),
            ("a reshard output", &["--force"], 0, ""),
        ];
        for (i, (what, flags, status, says)) in table.into_iter().enumerate() {
            let out = format!("case-{i}");
            if what.starts_with("a reshard output") {
                // The one of more shards with loader indexes (every shard's, and energon's
                // `.nv-meta/`), which the new output, without them, does not write again.
                let more = what.ends_with("more shards");
                let loaders: &[&str] = &["--shards", "3", "--dali-index", "--energon"];
                ok(store.run(&dir, &out, if more { loaders } else { &[] }));
            }
            store.put(&dir, &format!("{out}/mine.txt"), b"the user's own");
            if what == "a copied index.json" {
                store.put(&dir, &format!("{out}/index.json"), &copied);
            }
            let res = store.run(&dir, &out, flags);
            res.check(res.code() == Some(status), &format!("{what} {flags:?}"));
            res.stderr_has(says);
            res.check(
                store.get(&dir, &format!("{out}/mine.txt")).as_deref()
                    == Some(b"the user's own".as_slice()),
                "the user's file stays, byte for byte",
            );
            nothing_of_the_replaced_is_left(&store, &dir, &out, &res);
            if status == 0 {
                // Replaced: what a run writes where nothing was, and the user's file.
                let listing = store.listing(&dir, &out);
                res.check(listing == fresh, &format!("{out}: {listing:?}"));
            }
        }
        keep_removes_only_reshards(&store, &dir, &copied);
    }
}

/// `--keep` over the table's series (`series/epoch-1` published, with `copied` its manifest):
/// a directory with a copied index.json stays; of an older output only what reshard wrote
/// goes, the user's file inside it stays, also where the removal is cut short and finished by
/// the next run.
fn keep_removes_only_reshards(store: &Store<'_>, dir: &Dir, copied: &[u8]) {
    let ok = |out: crate::util::RunOutput| out.check(out.code() == Some(0), "expected success");
    // --keep 1 over a series holding a directory with a copied index.json: it stays.
    store.put(dir, "series/epoch-0/index.json", copied);
    store.put(dir, "series/epoch-0/mine.txt", b"the user's own");
    if matches!(store, Store::Fs) {
        dir.create_dir("series/epoch-0/.reshard");
    }
    // The user's file inside the older output --keep removes: only reshard's goes.
    store.put(dir, "series/epoch-1/mine.txt", b"the user's own 1");
    let res = store.run(
        dir,
        "series/epoch-{epoch}",
        &["--epoch", "2", "--keep", "1"],
    );
    ok(res);
    assert!(store.get(dir, "series/epoch-0/mine.txt").is_some());
    assert!(store.get(dir, "series/epoch-1/index.json").is_none());
    assert_eq!(store.listing(dir, "series/epoch-1"), ["mine.txt"]);
    assert_eq!(
        store.get(dir, "series/epoch-1/mine.txt").unwrap(),
        b"the user's own 1"
    );
    // And in one whose removal is cut short, then finished by the next run.
    store.put(dir, "series/epoch-2/mine.txt", b"the user's own 2");
    // A --keep cut short once the older output stopped being one (moved aside, or its
    // manifest gone under its removal marker) is finished by the next --keep run.
    let keep = |epoch: &str, env: &[(&str, &str)]| {
        let flags = ["--epoch", epoch, "--keep", "1"];
        store.run_with(dir, "series/epoch-{epoch}", &flags, env)
    };
    let cut = keep("3", &[("RESHARD_TEST_KILL", "0:keep")]);
    cut.check(cut.code() != Some(0), "the run killed in --keep fails");
    assert!(store.get(dir, "series/epoch-3/index.json").is_some());
    assert!(store.get(dir, "series/epoch-2/index.json").is_none());
    assert!(
        store.anything_of(dir, "series/epoch-2"),
        "a removal cut short"
    );
    let res = keep("4", &[]);
    res.stderr_has("--keep: finishing the removal of");
    ok(res);
    assert!(
        !store.anything_of(dir, "series/epoch-3"),
        "epoch-3 is removed"
    );
    assert_eq!(store.listing(dir, "series/epoch-2"), ["mine.txt"]);
    assert_eq!(
        store.get(dir, "series/epoch-2/mine.txt").unwrap(),
        b"the user's own 2"
    );
    assert!(!dir.join("series/.epoch-2.reshard-removing").exists());
    assert!(store.get(dir, "series/epoch-4/index.json").is_some());
    assert!(store.get(dir, "series/epoch-0/mine.txt").is_some());
}

/// Nothing reshard wrote of the output the new output at `out` replaced is left after the
/// commit, on either store: a shard it does not name with its saved index (the bug: on S3 the
/// saved index stayed under the new output), and every loader index (on S3 those of a shard
/// beyond the new count, and `.nv-meta/`, stayed). (The user's file inside it is no rule's
/// concern here: the table's caller checks that it stays on every store.)
fn nothing_of_the_replaced_is_left(
    store: &Store<'_>,
    dir: &Dir,
    out: &str,
    res: &crate::util::RunOutput,
) {
    for gone in [
        "shard-000002.tar",
        ".reshard/shard-000002.tar.reshard-layout",
        "shard-000002.idx",
        "shard-000002.tar.idx",
        "shard-000000.idx",
        ".nv-meta/index.sqlite",
    ] {
        let left = store.get(dir, &format!("{out}/{gone}"));
        res.check(left.is_none(), &format!("{out}: {gone} is left"));
    }
    res.check(
        !store.anything_of(dir, &format!("{out}/.nv-meta")),
        &format!("{out}: .nv-meta/ is left"),
    );
}

/// The arguments of a run to `out` (an `s3://` location or a directory) with `seed`: the
/// attacked run and its successor differ in seed, so that a shard of one over the other's shows.
/// Kills (SIGKILL) every reshard process run in `dir` but the stopped run A's (`a_pid`): run
/// B, taken over from A, ended as a lost node would end it.
fn kill_all_but(dir: &Dir, a_pid: i32) {
    for (pid, _) in reshard_processes(dir.path()) {
        if i32::try_from(pid).unwrap() != a_pid {
            signal(pid, libc::SIGKILL);
        }
    }
}

fn upload_args(out: &str, shards: usize, seed: &str) -> Vec<String> {
    let shards = shards.to_string();
    [
        "run", "--input", "in", "--output", out, "--shards", &shards, "--seed", seed,
    ]
    .map(String::from)
    .to_vec()
}

/// The attack of issue 37 on an `s3://` output, without test hooks: run A (another PID
/// namespace, so only its heartbeat can tell whether it lives; its writes slowed by
/// `--max-write-rate` so that its upload takes seconds) is stopped (SIGSTOP) once its first
/// shards are up and another is on its way. Run B, another request on the same output, takes the
/// lock over by silence and publishes, exit 0. A is continued: its upload in flight completes
/// or fails, and A fails saying nothing is published. B's published objects must stay exactly
/// B's (the bytes of B's request run on a file system), and A's staged copy must be left (moved
/// aside), not removed. The bug: A's shard in flight was put over B's published one.
fn a_run_that_lost_its_lock_mid_upload(test: &str, total: &str, shards: usize) {
    let dir = Dir::new(test);
    sized(&dir, "in", total, "64KiB", shards);
    let Some(s3) = crate::util::s3::server(test) else {
        return;
    };
    let bucket = s3.bucket(&dir, test);
    let target = format!("s3://{bucket}/out");
    dir.reshard(None)
        .args(upload_args("ref-b", shards, "2"))
        .assert_success();

    let mut a = in_namespaces(&dir, &upload_args(&target, shards, "1"));
    a.args(["--max-write-rate", "6MiB", "--scratch"])
        .arg(dir.join("scratch"));
    s3.with_env(&mut a);
    let a = std::thread::spawn(move || a.output());
    let shard_keys = || {
        s3.keys(&dir, &bucket, "out/")
            .into_iter()
            .filter(|k| k.ends_with(".tar") && !k.contains("/."))
            .count()
    };
    wait_until("run A has uploaded a shard", || shard_keys() >= 1);
    let (_, stopped_a) = stop_run_a(&dir);
    let up_when_stopped = shard_keys();
    assert!(up_when_stopped < shards, "A was stopped after its upload");

    let mut b = dir.reshard(None);
    b.args(upload_args(&target, shards, "2"))
        .args(["--lock-stale-after", "1", "--scratch"])
        .arg(dir.join("scratch"));
    s3.with_env(&mut b);
    let b = b.output();
    b.check(b.code() == Some(0), "B takes the output over and publishes");
    b.stderr_has("taking over");
    b.stderr_has("aside");

    drop(stopped_a);
    let a = a.join().unwrap();
    a.check(a.code() == Some(1), "A lost the output: it must fail");
    a.stderr_has("nothing of this run is published");
    a.stderr_has("this run lost the output's lock");

    s3.get(&dir, &bucket, "out", &dir.join("got"));
    assert_same_output(&dir.join("ref-b"), &dir.join("got"), &["ranks", "inputs"]);
    let staged = crate::util::staged_bucket(&dir.join("scratch"), &bucket).unwrap();
    let aside: Vec<String> = fs::read_dir(&staged)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".out.reshard-left."))
        .collect();
    assert_eq!(aside.len(), 1, "A's staged copy is moved aside: {aside:?}");
    let kept = staged.join(&aside[0]);
    assert!(
        kept.join("index.json").exists(),
        "A's staged copy is whole: {}",
        crate::util::listing(&kept)
    );
}

/// Shards under a part (one PUT each): A's PUT in flight lands after B published.
#[test]
fn a_run_that_lost_its_lock_mid_upload_cannot_replace_published_objects() {
    a_run_that_lost_its_lock_mid_upload(
        "a_run_that_lost_its_lock_mid_upload_cannot_replace_published_objects",
        "24MiB",
        6,
    );
}

/// Shards of multipart uploads (over 16 MiB): A's upload in flight completes after B published.
#[test]
fn a_run_that_lost_its_lock_mid_multipart_upload_cannot_replace_published_objects() {
    a_run_that_lost_its_lock_mid_upload(
        "a_run_that_lost_its_lock_mid_multipart_upload_cannot_replace_published_objects",
        "60MiB",
        3,
    );
}

/// The run's own side of the fence: objects put at its shards' names while it uploads (one it
/// created already, overwritten by a writer without conditions; one it has not completed yet)
/// are found before the manifest, removed while it holds the lock, and created again: the
/// store refused the conditional completion of its multipart upload (`412`), and the object
/// it created earlier is not the size and ETag it recorded. The output is the clean run's bytes.
/// Before this change the completion overwrote the one and the other went unnoticed.
#[test]
fn objects_put_at_a_runs_names_while_it_uploads_are_replaced_before_it_publishes() {
    let test = "objects_put_at_a_runs_names_while_it_uploads_are_replaced_before_it_publishes";
    let dir = Dir::new(test);
    sized(&dir, "in", "40MiB", "64KiB", 2);
    let Some(s3) = crate::util::s3::server(test) else {
        return;
    };
    let bucket = s3.bucket(&dir, test);
    dir.reshard(None)
        .args(upload_args("ref", 2, "3"))
        .assert_success();
    let mut run = dir.reshard(None);
    run.args(upload_args(&format!("s3://{bucket}/out"), 2, "3"))
        .arg("--scratch")
        .arg(dir.join("scratch"))
        .env("RESHARD_TEST_PAUSE_UPLOAD", "300");
    s3.with_env(&mut run);
    let run = std::thread::spawn(move || run.output());
    let scratch = dir.join("scratch");
    let marker =
        || crate::util::staged_bucket(&scratch, &bucket).map(|b| b.join(".paused-upload-0"));
    wait_until(
        "the run pauses in its last shard's multipart upload",
        || marker().is_some_and(|m| m.exists()),
    );
    for i in 0..2 {
        s3.put_bytes(
            &dir,
            &bucket,
            &format!("out/shard-{i:06}.tar"),
            b"not the run's",
        );
    }
    fs::remove_file(marker().unwrap()).unwrap();
    let out = run.join().unwrap();
    out.check(out.code() == Some(0), "expected success");
    let replaced = out
        .stderr
        .matches("was there before this run created it")
        .count();
    out.check(replaced == 2, "both objects put there are replaced");
    s3.get(&dir, &bucket, "out", &dir.join("got"));
    assert_same_output(&dir.join("ref"), &dir.join("got"), &["ranks", "inputs"]);
}

/// The upload records of issue 37's bucket `--resume` are fenced: run A (another PID namespace,
/// seed 1) is stopped (SIGSTOP) once a shard of it is recorded as uploaded in the bucket; run B
/// (seed 2) takes the output over by A's silence and is killed (SIGKILL) once a shard of its own
/// is recorded. A is continued: having lost the lock, it goes on creating the shards B never
/// reached and records them, late, under its own token; then it fails. A `--resume` of A's
/// request (seed 1) on a scratch directory of its own (no staged copy to continue, as on another
/// node) continues B, the run whose lock it took over: it does not read A's late records (each
/// would hold up: A's objects are there, with the resumed run's very bytes), and it does not keep
/// B's recorded shards (B's request's bytes, not its own: the MD5 differs). It publishes A's
/// request's bytes, leaves no open multipart upload and nothing beside the output.
#[test]
fn an_upload_record_of_a_run_that_lost_its_lock_is_not_believed() {
    let test = "an_upload_record_of_a_run_that_lost_its_lock_is_not_believed";
    let dir = Dir::new(test);
    sized(&dir, "in", "24MiB", "64KiB", 6);
    let Some(s3) = crate::util::s3::server(test) else {
        return;
    };
    let bucket = s3.bucket(&dir, test);
    let target = format!("s3://{bucket}/out");
    dir.reshard(None)
        .args(upload_args("ref-a", 6, "1"))
        .assert_success();
    // Every run's records, by its token: (token, shard).
    let records = || -> Vec<(String, String)> {
        s3.keys(&dir, &bucket, ".out.reshard-records.")
            .into_iter()
            .filter_map(|k| {
                let (prefix, shard) = k.split_once('/')?;
                let token = prefix.strip_prefix(".out.reshard-records.")?;
                Some((token.to_string(), shard.to_string()))
            })
            .collect()
    };
    let slow = |cmd: &mut crate::util::TestCommand, rate: &str, scratch: &str| {
        cmd.args(["--max-write-rate", rate, "--scratch"])
            .arg(dir.join(scratch));
    };
    let mut a = in_namespaces(&dir, &upload_args(&target, 6, "1"));
    slow(&mut a, "3MiB", "scratch-a");
    s3.with_env(&mut a);
    let a = std::thread::spawn(move || a.output());
    wait_until("run A records a shard as uploaded", || {
        !records().is_empty()
    });
    let (a_pid, stopped_a) = stop_run_a(&dir);
    let a_token = records()[0].0.clone();

    let mut b = dir.reshard(None);
    b.args(upload_args(&target, 6, "2"))
        .args(["--lock-stale-after", "1"]);
    // Slower: killed once its first shard is recorded, B is seconds from its second, so the
    // shard A was uploading when it was stopped is still free when A wakes.
    slow(&mut b, "2MiB", "scratch-b");
    s3.with_env(&mut b);
    let b = std::thread::spawn(move || b.output());
    wait_until("run B records a shard as uploaded", || {
        records().iter().any(|r| r.0 != a_token)
    });
    kill_all_but(&dir, a_pid);
    let b = b.join().unwrap();
    b.check(b.code() != Some(0), "B was killed");
    b.stderr_has("taking over");
    let of_b = records().iter().filter(|r| r.0 != a_token).count();

    drop(stopped_a);
    let a = a.join().unwrap();
    a.check(a.code() == Some(1), "A lost the output: it must fail");
    a.stderr_has("this run lost the output's lock");
    let late = records().iter().filter(|r| r.0 == a_token).count();
    assert!(late > 0, "A recorded nothing after it lost the lock");

    let mut c = dir.reshard(None);
    c.args(upload_args(&target, 6, "1"))
        .args(["--resume", "--scratch"])
        .arg(dir.join("scratch-c"));
    s3.with_env(&mut c);
    let c = c.assert_success();
    c.check(
        !c.stderr.contains("the earlier run uploaded completely"),
        "a shard was kept",
    );
    let other = c.stderr.matches("is not the bytes this run stages").count();
    c.check(
        other == of_b,
        "each of B's recorded shards is found another's",
    );
    s3.assert_only_the_output(&dir, &bucket, "ref-a", &["ranks", "inputs"]);
    println!("A recorded {late} shard(s) after it lost the lock, B {of_b}: none kept");
}

/// Two runs of *different* outputs of one name (`s3://B/out` at two endpoints; likewise an
/// `az://` container in two accounts) staged on one `--scratch`: each holds only its own
/// output's lock, in its own store, so at one staged path the second removed the first's live
/// staged copy and the first published the second's manifest over its own shard, exit 0 (found
/// by a review). The store is part of the staged path: both runs publish their own bytes.
#[test]
fn outputs_of_one_name_in_two_stores_staged_on_one_scratch_keep_apart() {
    let test = "outputs_of_one_name_in_two_stores_staged_on_one_scratch_keep_apart";
    let dir = Dir::new(test);
    sized(&dir, "in", "40MiB", "64KiB", 2);
    let Some(s3) = crate::util::s3::server(test) else {
        return;
    };
    let Some(s3b) = crate::util::s3::Server::private(&dir, test) else {
        return;
    };
    for (out, seed) in [("ref-a", "3"), ("ref-b", "4")] {
        dir.reshard(None)
            .args(upload_args(out, 2, seed))
            .assert_success();
    }
    let bucket = s3.bucket(&dir, test);
    s3b.client(&dir, &["mb", &bucket]);
    let target = format!("s3://{bucket}/out");
    let scratch = dir.join("scratch");
    let mut a = dir.reshard(None);
    a.args(upload_args(&target, 2, "3"))
        .arg("--scratch")
        .arg(&scratch)
        .env("RESHARD_TEST_PAUSE_UPLOAD", "300");
    s3.with_env(&mut a);
    let a = std::thread::spawn(move || a.output());
    let marker = || {
        crate::util::staged_bucket(&scratch, &bucket)
            .map(|b| b.join(".paused-upload-0"))
            .filter(|m| m.exists())
    };
    wait_until("run A pauses in its upload", || marker().is_some());
    let marker = marker().unwrap();

    let mut b = dir.reshard(None);
    b.args(upload_args(&target, 2, "4"))
        .arg("--scratch")
        .arg(&scratch);
    s3b.with_env(&mut b);
    let b = b.output();
    b.check(b.code() == Some(0), "B, another output, runs beside A");
    fs::remove_file(&marker).unwrap();
    let a = a.join().unwrap();
    a.check(a.code() == Some(0), "A is untouched by B");
    s3.get(&dir, &bucket, "out", &dir.join("got-a"));
    s3b.get(&dir, &bucket, "out", &dir.join("got-b"));
    assert_same_output(&dir.join("ref-a"), &dir.join("got-a"), &["ranks", "inputs"]);
    assert_same_output(&dir.join("ref-b"), &dir.join("got-b"), &["ranks", "inputs"]);
}

/// A removal at the output's names is fenced by a check, then sent: run A (another PID
/// namespace, seed 1), paused before its upload, finds an object at its first shard's name (put
/// there while it paused, as a late write would land) and is stopped (SIGSTOP, as `scontrol
/// suspend` may stop it anywhere) right after its fence check passed, before the removal is
/// sent. Run B (seed 2) takes the output over by A's silence and publishes, exit 0. A is
/// continued. B's published output must stay exactly B's. The bug: A's removal, checked while it
/// held the lock, removed B's published shard, and A then created its own at the free name, so
/// B's index.json listed A's shard (another request's bytes, another size).
#[test]
fn a_run_stopped_between_its_fence_check_and_a_removal_removes_nothing_published() {
    let test = "a_run_stopped_between_its_fence_check_and_a_removal_removes_nothing_published";
    let dir = Dir::new(test);
    sized(&dir, "in", "4MiB", "16KiB", 3);
    let Some(s3) = crate::util::s3::server(test) else {
        return;
    };
    let bucket = s3.bucket(&dir, test);
    let target = format!("s3://{bucket}/out");
    dir.reshard(None)
        .args(upload_args("ref-b", 3, "2"))
        .assert_success();
    let scratch = dir.join("scratch");

    let mut a = in_namespaces(&dir, &upload_args(&target, 3, "1"));
    a.arg("--scratch")
        .arg(&scratch)
        .env("RESHARD_TEST_PAUSE_PUBLISH", "300")
        .env("RESHARD_TEST_STOP", "0:remove");
    s3.with_env(&mut a);
    let a = std::thread::spawn(move || a.output());
    let marker = || {
        let staged = crate::util::staged_bucket(&scratch, &bucket)?;
        fs::read_dir(staged)
            .ok()?
            .flatten()
            .map(|e| e.path().join(".paused-publish-0"))
            .find(|m| m.exists())
    };
    wait_until("run A pauses before its upload", || marker().is_some());
    s3.put_bytes(&dir, &bucket, "out/shard-000000.tar", b"a late write");
    fs::remove_file(marker().unwrap()).unwrap();
    wait_until("run A stops right before its removal", || {
        !stopped_in(&dir).is_empty()
    });
    let stopped_a = Stopped::already(stopped_in(&dir));

    let mut b = dir.reshard(None);
    b.args(upload_args(&target, 3, "2"))
        .args(["--lock-stale-after", "1", "--scratch"])
        .arg(dir.join("scratch"));
    s3.with_env(&mut b);
    let b = b.output();
    b.check(b.code() == Some(0), "B takes the output over and publishes");
    b.stderr_has("taking over");

    drop(stopped_a);
    let a = a.join().unwrap();
    a.check(a.code() == Some(1), "A lost the output: it must fail");
    a.stderr_has("nothing of this run is published");

    s3.get(&dir, &bucket, "out", &dir.join("got"));
    assert_same_output(&dir.join("ref-b"), &dir.join("got"), &["ranks", "inputs"]);
}
