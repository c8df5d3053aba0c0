//! The output's life, one mechanism on every store: this file runs its steps in order and owns
//! its rules (what a run may replace, what goes once its output is committed, which older
//! outputs `--keep` removes and how a removal cut short is finished); a [`Commit`] strategy
//! says how each step is done where the output is. The strategy follows what the sink can do
//! ([`crate::storage::Capabilities`]), never the URL's scheme: where the output's sink renames,
//! the finished staging directory is renamed into place ([`super::by_rename`]); where it cannot
//! (an object store), the output is staged on `--scratch` (`cli::resolve` decides it by the
//! same capabilities), renamed there, uploaded, and committed by creating its manifest last,
//! only where none is (the upload's `by_manifest`).
//!
//! Before the commit ([`prepare`] over a [`Prepare`] strategy): the lock taken, what a failed
//! run left that nothing continues cleared, what may be replaced checked ([`may_replace`]), the
//! run begun. From the commit ([`commit`]): the lock checked, the commit (nothing is visible at
//! the output before it), then, the output live (a failure is a [`CleanupFailed`], never
//! "nothing published"): the records only an unfinished run needs, what the output replaced,
//! the run's staging released, `--link` pointed at it, and `--keep`'s older outputs removed. A run that fails leaves only
//! what `--resume` continues from ([`after_failure`]).

use std::path::{Path, PathBuf};

use anyhow::{bail, Result};

use crate::config::Keep;
use crate::exit::CleanupFailed;
use crate::hooks;
use crate::job::destination::lock::OutputLock;
use crate::job::destination::owned::AtOutput;
use crate::job::destination::scratch::{self, Scratch};
use crate::job::destination::series::outputs_beyond;
use crate::job::destination::staging::{self, Staging};
use crate::job::interrupt::{message, Interrupted};
use crate::output::checkpoint;

/// How each step of an output's life is done where the output is. The order of the steps and
/// what each may touch are [`life`](self)'s.
pub(crate) trait Commit {
    /// The output.
    fn target(&self) -> &Path;

    /// That this run still holds the output's lock, right before its commit.
    ///
    /// # Errors
    /// It lost the lock (nothing is published).
    fn check_owned(&self) -> Result<()>;

    /// Makes the output live in one step; whether it replaced an older output of reshard
    /// (which [`may_replace`] allowed).
    ///
    /// # Errors
    /// It cannot: nothing is published, and what the run made stays for `--resume`.
    fn commit(&self) -> Result<bool>;

    /// The records only an unfinished run needs (`--resume`'s) go (an object store's marker of
    /// the upload names what the output replaced: it goes with that, in `remove_replaced`).
    ///
    /// # Errors
    /// One cannot be removed.
    fn drop_records(&self) -> Result<()>;

    /// What the new output replaced goes (`replaced`: the commit said it replaced an output).
    ///
    /// # Errors
    /// Something of it cannot be removed (the next run on this output removes it).
    fn remove_replaced(&self, replaced: bool) -> Result<()>;

    /// The run's staging is let go: nothing of it is needed any more.
    ///
    /// # Errors
    /// It cannot be removed.
    fn release_staging(&self) -> Result<()>;

    /// `--link`: the symbolic link `link` points at the output.
    ///
    /// # Errors
    /// It cannot be made (or the store has no links: refused before the run).
    fn point_link(&self, link: &Path) -> Result<()>;

