//! The transport: the collectives the pipeline needs, behind a trait. `mpi` is the only module
//! of the crate that imports MPI; `local` runs P ranks as threads of one process for unit tests.

use std::ops::Range;

use anyhow::{anyhow, Result};

pub(crate) mod hydra;
pub mod launcher;
#[cfg(test)]
pub(crate) mod local;
pub mod mpi;
pub(crate) mod sort;
pub mod wire;

/// Collective operations over a fixed group of ranks. Every rank must call the same collectives
/// in the same order.
pub trait Comm {
    /// This rank's number, `0..size()`.
    fn rank(&self) -> usize;
    /// Number of ranks.
    fn size(&self) -> usize;
    /// Ranks on this rank's node (sharing its cores and memory), this one included.
    fn node_ranks(&self) -> usize {
        1
    }
    /// Every rank's `value`, indexed by rank.
    fn all_gather(&self, value: u64) -> Vec<u64>;
    /// Element-wise sum over all ranks.
    fn all_sum(&self, values: &[u64]) -> Vec<u64>;
    /// Element-wise maximum over all ranks.
    fn all_max(&self, values: &[u64]) -> Vec<u64>;
    /// [`Comm::all_sum`] for progress reports, which ranks make while their worker threads do
    /// the work: a rank that waits here for slower ones sleeps instead of spinning on a core
    /// its workers need (under MPI, a non-blocking reduction polled at `poll`).
    fn all_sum_idle(&self, values: &[u64], poll: std::time::Duration) -> Vec<u64> {
        let _ = poll;
        self.all_sum(values)
    }
    /// [`Comm::all_gather`] for agreement points, where a rank may wait long for another
    /// (rank 0 writing energon's `index.sqlite` while the others wait to agree on it): a rank
    /// that waits sleeps between polls instead of spinning on a core another rank of its node
    /// may need.
    fn all_gather_idle(&self, value: u64) -> Vec<u64> {
        self.all_gather(value)
    }
    /// `root`'s `data` on every rank (the argument is ignored elsewhere).
    fn broadcast(&self, root: usize, data: Vec<u8>) -> Vec<u8>;
    /// Personalized all-to-all: `send[ranges[d]]` goes to rank `d`. Fills `recv` (reusing its
    /// allocation) with the bytes received and returns, for each source rank, the range of `recv`
    /// it sent. Any size works: transports split exchanges that exceed their message limits into
    /// rounds.
    fn all_to_all(
        &self,
        send: &[u8],
        ranges: &[Range<usize>],
        recv: &mut Vec<u8>,
    ) -> Vec<Range<usize>>;
    /// A handle that ends the whole job with a code, callable from any thread (the stall
    /// watchdog's, while the main thread is blocked in a collective).
    fn aborter(&self) -> Aborter;
    /// A round of [`Comm::start_round`] in flight: it owns the round's buffers until it
    /// completes.
    type Round;
    /// Starts one round of a pipelined exchange and returns at once: `out.header` goes to every
    /// other rank, and `out.send[out.segments[d]]` (at most `slot` bytes) to rank `d`. Every rank
    /// starts the same rounds in the same order with the same `slot`, and any number of them may
    /// be in flight: a round's messages never match another round's. Unlike
    /// [`Comm::all_to_all`], nothing waits for the other ranks, so a rank whose transfers are done
    /// goes on with the next round while slower pairs finish this one.
    fn start_round(&self, out: Outgoing, slot: usize) -> Self::Round;
    /// Completes `round` if everything it sends and receives has moved (then its buffers come
    /// back with what arrived), else hands it back. Rounds in flight advance only while their
    /// rank calls this (or another transport call): call it often.
    ///
    /// # Errors
    /// None: `Err` is the round, still in flight.
    fn test_round(&self, round: Self::Round) -> Result<Arrived, Self::Round>;
}

/// What one rank hands to [`Comm::start_round`]; the transport owns it until the round completes.
#[derive(Debug, Default)]
pub struct Outgoing {
    /// A few bytes for every other rank (the same for all), such as the round's status.
    pub(crate) header: Vec<u8>,
    pub(crate) send: Vec<u8>,
    /// `send[segments[d]]` goes to rank `d`; this rank's own segment is not sent.
    pub(crate) segments: Vec<Range<usize>>,
    /// Where the round is received: its allocation is reused (grown to `slot` bytes per rank).
    pub(crate) recv: Vec<u8>,
}

