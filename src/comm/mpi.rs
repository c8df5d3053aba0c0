//! The MPI transport: the only module that touches MPI.

use std::mem::MaybeUninit;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Result};
use mpi::collective::SystemOperation;
use mpi::datatype::{Partition, PartitionMut};
use mpi::environment::Universe;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;
use mpi::Count;

use crate::hooks;
use crate::sys;

use super::{hydra, launcher, Arrived, Comm, Outgoing};
use crate::exit::Exit;

/// MPI for the length of the run: dropping it finalizes MPI.
pub struct MpiRuntime {
    // Declared first so that it drops before the universe finalizes MPI.
    pub comm: MpiComm,
    _universe: Universe,
}

impl MpiRuntime {
    /// Initializes MPI (funneled: helper threads may do I/O, only the main thread calls MPI),
    /// makes a panic on any thread abort the whole job, and checks that the launcher and the MPI
    /// library agree on the number of ranks.
    ///
    /// # Errors
    /// MPI cannot be initialized, or the launcher started more processes than the MPI world
    /// holds ([`launcher::LauncherMismatch`]: another MPI's launcher, or srun without a matching
    /// `--mpi` plugin).
    pub fn init(max_round_bytes: u64) -> Result<Self> {
        let Some((universe, _)) = mpi::initialize_with_threading(mpi::Threading::Funneled) else {
            bail!("MPI was already initialized");
        };
        abort_on_panic();
        let world = universe.world();
        let size = world.size() as usize;
        // Every rank sees the same mismatch, and each is in a world of its own: no collective
        // needed. Nothing has been written yet.
        launcher::check(size, |k| std::env::var(k).ok())?;
        let max_round =
            usize::try_from(max_round_bytes.clamp(1, i32::MAX as u64)).unwrap_or(usize::MAX);
        // Ranks that share this node (its memory): one collective, once.
        let node_ranks = world.split_shared(world.rank()).size() as usize;
        Ok(MpiRuntime {
            comm: MpiComm {
                world,
                max_round,
                node_ranks,
            },
            _universe: universe,
        })
    }
}

/// Ends a process that stops before any work (a usage error, `--help`) with `code`. Under a
/// launcher it first joins MPI and leaves it again, so that the launcher sees its processes start
/// and end as in any job: MPICH's hydra, whose processes all exited before it had finished
/// setting them up, was seen to die of SIGPIPE (`mpirun -np 4 reshard run --bogus` on a loaded
/// machine, about 1 in 60), losing the message and the exit status. No collective is made: a
/// peer may have gone on to a job of its own.
pub fn end_before_work(code: Exit) -> Exit {
    if launcher::launcher_rank(|k| std::env::var(k).ok()).is_none() {
        return code;
    }
    flush_stdio();
    match MpiRuntime::init(1) {
        Ok(mpi) => mpi.finalize(code),
        // A launcher that does not match the MPI library: the code stands.
        Err(_) => code,
    }
}

impl MpiRuntime {
    /// Ends the job on this rank: agrees with every rank on the exit status (the worst of all
    /// ranks' `code`s), then finalizes MPI. Call it on every rank once the job's output is
    /// published and its messages printed.
    ///
    /// MPI_Finalize can hang after all the work is done (MPICH 4.0 over UCX TCP: a rank waits
    /// for a disconnect acknowledgement from a peer that already sits in the closing barrier;
    /// MPICH 4.2 enters that barrier before the disconnects, pmodels/mpich#6596).
    /// So it runs under a deadline: if this rank has not exited `RESHARD_FINALIZE_TIMEOUT`
    /// seconds after the agreement, it says so on stderr and exits with the agreed status (see
    /// [`leave`]). Nothing is lost then: every rank had finished its part and agreed on the result.
    pub fn finish(self, code: Exit) -> Exit {
        flush_stdio();
        let code = Exit::from_worst(self.comm.all_max(&[code as u64])[0]);
        self.finalize(code)
    }

