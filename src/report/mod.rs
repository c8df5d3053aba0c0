//! What a plan says and what a run reports: the plan report ([`PlanReport`]), rank 0's progress
//! lines ([`narrate`]), and the shard statistics ([`Stats`]) and GPU shares ([`GpuShare`]) they
//! print.
//!
//! `report/` stands a floor above `output/`: `plan` lists the manifest's shard entries, and
//! `Stats` and `GpuShare`, which the manifest records too, are defined in `output/`. So the two
//! folders never import each other.

mod axis;
pub(crate) mod mixing;
pub(crate) mod narrate;
pub(crate) mod picture;
pub(crate) mod plan;
pub(crate) mod ranks;
pub(crate) mod storage;

// Re-exported so that the phases find everything a report prints in one place.
pub(crate) use crate::output::{GpuShare, Stats};
pub(crate) use narrate::narrate;
pub(crate) use plan::PlanReport;
pub(crate) use storage::Storage;
