//! One run at a time per output: rank 0 owns the output's staging directory through a lock file
//! beside it, `.NAME.reshard-lock`, from before it looks at the staging directory until the job
//! has published or given up. Two worlds on one output (`srun --mpi=none` starts one world per
//! task; two users; a rerun while the first run still lives) would race on the staging shards, so
//! the second refuses instead.
//!
//! The lock is created atomically with its content (written aside, then hard-linked into place,
//! which fails if it exists, on NFS too): a token unique to the run (128 random bits; a hostname
//! and pid are not unique across containers and reboots), the owner's host, boot id, PID
//! namespace, pid and process start time, and a heartbeat counter the owner rewrites every
//! second. The same token marks the staging directory ([`Staging::owner_file`]). A lock whose owner is
//! dead is stale and taken over: a lock from this boot and PID namespace by its pid (and start
//! time, against pid reuse), where that answer is certain; any other (another host, container
//! or boot) once its heartbeat has not moved for `--lock-stale-after` (no clocks compared).
//! Takeovers go through a second exclusive file, the guard, so that two newcomers never both
//! take one stale lock.
//!
//! A silent heartbeat does not prove death (a suspended job is silent too), so such a takeover
//! moves the staging directory aside ([`aside_path`]) instead of removing it, and the owner,
//! should it wake, checks its token on the lock and on the staging directory before finishing
//! and again before publishing ([`StagingLock::check_owned`]): it fails instead of publishing
//! another run's files.

use std::io::{self, ErrorKind};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};

use crate::job::staging::Staging;
use crate::storage;
use crate::sys;

/// The default `--lock-stale-after`: how long a lock whose pid cannot be checked must show no
/// heartbeat to be taken for dead. Minutes, so that a job its scheduler suspends for a while
/// (`scontrol suspend` stops every process) is not taken for dead.
pub const STALE_AFTER: Duration = Duration::from_secs(600);

/// How often the owner's heartbeat moves.
const BEAT: Duration = Duration::from_secs(1);

/// How long a newcomer watches a silent lock before it says how long until it takes over (a
/// live owner's heartbeat moves well within it, so a busy lock is refused without that note).
const QUIET_NOTE: Duration = Duration::from_secs(3);

/// Tries before giving up when other runs keep creating and taking over the lock.
const ATTEMPTS: usize = 6;

/// The lock file of the staging directory `staging` (`.NAME.reshard-tmp` -> `.NAME.reshard-lock`).
pub fn lock_path(staging: &Path) -> PathBuf {
    staging.with_file_name(format!("{}.reshard-lock", staging_base(staging)))
}

/// Where a takeover moves the staging directory of a run that may still live, beside it and
/// hidden: `.NAME.reshard-aside-TOKEN`, after that run's token, so that the run finds it.
pub fn aside_path(staging: &Path, token: &str) -> PathBuf {
    staging.with_file_name(format!("{}.reshard-aside-{token}", staging_base(staging)))
}

/// `.NAME` of the staging directory `.NAME.reshard-tmp`.
fn staging_base(staging: &Path) -> String {
    let name = staging.file_name().unwrap_or_default().to_string_lossy();
    name.strip_suffix(".reshard-tmp")
        .unwrap_or(&name)
        .to_string()
}

/// The takeover guard of the lock `lock`.
fn guard_path(lock: &Path) -> PathBuf {
    let name = lock.file_name().unwrap_or_default().to_string_lossy();
    lock.with_file_name(format!("{name}.takeover"))
}

/// Who holds a lock.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Owner {
    /// Unique to the run: 32 hex digits from the OS's random source (empty in a lock an older
    /// reshard wrote).
    token: String,
    host: String,
    /// `/proc/sys/kernel/random/boot_id` and the `/proc/self/ns/pid` link: a pid means the
    /// same process only within one boot and one PID namespace (empty where unknown).
    boot: String,
    pidns: String,
    pid: u32,
    /// The process's start time in clock ticks since boot (0 where unknown).
    start: u64,
    /// Seconds since the epoch when it took the lock.
    since: u64,
    beat: u64,
}

const HEADER: &str = "reshard staging lock\n";

impl Owner {
    fn me() -> Result<Owner> {
        let pid = std::process::id();
        Ok(Owner {
            token: new_token()?,
            host: sys::hostname(),
            boot: sys::boot_id(),
            pidns: sys::pid_namespace(),
            pid,
            start: sys::process_start(pid).unwrap_or(0),
            since: now_secs(),
            beat: 0,
        })
    }

    /// The file's content; the beat is last, at a fixed width, so it can be rewritten in place.
    fn render(&self) -> String {
        format!(
            "{HEADER}token {}\nhost {}\nboot {}\npidns {}\npid {}\nstart {}\nsince {}\nbeat {:020}\n",
            self.token, self.host, self.boot, self.pidns, self.pid, self.start, self.since, self.beat
        )
    }

    fn parse(text: &str) -> Option<Owner> {
        let body = text.strip_prefix(HEADER)?;
        let field = |name: &str| {
            body.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
                .map(str::to_string)
        };
        Some(Owner {
            // Absent in the locks of older versions: such a lock is judged by its heartbeat.
            token: field("token").unwrap_or_default(),
            host: field("host")?,
            boot: field("boot").unwrap_or_default(),
            pidns: field("pidns").unwrap_or_default(),
            pid: field("pid")?.parse().ok()?,
            start: field("start")?.parse().ok()?,
            since: field("since")?.parse().ok()?,
            beat: field("beat")?.parse().ok()?,
        })
    }

    /// The same holder, whatever its heartbeat says.
    fn same_holder(&self, other: &Owner) -> bool {
        (&self.token, &self.host, self.pid, self.start, self.since)
            == (
                &other.token,
                &other.host,
                other.pid,
                other.start,
                other.since,
            )
    }