    /// Finalizes MPI under the deadline of [`MpiRuntime::finish`], without agreeing on `code`
    /// first: for a process that ends before any work, whose peers may not all be here.
    fn finalize(self, code: Exit) -> Exit {
        flush_stdio();
        let rank = self.comm.rank();
        let timeout = hooks::finalize_timeout(|k| std::env::var(k).ok());
        let finalized = Arc::new(AtomicBool::new(false));
        let done = Arc::clone(&finalized);
        let main_thread = sys::current_thread();
        std::thread::Builder::new()
            .name("finalize-deadline".into())
            .spawn(move || {
                std::thread::sleep(timeout);
                leave(
                    rank,
                    code,
                    timeout,
                    done.load(Ordering::SeqCst),
                    main_thread,
                )
            })
            .expect("cannot start the finalize deadline thread");
        if hooks::hang_finalize(rank, |k| std::env::var(k).ok()) {
            // Test hook: a finalize that never returns.
            loop {
                std::thread::park();
            }
        }
        // Dropping the universe calls MPI_Finalize.
        drop(self);
        finalized.store(true, Ordering::SeqCst);
        code
    }
}

/// The finalize deadline passed: says so, and ends this rank with `code`.
///
/// If MPI_Finalize has not returned, the main thread is stopped where it stands first, and the
/// rank waits a moment before it exits: every rank's deadline passes within a moment of this
/// one's, and a rank's exit must not let a peer's finalize move on alone (a peer waiting for this
/// rank would then enter the launcher's closing barrier, and hydra fails the job when that
/// barrier completes after a rank's node has gone). Then, under hydra, the rank tells the
/// launcher it finalized (see [`hydra::tell_finalized`]).
fn leave(
    rank: usize,
    code: Exit,
    timeout: Duration,
    finalized: bool,
    main_thread: sys::Thread,
) -> ! {
    let what = if finalized {
        "the process did not exit"
    } else {
        "MPI_Finalize did not return"
    };
    crate::errln!(
        "reshard: rank {rank}: {what} within {} s after the job ended; exiting with status {} \
         anyway (every rank had finished and agreed on the result)",
        timeout.as_secs_f64(),
        code.code()
    );
    if !finalized && sys::park_thread(main_thread) {
        std::thread::sleep((timeout / 4).clamp(Duration::from_millis(100), Duration::from_secs(2)));
        // Hydra otherwise takes this rank for a failed one (see the hydra module).
        hydra::tell_finalized();
    }
    // No destructors or atexit handlers, any of which may wait in MPI; stdout and stderr were
    // flushed before the agreement.
    sys::exit_now(code.code())
}

fn flush_stdio() {
    use std::io::Write;
    // Nothing useful to do if they fail: the status still says how the job went.
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
}

/// Installs a panic hook that prints the panic and then aborts every rank: a panicking rank
/// would otherwise leave the others blocked in a collective forever.
fn abort_on_panic() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default(info);
        crate::errln!("reshard: a rank panicked; aborting all ranks");
        // SAFETY: MPI is initialized (the hook is installed after init) and MPI_Abort on the world
        // communicator may be called from any thread.
        unsafe {
            mpi::ffi::MPI_Abort(mpi::ffi::RSMPI_COMM_WORLD, Exit::Panic.code());
        }
    }));
}

/// The world communicator, with the largest exchange a single MPI call may carry per rank.
pub struct MpiComm {
    world: SimpleCommunicator,
    max_round: usize,
    /// Ranks on this node, this one included.
    node_ranks: usize,
}

fn count(n: usize) -> Count {
    Count::try_from(n).expect("exchange sizes are split below i32::MAX")
}

impl MpiComm {
    fn reduce(&self, values: &[u64], op: SystemOperation) -> Vec<u64> {
        let mut out = vec![0u64; values.len()];
        self.world.all_reduce_into(values, &mut out[..], op);
        out
    }

    fn exchange_once(
        &self,
        send: &[u8],
        sends: &[Range<usize>],
        recv: &mut [u8],
        recvs: &[Range<usize>],
    ) {
        let sc: Vec<Count> = sends.iter().map(|r| count(r.len())).collect();
        let sd: Vec<Count> = sends.iter().map(|r| count(r.start)).collect();
        let rc: Vec<Count> = recvs.iter().map(|r| count(r.len())).collect();
        let rd: Vec<Count> = recvs.iter().map(|r| count(r.start)).collect();
        let s = Partition::new(send, sc, sd);
        let mut r = PartitionMut::new(recv, rc, rd);
        mpi::request::scope(|scope| {
            let request = self
                .world
                .immediate_all_to_all_varcount_into(scope, &s, &mut r);
            wait_politely(request);
        });
    }
}

