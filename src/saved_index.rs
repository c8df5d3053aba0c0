//! Moved to [`crate::output::saved_index`]; shim removed when all callers are updated.

pub use crate::output::saved_index::{load, path_for, save, Lookup, DIR_NAME};
