//! `RESHARD_TRACE_ROUNDS`: every round's timeline on every rank, printed on stderr once the
//! writer has placed it. Times are milliseconds since this rank's exchange started, and each rank
//! first prints that start as a Unix time, so that ranks can be lined up (`examples/timeline.py`
//! does): one line says when the round was packed, in flight and written.

use std::ops::Range;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// The zero of this rank's timeline, when tracing.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Zero(Instant);

impl Zero {
    /// The zero, if `RESHARD_TRACE_ROUNDS` is set; says on stderr when it is.
    pub(crate) fn start(me: usize) -> Option<Self> {
        if !crate::hooks::trace_rounds() {
            return None;
        }
        let unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        crate::errln!("reshard: rank {me}: exchange timeline starts at unix time {unix:.6}");
        Some(Zero(Instant::now()))
    }

    fn ms(self, t: Instant) -> f64 {
        t.saturating_duration_since(self.0).as_secs_f64() * 1e3
    }
}

/// One round's timeline on one rank, up to its write.
#[derive(Debug, Clone)]
pub(crate) struct Timeline {
    pub(crate) zero: Zero,
    /// The reader filled the send buffer (empty when the reader had nothing more).
    pub(crate) pack: Range<Instant>,
    /// The round was handed to the transport, and everything for this rank arrived.
    pub(crate) exchange: Range<Instant>,
    /// Bytes sent to other ranks and received from them.
    pub(crate) out: usize,
    pub(crate) into: usize,
}

impl Timeline {
    /// Prints the round's line, with the writer's time placing it.
    pub(crate) fn print(&self, me: usize, round: u64, write: Range<Instant>) {
        let span = |r: &Range<Instant>| (self.zero.ms(r.start), self.zero.ms(r.end));
        let (p0, p1) = span(&self.pack);
        let (x0, x1) = span(&self.exchange);
        let (w0, w1) = span(&write);
        crate::errln!(
            "reshard: rank {me} round {round}: pack {p0:.1}-{p1:.1} ms, exchange {x0:.1}-{x1:.1} ms, write {w0:.1}-{w1:.1} ms ({} B out, {} B in)",
            self.out,
            self.into
        );
    }
}
