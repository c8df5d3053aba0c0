//! Heartbeats for the whole job: every rank shows that it runs, whatever phase it is in, and
//! watches two neighbours, so that a rank that stopped (SIGSTOP, a frozen node, a process the
//! launcher did not see die) ends the job in any phase instead of leaving its peers waiting in a
//! collective forever.
//!
//! Each rank's heartbeat thread rewrites `rank-NNNNNN` in the heartbeat directory (on the shared
//! file system, inside the staging directory; where `--scratch` is each node's own, in the
//! output's object store beside it; moved beside the staging directory for publishing, see
//! [`Place`]) once a tick: a counter that moves every time, the
//! exchange round, the host and the phase. The thread runs beside the phase's own work, so a rank
//! that is only slow (a huge shard's index, an fsync of minutes at finish, a wait on a rate limit)
//! still beats; only a process that does not run at all goes silent.
//!
//! Rank r watches ranks r - 1 and r + 1 (mod P): two reads a tick at any scale, and every rank is
//! watched by two others. A neighbour whose counter has not moved for `--stall-timeout` ends the
//! job ([`crate::exit::Exit::Stall`]), naming it, its host and its phase.
//!
//! Silence is counted on the observer's own running time ([`LivedClock`]): a tick that took far
//! longer than a tick means the observer did not run either (its process was stopped, its VM
//! paused), and only a tick's worth of it counts. A job suspended as a whole (Slurm's `scontrol
//! suspend` stops every process) therefore wakes with every silence clock where it was: every
//! rank saw its own clock jump, and nobody counts the suspension against a peer that was stopped
//! with it. A rank stopped alone is different: its neighbours ran the whole time and counted
//! every second of its silence.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::comm::Aborter;
use crate::exit::Exit;
use crate::storage;

/// The interval between heartbeats for a `timeout`: a tenth of it, between 50 ms and 1 s.
pub(crate) fn tick_for(timeout: Duration) -> Duration {
    (timeout / 10).clamp(Duration::from_millis(50), Duration::from_secs(1))
}

/// Time as a thread lived it: a monotonic clock whose jumps are left out. Each step counts at
/// most two ticks; a longer one means the thread was not running (its process stopped, its
/// machine paused) and counts as two ticks only.
#[derive(Debug, Clone)]
pub(crate) struct LivedClock {
    last: Instant,
    cap: Duration,
    /// Steps that were cut short: the times this thread found it had not been running.
    pub(crate) gaps: u64,
}

impl LivedClock {
    /// A clock for a thread that wakes every `tick`, from `now`.
    pub(crate) fn new(tick: Duration, now: Instant) -> Self {
        LivedClock {
            last: now,
            cap: 2 * tick,
            gaps: 0,
        }
    }

    /// Moves to `now`: the time lived since the last step (the time passed, or two ticks when
    /// more passed).
    pub(crate) fn step(&mut self, now: Instant) -> Duration {
        let passed = now.saturating_duration_since(self.last);
        self.last = now;
        if passed > self.cap {
            self.gaps += 1;
            self.cap
        } else {
            passed
        }
    }
}

/// What a rank's heartbeat says besides that it runs: shared with the phases, which set it.
#[derive(Debug, Default)]
pub(crate) struct Pulse {
    /// The exchange round the rank is in.
    pub(crate) round: AtomicU64,
    /// The phase the rank is in, for the messages (`index`, `exchange`, ...).
    phase: Mutex<String>,
}

impl Pulse {
    /// Records that the rank is now in `phase`.
    pub(crate) fn phase(&self, phase: &str) {
        if let Ok(mut p) = self.phase.lock() {
            phase.clone_into(&mut p);
        }
    }

    fn current(&self) -> String {
        self.phase.lock().map(|p| p.clone()).unwrap_or_default()
    }
}

/// One heartbeat as written: `COUNTER ROUND HOST PHASE`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Beat {
    pub(crate) counter: u64,
    pub(crate) round: u64,
    pub(crate) host: String,
    pub(crate) phase: String,
}

