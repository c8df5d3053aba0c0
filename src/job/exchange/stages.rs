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
pub const CHUNK_HEADER: usize = ChunkHeader::WIDTH;

/// The exchange's work on this rank: the samples it reads, where each goes, the shards it writes.
pub struct Work<'a> {
    pub inputs: &'a [InputShard],
    /// This rank's samples, in input order, and the global index of the first.
    pub local: &'a [LocalSample],
    pub first_global: u64,
    /// This rank's input shards the index phase did not read (their saved index was used):
    /// the compressed ones are read to their end here, so that their checksums are checked.
    pub unread: &'a [usize],
    /// Samples an earlier attempt already placed durably (`--resume`): not read, not sent.
    pub done: &'a Done,
    /// Where each sample goes (nowhere when dropped, twice when repeated).
    pub placement: &'a Placement,
    pub plan: &'a ShardPlan,
    /// This rank's own shards.
    pub layout: &'a ShardLayout,
    pub output: &'a OutputShards,
}

/// One round's packed send buffer, as the reader hands it over.
pub struct Packed {
    pub buf: Vec<u8>,
    /// Bytes used in each destination's segment.
    pub used: Vec<usize>,
    /// Sample bytes packed.
    pub payload: u64,
    /// Local samples before this one are all packed or copied (or were done before).
    pub through: usize,
    pub error: Option<anyhow::Error>,
    /// When the reader started and finished packing it (for `RESHARD_TRACE_ROUNDS`).
    pub packing: Range<Instant>,
}

/// What the writer places: the chunks received from other ranks, and this rank's own segment of
/// its send buffer (which never goes through MPI).
pub struct Delivery {
    pub recv: Vec<u8>,
    pub from: Vec<Range<usize>>,
    pub send: Vec<u8>,
    pub own: Range<usize>,
    /// The round, and whether the writer syncs its shards once it placed it (a checkpoint).
    pub round: u64,
    pub sync: bool,
    /// The round's timeline so far, when tracing: the writer adds its part and prints it.
    pub timeline: Option<Timeline>,
}

/// What the three stages share: the job, the writer's first failure, the bytes placed, and the
/// stall watchdog every stage reports progress to.
pub struct Stages<'a, 'j> {
    pub job: &'a Work<'j>,
    pub me: usize,
    pub write_failure: Mutex<Option<anyhow::Error>>,
    pub written: AtomicU64,
    /// The last round after which the writer synced its shards.
    pub synced: AtomicU64,
    /// Nanoseconds the reader spent reading and packing, and the writer writing (for the
    /// summary's slowest reader and writer).
    pub read_nanos: AtomicU64,
    pub write_nanos: AtomicU64,
    pub dog: Watchdog,
    /// `RESHARD_TRACE_ROUNDS`: the zero of this rank's round timeline.
    pub zero: Option<Zero>,
}
