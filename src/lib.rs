//! reshard: reorganize WebDataset tar shards over MPI.
//!
//! The job (see `job`) is a list of phases over a [`comm::Comm`] transport; only
//! `comm::mpi` touches MPI, so the whole job also runs in-process in unit tests.

/// `eprintln!` that writes the line with one `write(2)` ([`sys::stderr_line`]): every line
/// reshard prints to stderr goes through it, so that lines from several ranks never interleave.
#[macro_export]
macro_rules! errln {
    ($($arg:tt)*) => {
        $crate::sys::stderr_line(&format!($($arg)*))
    };
}

pub mod cli;
pub mod comm;
pub mod config;
pub mod exit;
pub mod generate;
pub(crate) mod heartbeat;
pub(crate) mod hex;
pub mod hooks;
pub(crate) mod input;
pub mod job;
pub(crate) mod key_map;
pub mod output;
pub mod plan;
pub mod progress;
pub(crate) mod report;
pub(crate) mod size;
pub(crate) mod storage;
pub mod sys;
pub mod tar;
pub(crate) mod throttle;
pub(crate) mod tree;
pub mod verify;
pub(crate) mod watchdog;