impl Beat {
    fn render(&self) -> String {
        format!(
            "{} {} {} {}\n",
            self.counter, self.round, self.host, self.phase
        )
    }

    /// Reads a heartbeat file's text; `None` when it is not one.
    pub(crate) fn parse(text: &str) -> Option<Beat> {
        let mut words = text.split_whitespace();
        Some(Beat {
            counter: words.next()?.parse().ok()?,
            round: words.next()?.parse().ok()?,
            host: words.next()?.to_string(),
            phase: words.collect::<Vec<_>>().join(" "),
        })
    }
}

/// The heartbeat file of `rank` in `dir`.
pub(crate) fn path_of(dir: &Path, rank: usize) -> PathBuf {
    dir.join(format!("rank-{rank:06}"))
}

/// The ranks rank `me` of `ranks` watches: its neighbours on the ring.
pub(crate) fn neighbours(me: usize, ranks: usize) -> Vec<usize> {
    let mut n: Vec<usize> = [(me + ranks - 1) % ranks.max(1), (me + 1) % ranks.max(1)]
        .into_iter()
        .filter(|&r| r != me)
        .collect();
    n.dedup();
    n
}

/// A watched neighbour, as this rank saw it.
#[derive(Debug)]
pub(crate) struct Watched {
    pub(crate) rank: usize,
    /// Its last heartbeat (`None`: none seen yet).
    pub(crate) seen: Option<Beat>,
    /// Lived time of the observer since the heartbeat last moved (or since watching began).
    pub(crate) silent: Duration,
}

impl Watched {
    pub(crate) fn new(rank: usize) -> Self {
        Watched {
            rank,
            seen: None,
            silent: Duration::ZERO,
        }
    }

    /// Takes what its file says now (`None`: no heartbeat to read), `lived` after the last look.
    pub(crate) fn observe(&mut self, now: Option<Beat>, lived: Duration) {
        let moved = match (&self.seen, &now) {
            (_, None) => false,
            (None, Some(_)) => true,
            (Some(a), Some(b)) => a.counter != b.counter || a.host != b.host,
        };
        if moved {
            self.seen = now;
            self.silent = Duration::ZERO;
        } else {
            self.silent += lived;
        }
    }
}

/// Where a job's heartbeats are: `dir` inside the staging directory until publishing, then
/// `aside`, beside it, where rank 0 moves them before the publishing rename (they are no part of
/// the output, and the ranks go on beating through publishing, uploading and the summary).
/// `owner`: the staging directory's owner mark, checked while the heartbeats are in `dir`.
#[derive(Debug, Clone)]
pub(crate) struct Place {
    pub(crate) dir: PathBuf,
    pub(crate) aside: Option<PathBuf>,
    pub(crate) owner: Option<PathBuf>,
}

impl Place {
    /// The directory the heartbeats are in now: `dir`, else `aside`; `None` when neither is
    /// there (the run was taken over, or the job is over).
    fn now(&self) -> Option<&PathBuf> {
        let is_dir = |d: &&PathBuf| {
            storage::source(d)
                .stat(d)
                .is_ok_and(|s| s.kind == storage::Kind::Dir)
        };
        let Some(aside) = &self.aside else {
            // Heartbeats that never move (in an object store beside the output, see
            // crate::job::destination::scratch): a prefix is there once a beat is.
            return Some(&self.dir);
        };
        Some(&self.dir)
            .filter(is_dir)
            .or_else(|| Some(aside).filter(is_dir))
    }
}

/// What the phases tell a heartbeat thread: beat now (the phase changed), then say so.
enum Tell {
    BeatNow(Sender<()>),
}

/// A rank's heartbeat and its watch of its neighbours; dropping it stops both (at once).
pub(crate) struct Heartbeat {
    pub(crate) pulse: Arc<Pulse>,
    stop: Option<Sender<Tell>>,
    thread: Option<JoinHandle<()>>,
}

