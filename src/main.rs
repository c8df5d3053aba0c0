//! `reshard`: parse the command line, resolve it into a task (a usage error exits 2 here, for
//! every subcommand), start MPI where the task needs it, run it, and print the error (with its
//! context chain) once.

use std::process::ExitCode;

use reshard::cli::resolve::{self, Task, UsageError};
use reshard::comm::launcher::LauncherMismatch;
use reshard::comm::mpi::{end_before_work, MpiComm, MpiRuntime};
use reshard::comm::{agree, Comm, PeerFailed};
use reshard::config::{RunConfig, VerifyConfig};
use reshard::exit::CleanupFailed;
use reshard::exit::Exit;
use reshard::job::interrupt::Interrupted;
use reshard::job::Outcome;

fn main() -> ExitCode {
    match reshard::cli::parse() {
        Ok(cli) => run(cli.command).unwrap_or_else(failed).into(),
        Err(exit) => end_before_work(exit).into(),
    }
}

fn run(command: reshard::cli::Command) -> anyhow::Result<Exit> {
    let task = match resolve::task(command) {
        Ok(task) => task,
        Err(e) => return Ok(end_before_work(failed_before_mpi(e.into()))),
    };
    match task {
        Task::Generate(cfg) => {
            reshard::generate::generate(&cfg)?;
            Ok(Exit::Success)
        }
        Task::Run {
            config,
            then_verify,
        } => under_mpi(config.max_round_bytes, |comm| {
            if !config.dry_run {
                // From here a stop signal checkpoints the job and ends it in order.
                reshard::job::interrupt::catch();
            }
            job(comm, &config, then_verify.as_ref())
        }),
        Task::Verify(cfg) => under_mpi(i32::MAX as u64, |comm| verify_job(comm, &cfg)),
        // No MPI here: completions must work on a login node without a launcher.
        Task::Completions(shell) => {
            reshard::cli::write_completions(shell)?;
            Ok(Exit::Success)
        }
        Task::Man(page) => {
            reshard::cli::write_man(page.as_deref())?;
            Ok(Exit::Success)
        }
    }
}

/// Prints a failure (once: ranks stopped by another rank's failure stay quiet) and says how to
/// exit for it.
fn failed(e: anyhow::Error) -> Exit {
    // A stop signal ended the job: rank 0 has said what was kept, every rank exits 128 + N.
    if let Some(i) = e.downcast_ref::<Interrupted>() {
        return Exit::for_signal(i.signal);
    }
    if e.downcast_ref::<PeerFailed>().is_none() {
        reshard::errln!("reshard: error: {e:#}");
    }
    // Started the wrong way (srun without a matching --mpi plugin, another MPI's launcher): as
    // wrong as a bad flag, and as useless to retry unchanged.
    if e.downcast_ref::<UsageError>().is_some() || e.downcast_ref::<LauncherMismatch>().is_some() {
        Exit::Usage
    } else if e.downcast_ref::<CleanupFailed>().is_some() {
        Exit::CleanupFailed
    } else {
        Exit::Failure
    }
}

/// [`failed`] for what every process meets alike before MPI numbers them (a usage error, a
/// launcher that does not match the MPI library): only the launcher's rank 0 says it, so that
/// the message is printed once per job, not once per rank.
fn failed_before_mpi(e: anyhow::Error) -> Exit {
    if reshard::comm::launcher::speaks_for_the_job() {
        failed(e)
    } else if e.downcast_ref::<UsageError>().is_some()
        || e.downcast_ref::<LauncherMismatch>().is_some()
    {
        Exit::Usage
    } else {
        Exit::Failure
    }
}

/// How long a process that MPI could not join to its peers (a launcher that does not match the
/// MPI library: each process is a world of its own) waits before it exits, when another process
/// speaks for the job. Nothing else orders their exits, and a launcher that ends the step at
/// the first failing task (`srun --kill-on-bad-exit`, as slurm/*.sbatch run it) killed the
/// launcher's rank 0 before it had said why when a quiet task exited first: the job ended with
/// 143 and no reason in its log (once in eight runs of the suite beside a second copy of it;
/// every time with `RESHARD_TEST_SLOW_SPEAKER`).
const SPEAKER_HEAD_START: std::time::Duration = std::time::Duration::from_secs(3);