    /// Older outputs of the series whose removal an earlier `--keep` began and did not finish,
    /// and how the message says it was left.
    ///
    /// # Errors
    /// The series cannot be listed.
    fn unfinished_removals(&self, keep: &Keep) -> Result<(Vec<PathBuf>, &'static str)>;

    /// Finishes the removal of `half` (one of [`Commit::unfinished_removals`]).
    ///
    /// # Errors
    /// It cannot be removed.
    fn finish_removal(&self, half: &Path) -> Result<()>;

    /// Removes the older output `old` of the series so that, cut short, the next `--keep` finds
    /// it in [`Commit::unfinished_removals`] and never as a half-deleted dataset.
    ///
    /// # Errors
    /// It cannot be removed.
    fn remove_older(&self, old: &Path) -> Result<()>;
}

/// How each step before the commit is done where the output is: one order on every store,
/// [`prepare`]'s, one sequence per run. A refused run must leave what `--resume` continues, and
/// what a failed run left must not read as someone else's when the rule of what may be replaced
/// is asked; so the strategy says what a failed run left that nothing continues, which goes
/// first, and what may be continued, which only `begin` takes, once the run is known to go
/// ahead. Every output is assembled in a staging directory on a file system (an object store's
/// on `--scratch`): its steps ([`StagingSteps`]) follow each of the strategy's own, under the
/// strategy's lock.
pub(crate) trait Prepare {
    /// Takes the output's lock where the output is committed (beside it on a file system, in
    /// the bucket for an object store's, staged on `--scratch` under it): the run's one lock and
    /// token. None in a dry run.
    ///
    /// # Errors
    /// Another live run holds it, or it cannot be taken.
    fn take_lock(&mut self) -> Result<()>;

    /// Holding the lock: what a failed run left that no `--resume` continues goes, so that it
    /// is not taken for something that may not be replaced. On a file system nothing here: its
    /// staging directory's step removes the heartbeats beside the staging directory of a run
    /// whose pid proved it dead (the directory itself is `begin`'s: a refused run leaves it for
    /// `--resume`); on an object store, its
    /// unfinished uploads, its side objects, the objects its marker names but for the shards
    /// `--resume` keeps, and an older output whose removal `--keep` began. It may refuse what
    /// the failed run's marker says (a `--force` run cut short is continued only with `--force`).
    ///
    /// # Errors
    /// Something cannot be removed or read, or the failed run's marker refuses.
    fn clear_failed(&mut self) -> Result<()>;

    /// The rule of what a run may replace ([`may_replace`]), asked of what is at the output now.
    ///
    /// # Errors
    /// Something that may not be replaced is there.
    fn check_replace(&mut self) -> Result<()>;

    /// The run's first writes where its output is committed, before its staging directory's
    /// ([`StagingSteps::begin`]): nothing more on a file system, where the staging directory is
    /// beside the output; on an object store, the marker of the upload under way (what is known
    /// before the run: its token, what it replaces, what a failed run left that `--resume` may
    /// keep; written only over what the run saw there, conditionally where the store can; the
    /// upload phase only adds the names it uploads, over this very marker), then the staged
    /// copy an earlier attempt left on `--scratch` continued or moved away.
    ///
    /// # Errors
    /// It cannot be written, or the run lost its lock.
    fn begin(&mut self) -> Result<()>;

    /// The staging directory the output is assembled in, whose steps follow each of this
    /// strategy's.
    fn staging(&mut self) -> StagingPart<'_>;
}

/// A strategy's staging directory ([`Prepare::staging`]).
pub(crate) struct StagingPart<'s> {
    /// The run's one lock, the strategy's (none in a dry run, which writes nothing).
    pub(crate) lock: Option<&'s OutputLock>,
    pub(crate) steps: &'s mut dyn StagingSteps,
    /// What is at the staging directory's output is a copy an earlier attempt staged, which
    /// the strategy's `begin` takes (continues, moves aside or removes).
    pub(crate) taken: bool,
    /// Where the output is committed by manifest: the token of the failed run its store's
    /// marker named (`Some(None)`: none did), the only run whose staged copy a run that found
    /// the lock free may take ([`crate::job::destination::scratch::may_take_copy`]). `None` on
    /// a file system, whose staging directory the lock alone decides.
    pub(crate) named: Option<Option<&'s str>>,
}

