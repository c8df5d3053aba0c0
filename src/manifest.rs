//! Moved to [`crate::output::manifest`]; shim removed when all callers are updated.

pub use crate::output::manifest::{KeyMapInfo, Manifest, RunInfo, ShardEntry};
