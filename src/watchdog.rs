//! The stall watchdog: a rank whose exchange makes no progress for `--stall-timeout` (a peer
//! died, a node's link went down) ends the job instead of waiting in a collective forever.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::comm::Aborter;

/// Exit code of a job ended by the watchdog.
pub const STALL_EXIT: i32 = 75;

/// Watches for progress; dropping it stops watching.
pub struct Watchdog {
    shared: Arc<Shared>,
    /// Dropping it wakes the watching thread at once to stop.
    stop: Option<Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

struct Shared {
    start: Instant,
    /// Milliseconds since `start` of the last progress.
    last: AtomicU64,
    /// What the rank was doing then, for the message.
    doing: Mutex<String>,
}

impl Watchdog {
    /// Starts watching. After `timeout` without [`Watchdog::beat`], prints which rank stalled
    /// where and calls `abort`. A zero timeout watches nothing.
    pub fn start(timeout: Duration, rank: usize, abort: Aborter) -> Self {
        let shared = Arc::new(Shared {
            start: Instant::now(),
            last: AtomicU64::new(0),
            doing: Mutex::new("starting the exchange".into()),
        });
        let (stop, stopped) = channel::<()>();
        let thread = (!timeout.is_zero()).then(|| {
            let shared = Arc::clone(&shared);
            std::thread::spawn(move || {
                let tick = (timeout / 10).clamp(Duration::from_millis(50), Duration::from_secs(1));
                while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(tick) {
                    let now = shared.start.elapsed().as_millis() as u64;
                    let idle = Duration::from_millis(now.saturating_sub(shared.last.load(Ordering::Relaxed)));
                    if idle >= timeout {
                        let doing = shared.doing.lock().map(|d| d.clone()).unwrap_or_default();
                        eprintln!(
                            "reshard: error: rank {rank} on {}: no progress for {} s (--stall-timeout) while {doing}: \
                             another rank or its node stopped answering; aborting the job, nothing is published",
                            hostname(),
                            idle.as_secs()
                        );
                        abort(STALL_EXIT);
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

    /// Records progress, and that the rank is now `doing` something (what a stall message will
    /// say it was waiting for).
    pub fn beat(&self, doing: impl FnOnce() -> String) {
        self.touch();
        if let Ok(mut d) = self.shared.doing.lock() {
            *d = doing();
        }
    }

    /// Records progress only (for helper threads).
    pub fn touch(&self) {
        let now = self.shared.start.elapsed().as_millis() as u64;
        self.shared.last.store(now, Ordering::Relaxed);
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

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "unknown host".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    #[test]
    fn fires_only_without_progress() {
        let fired = Arc::new(AtomicBool::new(false));
        let f = Arc::clone(&fired);
        let dog = Watchdog::start(
            Duration::from_millis(300),
            0,
            Arc::new(move |_| f.store(true, Ordering::SeqCst)),
        );
        for _ in 0..8 {
            std::thread::sleep(Duration::from_millis(100));
            dog.beat(|| "moving".into());
        }
        assert!(!fired.load(Ordering::SeqCst), "fired despite progress");
        std::thread::sleep(Duration::from_millis(700));
        assert!(
            fired.load(Ordering::SeqCst),
            "did not fire after the timeout"
        );
        drop(dog);
    }
}