/// A completed round: the buffers handed to [`Comm::start_round`] and what arrived.
#[derive(Debug)]
pub struct Arrived {
    /// The buffers as handed over, `recv` now holding what arrived.
    pub(crate) out: Outgoing,
    /// Every rank's header, by rank (this rank's own included).
    pub(crate) headers: Vec<Vec<u8>>,
    /// The range of `out.recv` each rank sent (empty for this rank).
    pub(crate) from: Vec<Range<usize>>,
}

/// Ends the whole job with the given exit status; see [`Comm::aborter`].
pub(crate) type Aborter = std::sync::Arc<dyn Fn(crate::exit::Exit) + Send + Sync>;

/// Raised on the ranks that did not fail when another rank did: they stop quietly, the failing
/// rank prints the cause.
#[derive(Debug)]
pub struct PeerFailed {
    pub(crate) ranks: Vec<usize>,
}

impl std::fmt::Display for PeerFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "stopped because rank(s) {:?} failed", self.ranks)
    }
}

impl std::error::Error for PeerFailed {}

/// All ranks agree on the outcome of a phase: if any rank failed, every rank returns an error
/// (the failing ranks their own, the others [`PeerFailed`]), so that no rank walks into the next
/// collective alone and hangs.
///
/// # Errors
/// This rank's error, or [`PeerFailed`] when only other ranks failed.
pub fn agree<T>(comm: &impl Comm, local: Result<T>) -> Result<T> {
    settle(comm, local, false)
}

/// [`agree`], for failures every rank may hit alike (a bad file every rank reads): when every
/// rank failed, only rank 0 keeps its error, so it is printed once.
///
/// # Errors
/// As [`agree`].
pub(crate) fn agree_once<T>(comm: &impl Comm, local: Result<T>) -> Result<T> {
    settle(comm, local, true)
}

fn settle<T>(comm: &impl Comm, local: Result<T>, once: bool) -> Result<T> {
    let failed = comm.all_gather_idle(u64::from(local.is_err()));
    if failed.iter().all(|&f| f == 0) {
        return local;
    }
    if once && comm.rank() != 0 && failed.iter().all(|&f| f == 1) {
        return Err(anyhow!(PeerFailed { ranks: vec![0] }));
    }
    let ranks = failed
        .iter()
        .enumerate()
        .filter(|(_, &f)| f != 0)
        .map(|(r, _)| r)
        .collect();
    match local {
        Err(e) => Err(e),
        Ok(_) => Err(anyhow!(PeerFailed { ranks })),
    }
}

/// A failure every rank detects identically: reported by rank 0 only, quiet elsewhere.
pub(crate) fn everywhere(lead: bool, e: anyhow::Error) -> anyhow::Error {
    if lead {
        e
    } else {
        anyhow!(PeerFailed { ranks: vec![0] })
    }
}

/// Broadcasts `root`'s outcome: its value (serialized) on success, or a failure every rank sees.
///
/// # Errors
/// `root`'s error on `root`, [`PeerFailed`] elsewhere.
pub(crate) fn broadcast_result<T>(
    comm: &impl Comm,
    root: usize,
    local: Option<Result<T>>,
) -> Result<T>
where
    T: serde::Serialize + serde::de::DeserializeOwned,
{
    let mut error = None;
    let payload = if comm.rank() == root {
        match local.expect("root must pass its result") {
            Ok(v) => {
                let mut bytes = vec![1u8];
                // JSON, not bincode: broadcast values are small, and a self-describing format
                // keeps `skip_serializing_if` fields (index.json's optional md5sum) decodable.
                bytes.extend(serde_json::to_vec(&v).expect("encodable"));
                bytes
            }
            Err(e) => {
                error = Some(e);
                vec![0u8]
            }
        }
    } else {
        Vec::new()
    };
    let got = comm.broadcast(root, payload);
    if let Some(e) = error {
        return Err(e);
    }
    if got.first() != Some(&1) {
        return Err(anyhow!(PeerFailed { ranks: vec![root] }));
    }
    let v = serde_json::from_slice(&got[1..])
        .map_err(|e| anyhow!("decoding a broadcast from rank {root}: {e}"))?;
    Ok(v)
}

