//! The calling thread's part of the exchange, the only one that calls MPI: one status
//! reduction and one all-to-all per round.

use std::ops::Range;
use std::sync::mpsc::{Receiver, SyncSender};
use std::time::Instant;

use anyhow::{anyhow, Result};

use super::checkpoint::Pacer;
use super::stages::{Delivery, ExchangeStats, Packed, Stages};
use super::timeline::Timeline;
use crate::comm::wire::RoundStatus;
use crate::comm::{Comm, PeerFailed};
use crate::hooks;

/// The calling thread's ends of the channels to the reader and the writer.
pub(super) struct Ends {
    /// Rounds the reader packed.
    pub packed: Receiver<Packed>,
    /// Rounds exchanged, to the writer.
    pub deliver: SyncSender<Delivery>,
    /// Receive buffers the writer is done with.
    pub free_recv: Receiver<Vec<u8>>,
}

/// The exchange's progress: sample bytes all ranks moved so far (from what an earlier attempt
/// placed, with `--resume`), and who hears of it after every round.
pub(super) struct Moved<'p> {
    pub so_far: u64,
    pub report: &'p mut dyn FnMut(u64),
}

/// The calling thread's part: one status reduction and one all-to-all per round.
pub(super) fn exchange_rounds(
    comm: &impl Comm,
    st: &Stages<'_, '_>,
    cap: usize,
    ends: Ends,
    pacer: &mut Pacer<'_>,
    mut moved: Moved<'_>,
) -> (Result<()>, ExchangeStats) {
    let write_failure = &st.write_failure;
    let (ranks, me) = (comm.size(), comm.rank());
    let mut stats = ExchangeStats::default();
    loop {
        // None once the reader has packed everything.
        let mut round = ends.packed.recv().ok();
        let posted = Instant::now();
        let mut failure = round.as_mut().and_then(|r| r.error.take());
        if failure.is_none() {
            // A copy: the writer keeps its failure and stops writing.
            failure = write_failure
                .lock()
                .unwrap()
                .as_ref()
                .map(|e| anyhow!("{e:#}"));
        }
        let payload = round.as_ref().map_or(0, |r| r.payload);
        let through = round.as_ref().map_or(st.job.local.len(), |r| r.through);
        // One small collective per round: did anyone fail, is anything left to move, and how
        // far is the checkpoint?
        let n = stats.rounds + 1;
        hooks::kill_in_round(me, n);
        hooks::slow_round();
        st.dog.beat(n, || {
            format!("waiting for every rank's status before exchange round {n}")
        });
        let status = RoundStatus {
            failed: u64::from(failure.is_some()),
            payload,
            ..pacer.status(comm, st)
        }
        .all_sum(comm);
        if status.failed > 0 {
            let e = failure.unwrap_or_else(|| anyhow!(PeerFailed { ranks: Vec::new() }));
            return (Err(e), stats);
        }
        if status.payload == 0 {
            return (Ok(()), stats);
        }
        let sync = match pacer.after_status(comm, st.job, &status, n, through) {
            Ok(sync) => sync,
            Err(e) => return (Err(e), stats),
        };
        stats.rounds += 1;
        stats.bytes_sent += payload;
        let (send, used, packing) = round
            .map_or((Vec::new(), vec![0; ranks], posted..posted), |r| {
                (r.buf, r.used, r.packing)
            });
        // Empty segments as 0..0: a rank whose reader has finished sends from an empty buffer.
        let segment = |d: usize| {
            if used[d] == 0 {
                0..0
            } else {
                d * cap..d * cap + used[d]
            }
        };
        let ranges: Vec<Range<usize>> = (0..ranks)
            .map(|d| if d == me { 0..0 } else { segment(d) })
            .collect();
        let mut recv = ends
            .free_recv
            .recv()
            .expect("the writer returns receive buffers");
        st.dog
            .beat(n, || format!("in the all-to-all of exchange round {n}"));
        let from = comm.all_to_all(&send, &ranges, &mut recv);
        let timeline = st.zero.map(|zero| Timeline {
            zero,
            pack: packing.clone(),
            exchange: posted..Instant::now(),
            out: ranges.iter().map(Range::len).sum(),
            into: recv.len(),
        });
        st.dog
            .beat(n, || format!("handing exchange round {n} to the writer"));
        let delivery = Delivery {
            recv,
            from,
            own: segment(me),
            send,
            round: n,
            sync,
            timeline,
        };
        ends.deliver
            .send(delivery)
            .expect("the writer runs until the deliveries end");
        moved.so_far += status.payload;
        (moved.report)(moved.so_far);
    }
}
