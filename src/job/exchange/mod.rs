//! Phase "exchange": the bounded data exchange. Ranks stream their samples sequentially
//! ([`reader`]), pack them per writer ([`pack`]), move them in all-to-all rounds whose buffers
//! respect the memory budget ([`rounds`]), and writers place them ([`writer`]).
//!
//! A sample larger than a round's share moves as several chunks: every chunk carries the sample's
//! output position and its offset inside the sample, so writers never reassemble anything.

mod checkpoint;
mod pack;
mod reader;
mod rounds;
mod stages;
mod timeline;
mod writer;

use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::mpsc::{channel, sync_channel};
use std::sync::Mutex;
use std::time::Duration;

use anyhow::{bail, Result};

use crate::comm::{agree, Comm};
use crate::hooks;
use crate::job::handoff::{Checkpoints, ExchangeStats};
use crate::watchdog::Watchdog;
use checkpoint::Checkpointing;
use pack::pack_rounds;
use rounds::{exchange_rounds, Ends, Moved};
pub(crate) use stages::Work;
use stages::{Delivery, Packed, Stages, CHUNK_HEADER};
use writer::write_rounds;

/// How a memory budget is split among the exchange's buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Buffers {
    /// Bytes each destination may receive from this rank per round. A rank receives at most
    /// `per_destination * ranks` bytes per round, like it sends.
    pub(crate) per_destination: usize,
    /// Size of the sequential read window over the input.
    pub(crate) read_window: usize,
}

impl Buffers {
    /// Splits `budget` bytes: a read window of at most 8 MiB, then equal shares for the send and
    /// receive buffers in flight (each holds `per_destination` bytes for every rank).
    pub(crate) fn for_budget(budget: u64, ranks: usize) -> Self {
        let budget = usize::try_from(budget).unwrap_or(usize::MAX);
        let read_window = (budget / 16).clamp(MIN_READ_WINDOW, 8 << 20);
        let buffer = budget.saturating_sub(read_window) / (SEND_BUFFERS + RECV_BUFFERS);
        let per_destination = (buffer / ranks).max(MIN_PER_DESTINATION);
        Buffers {
            per_destination,
            read_window,
        }
    }
}

/// The smallest read window.
const MIN_READ_WINDOW: usize = 64 << 10;
/// The smallest segment: one chunk header and a block of data.
const MIN_PER_DESTINATION: usize = CHUNK_HEADER + 512;

/// Rounds a rank's data is split into at least (budget permitting): the reader, the exchange and
/// the writer overlap except while the first round is read and the last one written, so with
/// few rounds those two ends dominate. On the 2 GiB bench set at np=2 (warm), 6 rounds of
/// 106 MB took 2.5-2.75 s to exchange, 22 rounds 2.2-2.4 s: buffers are also reused instead of
/// touched once (page faults, zeroing).
const MIN_ROUNDS: u64 = 16;

/// Rounds never shrink below this many bytes per destination for want of data.
const MIN_SEGMENT: u64 = 1 << 20;

impl Buffers {
    /// [`Buffers::for_budget`], with segments no larger than at least [`MIN_ROUNDS`] rounds
    /// need when each rank moves about `bytes_per_rank`.
    pub(crate) fn for_job(budget: u64, ranks: usize, bytes_per_rank: u64) -> Self {
        let mut b = Self::for_budget(budget, ranks);
        let share = bytes_per_rank
            .div_ceil(MIN_ROUNDS * ranks as u64)
            .max(MIN_SEGMENT);
        b.per_destination = b
            .per_destination
            .min(usize::try_from(share).unwrap_or(usize::MAX));
        if ranks == 1 {
            b.per_destination = b.per_destination.min(ALONE_SEGMENT);
        }
        b
    }
}

/// A rank alone sends nothing over MPI: its rounds' send buffers only hand its own samples
/// from the reader to the writer (those it does not copy inside the kernel: loose files,
/// compressed inputs), so they need not be larger than this, and small ones are still in the
/// CPU's caches when the writer copies them out. At np=1, 200,000 loose files of 8 KiB on
/// tmpfs (user + system CPU, medians of 3, load 9-12): rounds of 16 MiB 3.9 s and 145 MB of
/// RSS, 1.07 MiB 3.8 s and 85 MB, 140 KiB 4.2 s (the rounds' own costs); rounds of 103 MiB
/// (the budget's share) took 0.2-0.3 s more system CPU than 8-17 MiB and 516 MB of RSS, every
/// buffer's pages faulted in.
const ALONE_SEGMENT: usize = 1 << 20;