/// Completes a request without hogging a core: MPI implementations busy-poll inside a blocking
/// call, which starves this rank's reader and writer threads (and other ranks) wherever ranks
/// share cores. Polls back to back for a moment (a short exchange ends with no added latency),
/// then yields the core between polls. Sleeping between polls was tried: it slowed exchanges
/// between ranks of one node, whose shared-memory copies only advance while this thread polls.
fn wait_politely<'a, R: ?Sized, S: mpi::request::Scope<'a>>(
    mut request: mpi::request::Request<'a, R, S>,
) {
    for polls in 0u32.. {
        match request.test() {
            Ok(_) => return,
            Err(r) => request = r,
        }
        if polls < 64 {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}

/// Completes a request where the wait may be long and no thread of this rank has work: polls
/// back to back for a moment (peers that are already there answer at once), then sleeps
/// between polls, from 20 µs up to 2 ms. MPICH busy-polls inside a blocking collective: while
/// rank 0 merged 10^7 rows into `index.sqlite` (60 s of CPU), each waiting rank spent as much
/// CPU doing nothing, on cores rank 0 may share.
fn wait_idly<'a, R: ?Sized, S: mpi::request::Scope<'a>>(
    mut request: mpi::request::Request<'a, R, S>,
) {
    let mut nap = Duration::from_micros(20);
    for polls in 0u32.. {
        match request.test() {
            Ok(_) => return,
            Err(r) => request = r,
        }
        if polls < 64 {
            std::hint::spin_loop();
        } else {
            std::thread::sleep(nap);
            nap = (nap * 2).min(Duration::from_millis(2));
        }
    }
}

impl Comm for MpiComm {
    fn rank(&self) -> usize {
        self.world.rank() as usize
    }

    fn size(&self) -> usize {
        self.world.size() as usize
    }

    fn node_ranks(&self) -> usize {
        self.node_ranks
    }

    fn all_gather(&self, value: u64) -> Vec<u64> {
        let mut out = vec![0u64; self.size()];
        self.world.all_gather_into(&value, &mut out[..]);
        out
    }

    fn all_gather_idle(&self, value: u64) -> Vec<u64> {
        let mut out = vec![0u64; self.size()];
        mpi::request::scope(|scope| {
            let request = self
                .world
                .immediate_all_gather_into(scope, &value, &mut out[..]);
            wait_idly(request);
        });
        out
    }

    fn all_sum(&self, values: &[u64]) -> Vec<u64> {
        self.reduce(values, SystemOperation::sum())
    }

    fn all_max(&self, values: &[u64]) -> Vec<u64> {
        self.reduce(values, SystemOperation::max())
    }

    fn all_sum_idle(&self, values: &[u64], poll: Duration) -> Vec<u64> {
        let mut out = vec![0u64; values.len()];
        mpi::request::scope(|scope| {
            let mut request = self.world.immediate_all_reduce_into(
                scope,
                values,
                &mut out[..],
                SystemOperation::sum(),
            );
            loop {
                match request.test() {
                    Ok(_) => break,
                    Err(r) => request = r,
                }
                std::thread::sleep(poll);
            }
        });
        out
    }

    fn broadcast(&self, root: usize, mut data: Vec<u8>) -> Vec<u8> {
        let root = self.world.process_at_rank(root as i32);
        let mut len = data.len() as u64;
        root.broadcast_into(&mut len);
        data.resize(len as usize, 0);
        for chunk in data.chunks_mut(self.max_round) {
            root.broadcast_into(chunk);
        }
        data
    }

    fn all_to_all(
        &self,
        send: &[u8],
        ranges: &[Range<usize>],
        recv: &mut Vec<u8>,
    ) -> Vec<Range<usize>> {
        let p = self.size();
        let send_counts: Vec<u64> = ranges.iter().map(|r| r.len() as u64).collect();
        let mut recv_counts = vec![0u64; p];
        self.world
            .all_to_all_into(&send_counts[..], &mut recv_counts[..]);
        let mut from = Vec::with_capacity(p);
        let mut at = 0usize;
        for &c in &recv_counts {
            from.push(at..at + c as usize);
            at += c as usize;
        }
        // Old contents are overwritten by MPI: only growth needs initializing.
        recv.resize(at.max(recv.len()), 0);
        recv.truncate(at);

        // One call when every rank's send and receive buffers fit in one message (the common
        // case: the pipeline bounds rounds by --mem-limit); otherwise rounds in which each pair
        // moves at most max_round / P bytes, so no count or displacement exceeds i32.
        let fits = send.len() <= self.max_round && at <= self.max_round;
        let all_fit = self.reduce(&[u64::from(!fits)], SystemOperation::max())[0] == 0;
        if all_fit {
            self.exchange_once(send, ranges, recv, &from);
            return from;
        }
        let per_pair = (self.max_round / p).max(1);
        let longest = ranges
            .iter()
            .chain(&from)
            .map(Range::len)
            .max()
            .unwrap_or(0);
        let rounds =
            self.reduce(&[longest.div_ceil(per_pair) as u64], SystemOperation::max())[0] as usize;
        let mut sbuf = Vec::with_capacity(per_pair * p);
        let mut rbuf = vec![0u8; per_pair * p];
        for round in 0..rounds {
            let piece = |r: &Range<usize>| {
                let lo = (r.start + round * per_pair).min(r.end);
                lo..(lo + per_pair).min(r.end)
            };
            sbuf.clear();
            let mut sends = Vec::with_capacity(p);
            for r in ranges {
                let start = sbuf.len();
                sbuf.extend_from_slice(&send[piece(r)]);
                sends.push(start..sbuf.len());
            }
            let mut recvs = Vec::with_capacity(p);
            let mut at = 0;
            for r in &from {
                let n = piece(r).len();
                recvs.push(at..at + n);
                at += n;
            }
            self.exchange_once(&sbuf, &sends, &mut rbuf[..at], &recvs);
            for (r, got) in from.iter().zip(&recvs) {
                recv[piece(r)].copy_from_slice(&rbuf[got.clone()]);
            }
        }
        from
    }

    fn aborter(&self) -> super::Aborter {
        std::sync::Arc::new(|code: Exit| {
            // MPI_Abort itself may wait on a peer that no longer answers: exit regardless after
            // a grace period, so the bound on a stalled job holds.
            std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_secs(10));
                // No destructors: they may block in MPI.
                sys::exit_now(code.code())
            });
            // SAFETY: MPI is initialized for the life of the run; MPI_Abort may be called from any
            // thread to end the job.
            unsafe {
                mpi::ffi::MPI_Abort(mpi::ffi::RSMPI_COMM_WORLD, code.code());
            }
        })
    }

    type Round = MpiRound;

    fn start_round(&self, out: Outgoing, slot: usize) -> MpiRound {
        MpiRound::start(self, out, slot)
    }

    fn test_round(&self, mut round: MpiRound) -> Result<Arrived, MpiRound> {
        round.test().ok_or(round)
    }
}

