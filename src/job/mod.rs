//! `reshard run`: one job as a list of named phases, over any [`Comm`]. [`run`] reads top to
//! bottom as the sequence of phases.
//!
//! For each phase, rank 0 narrates, one call runs it on every rank, and the ranks agree on its
//! outcome before the next starts, so that one rank's failure stops every rank at the same point
//! (rank 0 then removes the staging directory). Nothing is visible at the output path until the
//! publish phase renames it there.
//!
//! | phase      | module                    | what it does                                       |
//! |------------|---------------------------|----------------------------------------------------|
//! | expand     | [`expand`]                | input spec -> shard list; output locked and        |
//! |            |                           | checked; staging made, or checked for `--resume`   |
//! | index      | [`planning::index`]       | tar headers of each rank's share -> samples        |
//! |            | [`planning::duplicates`]  | one key in two samples, across all shards          |
//! | plan       | [`planning::place`]       | every sample's output position                     |
//! |            | [`planning::split`]       | `--split`: every sample's split, by the seed alone |
//! |            | [`planning::layout`]      | every shard laid out by its writer                 |
//! | exchange   | [`exchange`]              | bounded all-to-all rounds; writers place samples   |
//! | finish     | [`finish`]                | inputs unchanged; shards synced, compressed,       |
//! |            |                           | indexed, digested                                  |
//! | publish    | [`destination::publish`]  | manifest; one rename; `--link`, `--keep`           |
//! | upload     | [`destination::upload`]   | an `s3://` output: the staged output uploaded      |
//! |            | [`summary`]               | per-rank figures for the summary and `--report`    |
//!
//! What one phase hands the next is defined in [`handoff`], which every phase imports; the
//! output location's life (lock, staging, ownership, `--keep`, `--link`, resume records,
//! publishing) is [`destination`]. The planning phases take settings of their own
//! ([`crate::config::PlanSettings`], decided once by [`crate::cli::resolve::plan_settings`]) and
//! the context every phase shares ([`handoff::Shared`]: the ranks and the input shards); their
//! pure planning lives in [`crate::plan`].

pub(crate) mod destination;
pub(crate) mod exchange;
pub(crate) mod expand;
pub(crate) mod finish;
pub(crate) mod handoff;
pub mod interrupt;
pub mod planning;
pub(crate) mod summary;
pub(crate) mod walk;

use anyhow::Result;

use crate::comm::{agree, broadcast_result, Comm};
use crate::config::{ExchangeSettings, JobSettings, ResumeSettings};
use crate::heartbeat::{self, Heartbeat};
use crate::hooks;
use crate::output::checkpoint::{self, Done, InputRecord};
use crate::output::{energon, OutputShards};
use crate::progress::{PhaseTimes, Progress};
use crate::report::mixing::Mixing;
use crate::report::narrate::count;
use crate::report::picture::{self, Picture};
use crate::report::{narrate, PlanReport};
use crate::size::human_bytes;
use destination::scratch::Scratch;
use destination::staging::Staging;
use destination::{publish, resume, space, upload, Held};
use exchange::Buffers;
use handoff::{ExchangeStats, Planned, Setup, Shared, WalkFacts};
use planning::{index, layout, place};
use summary::Summary;

/// What a job ends with.
#[derive(Debug)]
pub enum Outcome {
    /// The output was written and published.
    Ran(Box<Summary>),
    /// Only planned (`--dry-run`, `reshard plan`); the report is on rank 0.
    Planned(Option<Box<PlanReport>>),
}