/// The part of the stall timeout one round may take at a rank's share of a rate limit.
/// A round reads and writes up to about twice its send buffer on a rank (its segments, then
/// as much again in copies of its own samples), and a few rounds queue behind the writer: an
/// eighth of the timeout per buffer leaves the waiting peers half of it to spare.
const ROUNDS_PER_STALL: f64 = 16.0;

impl Buffers {
    /// Rounds small enough that a rank moving at `share` bytes per second (its share of the
    /// lower rate limit) finishes each well within `stall` (the timeout): a paced rank's peers
    /// wait for it at every round's end, and a round that took longer than the timeout would
    /// make them end a healthy job as stalled. Without a limit or a timeout, unchanged.
    pub(crate) fn within_stall(
        mut self,
        stall: Duration,
        share: Option<f64>,
        ranks: usize,
    ) -> Self {
        let Some(share) = share.filter(|_| !stall.is_zero()) else {
            return self;
        };
        let round = (share * stall.as_secs_f64() / ROUNDS_PER_STALL) as usize;
        self.read_window = self.read_window.min(round).max(MIN_READ_WINDOW);
        self.per_destination = self
            .per_destination
            .min(round / ranks.max(1))
            .max(MIN_PER_DESTINATION);
        self
    }
}

/// How the exchange watches for a rank that stalls.
pub(crate) struct Stall {
    /// How long a round may make no progress before the job is ended (zero: never).
    pub(crate) timeout: Duration,
    /// Where every rank leaves its heartbeat, so that the message names the silent ranks.
    pub(crate) heartbeats: Option<PathBuf>,
    /// This rank's heartbeat, told the round it is in.
    pub(crate) pulse: Option<std::sync::Arc<crate::heartbeat::Pulse>>,
}

/// Buffers in flight: the reader fills one send buffer while two more are in flight
/// ([`rounds::ROUNDS_IN_FLIGHT`]) and the writer places this rank's own share of a fourth; two
/// receive buffers are in flight while the writer places the third. Reading, exchanging and
/// writing overlap, and so do consecutive rounds on the network.
const SEND_BUFFERS: usize = 2 + rounds::ROUNDS_IN_FLIGHT;

const RECV_BUFFERS: usize = 1 + rounds::ROUNDS_IN_FLIGHT;

