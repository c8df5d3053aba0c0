//! What a run writes: the output shards and their names, their compression and digests, the
//! manifest (`index.json`), and the saved indexes that let a later run skip reading headers.
//!
//! - [`shards`]: [`OutputShards`] (one writer rank's files) and [`ShardNames`].
//! - [`compress`]: [`compress_shard`] and [`md5_file`].
//! - [`manifest`]: [`Manifest`], the wids `index.json`.
//! - [`saved_index`]: `.reshard/NAME.reshard-layout` files (each shard's layout, for the next epoch).
//! - [`seal`]: the checksum trailer of every record reshard writes and later reads back.
//! - [`checkpoint`]: what the staging directory records for `--resume`.
//! - [`loaders`]: the loader indexes of a shard, from its [`members`]: [`energon`] (`--energon`)
//!   and [`dali`] (`--dali-index`).

pub(crate) mod checkpoint;
pub(crate) mod compress;
pub(crate) mod dali;
pub mod energon;
pub(crate) mod gpu;
pub(crate) mod loaders;
pub(crate) mod manifest;
pub mod members;
pub mod saved_index;
// The tests read and write sealed records: public.
pub mod seal;
pub(crate) mod shards;
pub(crate) mod stats;

pub(crate) use compress::{compress_shard, md5_file};
pub(crate) use gpu::GpuShare;
pub(crate) use shards::{shard_file_name, OutputShards, ShardNames};
pub(crate) use stats::Stats;