/// Runs the whole job on this rank.
///
/// # Errors
/// Bad input, I/O failure or invalid request, on this rank (the message names file and offset)
/// or on another ([`crate::comm::PeerFailed`]). On error nothing is published, and the staging
/// directory is removed unless a checkpoint makes it worth a `--resume`; except after the
/// publishing rename ([`crate::exit::CleanupFailed`]), where the new output is live.
pub fn run(comm: &impl Comm, settings: &JobSettings) -> Result<Outcome> {
    let lead = comm.rank() == 0;
    let mut times = PhaseTimes::for_rank(comm.rank());
    times.start("expand");
    // Rank 0 holds the output's lock until the job has published or given up.
    let mut mine = Held::default();
    let prepared = lead.then(|| {
        expand::run(settings).map(|(setup, held)| {
            mine = held;
            setup
        })
    });
    let mut setup: Setup = broadcast_result(comm, 0, prepared)?;
    let staging = setup.staging.clone().filter(|_| !settings.dry_run);
    let mut scratch = Scratch::Shared;
    let result = (|| {
        let dead = mine
            .lock()
            .and_then(destination::lock::OutputLock::dead_predecessor);
        scratch = destination::scratch::settle(comm, settings, &setup, dead)?;
        let walked = walk::run(comm, &setup.trees, &mut setup.inputs, staging.as_deref())?;
        let digests = walked.as_ref().map_or(&[][..], |(_, d)| &d[..]);
        let records = lead.then_some(&mut mine.inputs);
        resume::record_units(comm, &setup, records, digests)?;
        if let Some((w, _)) = &walked {
            setup.walk = WalkFacts {
                dir_units: w.dir_units,
                calls: w.calls,
            };
        }
        setup.files = walked.map(|(w, _)| w.files);
        run_phases(
            comm,
            settings,
            &setup,
            lead.then_some(&mine),
            scratch,
            &mut times,
        )
    })();
    if let (Err(e), Some(staging)) = (&result, &setup.staging) {
        // Every rank has left the failed phase (failures are agreed collectively). A staging
        // directory another run took over is that run's.
        let ours = mine.lock().is_none_or(|l| l.may_clean_up(staging));
        let interrupted = e.downcast_ref::<interrupt::Interrupted>();
        let failed = destination::life::Failed {
            staging,
            target: settings.upload.target.as_deref(),
            scratch,
            interrupted,
        };
        destination::life::after_failure(&failed, lead, ours);
    }
    drop(mine);
    result
}

/// The phases after expand. `mine`: rank 0's records of the inputs and the output's lock.
fn run_phases(
    comm: &impl Comm,
    settings: &JobSettings,
    setup: &Setup,
    mine: Option<&Held>,
    scratch: Scratch,
    times: &mut PhaseTimes,
) -> Result<Outcome> {
    let lead = comm.rank() == 0;
    let inputs = mine.map(|m| &m.inputs[..]);
    let lock = mine.and_then(Held::lock);
    narrate_start(comm, setup);
    agree(comm, crate::throttle::start(&settings.io, comm.size()))?;
    let (heart, beats) = start_heartbeat(comm, settings, setup, scratch);
    let phase = |name: &str| heart.iter().for_each(|h| h.phase(name));
    phase("index");
    times.start("index");
    let plan = &settings.plan;
    let ctx = Shared {
        comm,
        inputs: &setup.inputs,
    };
    let mut index = index::run(&ctx, &plan.index, spool_dir(settings, setup, comm.rank()))?;
    hooks::kill_at(comm.rank(), "index");
    let samples = index.samples;
    let stopped = |e| interrupt::with_samples(e, samples);
    interrupt::check(comm).map_err(stopped)?;
    phase("plan");
    times.start_with("plan", "place");
    let placed = place::run(&ctx, &plan.place, &mut index)?;
    times.detail("layout");
    let laid = layout::run(&ctx, &plan.layout, &index, &placed)?;
    hooks::kill_at(comm.rank(), "plan");
    let mut planned = Planned {
        index,
        placed,
        laid,
    };
    if settings.dry_run {
        times.stop();
        let report =
            lead.then(|| Box::new(summary::plan_report(&settings.report, setup, &planned)));
        if let Some(path) = &settings.plot {
            plot_plan(comm, path, setup, &planned, report.as_deref())?;
        }
        return Ok(Outcome::Planned(report));
    }
    interrupt::check(comm).map_err(stopped)?;
    if settings.space_check {
        space::check(comm, setup.staging()?, &planned.laid.shard_bytes)?;
    }
    phase("staging");
    times.detail("staging");
    let resuming = &scratch.resume_settings(&settings.resume);
    let per_node = scratch != Scratch::Shared;
    let output = staging_shards(comm, (resuming, per_node), setup, inputs, &planned)?;
    phase("exchange");
    times.start("exchange");
    hooks::pause_before_exchange(setup.staging()?, comm.rank());
    let pulse = heart.as_ref().map(|h| std::sync::Arc::clone(&h.pulse));
    let stats = exchange_phase(
        comm,
        (&settings.exchange, resuming),
        setup,
        (&mut planned, pulse, beats),
        &output,
    )
    .map_err(stopped)?;
    interrupt::check(comm).map_err(stopped)?;
    phase("finish");
    times.start("finish");
    let finished = finish::run(comm, &settings.finish, setup, &planned, output, lock)?;
    let staging = setup.staging()?;
    let loaders = &settings.finish.loaders;
    if scratch != Scratch::Shared && loaders.energon.is_some() {
        // Rank 0 builds `.nv-meta/` from every writer's rows: those staged on other nodes.
        let (own, send) = (&planned.laid.layout.shards, scratch.removes_own_copy());
        energon::rows_to_lead(comm, staging, own, send, loaders.energon_key_index)?;
    }
    crate::hooks::pause_before_publish(staging, comm.rank());
    // The last moment to stop: publishing is one rename.
    interrupt::check(comm).map_err(stopped)?;
    // Before publish writes the manifests into the staging directory; again before its rename.
    agree(comm, lock.map_or(Ok(()), |l| l.check_owned(staging)))?;
    let done = (&planned, &finished, &stats);
    publish_and_after(comm, settings, setup, done, (mine, scratch), heart, times)
}