/// Every rank's `data` on `root`, by rank (empty vectors elsewhere).
pub(crate) fn gather(comm: &impl Comm, root: usize, data: &[u8]) -> Vec<Vec<u8>> {
    let mut ranges = vec![0..0; comm.size()];
    ranges[root] = 0..data.len();
    let mut recv = Vec::new();
    let from = comm.all_to_all(data, &ranges, &mut recv);
    if comm.rank() != root {
        return Vec::new();
    }
    from.into_iter().map(|r| recv[r].to_vec()).collect()
}

/// Exclusive prefix sum of `value` over ranks, and the total.
pub(crate) fn exclusive_sum(comm: &impl Comm, value: u64) -> (u64, u64) {
    let all = comm.all_gather(value);
    let before = all[..comm.rank()].iter().sum();
    (before, all.iter().sum())
}

#[cfg(test)]
mod tests {
    use super::local::LocalComm;
    use super::*;

    #[test]
    fn agree_fails_everywhere_when_one_rank_fails() {
        let out = LocalComm::run(3, |c| {
            let local = if c.rank() == 1 {
                Err(anyhow!("disk on fire"))
            } else {
                Ok(c.rank())
            };
            agree(c, local).map_err(|e| format!("{e:#}"))
        });
        assert!(out[0].as_ref().unwrap_err().contains("[1]"));
        assert_eq!(out[1].as_ref().unwrap_err(), "disk on fire");
        assert!(out[2].as_ref().unwrap_err().contains("[1]"));
    }

    #[test]
    fn broadcast_result_carries_value_or_failure() {
        let out = LocalComm::run(3, |c| {
            let local = (c.rank() == 0).then(|| Ok(vec![1u32, 2, 3]));
            broadcast_result(c, 0, local).unwrap()
        });
        assert!(out.iter().all(|v| v == &vec![1, 2, 3]));
        let out = LocalComm::run(2, |c| {
            let local = (c.rank() == 0).then(|| Err::<u8, _>(anyhow!("bad spec")));
            broadcast_result(c, 0, local).map_err(|e| e.to_string())
        });
        assert_eq!(out[0].as_ref().unwrap_err(), "bad spec");
        assert!(out[1].is_err());
    }

    #[test]
    fn prefix_sums_and_all_to_all() {
        let out = LocalComm::run(4, |c| {
            let (before, total) = exclusive_sum(c, c.rank() as u64 + 1);
            // Rank r sends r+d copies of byte r to rank d.
            let mut send = Vec::new();
            let mut ranges = Vec::new();
            for d in 0..c.size() {
                let start = send.len();
                send.extend(std::iter::repeat_n(c.rank() as u8, c.rank() + d));
                ranges.push(start..send.len());
            }
            let mut recv = Vec::new();
            let from = c.all_to_all(&send, &ranges, &mut recv);
            let ok = (0..c.size()).all(|s| {
                let got = &recv[from[s].clone()];
                got.len() == s + c.rank() && got.iter().all(|&b| b == s as u8)
            });
            (before, total, ok)
        });
        assert_eq!(out.iter().map(|o| o.0).collect::<Vec<_>>(), [0, 1, 3, 6]);
        assert!(out.iter().all(|o| o.1 == 10 && o.2));
    }

    #[test]
    fn rounds_in_flight_each_bring_their_own_data_and_headers() {
        let slot = 8;
        let out = LocalComm::run(3, |c| {
            let me = c.rank();
            // Both rounds are started before either is waited for. In round k, rank r sends
            // d + k bytes of value 10 * r + k to rank d.
            let started: Vec<_> = (0..2u8)
                .map(|k| {
                    let send = vec![10 * me as u8 + k; c.size() * slot];
                    let segments = (0..c.size())
                        .map(|d| d * slot..d * slot + d + usize::from(k))
                        .collect();
                    let header = vec![k, me as u8];
                    let out = Outgoing {
                        header,
                        send,
                        segments,
                        recv: Vec::new(),
                    };
                    c.start_round(out, slot)
                })
                .collect();
            let mut arrived = Vec::new();
            for mut round in started {
                arrived.push(loop {
                    match c.test_round(round) {
                        Ok(a) => break a,
                        Err(r) => round = r,
                    }
                });
            }
            (0..2u8).zip(arrived).all(|(k, a)| {
                (0..c.size()).all(|s| {
                    let got = &a.out.recv[a.from[s].clone()];
                    let want = if s == me { 0 } else { me + usize::from(k) };
                    a.headers[s] == [k, s as u8]
                        && got.len() == want
                        && got.iter().all(|&b| b == 10 * s as u8 + k)
                })
            })
        });
        assert_eq!(out, [true, true, true]);
    }
}
