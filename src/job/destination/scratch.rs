//! Where an object-store output is staged: on a `--scratch` every rank sees (one staging
//! directory, as for a file system's output), or on each node's own disk (a cloud cluster with
//! its data in a bucket and no shared file system).
//!
//! Found once, right after rank 0 made the staging directory: its name carries the run's token,
//! so a rank that sees it sees this run's, and one that does not is on another node's disk. When
//! every rank sees it nothing changes. When some rank does not, the run stages per node: every
//! rank that does not see it makes the same directory on its own node, each writer assembles
//! and finishes its shards there (it does so on a shared scratch too) and uploads them itself
//! ([`crate::job::destination::upload`]), the heartbeats go to the bucket, and each node
//! removes its own copy. One test at one moment, not a rule per call site: everything else is
//! the file-system pipeline, which never needed another rank's files but for what rank 0 reads
//! (the manifest's sizes and digests travel by message, and so do `--energon`'s rows:
//! [`crate::output::energon::rows_to_lead`]).

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};

use crate::comm::{agree, Comm};
use crate::config::{JobSettings, ResumeSettings};
use crate::job::destination::lock::{is_token, lock_of, lost_by_token};
use crate::job::destination::makers::{self, Makers};
use crate::job::destination::staging::{self, Staging};
use crate::job::handoff::Setup;
use crate::storage::{self, Kind};

/// How the ranks of a run see its staging directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scratch {
    /// Every rank sees rank 0's (and always for a file system's output).
    Shared,
    /// Some rank does not: each node stages in its own directory at the same path.
    PerNode {
        /// Whether this rank sees rank 0's copy (it is on rank 0's node).
        with_lead: bool,
    },
}

/// Finds how the ranks see the staging directory of an object-store output, and where some do
/// not, makes it on their nodes. Every rank returns the same kind. `dead` (rank 0's): the token
/// of the run whose lock this one took over from a pid that proved it dead.
///
/// # Errors
/// The directory cannot be made on a node.
pub(crate) fn settle(
    comm: &impl Comm,
    settings: &JobSettings,
    setup: &Setup,
    dead: Option<&str>,
) -> Result<Scratch> {
    let (Some(staging), Some(target)) = (&setup.staging, &settings.upload.target) else {
        return Ok(Scratch::Shared);
    };
    if settings.dry_run {
        return Ok(Scratch::Shared);
    }
    let seen = Staging::at(staging).present();
    let unseen = comm.all_sum(&[u64::from(!seen)])[0];
    if unseen == 0 && !crate::hooks::stage_per_node() {
        return Ok(Scratch::Shared);
    }
    // `--resume` needs no shared disk here: its records of the upload are in the bucket
    // (`upload::records`), and the exchange, which records nothing per node, runs again.
    // `--energon`'s rows reach rank 0 by message (`energon::rows_to_lead`).
    let made = if seen {
        Ok(())
    } else {
        Staging::at(staging)
            .make_on_this_node()
            .with_context(|| format!("--scratch: cannot create {}", staging.display()))
    };
    // Before any rank writes anything else into it: who made or uses this node's copy, so
    // that a later run on this node can tell once they are all gone.
    let made = made.and_then(|()| {
        makers::record(staging, comm.rank())
            .with_context(|| format!("--scratch: cannot write in {}", staging.display()))
    });
    agree(comm, made)?;
    let lead = (comm.rank() == 0).then(|| Ok(dead.map(String::from)));
    let dead: Option<String> = crate::comm::broadcast_result(comm, 0, lead)?;
    if !seen {
        // What the run whose death its pid proved left on this node's disk is nobody's now. (On
        // rank 0's node the staging pointer leads to it, and the expand phase removed it.)
        if let Some(dead) = &dead {
            remove_dead_copy(staging, dead);
        }
    }
    remove_gone_copies(staging, &lock_of(target), comm.rank() == 0);
    crate::report::narrate::narrate(
        comm.rank() == 0,
        format_args!(
            "--scratch is each node's own ({unseen} of {} ranks do not see rank 0's): every writer stages and uploads its own shards to {}",
            comm.size(),
            target.display()
        ),
    );
    Ok(Scratch::PerNode { with_lead: seen })
}