/// The steps of a staging directory on a file system, under the lock of the strategy they are
/// part of ([`StagingPart`]): a file system's output's own, or, where an object store's output
/// is staged on `--scratch`, the bucket's, so that a run runs one [`prepare`] whatever its
/// store. `lock`: none in a dry run, which writes nothing.
pub(crate) trait StagingSteps {
    /// [`Prepare::clear_failed`] of the staging directory's side.
    ///
    /// # Errors
    /// Something cannot be removed.
    fn clear_failed(&mut self, lock: Option<&OutputLock>) -> Result<()>;

    /// [`Prepare::check_replace`] of the staging directory's output; `taken` as
    /// [`StagingPart::taken`] (what is there then is not asked about).
    ///
    /// # Errors
    /// The output may not be written there.
    fn check_replace(&mut self, taken: bool) -> Result<()>;

    /// [`Prepare::begin`] of the staging directory: made, or an earlier attempt's continued;
    /// `named` as [`StagingPart::named`].
    ///
    /// # Errors
    /// It cannot be made or continued.
    fn begin(&mut self, lock: Option<&OutputLock>, named: Option<Option<&str>>) -> Result<()>;
}

/// The steps before the commit, in order, once per run: the lock taken, what a failed run left
/// that nothing continues cleared, what may be replaced checked, the run begun; each but the
/// first where the output is committed, then in its staging directory.
///
/// # Errors
/// The first step that fails; nothing after it runs.
pub(crate) fn prepare(strategy: &mut dyn Prepare) -> Result<()> {
    strategy.take_lock()?;
    strategy.clear_failed()?;
    let part = strategy.staging();
    part.steps.clear_failed(part.lock)?;
    strategy.check_replace()?;
    let part = strategy.staging();
    part.steps.check_replace(part.taken)?;
    strategy.begin()?;
    let part = strategy.staging();
    part.steps.begin(part.lock, part.named)
}

/// What the run asked of its output's life.
pub(crate) struct Rules<'a> {
    pub(crate) link: Option<&'a Path>,
    pub(crate) keep: Option<&'a Keep>,
    pub(crate) epoch: u64,
}

/// The rule of what a run may replace, on every store: nothing or an empty directory is
/// written, an output of reshard's ([`crate::job::destination::owned`]) only with `--force`,
/// and nothing else ever. Whether an output is replaced; `when` says at which moment it is
/// asked (before the run, at publishing).
///
/// # Errors
/// Something that may not be replaced is at `target`.
pub(crate) fn may_replace(
    target: &Path,
    found: &AtOutput,
    force: bool,
    when: &str,
) -> Result<bool> {
    match found {
        AtOutput::Nothing | AtOutput::Empty => Ok(false),
        _ if !force => bail!(
            "--output {}: exists and is not empty (use --force to replace it if it is an output of reshard)",
            target.display()
        ),
        AtOutput::ReshardOutput => Ok(true),
        AtOutput::Other(what) => bail!(
            "--output {}: {when} it is {what}; --force replaces only an empty directory or an output reshard wrote (its index.json and .reshard/), so it is left as it is: move it away or choose another --output",
            target.display()
        ),
    }
}

/// The commit and what follows it, in order: the lock checked, the output made live, then
/// [`after_commit`].
///
/// # Errors
/// The lock was lost or the commit failed (nothing is published); or a step after it failed
/// (a [`CleanupFailed`]: the new output is live).
pub(crate) fn commit(strategy: &dyn Commit, rules: &Rules<'_>) -> Result<()> {
    strategy.check_owned()?;
    let replaced = strategy.commit()?;
    after_commit(strategy, replaced, rules).map_err(|e| {
        e.context(CleanupFailed {
            output: strategy.target().to_path_buf(),
        })
    })
}

/// Once the output is live: the unfinished run's records, what it replaced, the staging,
/// `--link`, `--keep`.
pub(crate) fn after_commit(strategy: &dyn Commit, replaced: bool, rules: &Rules<'_>) -> Result<()> {
    strategy.drop_records()?;
    hooks::kill_at(0, "published");
    strategy.remove_replaced(replaced)?;
    strategy.release_staging()?;
    if let Some(link) = rules.link {
        strategy.point_link(link)?;
    }
    rules
        .keep
        .map_or(Ok(()), |keep| prune_series(strategy, keep, rules))
}

