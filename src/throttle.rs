//! I/O rate limits (`--max-read-rate`, `--max-write-rate`): a token bucket per direction that
//! paces the bytes this rank reads from the input and writes to the output.
//!
//! A job's limit is shared among its ranks: each rank gets `rate / ranks` and enforces it alone,
//! so no read or write waits for a collective (see [`share`]). The bucket itself ([`Bucket`]) is
//! pure arithmetic over a clock the caller passes in, unit-tested with a simulated one; the
//! process-wide pacers ([`read`], [`write`]) add the real clock, the sleep, and the tally of
//! bytes and time spent waiting that progress and the summary print.
//!
//! The pacers are called from one place: [`crate::storage::paced`], the wrapper of the storage
//! seam's backends that [`crate::storage::source`] and [`crate::storage::sink`] hand out while a
//! limit is set, so every byte any phase reads or writes through the seam counts once.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde::Serialize;

use crate::size::human_bytes;
use crate::sys;

/// The most a bucket saves up while idle, in seconds of its rate: a pause (a round's barrier)
/// may be made up for by this much burst, no more, so a limit holds over any stretch longer than
/// this.
const BURST_SECONDS: f64 = 0.25;

/// A token bucket over a caller's clock (seconds since any fixed start). Tokens are bytes; a
/// caller that takes more than there are goes into debt and is told how long to wait, and the
/// next caller waits behind that debt too, so concurrent threads share the rate.
#[derive(Debug, Clone)]
pub(crate) struct Bucket {
    /// Bytes per second.
    rate: f64,
    /// The most tokens the bucket holds.
    burst: f64,
    /// Bytes available now (negative: owed).
    tokens: f64,
    /// When `tokens` was last brought up to date.
    last: f64,
}

impl Bucket {
    /// An empty bucket filling at `rate` bytes per second from time `now`. It starts empty so
    /// that a job of B bytes never takes less than `B / rate` less one burst.
    pub(crate) fn new(rate: f64, now: f64) -> Self {
        Bucket {
            rate,
            burst: rate * BURST_SECONDS,
            tokens: 0.0,
            last: now,
        }
    }

    /// Takes `bytes` at time `now`: the seconds the caller must wait before it may move them.
    pub(crate) fn take(&mut self, now: f64, bytes: u64) -> f64 {
        if now > self.last {
            self.tokens = (self.tokens + (now - self.last) * self.rate).min(self.burst);
            self.last = now;
        }
        self.tokens -= bytes as f64;
        if self.tokens >= 0.0 {
            0.0
        } else {
            -self.tokens / self.rate
        }
    }
}

/// One rank's share of a job's `rate` (bytes per second) among `ranks` ranks: an equal share,
/// so the shares never add up to more than the job's limit, and no rank needs to ask the others.
/// Inputs are assigned to ranks balanced by bytes, so equal shares also finish together.
pub(crate) fn share(rate: u64, ranks: usize) -> f64 {
    rate as f64 / ranks.max(1) as f64
}

/// The limits of a run, as the command line gives them (bytes per second, for the whole job).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub(crate) struct Limits {
    pub(crate) read: Option<u64>,
    pub(crate) write: Option<u64>,
}

impl Limits {
    /// One rank's share of the lower of the two limits, bytes per second (`None` without
    /// limits).
    pub(crate) fn slowest_share(&self, ranks: usize) -> Option<f64> {
        [self.read, self.write]
            .into_iter()
            .flatten()
            .min()
            .map(|r| share(r, ranks))
    }

    /// Seconds the job's data movement takes at least at these limits: `read_bytes` read and
    /// `written` bytes written, each at its limit (the slower decides); `None` without limits.
    pub(crate) fn least_seconds(&self, read_bytes: u64, written: u64) -> Option<f64> {
        let at = |bytes: u64, rate: Option<u64>| rate.map(|r| bytes as f64 / r as f64);
        match (at(read_bytes, self.read), at(written, self.write)) {
            (None, None) => None,
            (a, b) => Some(a.unwrap_or(0.0).max(b.unwrap_or(0.0))),
        }
    }
}

