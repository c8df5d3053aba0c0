//! What a plan says and what a run reports: shard statistics ([`Stats`]), GPU shares
//! ([`GpuShare`]), the plan report ([`PlanReport`]), and rank 0's progress lines ([`narrate`]).
//!
//! `stats`, `gpu` and `narrate` are leaves: the manifest imports `Stats` and `GpuShare` from them
//! directly, and only `plan` imports the manifest, so the two never import each other.

mod axis;
pub mod gpu;
pub mod mixing;
pub mod narrate;
pub mod picture;
pub mod plan;
pub mod ranks;
pub mod stats;
pub mod storage;

pub use gpu::GpuShare;
pub use narrate::narrate;
pub use plan::PlanReport;
pub use stats::Stats;
pub use storage::Storage;