impl Scratch {
    /// Where the ranks' heartbeats go. In the staging directory when every rank sees it; else
    /// where every rank reaches, beside the output in its store, under the staging directory's
    /// name (hidden, named after the run's token, as the lock is beside the output): one small
    /// PUT and two GETs a rank per tick.
    pub(crate) fn heartbeats(self, staging: &Path, target: Option<&Path>) -> PathBuf {
        match (self, target) {
            (Scratch::PerNode { .. }, Some(target)) => target
                .with_file_name(staging.file_name().unwrap_or_default())
                .join(".heartbeats"),
            _ => Staging::at(staging).heartbeats(),
        }
    }

    /// After the last heartbeat, or a failure (rank 0): heartbeats in the store removed, and
    /// those rank 0 moved beside the staging directory for publishing. Best effort: they are no
    /// part of the output.
    pub(crate) fn remove_heartbeats(self, staging: &Path, target: Option<&Path>) {
        Staging::at(staging).remove_heartbeats();
        if let Scratch::PerNode { .. } = self {
            let dir = self.heartbeats(staging, target);
            if let Some(prefix) = dir.parent() {
                let _ = storage::sink(prefix).remove_dir_all(prefix);
            }
        }
    }

    /// The `--resume` records' settings: as asked where every rank sees the staging directory;
    /// else without checkpoints, since no disk every rank sees holds them (nor the plan record:
    /// the caller skips it).
    pub(crate) fn resume_settings(self, asked: &ResumeSettings) -> Cow<'_, ResumeSettings> {
        match self {
            Scratch::Shared => Cow::Borrowed(asked),
            Scratch::PerNode { .. } => Cow::Owned(ResumeSettings {
                checkpoint_every: Duration::MAX,
                ..asked.clone()
            }),
        }
    }

    /// Whether this rank removes its node's staging copy itself (after the upload, or a
    /// failure): on a node without rank 0, whose copy rank 0 neither sees nor removes.
    pub(crate) fn removes_own_copy(self) -> bool {
        matches!(self, Scratch::PerNode { with_lead: false })
    }
}

/// Rank 0, having taken the output's lock over from the run `dead` (its token) that its pid
/// proved dead: the heartbeats that run left in the store beside `target` when it staged per
/// node (`.NAME.reshard-tmp.TOKEN/.heartbeats/`, [`Scratch::heartbeats`]), which a run killed
/// outright cannot remove. Only that run's: its staging directory, and so its heartbeats' prefix,
/// is named after its lock's token (the run's one token), while a run that lost the lock earlier
/// by its silence may live and beat on under its own. This run beats there only later, once its
/// ranks start. Best effort: they are no part of the output.
pub(crate) fn remove_dead_heartbeats(target: &Path, dead: &str) {
    let (Some(parent), Some(name)) = (target.parent(), target.file_name()) else {
        return;
    };
    let name = format!(".{}.reshard-tmp.{dead}", name.to_string_lossy());
    let beats = parent.join(name).join(".heartbeats");
    let _ = storage::sink(&beats).remove_dir_all(&beats);
}

/// Removes, on this node's disk, the staging copy beside `staging` of the run `dead` (its token),
/// whose pid proved it dead (`.NAME.reshard-tmp.DEAD`), once however many ranks ask. Only that
/// run's: a run that lost the lock by its silence may live and write on in its own copy, and a
/// copy of another token may be such a run's (docs/guarantees.md: a staged copy of a run taken
/// over by silence is neither removed nor continued).
fn remove_dead_copy(staging: &Path, dead: &str) {
    let ours = staging.file_name().unwrap_or_default().to_string_lossy();
    let own = ours.rsplit_once('.').map(|(_, token)| token);
    // `dead` is a token ([`OutputLock::dead_predecessor`](crate::job::destination::lock::OutputLock::dead_predecessor)).
    if own != Some(dead) {
        remove_node_copy(&staging::run_dir(&staging::pointer_of(staging), dead));
    }
}

