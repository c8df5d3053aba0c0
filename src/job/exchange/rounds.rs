//! The calling thread's part of the exchange, the only one that calls MPI: it keeps two rounds in
//! flight, so that no round ends with every rank waiting for the slowest pair.
//!
//! Every round carries each rank's [`RoundStatus`] to every other rank with its data, so a rank
//! knows the round's outcome (did anyone fail, is anything left, how far is the checkpoint) once
//! the round arrived, with no collective of its own. A rank starts round `n + 1` as soon as its
//! reader packed it and round `n - 1` is settled, whatever round `n` is doing: a rank whose
//! transfers of round `n` are done already sends round `n + 1` while slower pairs finish `n`.
//!
//! The protocol stays the same on every rank: rounds are settled in order, from statuses every
//! rank receives alike, so every rank makes the same decisions at the same round. A round is
//! started only once the round two before it is settled; so when round `n` says "stop", no rank
//! has started round `n + 2`, and each one completes round `n + 1` (starting an empty one if its
//! reader had not packed it yet) before it leaves: nobody is left waiting for a message. (With
//! three in flight and only `n + 1` completed, runs hung at their end: see [`Flight::finish`].)

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::mpsc::{Receiver, SyncSender, TryRecvError, TrySendError};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};

use super::checkpoint::Checkpointing;
use super::stages::{Delivery, Packed, Stages};
use super::timeline::Timeline;
use crate::comm::wire::{RoundStatus, Wire};
use crate::comm::{Arrived, Comm, Outgoing, PeerFailed};
use crate::hooks;
use crate::job::handoff::ExchangeStats;

/// Rounds a rank has started and not yet settled, at most: two, so that one is always moving
/// while the other's last transfers finish.
pub(super) const ROUNDS_IN_FLIGHT: usize = 2;

/// The calling thread's ends of the channels to the reader and the writer.
pub(super) struct Ends {
    /// Rounds the reader packed.
    pub(crate) packed: Receiver<Packed>,
    /// Rounds exchanged, to the writer.
    pub(crate) deliver: SyncSender<Delivery>,
    /// Receive buffers the writer is done with.
    pub(crate) free_recv: Receiver<Vec<u8>>,
}

/// The exchange's progress: sample bytes all ranks moved so far (from what an earlier attempt
/// placed, with `--resume`), and who hears of it after every round.
pub(super) struct Moved<'p> {
    pub(crate) so_far: u64,
    pub(crate) report: &'p mut dyn FnMut(u64),
}

/// The calling thread's part: starts rounds as the reader packs them, settles them in order as
/// they arrive, and hands them to the writer.
pub(super) fn exchange_rounds<C: Comm>(
    comm: &C,
    st: &Stages<'_, '_>,
    cap: usize,
    ends: Ends,
    checkpointing: &mut Checkpointing<'_>,
    mut moved: Moved<'_>,
) -> (Result<()>, ExchangeStats) {
    let mut flight = Flight {
        comm,
        st,
        cap,
        rounds: VecDeque::new(),
        started: 0,
        idle: 0,
        crowded: crowded(comm.node_ranks()),
    };
    let mut stats = ExchangeStats::default();
    let outcome = loop {
        if flight.oldest_arrived() {
            let round = flight.rounds.pop_front().expect("the oldest round");
            match settle(&mut flight, &ends, round, checkpointing, &mut stats) {
                Ok(Some(payload)) => {
                    moved.so_far += payload;
                    (moved.report)(moved.so_far);
                }
                Ok(None) => break Ok(()),
                Err(e) => break Err(e),
            }
        } else if flight.rounds.is_empty() {
            // Nothing in flight that needs this thread: sleep until the reader has a round.
            let packed = ends.packed.recv().ok();
            flight.start(&ends, packed, checkpointing);
        } else if flight.rounds.len() < ROUNDS_IN_FLIGHT {
            match try_packed(&ends) {
                Some(packed) => flight.start(&ends, packed, checkpointing),
                None => flight.idle(),
            }
        } else {
            flight.idle();
        }
    };
    let late = flight.finish();
    // A failure this rank met in a round that was never settled is its own cause to report.
    let outcome = match outcome {
        Err(e) if e.is::<PeerFailed>() => Err(late.unwrap_or(e)),
        other => other,
    };
    (outcome, stats)
}

