//! What a plan says and what a run reports: the plan report ([`PlanReport`]), rank 0's progress
//! lines ([`narrate`]), and the shard statistics ([`Stats`]) and GPU shares ([`GpuShare`]) they
//! print.
//!
//! `report/` stands a floor above `output/`: `plan` lists the manifest's shard entries, and
//! `Stats` and `GpuShare`, which the manifest records too, are defined in `output/`. So the two
//! folders never import each other.

mod axis;
pub mod mixing;
pub mod narrate;
pub mod picture;
pub mod plan;
pub mod ranks;
pub mod storage;

// Re-exported so that the phases find everything a report prints in one place.
pub use crate::output::{GpuShare, Stats};
pub use narrate::narrate;
pub use plan::PlanReport;
pub use storage::Storage;
