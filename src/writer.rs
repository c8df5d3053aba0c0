//! Moved to [`crate::output`]; shim removed when all callers are updated.

pub use crate::output::{compress_shard, md5_file, shard_file_name, OutputShards, ShardNames};