    /// Whether `self`'s pid can be checked from `me`: the same boot and PID namespace. The
    /// hostname says nothing here: containers on one node may share it, and it may be reused.
    fn pid_checkable_from(&self, me: &Owner) -> bool {
        !self.boot.is_empty()
            && !self.pidns.is_empty()
            && (&self.boot, &self.pidns) == (&me.boot, &me.pidns)
    }

    /// "pid N on HOST", for messages.
    fn who(&self) -> String {
        format!("pid {} on {}", self.pid, self.host)
    }
}

/// What is known of a lock's holder.
#[derive(Debug, PartialEq, Eq)]
enum Holder {
    Alive,
    /// Dead: `surely` when its pid proved it, not when its heartbeat was only silent (a
    /// suspended run is silent too).
    Dead {
        surely: bool,
    },
    /// The lock changed hands or went away while it was looked at: look again.
    Changed,
}

/// The run whose lock this one took over.
struct Takeover {
    from: Owner,
    surely_dead: bool,
}

/// Rank 0's ownership of the staging directory; dropping it releases the lock.
pub struct StagingLock {
    path: PathBuf,
    owner: Owner,
    took_over: Option<Takeover>,
    /// Set by the heartbeat when it finds the lock gone or held by another run: why.
    lost: Arc<Mutex<Option<String>>>,
    stop: Option<Sender<()>>,
    beat: Option<JoinHandle<()>>,
}

impl StagingLock {
    /// Takes the lock `path` for the output `output`, taking over one whose holder is dead; a
    /// holder whose pid cannot be checked from here is dead once its heartbeat has not moved
    /// for `stale_after`.
    ///
    /// # Errors
    /// Another live run holds it (the message names its host and pid, and what to do), or the
    /// lock cannot be created.
    pub fn acquire(path: &Path, output: &Path, stale_after: Duration) -> Result<Self> {
        let me = Owner::me()?;
        let mut took_over = None;
        for _ in 0..ATTEMPTS {
            match create_exclusive(path, &me) {
                Ok(()) => return Ok(Self::hold(path, me, took_over)),
                Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
                Err(e) => {
                    // On a store, its error says what is wrong (credentials, endpoint).
                    let hint = if crate::storage::is_object_store(path) {
                        ""
                    } else {
                        " (is the output's parent writable?)"
                    };
                    return Err(e).with_context(|| {
                        format!(
                            "cannot create the staging directory's lock {}{hint}",
                            path.display()
                        )
                    });
                }
            }
            let Some(holder) = read_owner(path)? else {
                continue;
            };
            if holder == me {
                // Our own create: its answer was lost and the store's client sent it again
                // (an object store over a flaky network), which then found the lock there.
                return Ok(Self::hold(path, me, took_over));
            }
            match judge(path, &holder, &me, stale_after) {
                Holder::Alive => bail!(busy(output, path, &holder)),
                Holder::Dead { surely } => {
                    if take_over(path, &holder, &me, surely, stale_after)? {
                        took_over = Some(Takeover {
                            from: holder,
                            surely_dead: surely,
                        });
                    }
                }
                Holder::Changed => {}
            }
        }
        bail!(
            "{}: other runs kept taking this output's lock, or its takeover guard {} stayed in \
             place; is another reshard writing {}? If none is, remove both files",
            path.display(),
            guard_path(path).display(),
            output.display()
        )
    }

    /// Starts the heartbeat of a lock just created.
    fn hold(path: &Path, owner: Owner, took_over: Option<Takeover>) -> Self {
        let (stop, stopped) = channel::<()>();
        let lost = Arc::new(Mutex::new(None));
        let (p, o, l) = (path.to_path_buf(), owner.clone(), Arc::clone(&lost));
        let beat = std::thread::spawn(move || heartbeat(&p, o, &stopped, &l));
        StagingLock {
            path: path.to_path_buf(),
            owner,
            took_over,
            lost,
            stop: Some(stop),
            beat: Some(beat),
        }
    }

    /// Marks `staging` as this run's (its [`Staging::owner_file`] holds this run's token), once the
    /// staging directory exists or `--resume` continues it.
    ///
    /// # Errors
    /// The mark cannot be written.
    pub fn mark_staging(&self, staging: &Path) -> Result<()> {
        // Replaced atomically (POSIX: written aside and renamed; object storage: one PUT): a
        // newcomer reading it sees the old token or this one, never a part.
        let mark = Staging::at(staging).owner_file();
        storage::sink(&mark)
            .replace(&mark, format!("{}\n", self.owner.token).as_bytes())
            .with_context(|| format!("{}: cannot write", mark.display()))
    }

    /// Checks that this run still owns its lock and the staging directory `staging`: the
    /// heartbeat never found the lock in other hands, and both the lock and the staging
    /// directory's mark hold this run's token. Called right before the finish phase.
    ///
    /// # Errors
    /// Another run took the lock over (this run was silent longer than `--lock-stale-after`:
    /// suspended, stopped, or unable to write its heartbeat); the message names the lock and the
    /// staging directory, and says that nothing is published.
    pub fn check_owned(&self, staging: &Path) -> Result<()> {
        let lost = self.lost.lock().map(|l| l.clone()).unwrap_or_default();
        if let Some(why) = lost.or_else(|| self.lock_lost()) {
            bail!(
                "{}: this run lost the output's lock ({why}): another run took it over while \
                 this one was silent for longer than its --lock-stale-after (suspended, stopped, \
                 or unable to write the lock). Nothing is published; {} and what is in it are \
                 that run's now and left alone",
                self.path.display(),
                staging.display()
            );
        }
        let mark = Staging::at(staging).owner_file();
        let found = read_text(&mark).unwrap_or_default();
        if found.trim() != self.owner.token {
            bail!(
                "{}: the staging directory is not this run's any more ({} does not hold this \
                 run's token): another run moved it aside. Nothing is published",
                staging.display(),
                mark.display()
            );
        }
        Ok(())
    }

