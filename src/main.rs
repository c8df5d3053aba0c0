//! `reshard`: parse the command line, start MPI where the command needs it, run, and print the
//! error (with its context chain) once.

use std::process::ExitCode;

use clap::Parser;

use reshard::cli::{Cli, Command, RunArgs};
use reshard::comm::mpi::MpiRuntime;
use reshard::comm::{Comm, PeerFailed};
use reshard::error::Exit;
use reshard::pipeline::Outcome;

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code.into(),
        Err(e) => {
            if e.downcast_ref::<PeerFailed>().is_none() {
                eprintln!("reshard: error: {e:#}");
            }
            Exit::Failure.into()
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<Exit> {
    match cli.command {
        Command::Generate(args) => {
            reshard::generate::generate(&args)?;
            Ok(Exit::Success)
        }
        Command::Run(args) => run_job(&args, false),
        Command::Plan(args) => run_job(&args, true),
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
    let mpi = MpiRuntime::init(cfg.max_round_bytes)?;
    let comm = &mpi.comm;
    let outcome = match reshard::pipeline::run(comm, &cfg) {
        Ok(o) => o,
        Err(e) if e.downcast_ref::<PeerFailed>().is_some() => return Err(e),
        Err(e) => return Err(e.context(format!("rank {} of {}", comm.rank(), comm.size()))),
    };
    match outcome {
        Outcome::Ran(summary) if comm.rank() == 0 => {
            print!("{}", summary.render());
            if let Some(path) = &cfg.report {
                summary.write_report(path)?;
            }
        }
        Outcome::Planned(Some(plan)) if cfg.json => {
            println!(
                "{}",
                serde_json::to_string_pretty(&plan).expect("serializable")
            );
        }
        Outcome::Planned(Some(plan)) => print!("{}", plan.render()),
        _ => {}
    }
    Ok(Exit::Success)
}
