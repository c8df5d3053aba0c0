//! `reshard`: parse the command line, start MPI where the command needs it, run, and print the
//! error (with its context chain) once.

use std::ffi::OsString;
use std::process::ExitCode;

use clap::Parser;

use reshard::cli::{Cli, Command, RunArgs, RunConfig};
use reshard::comm::mpi::{MpiComm, MpiRuntime};
use reshard::comm::{agree, Comm, PeerFailed};
use reshard::exit::Exit;
use reshard::job::Outcome;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // --help and --version end here too, on stdout with exit code 0.
            let hint = input_hint(&e, &std::env::args_os().collect::<Vec<_>>());
            let _ = e.print();
            if let Some(hint) = hint {
                eprintln!("{hint}");
            }
            return ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2));
        }
    };
    run(cli).unwrap_or_else(failed).into()
}

/// Prints a failure (once: ranks stopped by another rank's failure stay quiet).
fn failed(e: anyhow::Error) -> Exit {
    if e.downcast_ref::<PeerFailed>().is_none() {
        eprintln!("reshard: error: {e:#}");
    }
    Exit::Failure
}

/// Runs `job` on every rank under MPI, prints its failure, then ends the job: every rank agrees on
/// the exit status and MPI is finalized under a deadline (see [`MpiRuntime::finish`]), so that a
/// finished job ends even where MPI_Finalize hangs.
fn under_mpi(
    max_round_bytes: u64,
    job: impl FnOnce(&MpiComm) -> anyhow::Result<Exit>,
) -> anyhow::Result<Exit> {
    let mpi = MpiRuntime::init(max_round_bytes)?;
    let code = job(&mpi.comm).unwrap_or_else(failed);
    Ok(mpi.finish(code))
}

/// A hint for clap's "unexpected argument" when the stray word is one of several paths after
/// `--input`, as the shell leaves an unquoted brace pattern (`--input data/train-{0..3}.tar`
/// becomes four words): the pattern must be quoted, or `--input` repeated.
fn input_hint(e: &clap::Error, argv: &[OsString]) -> Option<String> {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if e.kind() != ErrorKind::UnknownArgument {
        return None;
    }
    let Some(ContextValue::String(stray)) = e.get(ContextKind::InvalidArg) else {
        return None;
    };
    let at = 1 + argv
        .iter()
        .skip(1)
        .position(|a| a.to_str() == Some(stray))?;
    // Back over the words before it that are not flags, to the flag they follow.
    let run = (1..at)
        .rev()
        .take_while(|&i| !argv[i].to_string_lossy().starts_with('-'))
        .count();
    let flag = argv[at - run - 1].to_string_lossy();
    let separate = run > 0 && (flag == "--input" || flag == "-i");
    let attached = flag.starts_with("--input=") || (flag.starts_with("-i") && flag.len() > 2);
    if !(separate || attached) {
        return None;
    }
    let looks_like_shard = [".tar", ".tgz", ".tar.gz", ".tar.zst"]
        .iter()
        .any(|ext| stray.ends_with(ext))
        || std::path::Path::new(stray).is_file();
    if !looks_like_shard {
        return None;
    }
    Some(format!(
        "hint: '{stray}' looks like another input path after --input, which takes one SPEC: an \
         unquoted brace pattern is expanded by the shell into separate words. Quote the pattern \
         (--input 'data/train-{{000000..000003}}.tar', reshard expands it) or repeat --input \
         before each path."
    ))
}

fn run(cli: Cli) -> anyhow::Result<Exit> {
    match cli.command {
        Command::Generate(args) => {
            reshard::generate::generate(&args)?;
            Ok(Exit::Success)
        }
        Command::Run(args) => run_job(&args, false),
        Command::Plan(args) => run_job(&args, true),
        Command::Verify(args) => under_mpi(i32::MAX as u64, |comm| {
            verify_job(comm, &reshard::verify::VerifyConfig::from(&args))
        }),
        Command::Completions { shell } => {
            // No MPI here: completions must work on a login node without a launcher.
            let mut cmd = <Cli as clap::CommandFactory>::command();
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut cmd, "reshard", &mut script);
            // Into a buffer first: `reshard completions bash | head` must not panic on EPIPE.
            match std::io::Write::write_all(&mut std::io::stdout().lock(), &script) {
                Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
                    Err(anyhow::Error::new(e).context("cannot write the completion script"))
                }
                _ => Ok(Exit::Success),
            }
        }
    }
}

fn run_job(args: &RunArgs, plan_only: bool) -> anyhow::Result<Exit> {
    let cfg = match args.resolve(plan_only) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("reshard: error: {e:#}");
            return Ok(Exit::Usage);
        }
    };
    under_mpi(cfg.max_round_bytes, |comm| job(comm, &cfg, args.verify))
}

/// `reshard run` / `plan` on every rank, once MPI is up.
fn job(comm: &MpiComm, cfg: &RunConfig, verify: bool) -> anyhow::Result<Exit> {
    let outcome = match reshard::job::run(comm, cfg) {
        Ok(o) => o,
        Err(e) if e.downcast_ref::<PeerFailed>().is_some() => return Err(e),
        Err(e) => return Err(e.context(format!("rank {} of {}", comm.rank(), comm.size()))),
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
    if let (true, Some(output)) = (verify, &cfg.output) {
        let check = reshard::verify::VerifyConfig {
            inputs: cfg.inputs.clone(),
            output: output.clone(),
            json: false,
        };
        return verify_job(comm, &check);
    }
    Ok(Exit::Success)
}

/// `reshard verify` (and `run --verify`) on every rank: the report on rank 0, exit 1 on every
/// rank when anything does not hold.
fn verify_job(comm: &impl Comm, cfg: &reshard::verify::VerifyConfig) -> anyhow::Result<Exit> {
    let verdict = match reshard::verify::verify(comm, cfg) {
        Ok(v) => v,
        Err(e) if e.downcast_ref::<PeerFailed>().is_some() => return Err(e),
        Err(e) => return Err(e.context(format!("rank {} of {}", comm.rank(), comm.size()))),
    };
    if let Some(report) = &verdict.report {
        if cfg.json {
            let text = serde_json::to_string_pretty(report).expect("serializable");
            println!("{text}");
        } else {
            print!("{}", report.render());
        }
        if !report.ok {
            eprintln!(
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
