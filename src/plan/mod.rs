//! Pure planning, unit-tested without MPI: which rank reads which input shards ([`assign`]),
//! how many shards ([`sizing`]), which output shard each position falls in and which rank writes
//! it ([`shards`]), where each sample lands inside its shard ([`layout`]), the seeded permutation
//! ([`permute`]), the orders beyond it ([`order`], [`sort_key`], [`deal`]), the groups of output
//! shards and their sizes ([`groups`]), what the distributed sort sorts ([`sort_items`]), the
//! positions it leads to ([`positions`]), the runs of equal labels in the sorted order
//! ([`runs`]) and each rank's answer to where its samples go
//! ([`placement`]); `--split` ([`split`]).

pub(crate) mod assign;
pub(crate) mod deal;
pub(crate) mod groups;
pub(crate) mod layout;
pub(crate) mod order;
pub mod permute;
pub mod placement;
pub(crate) mod positions;
pub(crate) mod runs;
pub(crate) mod shards;
pub(crate) mod sizing;
pub(crate) mod sort_items;
pub(crate) mod sort_key;
pub(crate) mod split;

pub(crate) use assign::assign_inputs;
pub use layout::{ShardLayout, TAR_TRAILER};
pub use shards::{bounds_from_starts, byte_shard_of, ShardGroup, ShardPlan};
pub use sizing::{Equalize, Sizing, Targets};