/// Waits [`SPEAKER_HEAD_START`], or until a stop signal comes: the launcher ending the step once
/// the speaker has exited (`--kill-on-bad-exit` sends SIGTERM to the tasks left). The process then
/// exits with its own status, the refusal's, instead of dying of the signal: srun reported 143
/// for the step when a task was killed, and 2 only when every task exited by itself.
fn give_the_speaker_a_head_start() {
    let start = std::time::Instant::now();
    // Uncaught, a signal keeps its default action and stop_signal() stays None: the plain wait.
    let _ = reshard::sys::catch_stop_signals();
    while start.elapsed() < SPEAKER_HEAD_START && reshard::sys::stop_signal().is_none() {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Runs `job` on every rank under MPI, prints its failure, then ends the job: every rank agrees on
/// the exit status and MPI is finalized under a deadline (see [`MpiRuntime::finish`]), so that a
/// finished job ends even where MPI_Finalize hangs.
fn under_mpi(
    max_round_bytes: u64,
    job: impl FnOnce(&MpiComm) -> anyhow::Result<Exit>,
) -> anyhow::Result<Exit> {
    let mpi = match MpiRuntime::init(max_round_bytes) {
        Ok(mpi) => mpi,
        Err(e) => {
            if reshard::comm::launcher::speaks_for_the_job() {
                reshard::hooks::slow_speaker();
            } else {
                give_the_speaker_a_head_start();
            }
            return Ok(failed_before_mpi(e));
        }
    };
    let code = job(&mpi.comm).unwrap_or_else(failed);
    Ok(mpi.finish(code))
}

/// `reshard run` / `plan` on every rank, once MPI is up, and `verify` after it (`--verify`).
fn job(
    comm: &MpiComm,
    cfg: &RunConfig,
    then_verify: Option<&VerifyConfig>,
) -> anyhow::Result<Exit> {
    let outcome = match reshard::job::run(comm, &reshard::cli::resolve::job_settings(cfg)) {
        Ok(o) => o,
        Err(e) if e.downcast_ref::<PeerFailed>().is_some() => return Err(e),
        Err(e) => return Err(on_rank(comm, e)),
    };
    let reported = match outcome {
        Outcome::Ran(summary) if comm.rank() == 0 => {
            print!("{}", summary.render());
            cfg.report
                .as_ref()
                .map_or(Ok(()), |path| summary.write_report(path))
        }
        Outcome::Planned(Some(plan)) if cfg.json => {
            println!(
                "{}",
                serde_json::to_string_pretty(&plan).expect("serializable")
            );
            Ok(())
        }
        Outcome::Planned(Some(plan)) => {
            print!("{}", plan.render());
            Ok(())
        }
        _ => Ok(()),
    };
    // Rank 0 alone writes the report: every rank learns whether it could, before --verify's
    // collectives and the final agreement on the exit status.
    agree(comm, reported)?;
    match then_verify {
        Some(check) => verify_job(comm, check),
        None => Ok(Exit::Success),
    }
}

/// A rank's error named by its rank, when there are several (one alone needs no name).
fn on_rank(comm: &impl Comm, e: anyhow::Error) -> anyhow::Error {
    if comm.size() == 1 {
        return e;
    }
    e.context(format!("rank {} of {}", comm.rank(), comm.size()))
}

/// `reshard verify` (and `run --verify`) on every rank: the report on rank 0, exit 1 on every
/// rank when anything does not hold.
fn verify_job(comm: &impl Comm, cfg: &VerifyConfig) -> anyhow::Result<Exit> {
    let verdict = match reshard::verify::verify(comm, cfg) {
        Ok(v) => v,
        Err(e) if e.downcast_ref::<PeerFailed>().is_some() => return Err(e),
        Err(e) => return Err(on_rank(comm, e)),
    };
    if let Some(report) = &verdict.report {
        if cfg.json {
            let text = serde_json::to_string_pretty(report).expect("serializable");
            println!("{text}");
        } else {
            print!("{}", report.render());
        }
        if !report.ok {
            reshard::errln!(
                "reshard: error: verification of {} failed: {} problem{} (listed in the report)",
                cfg.output.display(),
                report.problems.len(),
                if report.problems.len() == 1 { "" } else { "s" }
            );
        }
    }
    Ok(if verdict.ok {
        Exit::Success
    } else {
        Exit::Failure
    })
}