/// `--keep` over the series of the output just committed: first the removals an earlier run
/// began and did not finish, then the older outputs beyond the `keep.count` highest epochs
/// ([`outputs_beyond`]: only reshard's own outputs of the series, never the new output nor
/// what `--link` points at).
fn prune_series(strategy: &dyn Commit, keep: &Keep, rules: &Rules<'_>) -> Result<()> {
    let target = strategy.target();
    let (halves, left) = strategy.unfinished_removals(keep)?;
    for half in halves {
        crate::errln!(
            "reshard: --keep: finishing the removal of {} ({left})",
            half.display()
        );
        strategy.finish_removal(&half)?;
    }
    for old in outputs_beyond(target, keep, rules.epoch, rules.link)? {
        crate::errln!(
            "reshard: --keep {}: removing the older output {}",
            keep.count,
            old.display()
        );
        strategy.remove_older(&old)?;
    }
    Ok(())
}

/// A run that failed: its staging directory, an object store's output, how it was staged, and
/// the stop signal that ended it, if one did.
pub(crate) struct Failed<'a> {
    pub(crate) staging: &'a Path,
    pub(crate) target: Option<&'a Path>,
    pub(crate) scratch: Scratch,
    pub(crate) interrupted: Option<&'a Interrupted>,
}

/// What a failed run leaves, on every store: only what `--resume` continues from, and only
/// what the run still owns (`lead`: rank 0; `owner`: its staging not taken over by another
/// run), but for its heartbeats, which only it reads. Its
/// staging directory stays where a checkpoint recorded durable samples (staged per node, there
/// is nothing to resume from: each node's copy goes). On an object store, what its upload put
/// stays, named by the marker of the upload: the store may be out of reach now, so the next run
/// holding the lock removes it, but for the shards `--resume` keeps (the upload's `prepare`).
pub(crate) fn after_failure(failed: &Failed<'_>, lead: bool, owner: bool) {
    let staging = failed.staging;
    if lead {
        // Its heartbeats are named by its own token (in the store when staged per node): no
        // other run reads them, whether or not this one still owns the output.
        failed.scratch.remove_heartbeats(staging, failed.target);
    }
    if lead && owner {
        if failed.scratch == Scratch::Shared {
            abandon(staging, failed.interrupted);
        } else {
            remove_staging(staging);
        }
    } else if failed.scratch.removes_own_copy() {
        scratch::remove_node_copy(staging);
    }
}

/// After a failure: the staging directory goes, unless a checkpoint recorded samples a rerun
/// with `--resume` need not move again. A stop signal's message says which (`interrupted`).
fn abandon(staging: &Path, interrupted: Option<&Interrupted>) {
    let checkpoint = checkpoint::read_checkpoint(staging);
    if let Some(i) = interrupted {
        let durable = match &checkpoint {
            Ok(Some(c)) => c.done.count(),
            _ => 0,
        };
        crate::errln!("{}", message(i, staging, durable));
        if durable == 0 {
            remove_staging(staging);
        }
        return;
    }
    match checkpoint {
        Ok(Some(c)) if !c.done.is_empty() => crate::errln!(
            "reshard: kept {}: {} samples are durably in place there; rerun with the same arguments and --resume to continue, or without it to start over",
            staging.display(),
            c.done.count()
        ),
        _ => remove_staging(staging),
    }
}

