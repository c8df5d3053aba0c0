//! WebDataset tar shards: reading their headers, grouping members into samples, and reading
//! their streams. Pure code over files and readers: no MPI, no knowledge of the job.
//!
//! - [`codec`]: how a shard is stored, and [`codec::open`], the one way to open its tar stream.
//! - [`key`]: sample keys and extensions from member paths.
//! - [`headers`]: the header walk, with the extent the archive stores for every member.
//! - [`reader`]: [`HeaderReader`], the reader under a plain shard's walk.
//! - [`group`]: members into samples, the hygiene rules, and the one duplicate policy.
//! - [`check`]: a sample's range checked against the tar structure before it is copied.
//! - [`index`]: a shard's [`ShardIndex`], and keys read back at sample offsets.
//! - [`stream`]: [`TarStream`], a shard's stream read front to back.

pub(crate) mod check;
pub(crate) mod codec;
pub(crate) mod group;
pub mod headers;
pub(crate) mod index;
pub(crate) mod key;
pub(crate) mod reader;
pub(crate) mod stream;

pub(crate) use codec::Codec;
pub use group::{
    Grouper, Hygiene, OnDuplicate, OnIncomplete, Rules, Sample, ShardIndex, Skipped, Warnings,
};
pub use index::{index_file, index_reader};
pub(crate) use index::{index_file_with, key_at, keys_at};
pub(crate) use key::key_hash;
pub use reader::HeaderReader;
pub(crate) use stream::TarStream;

/// Helpers shared by the unit tests of the tar modules.
#[cfg(test)]
pub(crate) mod testing {
    /// A GNU tar of regular files `(name, data)`, with the end-of-archive blocks.
    pub(crate) fn tar_of(members: &[(&str, &[u8])]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (name, data) in members {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            h.set_entry_type(tar::EntryType::Regular);
            b.append_data(&mut h, name, *data).unwrap();
        }
        b.into_inner().unwrap()
    }
}