/// Publishing, the upload of an object store's output and the summary. Rank 0 moves heartbeats
/// in the staging directory beside it before its rename (those in an object store stay where
/// they are); every rank beats on, so that a rank stopped while rank 0 publishes (or after)
/// ends the job rather than leaving the others in a collective for ever.
fn publish_and_after(
    comm: &impl Comm,
    settings: &JobSettings,
    setup: &Setup,
    (planned, finished, stats): (&Planned, &handoff::Finished, &ExchangeStats),
    (mine, scratch): (Option<&Held>, Scratch),
    heart: Option<Heartbeat>,
    times: &mut PhaseTimes,
) -> Result<Outcome> {
    let phase = |name: &str| heart.iter().for_each(|h| h.phase(name));
    let lock = mine.and_then(Held::lock);
    phase("publish");
    times.detail("publish");
    publish::run(comm, &settings.publish, setup, planned, finished, lock)?;
    if settings.upload.target.is_some() {
        phase("upload");
        times.detail("upload");
    }
    upload_phase(comm, settings, setup, planned, mine)?;
    times.stop();
    phase("summary");
    let summary = summary::gather(comm, &settings.report, setup, planned, stats, times)?;
    // Every rank's heartbeat has ended (its thread joined) before rank 0 removes them: a rank
    // still beating would leave a file behind in the directory being removed.
    drop(heart);
    agree(comm, Ok(()))?;
    if comm.rank() == 0 {
        let target = settings.upload.target.as_deref();
        scratch.remove_heartbeats(setup.staging()?, target);
    }
    Ok(Outcome::Ran(Box::new(summary)))
}

/// This rank's spool directory, named by the run's token (its staging directory's
/// `.NAME.reshard-tmp.TOKEN`) and the rank, so that runs and ranks may share one scratch; none
/// when only planning.
fn spool_dir(settings: &JobSettings, setup: &Setup, rank: usize) -> Option<std::path::PathBuf> {
    let staging = setup.staging.as_ref().filter(|_| !settings.dry_run)?;
    let token = staging.file_name()?.to_str()?.rsplit('.').next()?;
    let root = &settings.plan.index.spool;
    Some(root.join(format!("reshard-spool.{token}.{rank}")))
}