    /// That this run still holds the lock itself (an output without a staging directory of
    /// its own to check: an `s3://` output, right before its manifest is written).
    ///
    /// # Errors
    /// Another run took the lock over, or it was removed.
    pub fn check_held(&self) -> Result<()> {
        let lost = self.lost.lock().map(|l| l.clone()).unwrap_or_default();
        if let Some(why) = lost.or_else(|| self.lock_lost()) {
            bail!(
                "{}: this run lost the output's lock ({why}): nothing is published",
                self.path.display()
            );
        }
        Ok(())
    }

    /// [`Self::check_owned`], right before the publishing rename, and then the owner's mark is
    /// taken out of the staging directory so that it is not published with it.
    ///
    /// # Errors
    /// As [`Self::check_owned`], or the mark cannot be removed.
    pub fn check_before_publish(&self, staging: &Path) -> Result<()> {
        self.check_owned(staging)?;
        let mark = Staging::at(staging).owner_file();
        storage::sink(&mark)
            .remove_file(&mark)
            .with_context(|| format!("{}: cannot remove", mark.display()))
    }

    /// Why the lock file is not this run's any more, if it is not.
    fn lock_lost(&self) -> Option<String> {
        match read_owner(&self.path) {
            Ok(Some(now)) if now.same_holder(&self.owner) => None,
            Ok(Some(now)) => Some(format!("{} holds it now", now.who())),
            Ok(None) => Some("it was removed".into()),
            Err(e) => Some(format!("{e:#}")),
        }
    }

    /// A takeover of a run that may still live (judged by its silent heartbeat, not by its pid):
    /// that run's staging directory `staging` is moved aside, never removed, so that the run,
    /// should it wake, finds that it lost the output instead of finishing another run's files.
    /// Returns where it went.
    ///
    /// # Errors
    /// It cannot be renamed.
    pub fn set_aside_staging(&self, staging: &Path) -> Result<Option<PathBuf>> {
        let Some(t) = self.took_over.as_ref().filter(|t| !t.surely_dead) else {
            return Ok(None);
        };
        if storage::source(staging).stat_link(staging).is_err() {
            return Ok(None);
        }
        let mark = read_text(&Staging::at(staging).owner_file()).unwrap_or_default();
        let token = [mark.trim(), t.from.token.as_str()]
            .into_iter()
            .find(|t| is_token(t))
            .map_or_else(
                || format!("pid{}-{}", t.from.pid, t.from.since),
                str::to_string,
            );
        let aside = aside_path(staging, &token);
        storage::sink(staging)
            .rename(staging, &aside)
            .with_context(|| {
                format!(
                    "{}: cannot move the staging directory of the run that held {} aside to {}",
                    staging.display(),
                    self.path.display(),
                    aside.display()
                )
            })?;
        crate::errln!(
            "reshard: moved {} aside to {}: it belongs to the run that held {} ({}), which may \
             only be suspended, so it is not removed. That run removes it if it wakes (it then \
             fails without publishing); otherwise remove it once that run is surely gone, or \
             rename it back and rerun with --resume to continue it",
            staging.display(),
            aside.display(),
            self.path.display(),
            t.from.who()
        );
        Ok(Some(aside))
    }

    /// After a failure: whether the staging directory `staging` is still this run's to clean
    /// up. If another run took the lock over, it is not; then this run's own staging directory,
    /// where the takeover moved it, is removed (this run made it, and it lost the output).
    pub fn may_clean_up(&self, staging: &Path) -> bool {
        let lost = self.lost.lock().map(|l| l.is_some()).unwrap_or(true);
        if !lost && self.lock_lost().is_none() {
            return true;
        }
        let aside = aside_path(staging, &self.owner.token);
        let mine = read_text(&Staging::at(&aside).owner_file())
            .is_ok_and(|m| m.trim() == self.owner.token);
        if mine && storage::sink(&aside).remove_dir_all(&aside).is_ok() {
            crate::errln!(
                "reshard: removed {}: this run's staging directory, which the run that took \
                 over {} had moved aside",
                aside.display(),
                self.path.display()
            );
        }
        false
    }
}

impl Drop for StagingLock {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.beat.take() {
            let _ = t.join();
        }
        if self.lock_lost().is_none() {
            let _ = storage::sink(&self.path).remove_file(&self.path);
        }
    }
}

/// The owner's heartbeat: moves the beat every [`BEAT`] until told to stop. A failed write is
/// tried again at the next beat (a passing NFS error must not silence a live run for good);
/// a lock found gone or in other hands is recorded in `lost`, and then there is nothing left to
/// keep alive.
fn heartbeat(path: &Path, mut owner: Owner, stopped: &Receiver<()>, lost: &Mutex<Option<String>>) {
    let mut writes = Writes::default();
    while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(BEAT) {
        owner.beat += 1;
        let written = match rewrite_beat(path, &owner) {
            Ok(Some(why)) => {
                if let Ok(mut l) = lost.lock() {
                    *l = Some(why);
                }
                return;
            }
            Ok(None) => Ok(()),
            Err(e) => Err(e),
        };
        if let Some(line) = writes.after(path, written) {
            crate::errln!("{line}");
        }
    }
}

/// Whether the heartbeat's writes fail: each failing spell is told once, when it starts, and
/// once when it ends (a write failing every second must not print a line every second).
#[derive(Default)]
struct Writes {
    failing: bool,
}