/// The tag of the pipelined exchange's messages (no other point-to-point traffic uses the world).
const ROUND_TAG: i32 = 27;

/// A round of [`MpiComm::start_round`] in flight. Its requests point into the buffers it owns
/// (a vector's heap memory stays where it is when the vector moves), and it never gives them
/// back, nor frees them, before every request completed: dropped in flight, it waits.
///
/// Messages of one pair match in the order they were posted (MPI's non-overtaking rule), and
/// every rank posts its rounds in the same order, so rounds need no tags of their own. Each
/// pair's data moves as `pieces` messages of at most `piece` bytes (the last ones may be short
/// or empty), so that no count exceeds what one MPI call carries.
pub struct MpiRound {
    /// Written by MPI when posted (hence uninitialized until then), completed by MPI_Testall.
    requests: Vec<MaybeUninit<mpi::ffi::MPI_Request>>,
    statuses: Vec<MaybeUninit<mpi::ffi::MPI_Status>>,
    out: Outgoing,
    /// Every rank's header, received in place.
    headers: Vec<u8>,
    slot: usize,
    piece: usize,
    /// Index in `requests` of each rank's first data receive (none for this rank).
    receives: Vec<Option<usize>>,
}

impl MpiRound {
    fn start(comm: &MpiComm, mut out: Outgoing, slot: usize) -> Self {
        let (size, me) = (comm.size(), comm.rank());
        let piece = slot.min(comm.max_round).max(1);
        let pieces = slot.div_ceil(piece).max(1);
        let hlen = out.header.len();
        if out.recv.len() < size * slot {
            // Untouched pages of a fresh allocation stay unmapped until data lands there.
            out.recv = vec![0u8; size * slot];
        }
        let mut round = MpiRound {
            requests: Vec::with_capacity(2 * (size - 1) * (1 + pieces)),
            statuses: Vec::new(),
            out,
            headers: vec![0u8; size * hlen],
            slot,
            piece,
            receives: vec![None; size],
        };
        let world = comm.world.as_raw();
        let peers = (0..size).filter(|&r| r != me);
        // Receives first, so that data finds its place rather than a bounce buffer.
        for r in peers.clone() {
            let at = r * hlen;
            let to = round.headers[at..at + hlen].as_mut_ptr();
            round.post_recv(world, r, to, hlen);
            round.receives[r] = Some(round.requests.len());
            for k in 0..pieces {
                let at = r * slot + k * piece;
                let n = piece.min(slot - k * piece);
                let to = round.out.recv[at..at + n].as_mut_ptr();
                round.post_recv(world, r, to, n);
            }
        }
        for r in peers {
            let header = round.out.header.as_ptr();
            round.post_send(world, r, header, hlen);
            let seg = round.out.segments[r].clone();
            assert!(seg.len() <= slot, "a segment larger than the round's slot");
            for k in 0..pieces {
                let lo = (seg.start + k * piece).min(seg.end);
                let hi = (lo + piece).min(seg.end);
                let data = round.out.send[lo..hi].as_ptr();
                round.post_send(world, r, data, hi - lo);
            }
        }
        round.statuses = vec![MaybeUninit::uninit(); round.requests.len()];
        round
    }

