//! Checkpoints during the exchange, for `--resume`, without a round trip of their own.
//!
//! Rank 0 asks for one through the per-round status reduction when `every` has passed since the
//! last. The round in which every rank sees the request becomes the checkpoint's round `n`: each
//! writer syncs its shards once it has placed round `n` (in its own thread, while the exchange
//! goes on), and says so in a later status. Once every rank has, the samples each rank had packed
//! by round `n` are durable wherever they went (own samples were copied before their round was
//! handed over); rank 0 gathers those ranges and records them. One checkpoint is in flight at a
//! time.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::Instant;

use anyhow::Result;

use super::stages::{Stages, Work};
use crate::comm::wire::{gather_concat, route, RoundStatus};
use crate::comm::{agree, Comm};
use crate::job::handoff::Checkpoints;
use crate::job::interrupt::Interrupted;

// Checkpoints come by time only. From 2026-11-24 to 11-28 one also came after every 256 MiB a
// rank moved, so that a run killed (SIGKILL) in its first 30 s kept something. It was measured
// to cost a fifth of the run where it matters most: a checkpoint `fdatasync`s shards whose pages
// were written all over them, so the file system allocates their blocks piecemeal mid-run
// instead of once, in order, at the end. Cold disk, 3.39 GiB of 4 KiB samples (`cp -r` 3.9-5.1 s):
// np 1 9.9-11.7 s with it, 8.2-10.0 s without; np 2 8.9-9.6 s against 6.9-7.4 s; one checkpoint
// at 1 GiB a rank still cost 1-1.5 s. Redoing about `--checkpoint-every` seconds after a SIGKILL
// is the price, and what the flag says; SIGINT and SIGTERM still checkpoint at once.

/// The exchange's checkpoint state on one rank.
pub(super) struct Checkpointing<'a> {
    checkpoints: Checkpoints<'a>,
    last: Instant,
    /// The round being synced, and this rank's samples up to it.
    pending: Option<(u64, (u64, u64))>,
    pub(crate) taken: u64,
    /// A rank received this stop signal: checkpoint, then end.
    stopping: Option<i32>,
}

impl<'a> Checkpointing<'a> {
    pub(super) fn new(checkpoints: Checkpoints<'a>) -> Self {
        Checkpointing {
            checkpoints,
            last: Instant::now(),
            pending: None,
            taken: 0,
            stopping: None,
        }
    }

    /// This rank's part of the round status: rank 0 asks for a checkpoint; every rank says how
    /// far its writer synced, and whether it received a stop signal.
    pub(super) fn status(&self, comm: &impl Comm, st: &Stages<'_, '_>) -> RoundStatus {
        let due = self.last.elapsed() >= self.checkpoints.every;
        let ask = comm.rank() == 0 && self.pending.is_none() && due;
        let stop = crate::sys::stop_signal().is_some();
        RoundStatus {
            checkpoint: u64::from(ask),
            synced: st.synced.load(Ordering::Acquire),
            stopping: u64::from(stop),
            ..RoundStatus::default()
        }
    }

    /// Acts on the combined status of round `n`, in which this rank packed its samples up to
    /// local index `through`. Returns whether the writer must sync after placing round `n`.
    ///
    /// A stop signal on any rank starts a checkpoint at once (unless one is under way); once it
    /// is recorded, every rank ends with [`Interrupted`].
    ///
    /// # Errors
    /// Rank 0 could not record a checkpoint (every rank gets an error), or the job was stopped.
    pub(super) fn after_status(
        &mut self,
        comm: &impl Comm,
        job: &Work<'_>,
        status: &RoundStatus,
        n: u64,
        through: usize,
    ) -> Result<bool> {
        if status.stopping > 0 && self.stopping.is_none() {
            // Every rank sees the count in the same round: one more collective names the signal.
            let signal = comm.all_max(&[crate::sys::stop_signal().map_or(0, |s| s as u64)])[0];
            self.stopping = Some(i32::try_from(signal).unwrap_or(15));
        }
        if self.pending.is_some_and(|(m, _)| status.synced >= m) {
            let (_, range) = self.pending.take().expect("pending");
            self.record(comm, range)?;
            self.last = Instant::now();
            if let Some(signal) = self.stopping {
                return Err(anyhow::Error::new(Interrupted {
                    signal,
                    samples: None,
                }));
            }
        }
        if self.pending.is_none() && (status.checkpoint > 0 || self.stopping.is_some()) {
            let upto = job.first_global + through as u64;
            self.pending = Some((n, (job.first_global, upto)));
            return Ok(true);
        }
        Ok(false)
    }
}