/// How a run shares the machine with others (training beside it): rate limits for the whole
/// job, and the priorities every rank sets at start.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct IoConfig {
    pub(crate) limits: Limits,
    pub(crate) priority: IoPriority,
    /// `--nice N`: `None` leaves the CPU priority as it is.
    pub(crate) nice: Option<i32>,
}

/// `--io-priority` values: the kernel's I/O priority classes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub(crate) enum IoPriority {
    /// The idle class: the disk serves this run only when nothing else asks for it.
    Idle,
    /// Best effort at its lowest level (7).
    Low,
    /// As started (best effort, level 4, unless the launcher set another).
    #[default]
    Normal,
}

/// A pacer for one direction: its bucket on the real clock, and what went through it.
struct Pacer {
    start: Instant,
    bucket: Option<Mutex<Bucket>>,
    bytes: AtomicU64,
    waited_nanos: AtomicU64,
}

impl Pacer {
    fn new(rate: Option<f64>) -> Self {
        Pacer {
            start: Instant::now(),
            bucket: rate.map(|r| Mutex::new(Bucket::new(r, 0.0))),
            bytes: AtomicU64::new(0),
            waited_nanos: AtomicU64::new(0),
        }
    }

    /// Counts `bytes` and takes them from the bucket: how long the caller must wait for them.
    fn take(&self, bytes: u64) -> Duration {
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
        // Nothing moved in this direction: no wait for its debt either.
        let (Some(bucket), 1..) = (&self.bucket, bytes) else {
            return Duration::ZERO;
        };
        let now = self.start.elapsed().as_secs_f64();
        Duration::from_secs_f64(bucket.lock().unwrap().take(now, bytes))
    }

    fn waited(&self, wait: Duration) {
        self.waited_nanos
            .fetch_add(wait.as_nanos() as u64, Ordering::Relaxed);
    }

    fn tally(&self) -> Tally {
        Tally {
            bytes: self.bytes.load(Ordering::Relaxed),
            waited: Duration::from_nanos(self.waited_nanos.load(Ordering::Relaxed)),
        }
    }
}

/// What went through one direction's pacer on this rank.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Tally {
    pub(crate) bytes: u64,
    /// Time spent waiting on the limit (summed over the threads that waited).
    pub(crate) waited: Duration,
}

/// This process's pacers: (read, write). Set once per run by [`install`].
static PACERS: OnceLock<(Pacer, Pacer)> = OnceLock::new();
/// The job's limits (not this rank's share), for progress lines.
static JOB: OnceLock<Limits> = OnceLock::new();

/// Sets this rank's pacers: its share of `limits` among `ranks` ranks. The first call wins (one
/// run per process; in-process test runs set no limits).
pub(crate) fn install(limits: Limits, ranks: usize) {
    let rate = |r: Option<u64>| r.map(|r| share(r, ranks));
    let _ = JOB.set(limits);
    let _ = PACERS.get_or_init(|| {
        (
            Pacer::new(rate(limits.read)),
            Pacer::new(rate(limits.write)),
        )
    });
}

/// Starts this rank's share of the machine: its I/O priority and nice value (set on the calling
/// thread before the phases start their threads, which inherit them) and its pacers.
///
/// # Errors
/// The kernel refuses a priority (a negative `--nice` without privileges); the message names
/// the flag.
pub(crate) fn start(io: &IoConfig, ranks: usize) -> Result<()> {
    let class = match io.priority {
        IoPriority::Idle => Some((sys::IOPRIO_CLASS_IDLE, 0)),
        IoPriority::Low => Some((sys::IOPRIO_CLASS_BE, 7)),
        IoPriority::Normal => None,
    };
    if let Some((class, level)) = class {
        sys::set_io_priority(class, level)
            .context("--io-priority: the kernel refused the I/O priority")?;
    }
    if let Some(n) = io.nice {
        sys::set_nice(n).with_context(|| {
            format!("--nice {n}: the kernel refused it (a value below the current one needs privileges)")
        })?;
    }
    install(io.limits, ranks);
    Ok(())
}

