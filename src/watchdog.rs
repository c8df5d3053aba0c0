//! The exchange's stall watchdog: a rank whose exchange makes no progress for `--stall-timeout`
//! (a peer died, a node's link went down) ends the job instead of waiting in a collective forever.
//!
//! Every rank's heartbeat ([`crate::heartbeat`]) says which exchange round it is in. When this
//! watchdog fires it reads them all: a rank whose heartbeat went stale is frozen or dead, one
//! that is rounds behind is stuck; if every rank is alive and in step, the network between them
//! stopped delivering. Time without progress is counted on this thread's own running time
//! ([`LivedClock`]), so a job suspended as a whole does not find itself stalled when it wakes.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, UNIX_EPOCH};

use crate::comm::Aborter;
use crate::exit::Exit;
use crate::heartbeat::{self, Beat, LivedClock, Pulse};
use crate::storage;

/// Watches for progress; dropping it stops watching.
pub(crate) struct Watchdog {
    shared: Arc<Shared>,
    /// Dropping it wakes the watching thread at once to stop.
    stop: Option<Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

struct Shared {
    /// Moves at every progress.
    last: AtomicU64,
    /// What the rank was doing then, for the message.
    doing: Mutex<String>,
    /// The rank's heartbeat, which says the round it is in.
    pulse: Option<Arc<Pulse>>,
}

impl Watchdog {
    /// Starts watching. After `timeout` of this thread's running time without
    /// [`Watchdog::beat`], prints which rank stalled where (from the heartbeats in `heartbeats`)
    /// and calls `abort`. A zero timeout watches nothing. `pulse`: this rank's heartbeat, told
    /// each round.
    pub(crate) fn start(
        timeout: Duration,
        (rank, ranks): (usize, usize),
        (heartbeats, pulse): (Option<PathBuf>, Option<Arc<Pulse>>),
        abort: Aborter,
    ) -> Self {
        let shared = Arc::new(Shared {
            last: AtomicU64::new(0),
            doing: Mutex::new("starting the exchange".into()),
            pulse,
        });
        let (stop, stopped) = channel::<()>();
        let thread = (!timeout.is_zero()).then(|| {
            let shared = Arc::clone(&shared);
            std::thread::spawn(move || {
                let tick = heartbeat::tick_for(timeout);
                let host = crate::sys::hostname();
                let mut clock = LivedClock::new(tick, Instant::now());
                let mut seen = shared.last.load(Ordering::Relaxed);
                let mut idle = Duration::ZERO;
                while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(tick) {
                    let lived = clock.step(Instant::now());
                    let last = shared.last.load(Ordering::Relaxed);
                    if last == seen {
                        idle += lived;
                    } else {
                        (seen, idle) = (last, Duration::ZERO);
                    }
                    let round = shared.pulse.as_ref().map_or(0, |p| p.round.load(Ordering::Relaxed));
                    if idle >= timeout {
                        let doing = shared.doing.lock().map(|d| d.clone()).unwrap_or_default();
                        let culprits = heartbeats
                            .as_deref()
                            .map(|d| suspects(d, (rank, ranks), round, timeout))
                            .unwrap_or_else(|| "another rank or its node stopped answering".into());
                        // Not where the heartbeats are in the output's store (each node
                        // stages its own, and keeps nothing for --resume).
                        let staging = heartbeats
                            .as_deref()
                            .and_then(Path::parent)
                            .filter(|d| storage::sink(d).capabilities().rename)
                            .map(|d| format!(" (the staging directory {} is left: a rerun with --resume continues from its last checkpoint, one without removes it)", d.display()))
                            .unwrap_or_default();
                        crate::errln!(
                            "reshard: error: rank {rank} on {host}: no progress for {} s (--stall-timeout) while {doing}: \
                             {culprits}; aborting the job, nothing is published{staging}",
                            idle.as_secs()
                        );
                        // Give the launcher a moment to forward the message: an abort kills its
                        // stdio relays too, and the message is the point.
                        std::thread::sleep(Duration::from_millis(300));
                        abort(Exit::Stall);
                        return;
                    }
                }
            })
        });
        Watchdog {
            shared,
            stop: Some(stop),
            thread,
        }
    }

    /// Records progress, and that the rank is now in exchange round `round`, `doing` something
    /// (what a stall message will say it was waiting for).
    pub(crate) fn beat(&self, round: u64, doing: impl FnOnce() -> String) {
        self.touch();
        if let Some(p) = &self.shared.pulse {
            p.round.store(round, Ordering::Relaxed);
        }
        if let Ok(mut d) = self.shared.doing.lock() {
            *d = doing();
        }
    }