/// The reader's next round: `Some(None)` once it packed everything, `None` while it packs.
fn try_packed(ends: &Ends) -> Option<Option<Packed>> {
    match ends.packed.try_recv() {
        Ok(p) => Some(Some(p)),
        Err(TryRecvError::Disconnected) => Some(None),
        Err(TryRecvError::Empty) => None,
    }
}

/// A round this rank started, and what it needs to settle it.
struct Started<R> {
    n: u64,
    moving: Moving<R>,
    /// This rank's own failure, reported in the round's status.
    failure: Option<anyhow::Error>,
    payload: u64,
    /// Local samples before this one were packed by this round.
    through: usize,
    /// This rank's own segment of the send buffer (never sent).
    own: Range<usize>,
    packing: Range<Instant>,
    started: Instant,
}

enum Moving<R> {
    InFlight(R),
    Arrived(Arrived, Instant),
    /// Only while a round is being tested.
    Gone,
}

/// The rounds this rank started and has not settled, oldest first.
struct Flight<'c, 's, 'a, 'j, C: Comm> {
    comm: &'c C,
    st: &'s Stages<'a, 'j>,
    cap: usize,
    rounds: VecDeque<Started<C::Round>>,
    started: u64,
    /// Polls in a row that found nothing to do ([`Flight::idle`]).
    idle: u32,
    /// Whether this node's ranks have fewer cores than busy threads ([`crowded`]).
    crowded: bool,
}

/// Whether `node_ranks` ranks, each with a reader, a writer and this thread busy, have fewer
/// cores than threads on this node: only then does a waiting exchange thread nap
/// ([`Flight::idle`]); with a core to spare, polling on it costs no other thread anything and
/// keeps every transfer moving at once.
fn crowded(node_ranks: usize) -> bool {
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    cores < 3 * node_ranks.max(1)
}

/// Idle polls in a row that only yield the core before [`Flight::idle`] naps.
const SPINS: u32 = 64;
/// How long an idle poll naps after [`SPINS`] (the kernel's timer slack adds up to 50 µs):
/// short enough that a transfer MPI moves only while polled (TCP, shared memory) keeps its
/// socket buffers and copies going at any link speed of today.
const NAP: Duration = Duration::from_micros(20);

impl<C: Comm> Flight<'_, '_, '_, '_, C> {
    /// Tests the oldest round still in flight, which also moves every other one along (MPI
    /// advances all its requests whenever one is tested). Returns whether one arrived.
    fn progress(&mut self) -> bool {
        let Some(round) = self
            .rounds
            .iter_mut()
            .find(|r| matches!(r.moving, Moving::InFlight(_)))
        else {
            return false;
        };
        let Moving::InFlight(r) = std::mem::replace(&mut round.moving, Moving::Gone) else {
            unreachable!("found in flight")
        };
        match self.comm.test_round(r) {
            Ok(arrived) => {
                self.idle = 0;
                round.moving = Moving::Arrived(arrived, Instant::now());
                self.st
                    .dog
                    .beat(round.n, || format!("settling exchange round {}", round.n));
                true
            }
            Err(r) => {
                round.moving = Moving::InFlight(r);
                false
            }
        }
    }

    fn oldest_arrived(&mut self) -> bool {
        self.progress();
        self.rounds
            .front()
            .is_some_and(|r| matches!(r.moving, Moving::Arrived(..)))
    }