/// Removes this run's staging directory, and the staging pointer if it leads there.
fn remove_staging(staging: &Path) {
    if Staging::at(staging).remove().is_ok() {
        staging::unpoint(&staging::pointer_of(staging), staging);
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::rc::Rc;

    use super::*;

    /// The steps asked of a strategy and of its staging directory, in order.
    type Log = Rc<RefCell<Vec<String>>>;

    /// A strategy that notes each step it is asked to do, and fails the step named `fails`.
    struct Noted {
        target: PathBuf,
        steps: Log,
        fails: &'static str,
        halves: Vec<PathBuf>,
        stage: NotedStaging,
    }

    /// A staging directory that notes its steps in its strategy's log: `staging STEP`.
    struct NotedStaging {
        steps: Log,
        fails: &'static str,
    }

    fn note(steps: &Log, fails: &str, name: &str) -> Result<()> {
        steps.borrow_mut().push(name.to_string());
        if name.starts_with(fails) && !fails.is_empty() {
            bail!("{name} failed");
        }
        Ok(())
    }

    impl Noted {
        fn new(fails: &'static str) -> Self {
            let steps = Log::default();
            Noted {
                target: PathBuf::from("/nowhere/out-2"),
                steps: steps.clone(),
                fails,
                halves: vec![PathBuf::from("/nowhere/.out-0.gone")],
                stage: NotedStaging { steps, fails },
            }
        }

        fn step(&self, name: &str) -> Result<()> {
            note(&self.steps, self.fails, name)
        }
    }

    impl StagingSteps for NotedStaging {
        fn clear_failed(&mut self, lock: Option<&OutputLock>) -> Result<()> {
            assert!(lock.is_none(), "a noted strategy takes no lock");
            note(&self.steps, self.fails, "staging clear_failed")
        }
        fn check_replace(&mut self, taken: bool) -> Result<()> {
            note(
                &self.steps,
                self.fails,
                &format!("staging check_replace {taken}"),
            )
        }
        fn begin(&mut self, _: Option<&OutputLock>, _: Option<Option<&str>>) -> Result<()> {
            note(&self.steps, self.fails, "staging begin")
        }
    }

    impl Commit for Noted {
        fn target(&self) -> &Path {
            &self.target
        }
        fn check_owned(&self) -> Result<()> {
            self.step("check_owned")
        }
        fn commit(&self) -> Result<bool> {
            self.step("commit").map(|()| true)
        }
        fn drop_records(&self) -> Result<()> {
            self.step("drop_records")
        }
        fn remove_replaced(&self, replaced: bool) -> Result<()> {
            self.step(&format!("remove_replaced {replaced}"))
        }
        fn release_staging(&self) -> Result<()> {
            self.step("release_staging")
        }
        fn point_link(&self, link: &Path) -> Result<()> {
            self.step(&format!("point_link {}", link.display()))
        }
        fn unfinished_removals(&self, _: &Keep) -> Result<(Vec<PathBuf>, &'static str)> {
            Ok((self.halves.clone(), "left"))
        }
        fn finish_removal(&self, half: &Path) -> Result<()> {
            self.step(&format!("finish_removal {}", half.display()))
        }
        fn remove_older(&self, old: &Path) -> Result<()> {
            self.step(&format!("remove_older {}", old.display()))
        }
    }

    impl Prepare for Noted {
        fn take_lock(&mut self) -> Result<()> {
            self.step("take_lock")
        }
        fn clear_failed(&mut self) -> Result<()> {
            self.step("clear_failed")
        }
        fn check_replace(&mut self) -> Result<()> {
            self.step("check_replace")
        }
        fn begin(&mut self) -> Result<()> {
            self.step("begin")
        }
        fn staging(&mut self) -> StagingPart<'_> {
            StagingPart {
                lock: None,
                steps: &mut self.stage,
                taken: self.target.ends_with("staged"),
                named: None,
            }
        }
    }

    /// One sequence per run, whatever the store: the lock taken once, then each step where the
    /// output is committed followed by its staging directory's (on a file system the strategy's
    /// own steps are empty; on an object store the staging on `--scratch` is in the same
    /// sequence, under the bucket's lock, told when the strategy's `begin` takes a staged copy).
    #[test]
    fn the_steps_before_the_commit_run_in_one_order_and_stop_at_a_failure() {
        for (target, taken) in [("/nowhere/out-2", false), ("s3://b/staged", true)] {
            let mut noted = Noted::new("");
            noted.target = PathBuf::from(target);
            prepare(&mut noted).unwrap();
            let check: &'static str = format!("staging check_replace {taken}").leak();
            let all = [
                "take_lock",
                "clear_failed",
                "staging clear_failed",
                "check_replace",
                check,
                "begin",
                "staging begin",
            ];
            assert_eq!(*noted.steps.borrow(), all);
            for (i, fails) in all.iter().enumerate() {
                let mut noted = Noted::new(fails);
                noted.target = PathBuf::from(target);
                let e = prepare(&mut noted).unwrap_err();
                assert!(format!("{e}").contains(fails), "{e}");
                assert_eq!(*noted.steps.borrow(), all[..=i], "nothing after {fails}");
            }
        }
    }

    fn rules(link: Option<&Path>) -> Rules<'_> {
        Rules {
            link,
            keep: None,
            epoch: 2,
        }
    }

    #[test]
    fn the_steps_run_in_one_order_on_every_store() {
        let noted = Noted::new("");
        commit(&noted, &rules(Some(Path::new("/nowhere/current")))).unwrap();
        assert_eq!(
            *noted.steps.borrow(),
            [
                "check_owned",
                "commit",
                "drop_records",
                "remove_replaced true",
                "release_staging",
                "point_link /nowhere/current",
            ]
        );
    }

    #[test]
    fn a_failure_before_the_commit_publishes_nothing_and_after_it_is_a_clean_up_failure() {
        for fails in ["check_owned", "commit"] {
            let noted = Noted::new(fails);
            let e = commit(&noted, &rules(None)).unwrap_err();
            assert!(
                e.downcast_ref::<CleanupFailed>().is_none(),
                "{fails}: {e:#}"
            );
            assert_eq!(
                noted.steps.borrow().last().unwrap(),
                fails,
                "nothing after it"
            );
        }
        for fails in [
            "drop_records",
            "remove_replaced",
            "release_staging",
            "point_link",
        ] {
            let noted = Noted::new(fails);
            let e = commit(&noted, &rules(Some(Path::new("/l")))).unwrap_err();
            assert!(
                e.downcast_ref::<CleanupFailed>().is_some(),
                "{fails}: {e:#}"
            );
            assert!(noted.steps.borrow().last().unwrap().starts_with(fails));
        }
    }

    #[test]
    fn keep_finishes_what_an_earlier_run_began_first_and_a_failure_is_a_clean_up_failure() {
        let tmp = tempfile::tempdir().unwrap();
        let mut noted = Noted::new("finish_removal");
        noted.target = tmp.path().join("out-2");
        let keep = Keep {
            count: 1,
            series: "out-{epoch}".into(),
        };
        let rules = Rules {
            link: None,
            keep: Some(&keep),
            epoch: 2,
        };
        let e = commit(&noted, &rules).unwrap_err();
        assert!(e.downcast_ref::<CleanupFailed>().is_some());
        assert!(
            format!("{e:#}").contains("clean-up failed: finish_removal"),
            "{e:#}"
        );
        assert_eq!(
            noted.steps.borrow().last().unwrap(),
            "finish_removal /nowhere/.out-0.gone"
        );
    }

    #[test]
    fn only_nothing_an_empty_directory_or_with_force_an_output_of_reshard_is_replaced() {
        let out = Path::new("out");
        let other = AtOutput::Other("a directory holding mine.txt".into());
        assert!(!may_replace(out, &AtOutput::Nothing, false, "now").unwrap());
        assert!(!may_replace(out, &AtOutput::Empty, true, "now").unwrap());
        assert!(may_replace(out, &AtOutput::ReshardOutput, true, "now").unwrap());
        for (found, force, says) in [
            (&AtOutput::ReshardOutput, false, "exists and is not empty"),
            (&other, false, "exists and is not empty"),
            (
                &other,
                true,
                "now it is a directory holding mine.txt; --force replaces only",
            ),
        ] {
            let e = may_replace(out, found, force, "now").unwrap_err();
            assert!(format!("{e}").contains(says), "{e}");
        }
    }
}
