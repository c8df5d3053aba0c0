//! Moved to `job`; this shim goes once every caller imports from there.

pub use crate::job::{run, Outcome};
