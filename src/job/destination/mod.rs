//! The output location's life: its lock ([`lock`]), the staging directory where it is assembled
//! ([`staging`]), what is at an output ([`owned`]) and what reshard wrote of it ([`written`]) and the older outputs `--keep` may remove
//! ([`series`]), `--link` ([`link`]), the space check ([`space`]), the records a `--resume`
//! continues from ([`resume`]), and the publish and upload phases ([`publish`], [`upload`],
//! staged per node where `--scratch` is each node's own: [`scratch`]). The steps from the lock
//! check to `--keep`, their rules and what a failed run leaves are one mechanism ([`life`]) over
//! two ways to commit, chosen by what the sink can do: a rename ([`by_rename`]) or a manifest
//! created last (the upload's `by_manifest`).
//! The phases call in here; nothing in here runs a phase of its own but publish and upload,
//! which take the other phases' hand-offs ([`crate::job::handoff`]).

pub(crate) mod by_rename;
pub(crate) mod life;
pub(crate) mod link;
pub(crate) mod lock;
pub(crate) mod makers;
pub(crate) mod owned;
pub(crate) mod publish;
pub(crate) mod resume;
pub(crate) mod scratch;
pub(crate) mod series;
pub(crate) mod space;
pub(crate) mod staging;
pub(crate) mod upload;
pub(crate) mod written;

use crate::output::checkpoint::InputRecord;

/// What rank 0 keeps for itself: the output's lock, and every input's size and modification
/// time as the run started (for the plan record).
#[derive(Default)]
pub(crate) struct Held {
    /// The lock of an output on a file system, beside it.
    pub(crate) lock: Option<lock::OutputLock>,
    /// An `s3://` output's lock, in its store (taken by the upload's strategy of the steps
    /// before the commit, see [`upload`]), and what its upload carries over from a failed run.
    pub(crate) remote: Option<upload::RemoteLock>,
    pub(crate) inputs: Vec<InputRecord>,
}

impl Held {
    /// The run's one lock, wherever the output is: its token names everything the run writes
    /// (its staging directory, on `--scratch` too, its heartbeats, its records in the bucket),
    /// so that a successor that takes the lock over from it knows what is its.
    pub(crate) fn lock(&self) -> Option<&lock::OutputLock> {
        self.lock
            .as_ref()
            .or_else(|| self.remote.as_ref().map(upload::RemoteLock::lock))
    }
}