/// Rank 0 of a run that found the output's lock free (the run that held it last released it),
/// staged on `--scratch` for an object store: whether the copy `earlier` the staging `pointer`
/// leads to is its to remove or continue. The pointer is on rank 0's node only: a run with rank 0
/// elsewhere that took the lock over by silence from the run that staged there, and released
/// it, never saw it, so the copy may be that run's, suspended and alive. A copy with a plan
/// record (staged where every rank sees it: a run taking the lock over by silence would have
/// left it alone and pointed elsewhere) is taken as before; one without (staged per node, which
/// records no plan, so nothing in it for `--resume` to continue) only when its token is the one
/// `named` by the bucket's marker of a failed run, written under the lock. Else it is left where
/// it is, and said so.
pub(crate) fn may_take_copy(earlier: &Path, pointer: &Path, named: Option<&str>) -> bool {
    let planned = !matches!(crate::output::checkpoint::read_plan(earlier), Ok(None));
    let token = earlier
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.rsplit_once('.'))
        .map(|(_, token)| token);
    if earlier == pointer || planned || (named.is_some() && token == named) {
        return true;
    }
    let why = match makers::judge(earlier) {
        Makers::Gone if remove_node_copy(earlier) => {
            crate::errln!(
                "reshard: removed {}: the staging pointer {} led there, the output's lock was \
                 free and nothing in its store names that run, and every process that made \
                 that copy on this node is gone (their pids, checked from here)",
                earlier.display(),
                pointer.display()
            );
            return false;
        }
        Makers::Gone => "every process that made it is gone, but it cannot be removed".into(),
        Makers::Lives(p) => format!("its maker, {}, lives", p.who()),
        Makers::Unknown(why) => why,
    };
    crate::errln!(
        "reshard: left {} alone: the staging pointer {} leads there, but the output's lock was \
         free and nothing in its store names that run (staged on each node's own disk, it may \
         be the copy of a run that lost the lock to one on another node and still lives: \
         {why}); this run stages in a directory of its own. {LATER}",
        earlier.display(),
        pointer.display()
    );
    false
}

/// What a message leaving a node's copy in place says of its removal.
const LATER: &str = "A later run on this node removes it once every process that made it is \
                     gone, where their pids can be checked from there; else remove it once that \
                     run is surely gone";

/// Rank 0 of a run that found the output's lock free and no failed run's marker in the bucket,
/// staged on `--scratch` for an object store: a copy at the staged path `local` that an earlier
/// run renamed there (its upload under way) and that holds no plan record (staged per node)
/// carries no token, and nothing in the bucket can claim it (a marker names no node); it may be the copy of a run
/// suspended in its upload that lost the lock to one on another node, which never saw it:
/// it is moved aside to `.NAME.reshard-left.OWN` (`own`: this run's token, only to make the
/// name unique), never removed nor continued (a copy staged per node holds nothing `--resume`
/// continues), and said so. Whether it was.
///
/// # Errors
/// It cannot be moved.
pub(crate) fn set_aside_unclaimed(local: &Path, own: &str) -> Result<bool> {
    if !matches!(crate::output::checkpoint::read_plan(local), Ok(None)) {
        return Ok(false);
    }
    let why = match makers::judge(local) {
        Makers::Gone if remove_node_copy(local) => {
            crate::errln!(
                "reshard: removed {}: the output's lock was free, nothing in its store claims \
                 that copy staged on each node's own disk, and every process that made it is \
                 gone (their pids, checked from here)",
                local.display()
            );
            return Ok(true);
        }
        Makers::Gone => "every process that made it is gone, but it cannot be removed".into(),
        Makers::Lives(p) => format!("its maker, {}, lives", p.who()),
        Makers::Unknown(why) => why,
    };
    let aside = move_aside(local, own)?;
    crate::errln!(
        "reshard: moved {} aside to {}: the output's lock was free, and that copy, staged on each \
         node's own disk, may be the one of a run that lost the lock to a run on another node \
         and still lives ({why}). {LATER}",
        local.display(),
        aside.display()
    );
    Ok(true)
}

/// Moves the staged copy `local` to `.NAME.reshard-left.TOKEN` beside it (`token` names the run
/// that moved it or whose it was, and makes the name unique): where a copy that a live run may
/// still read goes instead of being removed. Where it went.
///
/// # Errors
/// It cannot be moved.
pub(crate) fn move_aside(local: &Path, token: &str) -> Result<PathBuf> {
    let name = local.file_name().unwrap_or_default().to_string_lossy();
    let aside = local.with_file_name(format!(".{name}.reshard-left.{token}"));
    storage::sink(local)
        .rename(local, &aside)
        .with_context(|| format!("{}: cannot move the staged copy aside", local.display()))?;
    Ok(aside)
}