impl Writes {
    /// The line to print after a write of the heartbeat, if it starts or ends a failing spell.
    fn after(&mut self, path: &Path, written: io::Result<()>) -> Option<String> {
        let was_failing = std::mem::replace(&mut self.failing, written.is_err());
        match written {
            Ok(()) => was_failing.then(|| {
                format!(
                    "reshard: {}: the heartbeat is written again",
                    path.display()
                )
            }),
            Err(e) => (!was_failing).then(|| {
                format!(
                    "reshard: warning: {}: cannot write the lock's heartbeat ({e}); trying \
                     again every second (a run that cannot check this one's pid takes the \
                     output over if it stays silent for --lock-stale-after)",
                    path.display()
                )
            }),
        }
    }
}

/// Why this run stops, and what to do.
fn busy(output: &Path, lock: &Path, holder: &Owner) -> String {
    format!(
        "--output {}: another reshard run is writing it ({}, for {} s); two runs must \
         not write one output, so this one stops without touching it. Wait for that run to end, \
         or choose another --output. Started by `srun --mpi=none`, or any launcher that starts \
         each task as a world of its own, every task is a run of its own: see slurm/README.md. \
         If no such run is alive, remove {}",
        output.display(),
        holder.who(),
        now_secs().saturating_sub(holder.since),
        lock.display()
    )
}

/// Creates `path` holding `owner`, atomically and only if it does not exist.
fn create_exclusive(path: &Path, owner: &Owner) -> io::Result<()> {
    storage::sink(path).create_new(path, owner.render().as_bytes())
}

