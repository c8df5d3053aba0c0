//! What the exchange's three stages share: the job, the buffers they hand each other, the
//! writer's first failure, the bytes placed, and the stall watchdog.

use std::ops::Range;
use std::sync::atomic::AtomicU64;
use std::sync::Mutex;
use std::time::Instant;

use super::timeline::{Timeline, Zero};

use crate::comm::wire::{ChunkHeader, Wire};
use crate::input::InputShard;
use crate::output::checkpoint::Done;
use crate::output::OutputShards;
use crate::plan::placement::{LocalSample, Placement};
use crate::plan::{ShardLayout, ShardPlan};
use crate::watchdog::Watchdog;

/// Bytes of the [`ChunkHeader`] in front of every chunk.
pub(crate) const CHUNK_HEADER: usize = ChunkHeader::WIDTH;

/// The exchange's work on this rank: the samples it reads, where each goes, the shards it writes.
pub(crate) struct Work<'a> {
    pub(crate) inputs: &'a [InputShard],
    /// This rank's samples, in input order, and the global index of the first.
    pub(crate) local: &'a [LocalSample],
    pub(crate) first_global: u64,
    /// This rank's input shards the index phase did not read (their saved index was used):
    /// the compressed ones are read to their end here, so that their checksums are checked.
    pub(crate) unread: &'a [usize],
    /// Samples an earlier attempt already placed durably (`--resume`): not read, not sent.
    pub(crate) done: &'a Done,
    /// Where each sample goes (nowhere when dropped, twice when repeated).
    pub(crate) placement: &'a Placement,
    pub(crate) plan: &'a ShardPlan,
    /// This rank's own shards.
    pub(crate) layout: &'a ShardLayout,
    pub(crate) output: &'a OutputShards,
}

/// One round's packed send buffer, as the reader hands it over.
pub(crate) struct Packed {
    pub(crate) buf: Vec<u8>,
    /// Bytes used in each destination's segment.
    pub(crate) used: Vec<usize>,
    /// Sample bytes packed.
    pub(crate) payload: u64,
    /// Local samples before this one are all packed or copied (or were done before).
    pub(crate) through: usize,
    pub(crate) error: Option<anyhow::Error>,
    /// When the reader started and finished packing it (for `RESHARD_TRACE_ROUNDS`).
    pub(crate) packing: Range<Instant>,
}

/// What the writer places: the chunks received from other ranks, and this rank's own segment of
/// its send buffer (which never goes through MPI).
pub(crate) struct Delivery {
    pub(crate) recv: Vec<u8>,
    pub(crate) from: Vec<Range<usize>>,
    pub(crate) send: Vec<u8>,
    pub(crate) own: Range<usize>,
    /// The round, and whether the writer syncs its shards once it placed it (a checkpoint).
    pub(crate) round: u64,
    pub(crate) sync: bool,
    /// The round's timeline so far, when tracing: the writer adds its part and prints it.
    pub(crate) timeline: Option<Timeline>,
}

/// What the three stages share: the job, the writer's first failure, the bytes placed, and the
/// stall watchdog every stage reports progress to.
pub(crate) struct Stages<'a, 'j> {
    pub(crate) job: &'a Work<'j>,
    pub(crate) me: usize,
    pub(crate) write_failure: Mutex<Option<anyhow::Error>>,
    pub(crate) written: AtomicU64,
    /// The last round after which the writer synced its shards.
    pub(crate) synced: AtomicU64,
    /// Nanoseconds the reader spent reading and packing, and the writer writing (for the
    /// summary's slowest reader and writer).
    pub(crate) read_nanos: AtomicU64,
    pub(crate) write_nanos: AtomicU64,
    pub(crate) dog: Watchdog,
    /// `RESHARD_TRACE_ROUNDS`: the zero of this rank's round timeline.
    pub(crate) zero: Option<Zero>,
}
