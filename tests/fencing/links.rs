//! Symbolic links put where reshard found an output of its own, between that check and the
//! removal it decided on: the removal must never go through the link, whose target was never
//! an output of the series.

use std::fs;

use crate::util::lock::{stopped_in, wait_until, Stopped};
use crate::util::{data::sized, Dir};

/// `--keep` finds the older outputs of the series first, then removes them one after the
/// other (each moved aside, then what reshard wrote of it removed): the run is stopped
/// (SIGSTOP, as a suspended job may be; a large epoch's removal takes as long) once the first
/// is moved aside, and the next, `epoch-1`, is replaced by a symbolic link to `other`, a
/// dataset of reshard's that is not of the series, holding the user's notes. The bug: the
/// link was moved aside as the epoch and the removal went through it, deleting `other`'s
/// shards, saved indexes and index.json.
#[test]
fn keep_never_removes_through_a_link_put_at_an_older_epoch_while_it_prunes() {
    let dir = Dir::new("fence-keep-swapped-link");
    sized(&dir, "in", "512KiB", "16KiB", 2);
    for out in ["epoch-1", "epoch-2", "other"] {
        super::small_run(&dir, out).assert_success();
    }
    fs::write(dir.join("other/NOTES"), b"mine").unwrap();
    let before = crate::util::listing(&dir.join("other"));
    let mut run = super::small_run(&dir, "epoch-{epoch}");
    run.args(["--epoch", "3", "--keep", "1"])
        .env("RESHARD_TEST_STOP", "0:keep");
    let run = std::thread::spawn(move || run.output());
    wait_until("the run stops once it moved epoch-2 aside", || {
        !stopped_in(&dir).is_empty()
    });
    let stopped = Stopped::already(stopped_in(&dir));
    fs::rename(dir.join("epoch-1"), dir.join("epoch-1.mine")).unwrap();
    std::os::unix::fs::symlink("other", dir.join("epoch-1")).unwrap();
    drop(stopped);
    let aside = dir.join(".epoch-1.reshard-removing");
    wait_until("the run stops once it moved epoch-1 aside", || {
        fs::symlink_metadata(&aside).is_ok() && !stopped_in(&dir).is_empty()
    });
    drop(Stopped::already(stopped_in(&dir)));
    let res = run.join().unwrap();
    res.check(res.code() == Some(0), "the new epoch is published");
    let after = crate::util::listing(&dir.join("other"));
    res.check(
        after == before,
        &format!("other is left as it was:\nbefore:\n{before}\nafter:\n{after}"),
    );
    res.check(
        fs::read_link(dir.join("epoch-1")).ok() == Some("other".into()),
        "the link goes back to its name, as it was",
    );
    res.check(!dir.join("epoch-2").exists(), "epoch-2 is removed");
}

/// `--force` checks what is at the output at publishing, then swaps (`RENAME_EXCHANGE`): the
/// output path replaced by a symbolic link in between (here while rank 0 is stopped right before
/// its rename, as a suspended run may be) is swapped to the staging name, and the link must not
/// be followed by the removal of the replaced output. The bug: the removal went through the link
/// and deleted what reshard wrote of `other`, a dataset that was never the output, and moved
/// the user's notes out of it into the new output (exit 0).
#[test]
fn force_never_removes_through_a_link_put_at_the_output_before_its_swap() {
    let (dir, before, res) = force_run_swapped_to_a_link("fence-force-swapped-link", None);
    let after = crate::util::listing(&dir.join("other"));
    res.check(
        after == before,
        &format!("other is left as it was:\nbefore:\n{before}\nafter:\n{after}"),
    );
    res.check(
        fs::read(dir.join("other/NOTES")).ok().as_deref() == Some(&b"mine"[..]),
        "the user's notes stay in other",
    );
}