/// Whether this run has a rate limit: then [`crate::storage`] hands out its backends wrapped
/// in [`crate::storage::paced`], which calls [`pace`] and [`charge`] for every byte they move.
pub(crate) fn limited() -> bool {
    JOB.get()
        .is_some_and(|l| l.read.is_some() || l.write.is_some())
}

/// Counts `read` bytes read and `written` bytes written and waits until both limits allow
/// them: one wait, the longer of the two, so a transfer that both reads and writes (an
/// in-kernel copy) takes as long as its slower limit, not the sum of both. Reservations are
/// made under the buckets' locks and the sleep outside them: other threads queue behind the debt.
///
/// The wait ends early once a stop signal came (SIGINT, SIGTERM), like every other wait of a
/// run: the job then stops at its next checkpoint, and what is still in flight before it (a few
/// rounds, within `--mem-limit`) moves at full speed instead of keeping the job past the
/// signal's grace ([`crate::job::interrupt::GRACE`]).
pub(crate) fn pace(read: u64, written: u64) {
    let Some((r, w)) = PACERS.get() else { return };
    let (wait_r, wait_w) = (r.take(read), w.take(written));
    let wait = wait_r.max(wait_w);
    if !wait.is_zero() {
        let waited = sleep_unless_stopped(wait, sys::stop_signal);
        r.waited(wait_r.min(waited));
        w.waited(wait_w.min(waited));
    }
}

/// How often a wait on a limit looks for a stop signal.
const STOP_POLL: Duration = Duration::from_millis(50);

/// Sleeps `wait`, or less once `stopped` says a stop signal came: the time slept.
fn sleep_unless_stopped(wait: Duration, stopped: impl Fn() -> Option<i32>) -> Duration {
    let start = Instant::now();
    loop {
        let slept = start.elapsed();
        if slept >= wait || stopped().is_some() {
            return slept;
        }
        std::thread::sleep((wait - slept).min(STOP_POLL));
    }
}

/// Counts `read` and `written` bytes and takes them from the buckets without waiting: for
/// small objects (markers, locks, heartbeats), which a limit must never delay (a heartbeat
/// queued behind a writer's debt would make a live rank look stalled). The transfers after
/// them wait for their bytes.
pub(crate) fn charge(read: u64, written: u64) {
    if let Some((r, w)) = PACERS.get() {
        r.take(read);
        w.take(written);
    }
}

/// For a progress line: each limit, the rate this rank achieved so far against its share of it,
/// and how long its threads waited on it, e.g.
/// `, write limit 4.00 MiB/s (rank 0: 1.95 MiB/s of its 2.00 MiB/s share, waited 1.5 s over its
/// threads)`; empty without limits. Rank 0's own figures: the job's would need a collective.
pub(crate) fn progress_note() -> String {
    let (Some(limits), Some((r, w))) = (JOB.get(), PACERS.get()) else {
        return String::new();
    };
    let mut s = String::new();
    for (what, limit, pacer) in [("read", limits.read, r), ("write", limits.write, w)] {
        let (Some(rate), Some(bucket)) = (limit, &pacer.bucket) else {
            continue;
        };
        let tally = pacer.tally();
        let secs = pacer.start.elapsed().as_secs_f64().max(1e-9);
        s += &format!(
            ", {what} limit {}/s (rank 0: {}/s of its {}/s share, waited {:.1} s over its threads)",
            human_bytes(rate),
            human_bytes((tally.bytes as f64 / secs) as u64),
            human_bytes(bucket.lock().unwrap().rate as u64),
            tally.waited.as_secs_f64()
        );
    }
    s
}

/// How a run kept to one limit, for the summary: job-wide figures.
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct RateReport {
    /// "read" or "write".
    pub(crate) what: &'static str,
    /// The job's limit in bytes per second.
    pub(crate) limit: u64,
    /// Bytes all ranks moved through the pacer.
    pub(crate) bytes: u64,
    /// The run's wall time, seconds.
    pub(crate) seconds: f64,
    /// The longest any rank waited on the limit, seconds.
    pub(crate) most_waited: f64,
}