/// Runs the exchange to completion on every rank. `progress` is called after each round with the
/// sample bytes moved so far by all ranks together (and those an earlier attempt had placed).
///
/// Three stages overlap: a reader thread packs rounds, the calling thread (the only one that
/// calls MPI) exchanges them, two at a time, and a writer thread places what arrives. Now and then the writers
/// sync and rank 0 records which samples are durable ([`Checkpoints`]).
///
/// # Errors
/// A read or write fails on this rank (the message names file and offset), a checkpoint cannot
/// be recorded, or another rank failed ([`PeerFailed`]); either way every rank leaves at the
/// same round.
pub(crate) fn run(
    comm: &impl Comm,
    job: &Work<'_>,
    buffers: Buffers,
    stall: Stall,
    checkpoints: Checkpoints<'_>,
    progress: &mut dyn FnMut(u64),
) -> Result<ExchangeStats> {
    let reused = checkpoint::reused(comm, job);
    let ranks = comm.size();
    let cap = buffers.per_destination;
    let (packed_tx, packed_rx) = sync_channel::<Packed>(1);
    let (free_send_tx, free_send_rx) = channel::<Vec<u8>>();
    let (deliver_tx, deliver_rx) = sync_channel::<Delivery>(1);
    let (free_recv_tx, free_recv_rx) = channel::<Vec<u8>>();
    for _ in 0..SEND_BUFFERS {
        free_send_tx
            .send(vec![0u8; cap * ranks])
            .expect("receiver alive");
    }
    for _ in 0..RECV_BUFFERS {
        free_recv_tx.send(Vec::new()).expect("receiver alive");
    }
    let stages = Stages {
        job,
        me: comm.rank(),
        write_failure: Mutex::new(None),
        written: AtomicU64::new(0),
        synced: AtomicU64::new(0),
        read_nanos: AtomicU64::new(0),
        write_nanos: AtomicU64::new(0),
        dog: Watchdog::start(
            stall.timeout,
            (comm.rank(), comm.size()),
            (stall.heartbeats, stall.pulse),
            comm.aborter(),
        ),
        zero: timeline::Zero::start(comm.rank()),
    };
    hooks::inject_fault(stages.me);
    let mut checkpointing = Checkpointing::new(checkpoints);
    let (outcome, mut stats) = std::thread::scope(|scope| {
        let st = &stages;
        scope.spawn(move || {
            pack_rounds(st, cap, ranks, buffers.read_window, free_send_rx, packed_tx)
        });
        scope.spawn(move || write_rounds(st, deliver_rx, free_send_tx, free_recv_tx));
        let ends = Ends {
            packed: packed_rx,
            deliver: deliver_tx,
            free_recv: free_recv_rx,
        };
        let moved = Moved {
            so_far: reused.total,
            report: progress,
        };
        exchange_rounds(comm, st, cap, ends, &mut checkpointing, moved)
    });
    drop(stages.dog);
    outcome?;
    // The writer may have failed on the last round, after the last status exchange.
    let write_failure = stages
        .write_failure
        .into_inner()
        .unwrap_or_else(|p| p.into_inner());
    agree(comm, write_failure.map_or(Ok(()), Err))?;
    checkpointing.stop_after_the_last_round(comm, job)?;
    stats.checkpoints = checkpointing.taken;
    stats.bytes_written = stages.written.into_inner();
    stats.bytes_reused = reused.bytes;
    stats.samples_reused = reused.samples;
    stats.shards_reused = reused.shards;
    stats.read_nanos = stages.read_nanos.into_inner();
    stats.write_nanos = stages.write_nanos.into_inner();
    let expected = job.layout.sample_bytes();
    if stats.bytes_written + stats.bytes_reused != expected {
        bail!(
            "internal error: rank {} wrote {} sample bytes (and found {} in place) but its shards hold {expected}",
            comm.rank(),
            stats.bytes_written,
            stats.bytes_reused
        );
    }
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_respect_the_budget() {
        for (budget, ranks) in [
            (1u64 << 30, 4usize),
            (64 << 20, 2),
            (1 << 20, 3),
            (1 << 30, 1000),
        ] {
            let b = Buffers::for_budget(budget, ranks);
            let total = b.read_window + (SEND_BUFFERS + RECV_BUFFERS) * b.per_destination * ranks;
            assert!(total as u64 <= budget, "{budget} {ranks}: {b:?}");
        }
    }

    #[test]
    fn rounds_are_many_enough_to_overlap_and_within_the_budget() {
        let gib = 1u64 << 30;
        // Plenty of budget: the data sets the round size (MIN_ROUNDS of them).
        let b = Buffers::for_job(gib, 2, gib);
        assert_eq!(b.per_destination as u64, gib / (MIN_ROUNDS * 2));
        assert_eq!(b.read_window, Buffers::for_budget(gib, 2).read_window);
        // Little budget: the budget sets it, as before.
        let small = Buffers::for_budget(64 << 20, 4);
        assert_eq!(Buffers::for_job(64 << 20, 4, 1 << 40), small);
        // Alone: rounds of at most ALONE_SEGMENT, whatever the budget and the data.
        assert_eq!(
            Buffers::for_job(gib, 1, 16 * gib).per_destination,
            ALONE_SEGMENT
        );
        assert_eq!(
            Buffers::for_job(gib, 1, 16 << 20).per_destination as u64,
            MIN_SEGMENT
        );
        // Little data: rounds do not shrink below MIN_SEGMENT.
        assert_eq!(
            Buffers::for_job(gib, 4, 1 << 20).per_destination as u64,
            MIN_SEGMENT
        );
    }

    #[test]
    fn a_round_at_the_rate_limit_takes_a_sixteenth_of_the_stall_timeout() {
        let gib = 1u64 << 30;
        let b = Buffers::for_job(gib, 2, gib);
        let stall = Duration::from_secs(120);
        // No limit, or no timeout: as the budget and the data say.
        assert_eq!(b.within_stall(stall, None, 2), b);
        assert_eq!(b.within_stall(Duration::ZERO, Some(1.0), 2), b);
        // 1 MiB/s a rank for 120 s: 7.5 MiB a round, split among the destinations.
        let slow = b.within_stall(stall, Some(f64::from(1 << 20)), 2);
        assert_eq!(slow.per_destination, (120 << 20) / 16 / 2);
        assert_eq!(slow.read_window, b.read_window.min((120 << 20) / 16));
        // A fast limit leaves the rounds alone.
        assert_eq!(b.within_stall(stall, Some(1e12), 2), b);
        // Never below one chunk and block a segment, nor 64 KiB a window.
        let crawl = b.within_stall(Duration::from_secs(1), Some(1.0), 4);
        assert_eq!(crawl.per_destination, MIN_PER_DESTINATION);
        assert_eq!(crawl.read_window, MIN_READ_WINDOW);
    }
}
