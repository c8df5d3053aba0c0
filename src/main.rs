//! `reshard`: parse the command line, start MPI where the command needs it, run, and print the
//! error (with its context chain) once.

use std::process::ExitCode;

use clap::Parser;

use reshard::cli::{Cli, Command};
use reshard::comm::mpi::MpiRuntime;
use reshard::comm::{Comm, PeerFailed};
use reshard::error::Exit;

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
        Command::Run(args) => {
            let cfg = match args.resolve() {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("reshard: error: {e:#}");
                    return Ok(Exit::Usage);
                }
            };
            let mpi = MpiRuntime::init(cfg.max_round_bytes)?;
            let comm = &mpi.comm;
            match reshard::pipeline::run(comm, &cfg) {
                Ok(summary) => {
                    if comm.rank() == 0 {
                        print!("{}", summary.render());
                        if let Some(path) = &cfg.report {
                            summary.write_report(path)?;
                        }
                    }
                    Ok(Exit::Success)
                }
                Err(e) if e.downcast_ref::<PeerFailed>().is_some() => Err(e),
                Err(e) => Err(e.context(format!("rank {} of {}", comm.rank(), comm.size()))),
            }
        }
    }
}