    /// Nothing to do this instant: gives the core to the reader and writer (and to other ranks
    /// on this node) instead of spinning, yet comes back soon to keep MPI moving: a yield, and
    /// on a crowded node ([`crowded`]) after [`SPINS`] polls in a row a nap of [`NAP`] each.
    /// On 2 cores with two ranks, each with a reader, a writer and this thread, the yields
    /// alone were 14-19% of the CPU (4 KiB samples on tmpfs), taken from the other rank's
    /// writer.
    fn idle(&mut self) {
        self.idle = self.idle.saturating_add(1);
        if !self.crowded || self.idle <= SPINS {
            std::thread::yield_now();
        } else {
            std::thread::sleep(NAP);
        }
    }

    /// Waits for `ready` while the rounds in flight keep moving. `None` once none is in
    /// flight (every round this rank started has arrived: always so for a rank alone, whose
    /// rounds arrive as they start): there is nothing to move, so the caller waits asleep
    /// instead of polling. At np=1 the polls while the writer placed a round were some 28,000
    /// yields and naps in a run of 200,000 loose files, each taking a core from the reader or
    /// the writer.
    fn wait_while_moving<T>(&mut self, mut ready: impl FnMut() -> Option<T>) -> Option<T> {
        loop {
            if let Some(v) = ready() {
                return Some(v);
            }
            if !self.progress() {
                if !self.in_flight() {
                    return None;
                }
                self.idle();
            }
        }
    }

    /// Whether a round this rank started has not arrived yet.
    fn in_flight(&self) -> bool {
        self.rounds
            .iter()
            .any(|r| matches!(r.moving, Moving::InFlight(_)))
    }

    /// Starts the next round with what the reader packed (`None`: nothing, it is done).
    fn start(&mut self, ends: &Ends, packed: Option<Packed>, checkpointing: &Checkpointing<'_>) {
        let (st, me) = (self.st, self.st.me);
        let ranks = self.comm.size();
        self.started += 1;
        self.idle = 0;
        let n = self.started;
        hooks::kill_in_round(me, n);
        hooks::slow_round(me);
        let mut round = packed.unwrap_or_else(|| Packed {
            buf: Vec::new(),
            used: vec![0; ranks],
            payload: 0,
            through: st.job.local.len(),
            error: None,
            packing: Instant::now()..Instant::now(),
        });
        let failure = round.error.take().or_else(|| {
            // A copy: the writer keeps its failure and stops writing.
            let failed = st.write_failure.lock().unwrap();
            failed.as_ref().map(|e| anyhow!("{e:#}"))
        });
        let status = RoundStatus {
            failed: u64::from(failure.is_some()),
            payload: if failure.is_some() { 0 } else { round.payload },
            ..checkpointing.status(self.comm, st)
        };
        let cap = self.cap;
        // Empty segments as 0..0: a rank whose reader has finished sends from an empty buffer.
        let segments: Vec<Range<usize>> = (0..ranks)
            .map(|d| match round.used[d] {
                _ if failure.is_some() => 0..0,
                0 => 0..0,
                used => d * cap..d * cap + used,
            })
            .collect();
        let returned = "the writer returns receive buffers";
        let recv = self
            .wait_while_moving(|| match ends.free_recv.try_recv() {
                Ok(buf) => Some(buf),
                Err(TryRecvError::Empty) => None,
                Err(TryRecvError::Disconnected) => panic!("{returned}"),
            })
            .unwrap_or_else(|| ends.free_recv.recv().expect(returned));
        let mut header = vec![0u8; RoundStatus::WIDTH];
        status.encode(&mut header);
        let own = segments[me].clone();
        let out = Outgoing {
            header,
            send: round.buf,
            segments,
            recv,
        };
        let started = Instant::now();
        let moving = Moving::InFlight(self.comm.start_round(out, cap));
        st.dog.beat(n, || {
            format!("in exchange round {n}, waiting for every rank's data")
        });
        self.rounds.push_back(Started {
            n,
            moving,
            failure,
            payload: status.payload,
            through: round.through,
            own,
            packing: round.packing,
            started,
        });
    }

