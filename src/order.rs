//! Moved to `plan::{order, sort_key, deal, placement}` and `job::place`; this shim goes once every
//! caller imports from there.

pub use crate::job::place::{positions as place, LocalSamples, OrderJob, Ordered};
pub use crate::plan::deal::Deal;
pub use crate::plan::order::{validate, Missing, OrderBy, OrderSpec, ValueKind};
pub use crate::plan::placement::{GroupPlan, Placement, StratifyReport};
pub use crate::plan::sort_key::{of_key as sample_key, value_key};
