//! What the phases of one job share, next to their own settings ([`crate::config::PlanSettings`]):
//! the ranks and the input shards.

use crate::comm::Comm;
use crate::input::InputShard;

/// The ranks of one job and its input shards, in canonical order (every rank holds the same).
pub struct Shared<'a, C> {
    pub comm: &'a C,
    pub inputs: &'a [InputShard],
}

impl<C: Comm> Shared<'_, C> {
    /// Whether this rank speaks for the job (rank 0).
    pub fn lead(&self) -> bool {
        self.comm.rank() == 0
    }
}
