//! The calling thread's part of the exchange, the only one that calls MPI: one status
//! reduction and one all-to-all per round.

use std::ops::Range;
use std::sync::mpsc::{Receiver, SyncSender};

use anyhow::{anyhow, Result};

use super::checkpoint::Pacer;
use super::stages::{Delivery, ExchangeStats, Packed, Stages};
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
    let trace = hooks::trace_rounds();
    loop {
        let t0 = std::time::Instant::now();
        // None once the reader has packed everything.
        let mut round = ends.packed.recv().ok();
        let t_read = t0.elapsed();
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
        let t_status = t0.elapsed();
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
        let (send, used) = round.map_or((Vec::new(), vec![0; ranks]), |r| (r.buf, r.used));
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
        let t_buffer = t0.elapsed();
        let from = comm.all_to_all(&send, &ranges, &mut recv);
        if trace {
            let out = ranges.iter().map(Range::len).sum::<usize>();
            let times = [t_read, t_status, t_buffer, t0.elapsed()];
            trace_round(me, n, times, (out, recv.len()));
        }
        st.dog
            .beat(n, || format!("handing exchange round {n} to the writer"));
        let delivery = Delivery {
            recv,
            from,
            own: segment(me),
            send,
            round: n,
            sync,
        };
        ends.deliver
            .send(delivery)
            .expect("the writer runs until the deliveries end");
        moved.so_far += status.payload;
        (moved.report)(moved.so_far);
    }
}

/// `RESHARD_TRACE_ROUNDS`: one round's timings, from the times since its start at which the
/// reader delivered, the status returned, the writer freed a buffer and the all-to-all ended.
fn trace_round(me: usize, n: u64, t: [std::time::Duration; 4], (out, into): (usize, usize)) {
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    crate::errln!(
        "reshard: rank {me} round {n}: reader {:.0} ms, status {:.0} ms, writer {:.0} ms, all-to-all {:.0} ms ({out} B out, {into} B in)",
        ms(t[0]),
        ms(t[1] - t[0]),
        ms(t[2] - t[1]),
        ms(t[3] - t[2]),
    );
}
