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

pub mod checkpoint;
pub mod compress;
pub mod dali;
pub mod energon;
pub mod gpu;
pub mod loaders;
pub mod manifest;
pub mod members;
pub mod saved_index;
pub mod seal;
pub mod shards;
pub mod stats;

pub use compress::{compress_shard, md5_file};
pub use gpu::GpuShare;
pub use manifest::{KeyMapInfo, Manifest, RunInfo, ShardEntry};
pub use shards::{shard_file_name, OutputShards, ShardNames, SplitPart};
pub use stats::Stats;
