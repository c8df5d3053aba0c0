//! The command line, in two steps as ripgrep's flags are: [`args`] is what clap parses (no I/O,
//! no checks beyond clap's), [`resolve`] turns each subcommand's arguments into its
//! configuration ([`crate::config`]) or a usage error.

pub(crate) mod args;
mod hint;
pub mod resolve;

pub use args::{
    Cli, Command, CompressArg, EqualizeArg, GenerateArgs, PlanArgs, RunArgs, VerifyArgs,
};

use std::io::Write;

use anyhow::{Context, Result};
use clap::Parser;

use crate::exit::Exit;

/// Parses the process's arguments. When clap ends the command instead (`--help`, `--version`, or
/// an argument it rejects), it has printed why (with a hint for a common mistake, see
/// [`hint::input_hint`]) and this returns the exit status.
pub fn parse() -> Result<Cli, Exit> {
    Cli::try_parse().map_err(|e| {
        // --help and --version end here too, on stdout with exit code 0.
        // Under a launcher, one rank prints them for the job.
        if e.exit_code() == 0 {
            if crate::comm::launcher::speaks_for_the_job() {
                let _ = e.print();
            }
            return Exit::Success;
        }
        // A usage error: every rank of the job has it, and one says it, in one write.
        if crate::comm::launcher::speaks_for_the_job() {
            let hint = hint::input_hint(&e, &std::env::args_os().collect::<Vec<_>>());
            let text = e.render().to_string();
            let hint = hint.map(|h| format!("\n{h}")).unwrap_or_default();
            crate::errln!("{}{hint}", text.trim_end());
        }
        Exit::Usage
    })
}

/// Writes the completion script for `shell` to stdout.
///
/// # Errors
/// stdout cannot be written (a closed pipe is not an error: `reshard completions bash | head`).
pub fn write_completions(shell: clap_complete::Shell) -> Result<()> {
    let mut cmd = <Cli as clap::CommandFactory>::command();
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut cmd, "reshard", &mut script);
    write_stdout(&script).context("cannot write the completion script")
}

/// Writes the man page of reshard (`page` None) or of one subcommand ([`args::MAN_PAGES`]) to
/// stdout, made from the same definitions as `--help`, so it cannot fall behind the flags.
///
/// # Errors
/// stdout cannot be written (a closed pipe is not an error: `reshard man run | head`).
pub fn write_man(page: Option<&str>) -> Result<()> {
    let mut cmd = <Cli as clap::CommandFactory>::command();
    // Built, subcommands know their full names (reshard-run) for the page's title.
    cmd.build();
    let cmd = match page {
        None => cmd,
        Some(name) => cmd
            .find_subcommand(name)
            .cloned()
            .with_context(|| format!("no man page for {name:?}"))?,
    };
    let mut roff = Vec::new();
    clap_mangen::Man::new(cmd)
        .render(&mut roff)
        .context("cannot render the man page")?;
    write_stdout(&roff).context("cannot write the man page")
}

/// Writes `bytes` to stdout, from a buffer so that `| head` does not panic on EPIPE.
fn write_stdout(bytes: &[u8]) -> std::io::Result<()> {
    match std::io::stdout().lock().write_all(bytes) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e),
        _ => Ok(()),
    }
}