/// Every rank passed the set-up's broadcast: each beats and watches its neighbours from here to
/// the end of the job. With the heartbeats' directory.
fn start_heartbeat(
    comm: &impl Comm,
    settings: &JobSettings,
    setup: &Setup,
    scratch: Scratch,
) -> (Option<Heartbeat>, Option<std::path::PathBuf>) {
    let Some(staging) = setup.staging.as_deref() else {
        return (None, None);
    };
    let dir = scratch.heartbeats(staging, settings.upload.target.as_deref());
    let place = heartbeat::Place {
        aside: (dir == Staging::at(staging).heartbeats())
            .then(|| Staging::at(staging).heartbeats_aside()),
        dir: dir.clone(),
        owner: Some(Staging::at(staging).owner_file()),
    };
    let ranks = (comm.rank(), comm.size());
    let timeout = settings.exchange.stall_timeout;
    let heart = Heartbeat::start(timeout, ranks, place, comm.aborter());
    (Some(heart), Some(dir))
}

/// Phase "upload" (an object store's output): every rank reads its files from its node's copy,
/// the published one, or where the publishing rename did not reach (a node of its own, see
/// [`destination::scratch`]) the staging directory.
fn upload_phase(
    comm: &impl Comm,
    settings: &JobSettings,
    setup: &Setup,
    planned: &Planned,
    mine: Option<&Held>,
) -> Result<()> {
    let (staging, local) = (setup.staging()?, setup.target()?);
    let staged = upload::Staged {
        local,
        copy: if Staging::at(staging).present() {
            staging
        } else {
            local
        },
        written: upload::written(planned, &settings.finish),
    };
    let remote = mine.and_then(|m| m.remote.as_ref());
    upload::run(comm, &settings.upload, &staged, remote)
}

/// This rank's staging shards, created and the plan recorded (a first attempt; not when
/// `unrecorded`, staged per node), or the plan checked and the shards an earlier attempt left
/// reopened (`--resume`).
fn staging_shards(
    comm: &impl Comm,
    (resuming, unrecorded): (&ResumeSettings, bool),
    setup: &Setup,
    inputs: Option<&[InputRecord]>,
    planned: &Planned,
) -> Result<OutputShards> {
    let (staging, resume) = (setup.staging()?, setup.resume.as_ref());
    let (names, layout) = (&planned.placed.names, &planned.laid.layout);
    if resume.is_some() {
        resume::record_plan(comm, resuming, staging, resume, inputs, planned)?;
        let output = agree(comm, OutputShards::reopen(staging, names, layout))?;
        let checked = resume
            .filter(|_| comm.rank() == 0)
            .map_or(Ok(()), |r| checkpoint::check_shards(staging, &r.checkpoint));
        agree(comm, checked)?;
        return Ok(output);
    }
    let output = agree(comm, OutputShards::create(staging, names, layout))?;
    // Recorded once every shard exists: a plan record promises them to a resumed run.
    if !unrecorded {
        resume::record_plan(comm, resuming, staging, None, inputs, planned)?;
    }
    Ok(output)
}

/// `--plot` of a plan: every rank counts where its samples go, rank 0 draws the picture (the
/// one file a plan writes, because it was asked for).
fn plot_plan(
    comm: &impl Comm,
    path: &std::path::Path,
    setup: &Setup,
    planned: &Planned,
    report: Option<&PlanReport>,
) -> Result<()> {
    let local = &planned.index.local;
    let plan = &planned.laid.plan;
    let mut mixing = Mixing::new(planned.placed.shards, setup.inputs.len() as u64);
    planned.placed.placement.for_each(local.len(), &mut |i, p| {
        mixing.add(plan.shard_of(p), u64::from(local[i].shard));
    });
    let mixing = mixing.with_counts(comm.all_sum(&mixing.counts));
    let drawn = report.map_or(Ok(()), |r| {
        let bytes: Vec<u64> = r.per_shard.iter().map(|e| e.filesize).collect();
        let samples: Vec<u64> = r.per_shard.iter().map(|e| e.nsamples).collect();
        let picture = Picture {
            title: format!(
                "reshard plan: {} samples, {} input shards -> {} output shards",
                r.samples, r.input_shards, r.shards
            ),
            shard_bytes: &bytes,
            shard_samples: &samples,
            mixing: &mixing,
        };
        let warning = picture::draw(path, &picture)?;
        if let Some(w) = warning {
            crate::errln!("reshard: warning: {w}");
        }
        narrate(true, format_args!("drew the plan to {}", path.display()));
        Ok(())
    });
    agree(comm, drawn)
}

