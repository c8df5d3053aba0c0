//! An in-process transport: P ranks as P threads sharing memory. Lets unit tests run the whole
//! pipeline, collectives included, without MPI.

use std::any::Any;
use std::collections::HashMap;
use std::ops::Range;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use super::{Arrived, Comm, Outgoing};

struct Shared {
    barrier: AbortableBarrier,
    slots: Mutex<Vec<Option<Arc<dyn Any + Send + Sync>>>>,
    /// Messages of rounds in flight: (round, from, to) -> (header, data).
    mail: Mutex<HashMap<(u64, usize, usize), Message>>,
}

type Message = (Vec<u8>, Vec<u8>);

/// A barrier that a panicking rank can break, so that a failing test fails instead of leaving
/// the other ranks waiting forever (what `MPI_Abort` does for the MPI transport).
struct AbortableBarrier {
    size: usize,
    state: Mutex<(usize, u64, bool)>, // (arrived, generation, aborted)
    cv: Condvar,
}

impl AbortableBarrier {
    fn wait(&self) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let generation = state.1;
        state.0 += 1;
        if state.0 == self.size {
            *state = (0, generation + 1, state.2);
            self.cv.notify_all();
        }
        while state.1 == generation && !state.2 {
            state = self.cv.wait(state).unwrap_or_else(|p| p.into_inner());
        }
        assert!(!state.2, "another in-process rank panicked");
    }

    /// Panics if another rank panicked (a rank polling for a round that will never complete).
    fn check(&self) {
        let aborted = self.state.lock().unwrap_or_else(|p| p.into_inner()).2;
        assert!(!aborted, "another in-process rank panicked");
    }

    fn abort(&self) {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).2 = true;
        self.cv.notify_all();
    }
}

/// One rank of an in-process group.
pub(crate) struct LocalComm {
    rank: usize,
    size: usize,
    shared: Arc<Shared>,
    /// Rounds this rank started.
    rounds: AtomicU64,
}

/// A round of [`LocalComm::start_round`] in flight.
#[derive(Debug)]
pub(crate) struct LocalRound {
    number: u64,
    out: Outgoing,
    slot: usize,
}

impl LocalComm {
    /// Runs `f` on `size` ranks, each on its own thread, and returns their results by rank.
    pub(crate) fn run<T, F>(size: usize, f: F) -> Vec<T>
    where
        T: Send,
        F: Fn(&LocalComm) -> T + Sync,
    {
        let shared = Arc::new(Shared {
            barrier: AbortableBarrier {
                size,
                state: Mutex::new((0, 0, false)),
                cv: Condvar::new(),
            },
            slots: Mutex::new(vec![None; size]),
            mail: Mutex::new(HashMap::new()),
        });
        std::thread::scope(|scope| {
            let handles: Vec<_> = (0..size)
                .map(|rank| {
                    let comm = LocalComm {
                        rank,
                        size,
                        shared: Arc::clone(&shared),
                        rounds: AtomicU64::new(0),
                    };
                    let f = &f;
                    scope.spawn(move || {
                        catch_unwind(AssertUnwindSafe(|| f(&comm))).unwrap_or_else(|panic| {
                            comm.shared.barrier.abort();
                            resume_unwind(panic)
                        })
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("rank thread panicked"))
                .collect()
        })
    }

    /// Every rank's `value`, by rank.
    fn gather_all<T: Clone + Send + Sync + 'static>(&self, value: T) -> Vec<T> {
        self.shared.slots.lock().unwrap_or_else(|p| p.into_inner())[self.rank] =
            Some(Arc::new(value));
        self.shared.barrier.wait();
        let all = {
            let slots = self.shared.slots.lock().unwrap_or_else(|p| p.into_inner());
            slots
                .iter()
                .map(|s| {
                    s.as_ref()
                        .unwrap()
                        .downcast_ref::<T>()
                        .expect("same collective")
                        .clone()
                })
                .collect()
        };
        // Nobody overwrites a slot before everyone has read.
        self.shared.barrier.wait();
        all
    }
}

impl Comm for LocalComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn all_gather(&self, value: u64) -> Vec<u64> {
        self.gather_all(value)
    }

    fn all_sum(&self, values: &[u64]) -> Vec<u64> {
        let all = self.gather_all(values.to_vec());
        (0..values.len())
            .map(|i| all.iter().map(|v| v[i]).sum())
            .collect()
    }

    fn all_max(&self, values: &[u64]) -> Vec<u64> {
        let all = self.gather_all(values.to_vec());
        (0..values.len())
            .map(|i| all.iter().map(|v| v[i]).max().unwrap())
            .collect()
    }

    fn broadcast(&self, root: usize, data: Vec<u8>) -> Vec<u8> {
        let all = self.gather_all(if self.rank == root { data } else { Vec::new() });
        all[root].clone()
    }

    fn all_to_all(
        &self,
        send: &[u8],
        ranges: &[Range<usize>],
        recv: &mut Vec<u8>,
    ) -> Vec<Range<usize>> {
        let parts: Vec<Vec<u8>> = ranges.iter().map(|r| send[r.clone()].to_vec()).collect();
        let all = self.gather_all(parts);
        recv.clear();
        let mut from = Vec::with_capacity(self.size);
        for parts in &all {
            let start = recv.len();
            recv.extend_from_slice(&parts[self.rank]);
            from.push(start..recv.len());
        }
        from
    }

    fn aborter(&self) -> super::Aborter {
        // In-process ranks cannot exit the test process: break the barrier, so that every rank
        // waiting in a collective panics.
        let shared = Arc::clone(&self.shared);
        Arc::new(move |_code| shared.barrier.abort())
    }

    type Round = LocalRound;

    fn start_round(&self, out: Outgoing, slot: usize) -> LocalRound {
        let number = self.rounds.fetch_add(1, Ordering::Relaxed);
        let mut mail = self.shared.mail.lock().unwrap_or_else(|p| p.into_inner());
        for (to, r) in out.segments.iter().enumerate() {
            if to != self.rank {
                assert!(r.len() <= slot, "a segment larger than the round's slot");
                let message = (out.header.clone(), out.send[r.clone()].to_vec());
                mail.insert((number, self.rank, to), message);
            }
        }
        LocalRound { number, out, slot }
    }

    fn test_round(&self, mut round: LocalRound) -> Result<Arrived, LocalRound> {
        self.shared.barrier.check();
        let mut mail = self.shared.mail.lock().unwrap_or_else(|p| p.into_inner());
        let key = |from| (round.number, from, self.rank);
        let others = (0..self.size).filter(|&s| s != self.rank);
        if !others.clone().all(|s| mail.contains_key(&key(s))) {
            return Err(round);
        }
        let recv = &mut round.out.recv;
        recv.resize(recv.len().max(self.size * round.slot), 0);
        let mut headers = vec![round.out.header.clone(); self.size];
        let mut from = vec![0..0; self.size];
        for s in others {
            let (header, data) = mail.remove(&key(s)).expect("checked above");
            let at = s * round.slot;
            recv[at..at + data.len()].copy_from_slice(&data);
            headers[s] = header;
            from[s] = at..at + data.len();
        }
        Ok(Arrived {
            out: round.out,
            headers,
            from,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panicking_rank_does_not_hang_the_others() {
        let outcome = catch_unwind(|| {
            LocalComm::run(3, |c| {
                if c.rank() == 1 {
                    panic!("rank 1 fails");
                }
                c.all_gather(1)
            })
        });
        assert!(outcome.is_err());
    }
}