    fn post_recv(&mut self, world: mpi::ffi::MPI_Comm, from: usize, at: *mut u8, n: usize) {
        self.requests.push(MaybeUninit::uninit());
        let request = self.requests.last_mut().expect("pushed").as_mut_ptr();
        // SAFETY: `at..at + n` lies in a buffer this round owns and does not touch until the
        // request completed; MPI writes at most `n` bytes there.
        unsafe {
            mpi::ffi::MPI_Irecv(
                at.cast(),
                count(n),
                u8::equivalent_datatype().as_raw(),
                from as i32,
                ROUND_TAG,
                world,
                request,
            );
        }
    }

    fn post_send(&mut self, world: mpi::ffi::MPI_Comm, to: usize, at: *const u8, n: usize) {
        self.requests.push(MaybeUninit::uninit());
        let request = self.requests.last_mut().expect("pushed").as_mut_ptr();
        // SAFETY: `at..at + n` lies in a buffer this round owns and does not change until the
        // request completed.
        unsafe {
            mpi::ffi::MPI_Isend(
                at.cast(),
                count(n),
                u8::equivalent_datatype().as_raw(),
                to as i32,
                ROUND_TAG,
                world,
                request,
            );
        }
    }

    /// Everything that arrived, if every request completed (which also drives MPI's progress).
    fn test(&mut self) -> Option<Arrived> {
        let mut flag = 0;
        // SAFETY: as many statuses as requests; completed requests become MPI_REQUEST_NULL.
        unsafe {
            mpi::ffi::MPI_Testall(
                count(self.requests.len()),
                self.requests.as_mut_ptr().cast(),
                &mut flag,
                self.statuses.as_mut_ptr().cast(),
            );
        }
        if flag == 0 {
            return None;
        }
        let size = self.receives.len();
        let hlen = self.out.header.len();
        let mut from = vec![0..0; size];
        let mut headers = vec![self.out.header.clone(); size];
        for (r, first) in self.receives.iter().enumerate() {
            let Some(first) = *first else { continue };
            headers[r] = self.headers[r * hlen..(r + 1) * hlen].to_vec();
            let pieces = self.slot.div_ceil(self.piece).max(1);
            let got: usize = self.statuses[first..first + pieces]
                .iter()
                .map(|s| {
                    let mut n = 0;
                    // SAFETY: the status of a completed receive of bytes.
                    unsafe {
                        mpi::ffi::MPI_Get_count(
                            s.as_ptr(),
                            u8::equivalent_datatype().as_raw(),
                            &mut n,
                        );
                    }
                    usize::try_from(n).expect("a received count")
                })
                .sum();
            from[r] = r * self.slot..r * self.slot + got;
        }
        self.requests.clear();
        Some(Arrived {
            out: std::mem::take(&mut self.out),
            headers,
            from,
        })
    }
}

impl Drop for MpiRound {
    fn drop(&mut self) {
        if !self.requests.is_empty() {
            // SAFETY: the buffers the requests point into are still owned here.
            unsafe {
                mpi::ffi::MPI_Waitall(
                    count(self.requests.len()),
                    self.requests.as_mut_ptr().cast(),
                    self.statuses.as_mut_ptr().cast(),
                );
            }
        }
    }
}