impl Heartbeat {
    /// Starts beating into `place` (every rank of the job at about the same point: the heartbeat
    /// directory exists and every rank has passed a collective) and watching the neighbours.
    /// After `timeout` of silence from one, prints who stopped answering and calls `abort`. A
    /// zero timeout writes and watches nothing.
    ///
    /// Before every heartbeat in the staging directory the thread checks that its owner mark
    /// still says what it said at the start: a run taken over while it was stopped (its staging
    /// moved aside, another run's in its place) writes nothing into its successor's directory
    /// when it wakes, and stops beating and watching (its own checks then fail the run).
    pub(crate) fn start(
        timeout: Duration,
        (me, ranks): (usize, usize),
        place: Place,
        abort: Aborter,
    ) -> Self {
        let pulse = Arc::new(Pulse::default());
        let (stop, told) = channel::<Tell>();
        let thread = (!timeout.is_zero()).then(|| {
            let pulse = Arc::clone(&pulse);
            std::thread::spawn(move || {
                beat_and_watch(timeout, (me, ranks), &place, &pulse, &told, &abort)
            })
        });
        Heartbeat {
            pulse,
            stop: Some(stop),
            thread,
        }
    }

    /// Records that the rank is now in `phase`, and has the thread beat with it at once (it
    /// waits for that beat, a second at most): a rank stopped right after still names its phase.
    pub(crate) fn phase(&self, phase: &str) {
        self.pulse.phase(phase);
        let (Some(stop), Some(_)) = (&self.stop, &self.thread) else {
            return;
        };
        let (done, beaten) = channel();
        if stop.send(Tell::BeatNow(done)).is_ok() {
            let _ = beaten.recv_timeout(Duration::from_secs(1));
        }
    }
}