/// Rank 0 says what the job reads and where it writes.
fn narrate_start(comm: &impl Comm, setup: &Setup) {
    let (ranks, lead) = (comm.size(), comm.rank() == 0);
    let input_bytes = setup.input_bytes();
    narrate(
        lead,
        format_args!(
            "indexing {} ({}) on {}",
            count(setup.inputs.len() as u64, "input shard"),
            human_bytes(input_bytes),
            count(ranks as u64, "rank")
        ),
    );
    if let Some(staging) = &setup.staging {
        // Named up front: if the job is killed, no rank may live to say where it was writing.
        narrate(
            lead,
            format_args!(
                "assembling the output in {} (renamed at the end)",
                staging.display()
            ),
        );
    }
}

/// The exchange, with a progress display on rank 0; the spooled input is removed after it.
fn exchange_phase(
    comm: &impl Comm,
    (settings, resuming): (&ExchangeSettings, &ResumeSettings),
    setup: &Setup,
    (planned, pulse, heartbeats): (
        &mut Planned,
        Option<std::sync::Arc<crate::heartbeat::Pulse>>,
        Option<std::path::PathBuf>,
    ),
    output: &OutputShards,
) -> Result<ExchangeStats> {
    let ranks = comm.size();
    let layout = &planned.laid.layout;
    let total_out = comm.all_sum(&[layout.sample_bytes()])[0];
    let mut progress = Progress::new(
        settings.progress,
        comm.rank() == 0,
        "exchange",
        total_out,
        None,
    );
    let nothing = Done::default();
    let resume = setup.resume.as_ref();
    let job = exchange::Work {
        inputs: &setup.inputs,
        local: &planned.index.local,
        first_global: planned.index.first_global,
        unread: &planned.index.unread,
        done: resume.map_or(&nothing, |r| &r.checkpoint.done),
        placement: &planned.placed.placement,
        plan: &planned.laid.plan,
        layout,
        output,
    };
    let staging = setup.staging()?;
    // The input spooled in memory holds its share of the budget until the exchange ends.
    let spooled = planned.index.spool.as_ref().map_or(0, |s| s.held()[0]);
    let budget = settings.mem_limit.saturating_sub(spooled);
    let stats = exchange::run(
        comm,
        &job,
        Buffers::for_job(budget, ranks, total_out / ranks as u64).within_stall(
            settings.stall_timeout,
            settings.limits.slowest_share(ranks),
            ranks,
        ),
        exchange::Stall {
            timeout: settings.stall_timeout,
            heartbeats,
            pulse,
        },
        resume::checkpoints(resuming, staging, resume),
        &mut |d| progress.update(d),
    )?;
    progress.finish();
    // Every sample read: the spooled input goes (the finish phase checks the store's objects).
    drop(planned.index.spool.take());
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::path::{Path, PathBuf};

    use super::*;
    use crate::cli::resolve::job_settings;
    use crate::comm::local::LocalComm;
    use crate::config::Balance;
    use crate::config::RunConfig;
    use crate::output::manifest::Manifest;
    use crate::output::shard_file_name;
    use crate::tar::{Codec, Rules};

    /// Writes `shards` small tar files with uneven sample counts and sizes.
    pub(super) fn write_inputs(dir: &Path, shards: usize) -> Vec<String> {
        let mut specs = Vec::new();
        let mut n = 0u32;
        for s in 0..shards {
            let path = dir.join(format!("in-{s:02}.tar"));
            let mut b = tar::Builder::new(fs::File::create(&path).unwrap());
            for _ in 0..(3 + 7 * s) {
                for ext in ["jpg", "cls"] {
                    let data = vec![(n % 251) as u8; (n as usize * 37) % 3000 + 1];
                    let mut h = tar::Header::new_gnu();
                    h.set_size(data.len() as u64);
                    h.set_mode(0o644);
                    b.append_data(&mut h, format!("k{n:05}.{ext}"), &data[..])
                        .unwrap();
                }
                n += 1;
            }
            b.finish().unwrap();
            specs.push(path.display().to_string());
        }
        specs
    }

    pub(super) fn config(inputs: Vec<String>, output: PathBuf, mem_limit: u64) -> RunConfig {
        RunConfig {
            inputs,
            files: Default::default(),
            output: Some(output),
            upload: None,
            sizing: crate::plan::Sizing::Count(5),
            equalize: crate::plan::Equalize::None,
            balance: Balance::Count,
            gpus: None,
            dry_run: false,
            space_check: true,
            json: false,
            seed: 3,
            epoch: 0,
            prefix: "shard".into(),
            mem_limit,
            force: false,
            report: None,
            rules: Rules::default(),
            checksum: false,
            compress: Codec::Plain,
            saved_indexes: None,
            spool: std::env::temp_dir(),
            link: None,
            keep: None,
            stall_timeout: std::time::Duration::from_secs(120),
            lock_stale_after: crate::job::destination::lock::STALE_AFTER,
            max_round_bytes: i32::MAX as u64,
            order: crate::plan::order::OrderSpec::default(),
            split: None,
            resume: false,
            checkpoint_every: std::time::Duration::ZERO,
            progress: crate::config::ProgressConfig::default(),
            plot: None,
            loaders: crate::config::LoaderIndexes::default(),
            io: crate::config::IoConfig::default(),
        }
    }

    /// The plan the planning phases make for `cfg` on `comm` (its output is left out: nothing
    /// is locked or written).
    pub(super) fn planned(comm: &impl Comm, cfg: &RunConfig) -> Planned {
        let mut cfg = cfg.clone();
        cfg.output = None;
        let settings = job_settings(&cfg);
        let prepared = (comm.rank() == 0).then(|| {
            expand::prepare(&settings.expand, &settings.resume, None).map(|(setup, _)| setup)
        });
        let setup: Setup = broadcast_result(comm, 0, prepared).unwrap();
        let ctx = Shared {
            comm,
            inputs: &setup.inputs,
        };
        let mut index = index::run(&ctx, &settings.plan.index, None).unwrap();
        let placed = place::run(&ctx, &settings.plan.place, &mut index).unwrap();
        let laid = layout::run(&ctx, &settings.plan.layout, &index, &placed).unwrap();
        Planned {
            index,
            placed,
            laid,
        }
    }

    fn shard_bytes(dir: &Path) -> Vec<Vec<u8>> {
        (0..5)
            .map(|s| fs::read(dir.join(shard_file_name("shard", s))).unwrap())
            .collect()
    }

    #[test]
    fn in_process_runs_are_identical_for_any_rank_count() {
        let tmp = tempfile::tempdir().unwrap();
        let inputs = write_inputs(tmp.path(), 4);
        let mut outputs = Vec::new();
        for ranks in 1..=4 {
            let out = tmp.path().join(format!("out-{ranks}"));
            // A 1 MiB budget forces many rounds and chunked samples on the larger rank counts.
            let cfg = config(inputs.clone(), out.clone(), 1 << 20);
            let results = LocalComm::run(ranks, |c| match run(c, &job_settings(&cfg)) {
                Ok(Outcome::Ran(s)) => Ok((s.samples, s.shards)),
                Ok(Outcome::Planned(_)) => panic!("not a dry run"),
                Err(e) => Err(e),
            });
            for r in results {
                assert_eq!(r.unwrap(), (3 + 10 + 17 + 24, 5));
            }
            outputs.push(shard_bytes(&out));
            let manifest: Manifest =
                serde_json::from_slice(&fs::read(out.join("index.json")).unwrap()).unwrap();
            let counts: Vec<u64> = manifest.shardlist.iter().map(|e| e.nsamples).collect();
            assert_eq!(counts, [11, 11, 11, 11, 10]);
            assert!(!tmp
                .path()
                .join(format!(".out-{ranks}.reshard-tmp"))
                .exists());
        }
        for o in &outputs[1..] {
            assert_eq!(o, &outputs[0]);
        }
    }

    /// Checkpoints of the exchange (for `--resume`): with `--checkpoint-every 0` one is due at
    /// every round and some complete; with an hour none is asked for (they come by time only).
    #[test]
    fn checkpoints_are_taken_when_due_and_only_then() {
        let tmp = tempfile::tempdir().unwrap();
        let inputs = write_inputs(tmp.path(), 4);
        let (zero, hour) = (
            std::time::Duration::ZERO,
            std::time::Duration::from_secs(3600),
        );
        for (every, ranks) in [(zero, 1), (zero, 2), (zero, 4), (hour, 1), (hour, 4)] {
            let out = tmp.path().join(format!("out-{}-{ranks}", every.as_secs()));
            // A small budget: many rounds, so that a checkpoint completes rounds later.
            let mut cfg = config(inputs.clone(), out, 1 << 16);
            cfg.checkpoint_every = every;
            let results = LocalComm::run(ranks, |c| match run(c, &job_settings(&cfg)) {
                Ok(Outcome::Ran(s)) => Ok(s.checkpoints),
                Ok(Outcome::Planned(_)) => panic!("not a dry run"),
                Err(e) => Err(e),
            });
            for taken in results.into_iter().map(Result::unwrap) {
                if every.is_zero() {
                    assert!(taken > 0, "{ranks} ranks: no checkpoint");
                } else {
                    assert_eq!(taken, 0, "{ranks} ranks");
                }
            }
        }
    }

    /// Every file below `root` but the manifests and saved indexes (they record the rank count
    /// and modification times), by path relative to `root`.
    fn files_below(root: &Path) -> Vec<(PathBuf, Vec<u8>)> {
        let mut files = Vec::new();
        let mut dirs = vec![root.to_path_buf()];
        while let Some(dir) = dirs.pop() {
            for entry in fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                if path.ends_with(crate::output::saved_index::DIR_NAME) {
                    continue;
                }
                if path.is_dir() {
                    dirs.push(path);
                } else if !path.ends_with("index.json") {
                    let bytes = fs::read(&path).unwrap();
                    files.push((path.strip_prefix(root).unwrap().to_path_buf(), bytes));
                }
            }
        }
        files.sort();
        files
    }

    #[test]
    fn in_process_split_runs_are_identical_for_any_rank_count() {
        let tmp = tempfile::tempdir().unwrap();
        let inputs = write_inputs(tmp.path(), 4);
        let mut outputs = Vec::new();
        for ranks in 1..=4 {
            let out = tmp.path().join(format!("split-{ranks}"));
            let mut cfg = config(inputs.clone(), out.clone(), 1 << 20);
            cfg.split = Some(crate::config::Splits {
                spec: "train=0.8,val=0.1,test=rest".parse().unwrap(),
                shards: vec![None, Some(2), None],
            });
            let results = LocalComm::run(ranks, |c| run(c, &job_settings(&cfg)).map(|_| ()));
            assert!(results.iter().all(Result::is_ok), "{results:?}");
            let counts: Vec<u64> = ["train", "val", "test"]
                .iter()
                .map(|split| {
                    let m: Manifest = serde_json::from_slice(
                        &fs::read(out.join(split).join("index.json")).unwrap(),
                    )
                    .unwrap();
                    m.shardlist.iter().map(|e| e.nsamples).sum()
                })
                .collect();
            // 54 samples: 43.2, 5.4 and 5.4; the earlier of the equal remainders gets the one.
            assert_eq!(counts, [43, 6, 5]);
            outputs.push(files_below(&out));
        }
        for o in &outputs[1..] {
            assert_eq!(o, &outputs[0]);
        }
        let names: Vec<String> = outputs[0]
            .iter()
            .map(|f| f.0.display().to_string())
            .collect();
        assert_eq!(names.len(), 5 + 2 + 1, "{names:?}");
        assert!(names.contains(&"val/shard-000001.tar".to_string()));
    }

    /// The whole job (expand, lock, staging, index, plan, exchange, finish with digests,
    /// publish) on `mem://` locations, which `std::fs` cannot reach: every byte it writes goes
    /// through the seam, and the bytes are the ones a run on the file system writes.
    #[test]
    fn the_whole_job_runs_on_a_backend_that_is_not_a_file_system() {
        use crate::storage::{self, memory};
        let tmp = tempfile::tempdir().unwrap();
        let on_disk = write_inputs(tmp.path(), 4);
        let root = Path::new("mem://whole-job");
        storage::sink(root).create_dir_all(root).unwrap();
        for spec in &on_disk {
            let path = Path::new(spec);
            let name = path.file_name().unwrap();
            memory::put(&root.join("in").join(name), fs::read(path).unwrap());
        }
        let run_on = |inputs: Vec<String>, out: &Path| {
            let mut cfg = config(inputs, out.to_path_buf(), 1 << 20);
            cfg.checksum = true;
            let results = LocalComm::run(3, |c| run(c, &job_settings(&cfg)).map(|_| ()));
            assert!(results.iter().all(Result::is_ok), "{results:?}");
        };
        let (mem_out, disk_out) = (root.join("out"), tmp.path().join("out"));
        run_on(vec![root.join("in").display().to_string()], &mem_out);
        run_on(on_disk, &disk_out);

        for s in 0..5 {
            let name = shard_file_name("shard", s);
            let written = memory::get(&mem_out.join(&name)).expect("published in memory");
            assert_eq!(written, fs::read(disk_out.join(&name)).unwrap(), "{name}");
        }
        let manifest = |bytes: Vec<u8>| -> Vec<(String, Option<String>)> {
            let m: Manifest = serde_json::from_slice(&bytes).unwrap();
            m.shardlist.into_iter().map(|e| (e.url, e.md5sum)).collect()
        };
        let in_memory = manifest(memory::get(&mem_out.join("index.json")).unwrap());
        assert_eq!(
            in_memory,
            manifest(fs::read(disk_out.join("index.json")).unwrap())
        );
        assert!(in_memory.iter().all(|(_, md5)| md5.is_some()));
        let source = storage::source(root);
        for gone in [".out.reshard-tmp", ".out.reshard-lock"] {
            assert!(source.stat(&root.join(gone)).is_err(), "{gone} left behind");
        }
        assert!(
            !Path::new("mem:").exists(),
            "nothing went to the file system"
        );
    }

    #[test]
    fn a_failure_on_one_rank_stops_all_and_publishes_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let mut inputs = write_inputs(tmp.path(), 3);
        let bad = tmp.path().join("bad.tar");
        fs::write(&bad, vec![b'x'; 4096]).unwrap();
        inputs.push(bad.display().to_string());
        let out = tmp.path().join("out");
        let cfg = config(inputs, out.clone(), 1 << 20);
        let results = LocalComm::run(3, |c| {
            run(c, &job_settings(&cfg))
                .map(|_| ())
                .map_err(|e| format!("{e:#}"))
        });
        let real: Vec<&String> = results
            .iter()
            .filter_map(|r| r.as_ref().err())
            .filter(|e| !e.contains("stopped because"))
            .collect();
        assert_eq!(real.len(), 1, "{results:?}");
        assert!(
            real[0].contains("bad.tar") && real[0].contains("byte offset 0"),
            "{}",
            real[0]
        );
        assert!(results.iter().all(Result::is_err));
        assert!(!out.exists());
        assert!(!tmp.path().join(".out.reshard-tmp").exists());
    }
}
