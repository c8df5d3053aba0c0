//! Moved to crate::exit; shim removed when all callers are updated.

pub use crate::exit::Exit;
