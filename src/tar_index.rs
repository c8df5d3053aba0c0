//! Moved to [`crate::tar`]; shim removed when all callers are updated.

pub use crate::sys::read_up_to;
pub use crate::tar::{
    index_file, index_file_with, index_reader, index_reader_with, key_at, key_hash, keys_at,
    sample_key, Codec, HeaderReader, Hygiene, OnDuplicate, OnIncomplete, Rules, Sample, ShardIndex,
    Skipped,
};