    /// Records progress only (for helper threads).
    pub(crate) fn touch(&self) {
        self.shared.last.fetch_add(1, Ordering::Relaxed);
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Reads every rank's heartbeat and says which ranks look like the cause.
fn suspects(dir: &Path, (me, ranks): (usize, usize), my_round: u64, timeout: Duration) -> String {
    let stale_after = (timeout / 2).max(Duration::from_secs(3));
    let mut silent = Vec::new();
    let mut behind = Vec::new();
    for rank in (0..ranks).filter(|&r| r != me) {
        let path = heartbeat::path_of(dir, rank);
        let source = storage::source(&path);
        let Ok(stat) = source.stat(&path) else {
            silent.push(format!("rank {rank} (never wrote a heartbeat)"));
            continue;
        };
        let beat = heartbeat::read_beat(dir, rank);
        let round = beat.as_ref().map(|b| b.round);
        let host = beat.map_or("?".into(), |b: Beat| b.host);
        let modified =
            u64::try_from(stat.stamp.mtime_ns).map(|ns| UNIX_EPOCH + Duration::from_nanos(ns));
        let age = modified.ok().and_then(|t| t.elapsed().ok());
        if age.is_none_or(|a| a > stale_after) {
            let secs = age.map_or("?".into(), |a| a.as_secs().to_string());
            silent.push(format!("rank {rank} on {host} (silent for {secs} s)"));
        } else if let Some(r) = round.filter(|&r| r < my_round) {
            behind.push(format!("rank {rank} on {host} (still in round {r})"));
        }
    }
    if !silent.is_empty() {
        format!("stopped answering: {}", silent.join(", "))
    } else if !behind.is_empty() {
        format!("stuck behind: {}", behind.join(", "))
    } else {
        "every rank is alive and in step, so the network between them stopped delivering (a link down?)".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// No margin to lose on a loaded machine: whenever the dog fires, it must be at least the
    /// timeout after the last beat before it (which a dog that ignored beats, firing during
    /// them, breaks), and after the beats stop it must fire (however late).
    #[test]
    fn fires_only_without_progress() {
        let timeout = Duration::from_millis(300);
        let (tx, rx) = std::sync::mpsc::channel();
        let tx = std::sync::Mutex::new(tx);
        let dog = Watchdog::start(
            timeout,
            (0, 1),
            (None, None),
            Arc::new(move |_| {
                let _ = tx.lock().unwrap().send(Instant::now());
            }),
        );
        let started = Instant::now();
        let mut beats = Vec::new();
        let mut round = 0;
        while started.elapsed() < 3 * timeout {
            beats.push(Instant::now());
            dog.beat(round, || "moving".into());
            round += 1;
            std::thread::sleep(Duration::from_millis(5));
        }
        let fired = rx
            .recv_timeout(Duration::from_secs(120))
            .expect("did not fire after the beats stopped");
        let last = beats.iter().filter(|&&b| b <= fired).max().unwrap();
        assert!(
            fired >= *last + timeout,
            "fired {:?} after a beat",
            fired - *last
        );
        drop(dog);
    }

    #[test]
    fn heartbeats_name_the_silent_rank() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("rank-000001"), "9 4 node1 exchange\n").unwrap();
        std::fs::write(dir.path().join("rank-000002"), "9 4 node2 exchange\n").unwrap();
        let alive = suspects(dir.path(), (0, 3), 4, Duration::from_secs(10));
        assert!(alive.contains("network"), "{alive}");
        std::fs::write(dir.path().join("rank-000002"), "9 2 node2 exchange\n").unwrap();
        let behind = suspects(dir.path(), (0, 3), 4, Duration::from_secs(10));
        assert!(behind.contains("rank 2 on node2"), "{behind}");
        let old = std::time::SystemTime::now() - Duration::from_secs(60);
        std::fs::File::options()
            .write(true)
            .open(dir.path().join("rank-000001"))
            .unwrap()
            .set_modified(old)
            .unwrap();
        let silent = suspects(dir.path(), (0, 3), 4, Duration::from_secs(10));
        assert!(
            silent.contains("stopped answering: rank 1 on node1"),
            "{silent}"
        );
        let missing = suspects(dir.path(), (0, 4), 4, Duration::from_secs(10));
        assert!(
            missing.contains("rank 3 (never wrote a heartbeat)"),
            "{missing}"
        );
    }
}