    /// Completes every round still in flight. When round `n` said stop, a rank may have started
    /// rounds up to `n + ROUNDS_IN_FLIGHT - 1` (no later: each needs the one `ROUNDS_IN_FLIGHT`
    /// before it settled), so every rank starts those it had not (empty) and waits for all: no
    /// rank is left waiting for a message. Returns the first failure this rank had put in one of
    /// them.
    fn finish(&mut self) -> Option<anyhow::Error> {
        let settled = self.started - self.rounds.len() as u64;
        while self.started < settled + ROUNDS_IN_FLIGHT as u64 - 1 {
            let ranks = self.comm.size();
            let mut header = vec![0u8; RoundStatus::WIDTH];
            RoundStatus::default().encode(&mut header);
            let out = Outgoing {
                header,
                segments: vec![0..0; ranks],
                ..Outgoing::default()
            };
            let now = Instant::now();
            self.started += 1;
            self.rounds.push_back(Started {
                n: self.started,
                moving: Moving::InFlight(self.comm.start_round(out, self.cap)),
                failure: None,
                payload: 0,
                through: 0,
                own: 0..0,
                packing: now..now,
                started: now,
            });
        }
        let n = self.started;
        self.st.dog.beat(n, || {
            format!("ending the exchange: waiting for round {n} from every rank")
        });
        while self.in_flight() {
            if !self.progress() {
                self.idle();
            }
        }
        self.rounds.drain(..).find_map(|r| r.failure)
    }
}

/// Settles the oldest round: combines every rank's status and acts on it. Returns the sample
/// bytes all ranks moved in it, or `None` when every rank is done.
fn settle<C: Comm>(
    flight: &mut Flight<'_, '_, '_, '_, C>,
    ends: &Ends,
    round: Started<C::Round>,
    checkpointing: &mut Checkpointing<'_>,
    stats: &mut ExchangeStats,
) -> Result<Option<u64>> {
    let (comm, st) = (flight.comm, flight.st);
    let Started { n, moving, .. } = round;
    let Moving::Arrived(arrived, at) = moving else {
        unreachable!("settled only once arrived")
    };
    let status = RoundStatus::combine(arrived.headers.iter().map(|h| RoundStatus::decode(h)));
    if status.failed > 0 {
        return Err(round
            .failure
            .unwrap_or_else(|| anyhow!(PeerFailed { ranks: Vec::new() })));
    }
    if status.payload == 0 {
        return Ok(None);
    }
    let sync = checkpointing.after_status(comm, st.job, &status, n, round.through)?;
    stats.rounds += 1;
    stats.bytes_sent += round.payload;
    let Arrived { out, from, .. } = arrived;
    let timeline = st.zero.map(|zero| Timeline {
        zero,
        pack: round.packing,
        exchange: round.started..at,
        out: out
            .segments
            .iter()
            .enumerate()
            .filter(|&(d, _)| d != st.me)
            .map(|(_, r)| r.len())
            .sum(),
        into: from.iter().map(Range::len).sum(),
    });
    let mut delivery = Some(Delivery {
        recv: out.recv,
        from,
        own: round.own,
        send: out.send,
        round: n,
        sync,
        timeline,
    });
    let writing = "the writer runs until the deliveries end";
    let handed = flight.wait_while_moving(|| match ends.deliver.try_send(delivery.take()?) {
        Ok(()) => Some(()),
        Err(TrySendError::Full(d)) => {
            delivery = Some(d);
            None
        }
        Err(TrySendError::Disconnected(_)) => panic!("{writing}"),
    });
    if let (None, Some(d)) = (handed, delivery) {
        ends.deliver.send(d).expect(writing);
    }
    st.dog
        .beat(n, || format!("exchange round {n} handed to the writer"));
    Ok(Some(status.payload))
}