/// The small file at `path` as text (a lock, a staging directory's owner mark).
fn read_text(path: &Path) -> io::Result<String> {
    let bytes = storage::source(path).read(path)?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// The holder named in `path`, or `None` if it does not exist (any more).
///
/// # Errors
/// It cannot be read, or it is not a reshard lock (then it is left alone).
fn read_owner(path: &Path) -> Result<Option<Owner>> {
    match read_text(path) {
        Ok(text) => match Owner::parse(&text) {
            Some(o) => Ok(Some(o)),
            None if text.is_empty() => Ok(None),
            None => bail!(
                "{}: not a reshard lock file; remove it if no reshard run writes this output",
                path.display()
            ),
        },
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(e) => {
            Err(e).with_context(|| format!("{}: cannot read the output's lock", path.display()))
        }
    }
}

/// Whether the lock at `path` may be held by a live run, without waiting to find out: false
/// where there is none, or its holder's pid, checkable from here, is gone (a lock
/// [`StagingLock::acquire`] takes over at once); true for any other, and for a file there that
/// is not a reshard lock.
pub fn may_be_held(path: &Path) -> bool {
    let (Ok(me), owner) = (Owner::me(), read_owner(path)) else {
        return true;
    };
    match owner {
        Ok(None) => false,
        Ok(Some(holder)) if holder.pid_checkable_from(&me) => {
            judge(path, &holder, &me, Duration::ZERO) == Holder::Alive
        }
        _ => true,
    }
}

/// Whether the holder of the lock (or guard) at `path` lives: by its pid and start time where
/// that pid means the same process here (same boot and PID namespace), else by its heartbeat,
/// watched for `window`.
fn judge(path: &Path, holder: &Owner, me: &Owner, window: Duration) -> Holder {
    if holder.pid_checkable_from(me) {
        let alive = sys::process_start(holder.pid)
            .is_some_and(|start| holder.start == 0 || start == holder.start);
        return if alive {
            Holder::Alive
        } else {
            Holder::Dead { surely: true }
        };
    }
    let watched = Instant::now();
    let mut told = false;
    while watched.elapsed() < window {
        std::thread::sleep(Duration::from_millis(200).min(window));
        match read_owner(path) {
            Ok(Some(now)) if now.same_holder(holder) => {
                if now.beat != holder.beat {
                    return Holder::Alive;
                }
            }
            _ => return Holder::Changed,
        }
        let silent = watched.elapsed();
        if note_due(told, silent, window) {
            told = true;
            crate::errln!(
                "reshard: {}: held by {}, whose pid cannot be checked from here (another \
                 machine, boot or PID namespace), and unchanged for {} s: taken for dead and \
                 taken over in {} s unless its heartbeat moves (--lock-stale-after {})",
                path.display(),
                holder.who(),
                silent.as_secs(),
                (window - silent).as_secs(),
                window.as_secs()
            );
        }
    }
    Holder::Dead { surely: false }
}

/// Whether [`judge`] tells that a silent holder will be taken for dead: once, after
/// [`QUIET_NOTE`] of silence, and only while the window runs (the note says how much is left).
fn note_due(told: bool, silent: Duration, window: Duration) -> bool {
    !told && silent >= QUIET_NOTE && silent < window
}

/// Removes the stale lock of `dead` through the takeover guard, so that two newcomers never
/// both take it. Whether it was removed (if not, the caller looks again).
///
/// # Errors
/// The guard cannot be created or is not a reshard lock file.
fn take_over(
    path: &Path,
    dead: &Owner,
    me: &Owner,
    surely: bool,
    stale_after: Duration,
) -> Result<bool> {
    let guard = guard_path(path);
    // Twice: once more right after clearing a stale guard.
    for _ in 0..2 {
        match create_exclusive(&guard, me) {
            Ok(()) => {
                let replaced = read_owner(path)?.is_some_and(|now| now.same_holder(dead));
                if replaced {
                    let why = if surely {
                        "is gone".to_string()
                    } else {
                        format!(
                            "has not moved its heartbeat for {} s (--lock-stale-after), so it is \
                             taken for dead",
                            stale_after.as_secs()
                        )
                    };
                    crate::errln!(
                        "reshard: taking over {}: its run ({}) {why}",
                        path.display(),
                        dead.who()
                    );
                    let _ = storage::sink(path).remove_file(path);
                }
                let _ = storage::sink(&guard).remove_file(&guard);
                return Ok(replaced);
            }
            Err(e) if e.kind() == ErrorKind::AlreadyExists => {
                if !clear_stale_guard(&guard, me, stale_after)? {
                    std::thread::sleep(BEAT);
                    return Ok(false);
                }
            }
            Err(e) => {
                return Err(e).with_context(|| {
                    format!("{}: cannot create the takeover guard", guard.display())
                });
            }
        }
    }
    Ok(false)
}

/// A takeover holds the guard for milliseconds; a guard left by a newcomer that died is judged
/// by the rules of the lock (its pid where it can be checked, else `stale_after` unchanged) and
/// removed. Whether the guard may be tried again.
fn clear_stale_guard(guard: &Path, me: &Owner, stale_after: Duration) -> Result<bool> {
    let Some(holder) = read_owner(guard)? else {
        return Ok(true);
    };
    match judge(guard, &holder, me, stale_after) {
        Holder::Alive => Ok(false),
        Holder::Changed => Ok(true),
        Holder::Dead { .. } => {
            if read_owner(guard)?.is_some_and(|now| now.same_holder(&holder)) {
                crate::errln!(
                    "reshard: removing the takeover guard {}: left by a run that is gone ({})",
                    guard.display(),
                    holder.who()
                );
                let _ = storage::sink(guard).remove_file(guard);
            }
            Ok(true)
        }
    }
}

/// Moves the heartbeat of the lock at `path` if `owner` still holds it: `Ok(None)`, or why it
/// does not. The check and the write go to the one object read ([`storage::Sink::update`]), so
/// that a lock another run put in its place meanwhile is never written to. The beat is last and
/// of fixed width, so only its digits change.
fn rewrite_beat(path: &Path, owner: &Owner) -> io::Result<Option<String>> {
    let mut why = None;
    let mut check = |old: &[u8]| {
        match Owner::parse(&String::from_utf8_lossy(old)) {
            Some(now) if now.same_holder(owner) => return Some(owner.render().into_bytes()),
            Some(now) => why = Some(format!("{} holds it now", now.who())),
            None => why = Some("it holds something else now".into()),
        }
        None
    };
    match storage::sink(path).update(path, &mut check) {
        Ok(_) => Ok(why),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(Some("it was removed".into())),
        Err(e) => Err(e),
    }
}

/// 128 bits from the OS's random source, as 32 hex digits.
pub fn new_token() -> Result<String> {
    let mut bytes = [0u8; 16];
    sys::random_bytes(&mut bytes)
        .context("/dev/urandom: cannot read a token for the output's lock")?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Whether `s` looks like a token (safe in a file name).
fn is_token(s: &str) -> bool {
    (16..=64).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_hexdigit())
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    const OUT: &str = "out";

    /// Someone else, as seen from here: another PID namespace on this very host (a container).
    fn elsewhere() -> Owner {
        let mut o = Owner::me().unwrap();
        o.pidns = "pid:[1]".into();
        o
    }

    fn beat_of(path: &Path) -> u64 {
        read_owner(path).unwrap().unwrap().beat
    }

    /// Waits (generously) until `cond` holds.
    fn wait_for(what: &str, cond: impl Fn() -> bool) {
        let start = Instant::now();
        while !cond() {
            assert!(start.elapsed() < Duration::from_secs(60), "never: {what}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn the_lock_and_aside_names_follow_the_staging_directory() {
        let staging = Path::new("/d/.out.reshard-tmp");
        assert_eq!(lock_path(staging), Path::new("/d/.out.reshard-lock"));
        assert_eq!(
            aside_path(staging, "ab12"),
            Path::new("/d/.out.reshard-aside-ab12")
        );
        assert_eq!(
            guard_path(&lock_path(staging)),
            Path::new("/d/.out.reshard-lock.takeover")
        );
    }

    #[test]
    fn tokens_are_unique_and_the_lock_reads_back() {
        let (a, b) = (Owner::me().unwrap(), Owner::me().unwrap());
        assert_ne!(a.token, b.token);
        assert!(is_token(&a.token) && a.token.len() == 32, "{}", a.token);
        assert!(!is_token("../x") && !is_token(""));
        assert!(!a.boot.is_empty() && a.pidns.starts_with("pid:"), "{a:?}");
        assert_eq!(Owner::parse(&a.render()), Some(a.clone()));
        // An older reshard's lock (no token, boot or PID namespace) is read, and its pid is
        // never trusted.
        let old = format!("{HEADER}host h\npid 1\nstart 2\nsince 3\nbeat {:020}\n", 4);
        let old = Owner::parse(&old).unwrap();
        assert!(old.token.is_empty() && !old.pid_checkable_from(&a));
        assert!(a.pid_checkable_from(&b) && !elsewhere().pid_checkable_from(&a));
    }

    #[test]
    fn a_live_pid_with_another_start_time_is_dead() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join(".x.reshard-lock");
        let me = Owner::me().unwrap();
        let alive = |o: &Owner| judge(&path, o, &me, Duration::ZERO);
        assert_eq!(alive(&me), Holder::Alive);
        // This very pid, started at another time: the pid was reused, its holder is dead.
        let mut reused = me.clone();
        reused.start += 1;
        assert_eq!(alive(&reused), Holder::Dead { surely: true });
        reused.start = 0;
        assert_eq!(
            alive(&reused),
            Holder::Alive,
            "start unknown: the pid decides"
        );
    }

    #[test]
    fn one_holder_at_a_time_and_a_dead_one_is_replaced() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join(".out.reshard-lock");
        let window = Duration::from_secs(60);
        let lock = StagingLock::acquire(&path, Path::new(OUT), window).unwrap();
        let again = StagingLock::acquire(&path, Path::new(OUT), window).map(|_| ());
        let msg = format!("{:#}", again.unwrap_err());
        assert!(
            msg.contains("another reshard run")
                && msg.contains(&format!("pid {}", std::process::id())),
            "{msg}"
        );
        drop(lock);
        assert!(!path.exists(), "released");
        // A lock of a process that is gone (beyond any pid_max), surely dead by its pid.
        let mut dead = Owner::me().unwrap();
        dead.pid = u32::MAX - 1;
        create_exclusive(&path, &dead).unwrap();
        let lock = StagingLock::acquire(&path, Path::new(OUT), window).unwrap();
        assert_eq!(read_owner(&path).unwrap().unwrap().pid, std::process::id());
        assert!(lock.took_over.as_ref().is_some_and(|t| t.surely_dead));
        drop(lock);
    }

    #[test]
    fn another_pid_namespace_or_boot_is_judged_by_its_heartbeat() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join(".x.reshard-lock");
        let me = Owner::me().unwrap();
        // Same host name and a pid that lives here (this test's own), but another namespace or
        // boot: the pid says nothing.
        let mut other_boot = me.clone();
        other_boot.boot = "another-boot".into();
        for other in [elsewhere(), other_boot] {
            let _ = fs::remove_file(&path);
            create_exclusive(&path, &other).unwrap();
            let window = Duration::from_millis(600);
            assert_eq!(
                judge(&path, &other, &me, window),
                Holder::Dead { surely: false }
            );
            // Beating: alive.
            let (p, o) = (path.clone(), other.clone());
            let beating = std::thread::spawn(move || {
                let mut o = o;
                for _ in 0..5 {
                    std::thread::sleep(Duration::from_millis(100));
                    o.beat += 1;
                    rewrite_beat(&p, &o).unwrap();
                }
            });
            assert_eq!(judge(&path, &other, &me, window), Holder::Alive);
            beating.join().unwrap();
        }
    }

    #[test]
    fn a_lock_that_changed_hands_while_watched_is_looked_at_again() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join(".x.reshard-lock");
        let me = Owner::me().unwrap();
        let (first, mut second) = (elsewhere(), elsewhere());
        assert_ne!(first.token, second.token);
        // The newcomer read `first`; by the time it looks again, `second` holds the lock (and
        // has beaten): that is not `first` being alive.
        second.beat = first.beat + 1;
        create_exclusive(&path, &second).unwrap();
        let window = Duration::from_millis(600);
        assert_eq!(judge(&path, &first, &me, window), Holder::Changed);
        fs::remove_file(&path).unwrap();
        assert_eq!(judge(&path, &first, &me, window), Holder::Changed);
    }

    #[test]
    fn the_takeover_note_comes_once_after_a_quiet_spell_inside_the_window() {
        let s = Duration::from_secs;
        let window = s(10);
        assert!(!note_due(
            false,
            QUIET_NOTE - Duration::from_millis(1),
            window
        ));
        assert!(note_due(false, QUIET_NOTE, window));
        assert!(note_due(false, s(5), window));
        assert!(!note_due(true, s(5), window), "once");
        // At or past the window's end the holder is taken over now: nothing left to announce.
        assert!(!note_due(false, window, window));
        assert!(!note_due(false, s(11), window));
    }

    /// A run that holds `path` as `owner` without a heartbeat (a suspended run).
    fn silent(path: &Path, owner: Owner) -> StagingLock {
        create_exclusive(path, &owner).unwrap();
        StagingLock {
            path: path.to_path_buf(),
            owner,
            took_over: None,
            lost: Arc::new(Mutex::new(None)),
            stop: None,
            beat: None,
        }
    }

    #[test]
    fn a_silent_owner_is_taken_over_and_finds_its_staging_moved_aside() {
        let tmp = tempfile::tempdir().unwrap();
        let staging = tmp.path().join(".out.reshard-tmp");
        let path = lock_path(&staging);
        let paused = silent(&path, elsewhere());
        fs::create_dir(&staging).unwrap();
        paused.mark_staging(&staging).unwrap();
        fs::write(staging.join("shard"), b"A's").unwrap();
        paused.check_owned(&staging).unwrap();

        let window = Duration::from_millis(600);
        let newcomer = StagingLock::acquire(&path, Path::new(OUT), window).unwrap();
        let aside = newcomer.set_aside_staging(&staging).unwrap().unwrap();
        assert_eq!(aside, aside_path(&staging, &paused.owner.token));
        assert_eq!(
            fs::read(aside.join("shard")).unwrap(),
            b"A's",
            "moved, not removed"
        );
        fs::create_dir(&staging).unwrap();
        newcomer.mark_staging(&staging).unwrap();

        // The paused run wakes: it owns neither the lock nor the staging directory.
        let msg = format!("{:#}", paused.check_owned(&staging).unwrap_err());
        assert!(
            msg.contains(&path.display().to_string())
                && msg.contains("lost the output's lock")
                && msg.contains("Nothing is published"),
            "{msg}"
        );
        assert!(!paused.may_clean_up(&staging));
        assert!(
            !aside.exists(),
            "its own staging directory, moved aside, is removed"
        );
        assert!(
            Staging::at(&staging).owner_file().exists(),
            "the newcomer's is not"
        );
        drop(paused);
        assert!(path.exists(), "the newcomer's lock stays");
        newcomer.check_before_publish(&staging).unwrap();
        assert!(
            !Staging::at(&staging).owner_file().exists(),
            "the mark is not published"
        );
    }

    #[test]
    fn a_foreign_mark_on_the_staging_directory_fails_the_check() {
        let tmp = tempfile::tempdir().unwrap();
        let staging = tmp.path().join(".out.reshard-tmp");
        let lock = StagingLock::acquire(&lock_path(&staging), Path::new(OUT), STALE_AFTER).unwrap();
        fs::create_dir(&staging).unwrap();
        fs::write(
            Staging::at(&staging).owner_file(),
            format!("{}\n", elsewhere().token),
        )
        .unwrap();
        let msg = format!("{:#}", lock.check_before_publish(&staging).unwrap_err());
        assert!(
            msg.contains(&staging.display().to_string()) && msg.contains("not this run's"),
            "{msg}"
        );
        assert!(
            Staging::at(&staging).owner_file().exists(),
            "not taken out when not ours"
        );
        lock.mark_staging(&staging).unwrap();
        lock.check_owned(&staging).unwrap();
    }

    #[test]
    fn the_heartbeat_survives_failed_writes_and_notices_a_takeover() {
        let tmp = tempfile::tempdir().unwrap();
        let staging = tmp.path().join(".out.reshard-tmp");
        let path = lock_path(&staging);
        let lock = StagingLock::acquire(&path, Path::new(OUT), STALE_AFTER).unwrap();
        fs::create_dir(&staging).unwrap();
        lock.mark_staging(&staging).unwrap();
        // Writes fail for a while: a directory in the lock's place (swapped atomically, so the
        // lock never looks removed).
        let blocker = tmp.path().join("blocker");
        fs::create_dir(&blocker).unwrap();
        crate::sys::exchange_paths(&path, &blocker).unwrap();
        std::thread::sleep(3 * BEAT);
        crate::sys::exchange_paths(&path, &blocker).unwrap();
        let before = beat_of(&path);
        wait_for("the heartbeat moves again", || beat_of(&path) > before);
        lock.check_owned(&staging).unwrap();

        // Another run takes the lock: the heartbeat records it, and that stands even if the
        // lock file were put back.
        let mine = fs::read(&path).unwrap();
        fs::remove_file(&path).unwrap();
        create_exclusive(&path, &elsewhere()).unwrap();
        wait_for("the heartbeat notices", || {
            lock.lost.lock().unwrap().is_some()
        });
        fs::write(&path, mine).unwrap();
        let msg = format!("{:#}", lock.check_owned(&staging).unwrap_err());
        assert!(msg.contains("holds it now"), "{msg}");
    }

    #[test]
    fn a_guard_left_by_a_dead_run_elsewhere_is_cleared() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join(".out.reshard-lock");
        let guard = guard_path(&path);
        create_exclusive(&path, &elsewhere()).unwrap();
        create_exclusive(&guard, &elsewhere()).unwrap();
        let window = Duration::from_millis(600);
        let lock = StagingLock::acquire(&path, Path::new(OUT), window).unwrap();
        assert!(!guard.exists());
        assert!(lock.took_over.as_ref().is_some_and(|t| !t.surely_dead));
        drop(lock);
        // A guard whose holder lives here (this process) is waited for; the message names it.
        let mut dead = Owner::me().unwrap();
        dead.pid = u32::MAX - 1;
        create_exclusive(&path, &dead).unwrap();
        create_exclusive(&guard, &Owner::me().unwrap()).unwrap();
        let err = StagingLock::acquire(&path, Path::new(OUT), window).map(|_| ());
        let msg = format!("{:#}", err.unwrap_err());
        assert!(msg.contains(&guard.display().to_string()), "{msg}");
    }

    #[test]
    fn a_lock_that_cannot_be_made_or_read_is_reported_as_such() {
        let tmp = tempfile::tempdir().unwrap();
        let window = Duration::from_millis(600);
        let acquire = |path: &Path| {
            let got = StagingLock::acquire(path, Path::new(OUT), window).map(|_| ());
            format!("{:#}", got.unwrap_err())
        };
        let nowhere = tmp.path().join("missing").join(".out.reshard-lock");
        let msg = acquire(&nowhere);
        assert!(
            msg.contains("cannot create the staging directory's lock")
                && msg.contains(&nowhere.display().to_string()),
            "{msg}"
        );
        // A directory where the lock is: it exists but cannot be read.
        let path = tmp.path().join(".out.reshard-lock");
        fs::create_dir(&path).unwrap();
        let msg = acquire(&path);
        assert!(msg.contains("cannot read the output's lock"), "{msg}");
        fs::remove_dir(&path).unwrap();
        // Not a lock of reshard's: left alone.
        fs::write(&path, b"mine\n").unwrap();
        let msg = acquire(&path);
        assert!(msg.contains("not a reshard lock file"), "{msg}");
        assert_eq!(fs::read(&path).unwrap(), b"mine\n");
        // An empty file is a lock still being written (object storage): no holder yet.
        fs::write(&path, b"").unwrap();
        assert_eq!(read_owner(&path).unwrap(), None);
    }

    #[test]
    fn a_takeover_guard_that_cannot_be_created_is_reported() {
        let tmp = tempfile::tempdir().unwrap();
        // A lock name so long that the guard's (and the file it is written to first) is over
        // the file system's limit of 255 bytes while the lock's own fits.
        let path = tmp
            .path()
            .join(format!(".{}.reshard-lock", "o".repeat(220)));
        let mut dead = Owner::me().unwrap();
        dead.pid = u32::MAX - 1;
        create_exclusive(&path, &dead).unwrap();
        let got = StagingLock::acquire(&path, Path::new(OUT), STALE_AFTER).map(|_| ());
        let msg = format!("{:#}", got.unwrap_err());
        assert!(msg.contains("cannot create the takeover guard"), "{msg}");
        assert_eq!(read_owner(&path).unwrap(), Some(dead), "left as it was");
    }

    #[test]
    fn a_run_that_holds_its_lock_cleans_up_after_itself() {
        let tmp = tempfile::tempdir().unwrap();
        let staging = tmp.path().join(".out.reshard-tmp");
        let lock = StagingLock::acquire(&lock_path(&staging), Path::new(OUT), STALE_AFTER).unwrap();
        assert!(lock.may_clean_up(&staging));
    }

    #[test]
    fn a_lock_removed_under_its_run_is_lost() {
        let tmp = tempfile::tempdir().unwrap();
        let staging = tmp.path().join(".out.reshard-tmp");
        fs::create_dir(&staging).unwrap();
        let path = lock_path(&staging);
        // Without a heartbeat, the check itself finds it gone.
        let paused = silent(&path, elsewhere());
        paused.mark_staging(&staging).unwrap();
        fs::remove_file(&path).unwrap();
        let msg = format!("{:#}", paused.check_owned(&staging).unwrap_err());
        assert!(msg.contains("(it was removed)"), "{msg}");
        drop(paused);
        // With one, the heartbeat finds it gone first.
        let lock = StagingLock::acquire(&path, Path::new(OUT), STALE_AFTER).unwrap();
        fs::remove_file(&path).unwrap();
        wait_for("the heartbeat notices", || {
            lock.lost.lock().unwrap().is_some()
        });
        let why = lock.lost.lock().unwrap().clone();
        assert_eq!(why.as_deref(), Some("it was removed"));
    }

    #[test]
    fn a_dead_guard_is_cleared_within_one_takeover_and_a_live_one_stays() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join(".out.reshard-lock");
        let guard = guard_path(&path);
        let me = Owner::me().unwrap();
        let mut dead = Owner::me().unwrap();
        dead.pid = u32::MAX - 1;
        create_exclusive(&path, &dead).unwrap();
        create_exclusive(&guard, &dead).unwrap();
        assert!(take_over(&path, &dead, &me, true, STALE_AFTER).unwrap());
        assert!(!path.exists() && !guard.exists());
        // A guard whose holder lives (this process) is not cleared: wait for it.
        create_exclusive(&path, &dead).unwrap();
        create_exclusive(&guard, &me).unwrap();
        assert!(!clear_stale_guard(&guard, &me, STALE_AFTER).unwrap());
        assert!(!take_over(&path, &dead, &me, true, STALE_AFTER).unwrap());
        assert!(path.exists() && guard.exists());
    }

    #[test]
    fn a_busy_output_says_for_how_long_its_run_has_held_it() {
        let mut holder = elsewhere();
        holder.since = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs()
            - 3600;
        let msg = busy(Path::new(OUT), Path::new(".out.reshard-lock"), &holder);
        // 3600 s, or a second more if the clock ticked between.
        assert!(
            msg.contains(&format!("({}, for 360", holder.who())),
            "{msg}"
        );
    }

    #[test]
    fn a_failing_heartbeat_is_told_once_when_it_starts_and_once_when_it_ends() {
        let path = Path::new(".out.reshard-lock");
        let mut writes = Writes::default();
        let failed = || Err(io::Error::from(ErrorKind::PermissionDenied));
        let said: Vec<Option<String>> = [Ok(()), failed(), failed(), failed(), Ok(()), Ok(())]
            .into_iter()
            .chain([failed(), Ok(())])
            .map(|w| writes.after(path, w))
            .collect();
        let told: Vec<usize> = (0..said.len()).filter(|&i| said[i].is_some()).collect();
        assert_eq!(told, [1, 4, 6, 7], "{said:?}");
        let line = said[1].as_deref().unwrap();
        assert!(
            line.contains("cannot write the lock's heartbeat")
                && line.contains(".out.reshard-lock"),
            "{line}"
        );
        assert!(said[4]
            .as_deref()
            .unwrap()
            .contains("the heartbeat is written again"));
    }

    #[test]
    fn a_lock_taken_over_or_lost_is_no_longer_held() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join(".out.reshard-lock");
        let lock = StagingLock::acquire(&path, Path::new(OUT), STALE_AFTER).unwrap();
        lock.check_held().unwrap();
        drop(lock);
        // Without a heartbeat, the check itself reads the lock: another run's now.
        let paused = silent(&path, elsewhere());
        paused.check_held().unwrap();
        let other = elsewhere();
        fs::remove_file(&path).unwrap();
        create_exclusive(&path, &other).unwrap();
        let msg = format!("{:#}", paused.check_held().unwrap_err());
        assert!(
            msg.contains(&path.display().to_string())
                && msg.contains(&format!("({} holds it now)", other.who()))
                && msg.contains("nothing is published"),
            "{msg}"
        );
        // What the heartbeat found stands, even with the lock back in this run's hands.
        fs::remove_file(&path).unwrap();
        create_exclusive(&path, &paused.owner).unwrap();
        paused.check_held().unwrap();
        *paused.lost.lock().unwrap() = Some("found by the heartbeat".into());
        let msg = format!("{:#}", paused.check_held().unwrap_err());
        assert!(msg.contains("(found by the heartbeat)"), "{msg}");
    }

    #[test]
    fn only_a_takeover_of_a_run_that_may_live_moves_its_staging_aside() {
        let tmp = tempfile::tempdir().unwrap();
        let staging = tmp.path().join(".out.reshard-tmp");
        let path = lock_path(&staging);
        fs::create_dir(&staging).unwrap();
        // No takeover: nothing to move.
        let lock = StagingLock::acquire(&path, Path::new(OUT), STALE_AFTER).unwrap();
        assert_eq!(lock.set_aside_staging(&staging).unwrap(), None);
        drop(lock);
        // A holder whose pid proved it gone cannot wake: its staging directory stays.
        let mut dead = Owner::me().unwrap();
        dead.pid = u32::MAX - 1;
        create_exclusive(&path, &dead).unwrap();
        let lock = StagingLock::acquire(&path, Path::new(OUT), STALE_AFTER).unwrap();
        assert!(lock.took_over.as_ref().is_some_and(|t| t.surely_dead));
        assert_eq!(lock.set_aside_staging(&staging).unwrap(), None);
        assert!(staging.is_dir() && !aside_path(&staging, &dead.token).exists());
    }
}
