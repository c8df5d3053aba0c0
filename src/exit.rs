//! Every exit code `reshard` ends with, in one enum, so that the codes a script or a scheduler
//! may see are listed (and kept distinct) in one place.

use std::process::ExitCode;

/// How `reshard` exits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// The job completed.
    Success = 0,
    /// The job failed: bad input, I/O error, or another rank failed. Nothing was published.
    Failure = 1,
    /// The command line was invalid (clap also uses 2), or the launcher's: srun started more
    /// tasks than the MPI world holds (no matching `--mpi` plugin), or another MPI's launcher
    /// started the binary. Nothing was written.
    Usage = 2,
    /// The output was published (it is live and complete), but a step after the publishing
    /// rename failed: removing the output it replaced, `--link` or `--keep`.
    CleanupFailed = 3,
    /// A rank panicked and aborted the whole job (`EX_SOFTWARE`: a bug in reshard).
    Panic = 70,
    /// The stall watchdog ended the job: a rank or its node stopped answering (`EX_TEMPFAIL`:
    /// trying again may work).
    Stall = 75,
    /// SIGINT stopped the job (128 + 2, as a shell reports a process the signal ended): it
    /// checkpointed and kept its staging directory for `--resume`, or had nothing to keep.
    Interrupted = 130,
    /// SIGTERM stopped the job (128 + 15: `scancel`, Slurm's time limit, `kill`), as
    /// [`Exit::Interrupted`].
    Terminated = 143,
}

impl Exit {
    /// The status for a job that a stop signal ended.
    pub fn for_signal(signal: i32) -> Exit {
        if signal == 2 {
            Exit::Interrupted
        } else {
            Exit::Terminated
        }
    }

    /// The status as the operating system and MPI take it (`_exit`, `MPI_Abort`).
    pub(crate) fn code(self) -> i32 {
        self as i32
    }

    /// The status of the whole job from the worst (highest) status of its ranks, as
    /// [`crate::comm::mpi::MpiRuntime::finish`] agrees on it: a rank that returns normally ends
    /// with success, a usage error, a failure, or a failure after publishing (which wins over a
    /// peer's failure: the ranks that did not publish learn only that rank 0 failed).
    pub(crate) fn from_worst(worst: u64) -> Exit {
        match worst {
            0 => Exit::Success,
            2 => Exit::Usage,
            3 => Exit::CleanupFailed,
            130 => Exit::Interrupted,
            143 => Exit::Terminated,
            _ => Exit::Failure,
        }
    }
}

impl From<Exit> for ExitCode {
    fn from(e: Exit) -> Self {
        ExitCode::from(e as u8)
    }
}

/// A failure after the publishing rename: the new output is live and complete, but removing
/// the replaced output or the checkpoint records, `--link` or `--keep` failed. It has its own
/// exit status ([`Exit::CleanupFailed`]), never "nothing published".
#[derive(Debug)]
pub struct CleanupFailed {
    pub(crate) output: std::path::PathBuf,
}

impl std::fmt::Display for CleanupFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "published {} (the new output is live and complete); clean-up failed",
            self.output.display()
        )
    }
}