impl Checkpointing<'_> {
    /// Records a checkpoint of every rank's durable `range` (gathered on rank 0, which writes
    /// the record), agreed by every rank.
    fn record(&mut self, comm: &impl Comm, range: (u64, u64)) -> Result<()> {
        let ranges = gather_concat::<(u64, u64)>(comm, 0, &vec![range]);
        let recorded = match (comm.rank() == 0, ranges) {
            (true, Ok(r)) => (self.checkpoints.record)(r),
            (true, Err(e)) => Err(e),
            (false, _) => Ok(()),
        };
        agree(comm, recorded)?;
        self.taken += 1;
        Ok(())
    }

    /// After the last round, every sample placed (the writer has ended): a stop signal that came
    /// as the last rounds were settled, while the writers still placed them (a write limit keeps
    /// them rounds behind), found no later round to carry its checkpoint. It is taken here, over
    /// every sample of the job, so that the job ends in order and a `--resume` moves none of
    /// them again. A collective: every rank calls it.
    ///
    /// # Errors
    /// [`Interrupted`] once the checkpoint is recorded; a sync or the record failed.
    pub(super) fn stop_after_the_last_round(
        &mut self,
        comm: &impl Comm,
        job: &Work<'_>,
    ) -> Result<()> {
        let mine = crate::sys::stop_signal().map_or(0, |s| u64::from(s.unsigned_abs()));
        let signal = comm.all_max(&[mine])[0];
        if signal == 0 {
            return Ok(());
        }
        agree(comm, job.output.sync_data())?;
        let range = (job.first_global, job.first_global + job.local.len() as u64);
        self.record(comm, range)?;
        Err(anyhow::Error::new(Interrupted {
            signal: i32::try_from(signal).unwrap_or(15),
            samples: None,
        }))
    }
}

/// What an earlier attempt left in place (`--resume`), as this rank sees it.
#[derive(Debug, Default)]
pub(super) struct Reused {
    /// This rank's input samples it had moved.
    pub(crate) samples: u64,
    /// Sample bytes in this rank's shards, and in all shards.
    pub(crate) bytes: u64,
    pub(crate) total: u64,
    /// This rank's shards it had completed.
    pub(crate) shards: u64,
}

/// What an earlier attempt placed: each rank sums, per shard, the bytes of its done samples and
/// sends the sums to the shards' writers (records for at most every shard: O(S) per rank). Nothing
/// (and no collective) on a first attempt: the done set is the same on every rank.
pub(super) fn reused(comm: &impl Comm, job: &Work<'_>) -> Reused {
    if job.done.is_empty() {
        return Reused::default();
    }
    let done = |i: usize| job.done.done_until(job.first_global + i as u64).is_some();
    let mut per_shard: BTreeMap<u64, u64> = BTreeMap::new();
    job.placement.for_each(job.local.len(), &mut |i, p| {
        if done(i) {
            *per_shard.entry(job.plan.shard_of(p)).or_default() += job.local[i].len;
        }
    });
    let got = route::<(u64, u64)>(comm, &|sink| {
        for (&s, &bytes) in &per_shard {
            sink(job.plan.writer_of(s), &(s, bytes));
        }
    });
    let mut mine: BTreeMap<u64, u64> = BTreeMap::new();
    for (s, bytes) in got.iter() {
        *mine.entry(s).or_default() += bytes;
    }
    let shard_bytes = |s: u64| -> u64 {
        job.plan
            .shard_positions(s)
            .map(|p| job.layout.place(p).map_or(0, |(_, len)| len))
            .sum()
    };
    let bytes = mine.values().sum();
    Reused {
        samples: (0..job.local.len()).filter(|&i| done(i)).count() as u64,
        bytes,
        total: comm.all_sum(&[bytes])[0],
        shards: mine.iter().filter(|(&s, &b)| b == shard_bytes(s)).count() as u64,
    }
}