/// A heartbeat thread's life: beats every tick into `place` and watches `me`'s neighbours,
/// until the phases stop it, its run was taken over, or a neighbour fell silent (`abort`).
fn beat_and_watch(
    timeout: Duration,
    (me, ranks): (usize, usize),
    place: &Place,
    pulse: &Pulse,
    told: &std::sync::mpsc::Receiver<Tell>,
    abort: &Aborter,
) {
    let tick = tick_for(timeout);
    let host = crate::sys::hostname();
    let mut clock = LivedClock::new(tick, Instant::now());
    let mut watched: Vec<Watched> = neighbours(me, ranks)
        .into_iter()
        .map(Watched::new)
        .collect();
    let mark = |p: &PathBuf| storage::source(p).read(p).ok();
    let ours = place.owner.as_ref().and_then(mark);
    let mut counter = 0u64;
    let mut asked: Option<Sender<()>> = None;
    loop {
        let Some(dir) = place.now() else {
            return;
        };
        // Another run's mark: taken over. No mark (the staging directory published, or moved
        // by a successor, whose heartbeats are elsewhere) stops nothing.
        if place
            .owner
            .as_ref()
            .and_then(mark)
            .is_some_and(|now| Some(&now) != ours.as_ref())
        {
            return;
        }
        counter += 1;
        let beat = Beat {
            counter,
            round: pulse.round.load(Ordering::Relaxed),
            host: host.clone(),
            phase: pulse.current(),
        };
        write_beat(dir, me, &beat);
        if let Some(done) = asked.take() {
            let _ = done.send(());
        }
        match told.recv_timeout(tick) {
            Err(RecvTimeoutError::Timeout) => {}
            Ok(Tell::BeatNow(done)) => {
                asked = Some(done);
                continue;
            }
            Err(RecvTimeoutError::Disconnected) => return,
        }
        let lived = clock.step(Instant::now());
        let Some(dir) = place.now() else {
            // The job is over (rank 0 removed the heartbeats): nothing left to watch.
            return;
        };
        for w in &mut watched {
            w.observe(read_beat(dir, w.rank), lived);
        }
        if let Some(w) = watched.iter().find(|w| w.silent >= timeout) {
            let publishing = *dir != place.dir;
            let staging = place.dir.parent();
            crate::errln!(
                "{}",
                stopped_message(w, (me, &host), &beat.phase, (staging, publishing))
            );
            // Give the launcher a moment to forward the message: an abort kills its stdio
            // relays too, and the message is the point.
            std::thread::sleep(Duration::from_millis(300));
            abort(Exit::Stall);
            return;
        }
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Writes this rank's heartbeat, aside and renamed: a rank stopped mid-write leaves the old one,
/// never an empty one. Best effort: a missing heartbeat only makes this rank look silent.
fn write_beat(dir: &Path, rank: usize, beat: &Beat) {
    let path = path_of(dir, rank);
    let sink = storage::sink(&path);
    if !sink.capabilities().rename {
        // In an object store (node-local scratch: crate::job::destination::scratch), where a
        // PUT is atomic: a reader sees the old beat or the new one.
        let _ = sink.write(&path, beat.render().as_bytes());
        return;
    }
    let tmp = dir.join(format!(".rank-{rank:06}"));
    let _ = storage::write_unsynced(&tmp, beat.render().as_bytes())
        .and_then(|()| storage::sink(&path).rename(&tmp, &path));
}

/// A rank's heartbeat as its file says it now.
pub(crate) fn read_beat(dir: &Path, rank: usize) -> Option<Beat> {
    let path = path_of(dir, rank);
    let bytes = storage::source(&path).read(&path).ok()?;
    Beat::parse(&String::from_utf8_lossy(&bytes))
}

/// What the rank that saw `w` go silent says. `staging`: the staging directory; `publishing`:
/// whether the heartbeats had moved aside for publishing (the output may be live by now).
fn stopped_message(
    w: &Watched,
    (me, host): (usize, &str),
    phase: &str,
    (staging, publishing): (Option<&Path>, bool),
) -> String {
    let whom = match &w.seen {
        Some(b) => format!(
            "rank {} on {} stopped answering in phase {}",
            w.rank,
            b.host,
            if b.phase.is_empty() { "?" } else { &b.phase }
        ),
        None => format!(
            "rank {} stopped answering (it never wrote a heartbeat)",
            w.rank
        ),
    };
    let outcome = match staging {
        _ if publishing => "aborting the job while it published: the output is there whole (its index.json names this run's shards) or not at all, never in part".to_string(),
        Some(d) if storage::sink(d).capabilities().rename => format!("aborting the job, nothing is published (the staging directory {} is left: a rerun with --resume continues from its last checkpoint, one without removes it)", d.display()),
        _ => "aborting the job, nothing is published".to_string(),
    };
    format!(
        "reshard: error: {whom}: its heartbeat has not moved for {} s (--stall-timeout) while rank {me} on {host} ran in phase {phase} \
         (only time this rank was running counts: a job suspended as a whole is no stall); {outcome}",
        w.silent.as_secs()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clock_jump_counts_as_two_ticks() {
        let t0 = Instant::now();
        let tick = Duration::from_millis(100);
        let mut clock = LivedClock::new(tick, t0);
        assert_eq!(clock.step(t0 + tick), tick);
        // Stopped for a minute: the thread did not run, so two ticks count.
        let after = t0 + tick + Duration::from_secs(60);
        assert_eq!(clock.step(after), 2 * tick);
        assert_eq!(clock.gaps, 1);
        assert_eq!(clock.step(after + tick), tick);
        assert_eq!(clock.gaps, 1);
    }

    fn beat(counter: u64) -> Option<Beat> {
        Some(Beat {
            counter,
            round: 0,
            host: "n1".into(),
            phase: "index".into(),
        })
    }

    #[test]
    fn silence_is_counted_in_the_observers_lived_time() {
        let tick = Duration::from_millis(100);
        let mut w = Watched::new(1);
        // Never beat: silent from the start.
        w.observe(None, tick);
        assert_eq!(w.silent, tick);
        w.observe(beat(1), tick);
        assert_eq!(w.silent, Duration::ZERO);
        // A stopped peer: its counter stays while the observer lives on.
        for _ in 0..30 {
            w.observe(beat(1), tick);
        }
        assert_eq!(w.silent, 30 * tick);
        w.observe(beat(2), tick);
        assert_eq!(w.silent, Duration::ZERO);
        // A whole job suspended: the observer's own clock jumped, so its step was two ticks, and
        // the peer beats again once it runs.
        let mut clock = LivedClock::new(tick, Instant::now());
        let step = clock.step(Instant::now() + Duration::from_secs(3600));
        w.observe(beat(2), step);
        assert!(w.silent <= 2 * tick);
        w.observe(beat(3), tick);
        assert_eq!(w.silent, Duration::ZERO);
    }

    #[test]
    fn heartbeats_round_trip_and_neighbours_form_a_ring() {
        let b = Beat {
            counter: 7,
            round: 3,
            host: "node-2".into(),
            phase: "exchange".into(),
        };
        assert_eq!(Beat::parse(&b.render()), Some(b));
        assert_eq!(Beat::parse(""), None);
        assert_eq!(Beat::parse("4 node1\n"), None);
        assert_eq!(neighbours(0, 1), Vec::<usize>::new());
        assert_eq!(neighbours(0, 2), vec![1]);
        assert_eq!(neighbours(1, 2), vec![0]);
        assert_eq!(neighbours(0, 3), vec![2, 1]);
        assert_eq!(neighbours(5, 8), vec![4, 6]);
    }

    /// A neighbour that never beats ends the job, naming it; one that beats does not.
    #[test]
    fn a_silent_neighbour_is_named_and_a_beating_one_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let tx = Mutex::new(tx);
        let timeout = Duration::from_millis(500);
        let abort: Aborter = Arc::new(move |e| {
            let _ = tx.lock().unwrap().send(e);
        });
        let at = || Place {
            dir: dir.path().to_path_buf(),
            aside: None,
            owner: None,
        };
        let live = Heartbeat::start(timeout, (1, 2), at(), Arc::clone(&abort));
        let watcher = Heartbeat::start(timeout, (0, 2), at(), abort);
        watcher.pulse.phase("index");
        std::thread::sleep(4 * timeout);
        assert!(rx.try_recv().is_err(), "fired while its neighbour beat");
        // Rank 1 stops beating (as a stopped process would): rank 0 ends the job.
        drop(live);
        let fired = rx
            .recv_timeout(Duration::from_secs(120))
            .expect("never fired");
        assert_eq!(fired, Exit::Stall);
        drop(watcher);
    }

    /// A run taken over while it was stopped finds another run's mark on the staging directory
    /// when it wakes: it writes no heartbeat there (that directory is its successor's).
    #[test]
    fn a_run_taken_over_writes_nothing_into_its_successors_staging() {
        let staging = tempfile::tempdir().unwrap();
        let (beats, owner) = (
            staging.path().join(".heartbeats"),
            staging.path().join(".reshard-owner"),
        );
        std::fs::create_dir(&beats).unwrap();
        std::fs::write(&owner, "run-a").unwrap();
        let abort: Aborter = Arc::new(|_| panic!("nothing to watch"));
        let timeout = Duration::from_millis(500);
        let place = Place {
            dir: beats.clone(),
            aside: None,
            owner: Some(owner.clone()),
        };
        let dog = Heartbeat::start(timeout, (0, 1), place, abort);
        let mine = path_of(&beats, 0);
        let start = Instant::now();
        while !mine.exists() {
            assert!(start.elapsed() < Duration::from_secs(60), "never beat");
            std::thread::sleep(Duration::from_millis(10));
        }
        // Run B took the output over: its mark, its directory.
        std::fs::write(&owner, "run-b").unwrap();
        std::fs::remove_file(&mine).unwrap();
        std::thread::sleep(4 * tick_for(timeout));
        assert!(!mine.exists(), "wrote into another run's staging directory");
        drop(dog);
    }
}
