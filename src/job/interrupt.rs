//! Stop signals: SIGINT (Ctrl-C, also through `mpirun`, which passes it on to every rank) and
//! SIGTERM (`scancel`, Slurm's time limit with `--signal=TERM@SECS`, `kill`).
//!
//! A signal only marks the rank ([`crate::sys::catch_stop_signals`]). The ranks learn of it
//! together, in the status of the next exchange round or at the next phase boundary
//! ([`check`]); the exchange first takes a checkpoint, so that everything placed so far is
//! durable, then every rank ends with [`Interrupted`]. Rank 0 says where the staging directory
//! is, how much of it is durable and that `--resume` continues it; the job exits with 128 + the
//! signal's number. A rank that cannot get there within [`GRACE`] (stuck in a long read, a
//! peer gone) says so and exits anyway: a stop signal must end the job, and a second one ends
//! it at once.

use std::fmt;
use std::time::Duration;

use anyhow::Result;

use crate::comm::Comm;
use crate::sys;

/// How long after a stop signal a rank may take to checkpoint and end in order (Slurm's
/// default `KillWait` leaves 30 s before SIGKILL).
pub(crate) const GRACE: Duration = Duration::from_secs(10);

/// The job was stopped by a signal; every rank ends with it.
#[derive(Debug)]
pub struct Interrupted {
    pub signal: i32,
    /// The input samples of the job, once planned (for the message).
    pub(crate) samples: Option<u64>,
}

impl fmt::Display for Interrupted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "interrupted by {}", sys::signal_name(self.signal))
    }
}

impl std::error::Error for Interrupted {}

/// Makes SIGINT and SIGTERM stop the job in order from now on, and starts the deadline that
/// ends this rank [`GRACE`] after the first of them whatever it is doing.
pub fn catch() {
    static CAUGHT: std::sync::Once = std::sync::Once::new();
    CAUGHT.call_once(install);
}

fn install() {
    if let Err(e) = sys::catch_stop_signals() {
        crate::errln!("reshard: warning: cannot catch SIGINT/SIGTERM ({e}): a stop signal ends the job without a checkpoint");
        return;
    }
    let deadline = std::thread::Builder::new()
        .name("stop-deadline".into())
        .spawn(|| {
            let signal = loop {
                match sys::stop_signal() {
                    Some(s) => break s,
                    None => std::thread::sleep(Duration::from_millis(100)),
                }
            };
            std::thread::sleep(GRACE);
            crate::errln!(
                "reshard: {} came {} s ago and this rank has not ended in order (stuck in a read, or a rank gone?): exiting now",
                sys::signal_name(signal),
                GRACE.as_secs()
            );
            sys::exit_now(128 + signal)
        });
    if deadline.is_err() {
        crate::errln!("reshard: warning: cannot start the stop-signal deadline");
    }
}

/// A phase boundary: whether any rank received a stop signal, agreed on every rank (a
/// collective: call it on every rank at the same point).
///
/// # Errors
/// [`Interrupted`] on every rank when one of them received a stop signal.
pub(crate) fn check(comm: &impl Comm) -> Result<()> {
    let mine = sys::stop_signal().map_or(0, |s| u64::from(s.unsigned_abs()));
    match comm.all_max(&[mine])[0] {
        0 => Ok(()),
        s => Err(anyhow::Error::new(Interrupted {
            signal: i32::try_from(s).unwrap_or(15),
            samples: None,
        })),
    }
}

/// `e`, with the job's sample count when it is an [`Interrupted`].
pub(crate) fn with_samples(e: anyhow::Error, samples: u64) -> anyhow::Error {
    match e.downcast::<Interrupted>() {
        Ok(i) => anyhow::Error::new(Interrupted {
            samples: Some(samples),
            ..i
        }),
        Err(e) => e,
    }
}

/// What rank 0 says when a stop signal ended the job: where the staging directory is and how
/// much of it a `--resume` will not move again (`durable` samples), or that nothing was kept.
pub(crate) fn message(i: &Interrupted, staging: &std::path::Path, durable: u64) -> String {
    let what = sys::signal_name(i.signal);
    if durable == 0 {
        return format!(
            "reshard: {what}: stopped before any sample was durably in place; nothing was published and the staging directory {} was removed: rerun to start over",
            staging.display()
        );
    }
    let of = i.samples.map_or(String::new(), |n| {
        format!(" of {n} ({:.0}%)", 100.0 * durable as f64 / n.max(1) as f64)
    });
    format!(
        "reshard: {what}: stopped after a checkpoint; nothing was published. The staging directory {} holds {durable} samples{of} durably: rerun the same command with --resume to continue from there (without --resume it is removed and the run starts over)",
        staging.display()
    )
}
