//! Moved to [`crate::tar::headers`]; shim removed when all callers are updated.

pub use crate::sys::read_up_to;
pub use crate::tar::headers::{
    describe_start, EntryKind, Forward, Member, Seekable, Source, Walk, BLOCK,
};