/// Removes a node's copy `dir` of the staging directory, once, however many of the node's
/// ranks ask: the first moves it aside (one rename, which the others then find gone) and
/// removes it. Best effort: a copy left on a node's disk is no part of the output. Whether this
/// call moved it (the others find it gone).
pub(crate) fn remove_node_copy(dir: &Path) -> bool {
    let name = dir.file_name().unwrap_or_default().to_string_lossy();
    let aside = dir.with_file_name(format!("{name}.removing"));
    let sink = storage::sink(dir);
    let moved = sink.rename(dir, &aside).is_ok();
    if moved {
        let _ = sink.remove_dir_all(&aside);
    }
    moved
}

/// Removes, from this node's disk, the copies earlier runs left beside this run's `staging`
/// whose makers are all gone ([`makers::judge`]): a run's staging directory
/// (`.NAME.reshard-tmp.TOKEN`) or a staged copy moved aside (`.NAME.reshard-left.TOKEN`), of
/// this output only, this run's own excepted. Such a copy is nobody's: no run can use it (staged
/// per node, it holds nothing `--resume` continues, and a copy the bucket's marker names was
/// taken by the expand phase), and its run, were it alive, would be among its makers. A copy
/// that records no maker, or one whose pid cannot be checked from here, stays: `lead` says so.
/// So does one marked as the staging directory of the run holding the output's `lock` now: a
/// run continuing (`--resume`) a dead run's copy renames it to its own name and marks it before
/// its ranks record themselves in it. Best effort, once however many of the node's ranks ask.
fn remove_gone_copies(staging: &Path, lock: &Path, lead: bool) {
    for copy in earlier_copies(staging) {
        match makers::judge(&copy) {
            Makers::Gone if !held_by_lock_holder(&copy, &copy, lock) => {
                if remove_if_still_gone(&copy, lock) {
                    crate::errln!(
                        "reshard: removed {}: an earlier run's copy on this node's disk, every \
                         process that made it gone (their pids, checked from here)",
                        copy.display()
                    );
                }
            }
            Makers::Unknown(why) if lead => crate::errln!(
                "reshard: left {} alone: an earlier run's copy on this node's disk, but {why}. \
                 Remove it once that run is surely gone",
                copy.display()
            ),
            Makers::Gone | Makers::Lives(_) | Makers::Unknown(_) => {}
        }
    }
    // A removal killed part way left its copy at `.removing`, which no run takes: it goes once
    // every process that made it is gone (as above; the remover's own is among them).
    for left in earlier_copies_named(staging, ".removing") {
        let sink = storage::sink(&left);
        if matches!(makers::judge(&left), Makers::Gone) && sink.remove_dir_all(&left).is_ok() {
            crate::errln!(
                "reshard: removed {}: an earlier run's removal of its copy on this node's disk,                  cut short, every process that made it gone (their pids, checked from here)",
                left.display()
            );
        }
    }
}

/// Removes the `copy` [`remove_gone_copies`] judged nobody's, judging it again once it is out of
/// every run's way: renamed to `.removing` first (from then on no run finds it by its name), it
/// goes only if it is still nobody's there; a rank of the lock holder that recorded itself in
/// it, or the holder's mark, written since the first judgement, has it renamed back.
fn remove_if_still_gone(copy: &Path, lock: &Path) -> bool {
    let name = copy.file_name().unwrap_or_default().to_string_lossy();
    let aside = copy.with_file_name(format!("{name}.removing"));
    let sink = storage::sink(copy);
    if sink.rename(copy, &aside).is_err() {
        return false;
    }
    let gone =
        matches!(makers::judge(&aside), Makers::Gone) && !held_by_lock_holder(copy, &aside, lock);
    if !gone {
        let _ = sink.rename_noreplace(&aside, copy);
        return false;
    }
    let _ = sink.remove_dir_all(&aside);
    true
}

/// Whether the copy named `name` (now at `dir`) is the staging directory of the run holding
/// `lock` now: named after its token (a run continuing a dead run's copy renames it to its own
/// name before it marks it, and that mark still names the dead run in between), or marked as
/// its ([`crate::job::destination::lock::OutputLock::mark_staging`]). Where the mark cannot be
/// read, whether it is marked at all.
fn held_by_lock_holder(name: &Path, dir: &Path, lock: &Path) -> bool {
    let holds = |token: &str| matches!(lost_by_token(lock, token), Ok(None));
    let named = name
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.rsplit_once('.'))
        .is_some_and(|(_, token)| is_token(token) && holds(token));
    if named {
        return true;
    }
    let mark = Staging::at(dir).owner_file();
    let Ok(text) = storage::source(&mark).read(&mark) else {
        return false;
    };
    holds(String::from_utf8_lossy(&text).trim())
}