/// The same `--force` run killed right after its exchange instead (`0:published`, a lost node):
/// the link it swapped in stays at its staging name `.out.reshard-tmp.TOKEN`, where the staging
/// pointer leads. The next `--force` run must not follow it. The bug: that run took the lock
/// over from the dead pid, resolved the pointer with `canonicalize` (through both links) to
/// `other`, whose name carries no token, took it for the dead run's staging and removed it
/// whole, the user's NOTES with it ("removing …/other left by an earlier run that did not
/// finish").
#[test]
fn a_link_swapped_in_by_a_force_run_killed_after_its_exchange_is_never_followed_by_the_next_run() {
    let (dir, before, killed) =
        force_run_swapped_to_a_link("fence-force-swapped-link-killed", Some("0:published"));
    killed.check(
        killed.code() != Some(0),
        "the run is killed right after its exchange",
    );
    let res = super::small_run(&dir, "out").arg("--force").output();
    let after = crate::util::listing(&dir.join("other"));
    res.check(
        after == before,
        &format!("other is left as it was:\nbefore:\n{before}\nafter:\n{after}"),
    );
    res.check(res.code() == Some(0), "the next run succeeds");
    res.stderr_has("so nothing was removed through it: the link is left in");
    let kept = dir.join("out.reshard-replaced");
    res.check(
        fs::read_link(&kept).is_ok_and(|to| to == std::path::Path::new("other")),
        "the link is moved where finish_replaced leaves one, out.reshard-replaced",
    );
    let links: Vec<_> = fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().contains(".out.reshard-tmp."))
        .filter(|p| p.symlink_metadata().is_ok_and(|m| m.is_symlink()))
        .collect();
    res.check(
        links.is_empty(),
        &format!("no link left at a staging name: {links:?}"),
    );
}

/// The same, and the next run a `--resume`: it never adopts (renames into its own staging
/// directory) what such a link leads to.
#[test]
fn a_link_swapped_in_by_a_killed_force_run_is_never_adopted_by_resume() {
    let (dir, before, killed) =
        force_run_swapped_to_a_link("fence-force-swapped-link-resume", Some("0:published"));
    killed.check(
        killed.code() != Some(0),
        "the run is killed right after its exchange",
    );
    let res = super::small_run(&dir, "out")
        .args(["--force", "--resume"])
        .output();
    let after = crate::util::listing(&dir.join("other"));
    res.check(
        after == before,
        &format!("other is left as it was:\nbefore:\n{before}\nafter:\n{after}"),
    );
}

/// Two outputs of reshard's, `out` and `other` (holding the user's NOTES); a `--force` run on
/// `out` stopped right before its rename (and killed at `kill`, if given), `out` replaced by a
/// symbolic link to `other` meanwhile: the directory, `other`'s listing before, and the run.
fn force_run_swapped_to_a_link(
    name: &str,
    kill: Option<&str>,
) -> (Dir, String, crate::util::RunOutput) {
    let dir = Dir::new(name);
    sized(&dir, "in", "512KiB", "16KiB", 2);
    super::small_run(&dir, "out").assert_success();
    super::small_run(&dir, "other").assert_success();
    fs::write(dir.join("other/NOTES"), b"mine").unwrap();
    let before = crate::util::listing(&dir.join("other"));
    let mut run = super::small_run(&dir, "out");
    run.arg("--force").env("RESHARD_TEST_STOP", "0:rename");
    if let Some(kill) = kill {
        run.env("RESHARD_TEST_KILL", kill);
    }
    let run = std::thread::spawn(move || run.output());
    wait_until("the run stops right before its rename", || {
        !stopped_in(&dir).is_empty()
    });
    let stopped = Stopped::already(stopped_in(&dir));
    fs::rename(dir.join("out"), dir.join("out.mine")).unwrap();
    std::os::unix::fs::symlink("other", dir.join("out")).unwrap();
    drop(stopped);
    let res = run.join().unwrap();
    (dir, before, res)
}