impl RateReport {
    /// One summary line: the limit, the rate achieved over the run, and the wait.
    pub(crate) fn render(&self) -> String {
        format!(
            "  {} limit {}/s: achieved {}/s ({} in {:.2} s); waited on it up to {:.2} s on a rank\n",
            self.what,
            human_bytes(self.limit),
            human_bytes((self.bytes as f64 / self.seconds.max(1e-9)) as u64),
            human_bytes(self.bytes),
            self.seconds,
            self.most_waited
        )
    }
}

/// What this rank read and wrote through the pacers so far: (read, write).
pub(crate) fn tallies() -> (Tally, Tally) {
    PACERS
        .get()
        .map(|(r, w)| (r.tally(), w.tally()))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Moves `total` bytes in `chunk`-byte pieces through a bucket of `rate`, each piece after
    /// its wait (a simulated clock): when the last piece may go.
    fn finish_time(rate: f64, total: u64, chunk: u64) -> f64 {
        let mut b = Bucket::new(rate, 0.0);
        let mut now = 0.0;
        let mut moved = 0;
        while moved < total {
            now += b.take(now, chunk);
            moved += chunk;
        }
        now
    }

    #[test]
    fn a_rate_is_respected_over_a_simulated_clock() {
        // 8 MiB at 4 MiB/s, in pieces of every size: never sooner than B/R, and not later.
        for chunk in [512, 64 << 10, 1 << 20, 8 << 20] {
            let t = finish_time(4.0 * 1048576.0, 8 << 20, chunk);
            assert!((t - 2.0).abs() < 1e-9, "chunk {chunk}: {t}");
        }
    }

    #[test]
    fn idle_time_saves_up_one_burst_at_most() {
        let mut b = Bucket::new(1000.0, 0.0);
        // After 100 s idle only a quarter second's worth is free.
        assert_eq!(b.take(100.0, 250), 0.0);
        assert!((b.take(100.0, 1000) - 1.0).abs() < 1e-9);
    }

    #[test]
    fn concurrent_takers_queue_behind_the_debt() {
        let mut b = Bucket::new(100.0, 0.0);
        assert!((b.take(0.0, 100) - 1.0).abs() < 1e-9);
        // A second thread at the same moment waits for both.
        assert!((b.take(0.0, 100) - 2.0).abs() < 1e-9);
        // Once the first wait is over, the second's bytes are still owed.
        assert!((b.take(1.0, 0) - 1.0).abs() < 1e-9);
    }

    #[test]
    fn a_wait_on_a_limit_ends_at_a_stop_signal() {
        let hour = Duration::from_secs(3600);
        let start = Instant::now();
        let asked = std::cell::Cell::new(0);
        // The signal comes at the third look.
        let slept = sleep_unless_stopped(hour, || {
            asked.set(asked.get() + 1);
            (asked.get() >= 3).then_some(2)
        });
        assert!(slept < hour && start.elapsed() < hour, "{slept:?}");
        assert_eq!(asked.get(), 3);
        // Without one, the whole wait.
        let short = Duration::from_millis(120);
        assert!(sleep_unless_stopped(short, || None) >= short);
    }

    #[test]
    fn the_shares_split_the_job_rate_fairly() {
        for ranks in 1..=7 {
            let s = share(7 << 20, ranks);
            assert!((s * ranks as f64 - (7 << 20) as f64).abs() < 1e-3);
        }
        assert_eq!(share(100, 0), 100.0);
    }

    #[test]
    fn the_slower_limit_decides_the_least_time() {
        let l = Limits {
            read: Some(100),
            write: Some(50),
        };
        assert_eq!(l.least_seconds(1000, 1000), Some(20.0));
        assert_eq!(Limits::default().least_seconds(1000, 1000), None);
        let read_only = Limits {
            read: Some(100),
            write: None,
        };
        assert_eq!(read_only.least_seconds(1000, 5), Some(10.0));
    }
}