/// The copies of this output's earlier runs beside `staging` (this run's): directories named
/// `.NAME.reshard-tmp.TOKEN` or `.NAME.reshard-left.TOKEN` (a token, nothing after it: a
/// removal under way, `.removing`, or heartbeats moved aside are not copies).
fn earlier_copies(staging: &Path) -> Vec<PathBuf> {
    earlier_copies_named(staging, "")
}

/// As [`earlier_copies`], of the names that end with `suffix` after the token.
fn earlier_copies_named(staging: &Path, suffix: &str) -> Vec<PathBuf> {
    let pointer = staging::pointer_of(staging);
    let (Some(parent), Some(base)) = (staging.parent(), pointer.file_name()) else {
        return Vec::new();
    };
    let base = base.to_string_lossy();
    let Some(name) = base.strip_suffix(".reshard-tmp") else {
        return Vec::new();
    };
    let forms = [format!("{base}."), format!("{name}.reshard-left.")];
    let Ok(entries) = storage::source(parent).list(parent) else {
        return Vec::new();
    };
    let mut copies: Vec<PathBuf> = entries
        .into_iter()
        .filter(|e| e.kind == Kind::Dir)
        .filter_map(|e| {
            let n = e.name.to_string_lossy().into_owned();
            let token = forms.iter().find_map(|f| n.strip_prefix(f.as_str()))?;
            is_token(token.strip_suffix(suffix)?).then(|| parent.join(&n))
        })
        .filter(|copy| copy != staging)
        .collect();
    copies.sort();
    copies
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heartbeats_go_beside_the_output_only_when_staged_per_node() {
        let staging = Path::new("/scratch/reshard-scratch/b/p/.out.reshard-tmp.T0KEN");
        let target = Path::new("s3://b/p/out");
        let per_node = Scratch::PerNode { with_lead: false };
        assert_eq!(
            per_node.heartbeats(staging, Some(target)),
            Path::new("s3://b/p/.out.reshard-tmp.T0KEN/.heartbeats")
        );
        assert_eq!(
            Scratch::Shared.heartbeats(staging, Some(target)),
            staging.join(".heartbeats")
        );
        assert!(per_node.removes_own_copy());
        assert!(!Scratch::PerNode { with_lead: true }.removes_own_copy());
        assert!(!Scratch::Shared.removes_own_copy());
    }

    #[test]
    fn no_checkpoints_when_staged_per_node_and_a_copy_goes_once() {
        let asked = ResumeSettings {
            arguments: Vec::new(),
            key_map: None,
            mem_limit: 1,
            checkpoint_every: Duration::from_secs(60),
        };
        let per_node = Scratch::PerNode { with_lead: true };
        assert_eq!(
            per_node.resume_settings(&asked).checkpoint_every,
            Duration::MAX
        );
        let shared = Scratch::Shared.resume_settings(&asked);
        assert_eq!(shared.checkpoint_every, Duration::from_secs(60));

        let tmp = tempfile::tempdir().unwrap();
        let copy = tmp.path().join(".out.reshard-tmp.T0KEN");
        std::fs::create_dir_all(copy.join(".reshard")).unwrap();
        std::fs::write(copy.join("shard-000000.tar"), b"x").unwrap();
        remove_node_copy(&copy);
        remove_node_copy(&copy);
        assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0);
    }

    #[test]
    fn with_the_lock_free_a_node_copy_is_taken_only_when_the_bucket_names_its_run() {
        let tmp = tempfile::tempdir().unwrap();
        let pointer = tmp.path().join(".out.reshard-tmp");
        let copy = staging::run_dir(&pointer, "SILENT");
        std::fs::create_dir_all(copy.join(".reshard")).unwrap();
        // Staged per node: no plan record. Named by the marker, or not.
        assert!(may_take_copy(&copy, &pointer, Some("SILENT")));
        assert!(!may_take_copy(&copy, &pointer, Some("OTHER")));
        assert!(!may_take_copy(&copy, &pointer, None));
        // An older reshard's directory at the pointer's own path is taken as before.
        assert!(may_take_copy(&pointer, &pointer, None));
        // Staged where every rank sees it (a plan record): taken as before.
        let plan = crate::output::checkpoint::PlanRecord {
            arguments: Vec::new(),
            inputs: Vec::new(),
            digest: "d".into(),
            ranks: 1,
            mem_limit: 1,
        };
        crate::output::checkpoint::write_plan(&copy, &plan).unwrap();
        assert!(may_take_copy(&copy, &pointer, None));
    }

    #[test]
    fn only_the_copy_of_the_run_proved_dead_goes_from_a_node() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = |name: &str| {
            let d = tmp.path().join(name);
            std::fs::create_dir_all(d.join(".reshard")).unwrap();
            d
        };
        let ours = dir(".out.reshard-tmp.NEW");
        dir(".out.reshard-tmp.DEAD");
        // The run whose lock was taken over by its silence (it may live and write on here),
        // and a copy of an older token: neither is proved dead.
        dir(".out.reshard-tmp.SILENT");
        dir(".out.reshard-tmp.OLDER");
        // A removal under way (a node-mate's) is its own.
        dir(".out.reshard-tmp.GONE.removing");
        for keep in [".other.reshard-tmp.DEAD", "out", ".out.reshard-tmp"] {
            dir(keep);
        }
        remove_dead_copy(&ours, "NEW");
        remove_dead_copy(&ours, "DEAD");
        remove_dead_copy(&ours, "DEAD");
        let mut left: Vec<String> = std::fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(
            left,
            [
                ".other.reshard-tmp.DEAD",
                ".out.reshard-tmp",
                ".out.reshard-tmp.GONE.removing",
                ".out.reshard-tmp.NEW",
                ".out.reshard-tmp.OLDER",
                ".out.reshard-tmp.SILENT",
                "out"
            ]
        );
    }

    /// A directory `name` in `parent`, with `.reshard/` inside and the makers `made` recorded.
    fn copy_in(parent: &Path, name: &str, made: &[makers::Process]) -> PathBuf {
        let d = parent.join(name);
        std::fs::create_dir_all(d.join(".reshard")).unwrap();
        for (rank, p) in made.iter().enumerate() {
            makers::write(&d, &rank.to_string(), p);
        }
        d
    }

    fn listing(dir: &Path) -> Vec<String> {
        let mut left: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        left
    }

    #[test]
    fn a_node_copy_goes_once_every_process_that_made_it_is_provably_gone() {
        let tmp = tempfile::tempdir().unwrap();
        let t = |c: char| c.to_string().repeat(32);
        let (gone, me) = (makers::ended(), makers::Process::me());
        let elsewhere = makers::Process {
            pidns: "pid:[1]".into(),
            ..makers::ended()
        };
        let copy = |name: String, made: &[makers::Process]| copy_in(tmp.path(), &name, made);
        let one = std::slice::from_ref(&gone);
        let ours = copy(
            format!(".out.reshard-tmp.{}", t('0')),
            std::slice::from_ref(&me),
        );
        // Gone: a staging copy and one moved aside, every maker gone.
        copy(format!(".out.reshard-tmp.{}", t('a')), one);
        // A removal killed part way: its makers gone too.
        copy(format!(".out.reshard-left.{}.removing", t('9')), one);
        copy(
            format!(".out.reshard-left.{}", t('b')),
            &[gone.clone(), makers::ended()],
        );
        // One maker lives; one ran in another PID namespace; an older reshard's records none.
        let kept = [
            copy(
                format!(".out.reshard-tmp.{}", t('c')),
                &[gone.clone(), me.clone()],
            ),
            copy(
                format!(".out.reshard-left.{}", t('d')),
                &[gone.clone(), elsewhere],
            ),
            copy(format!(".out.reshard-tmp.{}", t('e')), &[]),
            // Not this output's, not a token, a removal under way, the pointer's own path.
            copy(format!(".other.reshard-tmp.{}", t('a')), one),
            copy(".out.reshard-left.not-a-token".into(), one),
            copy(
                format!(".out.reshard-tmp.{}.removing", t('f')),
                std::slice::from_ref(&me),
            ),
            copy(format!(".out.reshard-tmp.{}.moving", t('f')), one),
            copy(".out.reshard-tmp".into(), one),
            copy("out".into(), one),
        ];
        // This run's own copy is never judged, even with its makers gone.
        makers::write(&ours, "0", &gone);
        let lock = tmp.path().join(".out.reshard-lock");
        remove_gone_copies(&ours, &lock, true);
        remove_gone_copies(&ours, &lock, false);
        let mut expected: Vec<String> = kept
            .iter()
            .chain([&ours])
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        expected.sort();
        assert_eq!(listing(tmp.path()), expected);
    }

    #[test]
    fn with_the_lock_free_a_copy_whose_makers_are_gone_is_removed_not_left_or_moved_aside() {
        let tmp = tempfile::tempdir().unwrap();
        let pointer = tmp.path().join(".out.reshard-tmp");
        let (gone, me) = (makers::ended(), makers::Process::me());
        // Left alone while a maker lives, removed once every one is gone.
        let copy = staging::run_dir(&pointer, "SILENT");
        copy_in(
            tmp.path(),
            ".out.reshard-tmp.SILENT",
            &[gone.clone(), me.clone()],
        );
        assert!(!may_take_copy(&copy, &pointer, None));
        assert!(copy.is_dir());
        makers::write(&copy, "1", &gone);
        assert!(!may_take_copy(&copy, &pointer, None));
        assert!(!copy.exists());

        // At the staged path: moved aside while its maker lives, removed once it is gone.
        let own = "1".repeat(32);
        let local = copy_in(tmp.path(), "out", &[me]);
        assert!(set_aside_unclaimed(&local, &own).unwrap());
        let aside = tmp.path().join(format!(".out.reshard-left.{own}"));
        assert!(!local.exists() && aside.is_dir());
        std::fs::remove_dir_all(&aside).unwrap();
        let local = copy_in(tmp.path(), "out", &[gone]);
        assert!(set_aside_unclaimed(&local, &own).unwrap());
        assert_eq!(listing(tmp.path()), Vec::<String>::new());
    }

    /// The lock of the output `out` in `dir`, held by this process: its path and the lock.
    fn held_lock(dir: &Path) -> (PathBuf, crate::job::destination::lock::OutputLock) {
        let lock_path = dir.join(".out.reshard-lock");
        let lock = crate::job::destination::lock::OutputLock::acquire(
            &lock_path,
            Path::new("out"),
            crate::job::destination::lock::STALE_AFTER,
        )
        .unwrap();
        (lock_path, lock)
    }

    #[test]
    fn a_dead_runs_copy_continued_by_the_run_holding_the_lock_stays() {
        let tmp = tempfile::tempdir().unwrap();
        let (lock_path, lock) = held_lock(tmp.path());
        let t = |c: char| c.to_string().repeat(32);
        let ours = copy_in(tmp.path(), &format!(".out.reshard-tmp.{}", t('0')), &[]);
        // Renamed to the lock holder's name and marked, its ranks not yet recorded in it.
        let continued = copy_in(
            tmp.path(),
            &format!(".out.reshard-tmp.{}", lock.token()),
            &[makers::ended()],
        );
        lock.mark_staging(&continued).unwrap();
        // Marked by a run that no longer holds the lock: nobody's.
        let other = copy_in(
            tmp.path(),
            &format!(".out.reshard-tmp.{}", t('b')),
            &[makers::ended()],
        );
        std::fs::write(Staging::at(&other).owner_file(), t('b')).unwrap();
        remove_gone_copies(&ours, &lock_path, true);
        assert!(continued.is_dir() && !other.exists());
        drop(lock);
    }

    #[test]
    fn a_dead_runs_copy_renamed_to_the_lock_holders_name_but_not_yet_marked_stays() {
        let tmp = tempfile::tempdir().unwrap();
        let (lock_path, lock) = held_lock(tmp.path());
        let ours = copy_in(
            tmp.path(),
            &format!(".out.reshard-tmp.{}", "0".repeat(32)),
            &[],
        );
        // `--resume` renamed it (adopt) and has not marked it yet: the mark names the dead run.
        let adopted = copy_in(
            tmp.path(),
            &format!(".out.reshard-tmp.{}", lock.token()),
            &[makers::ended()],
        );
        std::fs::write(Staging::at(&adopted).owner_file(), "d".repeat(32)).unwrap();
        remove_gone_copies(&ours, &lock_path, true);
        assert!(adopted.is_dir());
        // Judged again once renamed to `.removing`: its maker there lives now, so it is put back.
        makers::write(&adopted, "1", &makers::Process::me());
        assert!(!remove_if_still_gone(&adopted, &lock_path));
        assert!(adopted.is_dir());
        assert_eq!(listing(tmp.path()).len(), 3, "{:?}", listing(tmp.path()));
        drop(lock);
    }
}
