//! Exit codes, kept in one place.

use std::process::ExitCode;

/// How `reshard` exits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// The job completed.
    Success = 0,
    /// The job failed: bad input, I/O error, or another rank failed. Nothing was published.
    Failure = 1,
    /// The command line was invalid (clap also uses 2).
    Usage = 2,
}

impl From<Exit> for ExitCode {
    fn from(e: Exit) -> Self {
        ExitCode::from(e as u8)
    }
}
