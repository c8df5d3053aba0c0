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
//! A silent heartbeat does not prove death (a suspended job is silent too), so a run that took
//! the lock over that way never continues or removes the earlier run's staging directory. It
//! need not move it either: every run stages in a directory named after its own token
//! ([`crate::job::destination::staging::run_dir`]), so the earlier run, should it wake, writes only into its
//! own directory, where no successor looks. It then checks its token on the lock and on its
//! staging directory before finishing and again before publishing ([`OutputLock::check_owned`]),
//! and fails instead of publishing.

use std::io::{self, ErrorKind};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};

use crate::job::destination::makers::Process;
use crate::job::destination::staging::Staging;
use crate::storage;
use crate::sys;

/// The default `--lock-stale-after` (`cli/args.rs` gives clap the same 600 s), for the tests'
/// runs: how long a lock whose pid cannot be checked must show no heartbeat to be taken for
/// dead. Minutes, so that a job its scheduler suspends for a while (`scontrol suspend` stops
/// every process) is not taken for dead.
#[cfg(test)]
pub(crate) const STALE_AFTER: Duration = Duration::from_secs(600);

/// How often the owner's heartbeat moves.
const BEAT: Duration = Duration::from_secs(1);

/// How long a newcomer watches a silent lock before it says how long until it takes over (a
/// live owner's heartbeat moves well within it, so a busy lock is refused without that note).
const QUIET_NOTE: Duration = Duration::from_secs(3);

/// Tries before giving up when other runs keep creating and taking over the lock.
const ATTEMPTS: usize = 6;

/// The lock file beside the staging pointer `staging` (`.NAME.reshard-tmp` -> `.NAME.reshard-lock`).
pub(crate) fn lock_path(staging: &Path) -> PathBuf {
    staging.with_file_name(format!("{}.reshard-lock", staging_base(staging)))
}

/// The lock of the output `target` on every store, one name: `.NAME.reshard-lock` beside it
/// (beside its staging pointer, on a file system), outside what the output holds.
pub(crate) fn lock_of(target: &Path) -> PathBuf {
    let (parent, name) = (target.parent().unwrap_or(Path::new("")), target.file_name());
    lock_path(&crate::job::destination::staging::path_for(
        parent,
        name.unwrap_or_default(),
    ))
}

/// `.NAME` of the staging pointer `.NAME.reshard-tmp`.
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
        let Process {
            host,
            boot,
            pidns,
            pid,
            start,
        } = Process::me();
        Ok(Owner {
            token: new_token()?,
            host,
            boot,
            pidns,
            pid,
            start,
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
        self.lives(me).is_some()
    }

    /// Whether its process lives, asked from `me` ([`Process::lives`]).
    fn lives(&self, me: &Owner) -> Option<bool> {
        self.process().lives(&me.process())
    }

    fn process(&self) -> Process {
        Process {
            host: self.host.clone(),
            boot: self.boot.clone(),
            pidns: self.pidns.clone(),
            pid: self.pid,
            start: self.start,
        }
    }

    /// "pid N on HOST", for messages.
    fn who(&self) -> String {
        self.process().who()
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
pub(crate) struct OutputLock {
    path: PathBuf,
    owner: Owner,
    took_over: Option<Takeover>,
    /// Set by the heartbeat when it finds the lock gone or held by another run: why.
    lost: Arc<Mutex<Option<String>>>,
    stop: Option<Sender<()>>,
    beat: Option<JoinHandle<()>>,
}

impl OutputLock {
    /// Takes the lock `path` for the output `output`, taking over one whose holder is dead; a
    /// holder whose pid cannot be checked from here is dead once its heartbeat has not moved
    /// for `stale_after`.
    ///
    /// # Errors
    /// Another live run holds it (the message names its host and pid, and what to do), or the
    /// lock cannot be created.
    pub(crate) fn acquire(path: &Path, output: &Path, stale_after: Duration) -> Result<Self> {
        let me = Owner::me()?;
        let mut took_over = None;
        for _ in 0..ATTEMPTS {
            match create_exclusive(path, &me) {
                Ok(()) => return Ok(Self::hold(path, me, took_over)),
                Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
                Err(e) => {
                    // On a file system, permissions; on an object store (no directories to
                    // rename in), its error says what is wrong (credentials, endpoint).
                    let hint = if crate::storage::sink(path).capabilities().rename {
                        " (is the output's parent writable?)"
                    } else {
                        ""
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
        OutputLock {
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
    pub(crate) fn mark_staging(&self, staging: &Path) -> Result<()> {
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
    pub(crate) fn check_owned(&self, staging: &Path) -> Result<()> {
        let lost = self.lost.lock().map(|l| l.clone()).unwrap_or_default();
        if let Some(why) = lost.or_else(|| self.lock_lost()) {
            bail!(
                "{}: this run lost the output's lock ({why}): another run took it over while \
                 this one was silent for longer than its --lock-stale-after (suspended, stopped, \
                 or unable to write the lock). Nothing is published; {} is this run's own \
                 staging directory, which that run does not use",
                self.path.display(),
                staging.display()
            );
        }
        let mark = Staging::at(staging).owner_file();
        let found = read_text(&mark).unwrap_or_default();
        if found.trim() != self.owner.token {
            bail!(
                "{}: the staging directory is not this run's any more ({} does not hold this \
                 run's token). Nothing is published",
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
    pub(crate) fn check_held(&self) -> Result<()> {
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
    pub(crate) fn check_before_publish(&self, staging: &Path) -> Result<()> {
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

    /// This run's token, which the lock holds while this run holds it.
    pub(crate) fn token(&self) -> &str {
        &self.owner.token
    }

    /// The token of the run whose lock this one took over when that run may only be suspended
    /// (judged by its silent heartbeat, not by its pid): what it made is left to it.
    pub(crate) fn taken_from_silent(&self) -> Option<&str> {
        self.took_over
            .as_ref()
            .filter(|t| !t.surely_dead)
            .map(|t| t.from.token.as_str())
    }

    /// Whether this run found the lock free (it took over no run's): the run that held it last
    /// released it, having ended.
    pub(crate) fn found_free(&self) -> bool {
        self.took_over.is_none()
    }

    /// This run's own staging directory beside the staging `pointer`, named after its token:
    /// no other run's path leads there.
    pub(crate) fn run_dir(&self, pointer: &Path) -> PathBuf {
        crate::job::destination::staging::run_dir(pointer, &self.owner.token)
    }

    /// The token of the run this one took the lock from, when its pid proved it dead.
    pub(crate) fn dead_predecessor(&self) -> Option<&str> {
        let t = self.took_over.as_ref()?;
        (t.surely_dead && is_token(&t.from.token)).then_some(t.from.token.as_str())
    }

    /// Whether the staging directory `earlier`, where the staging `pointer` led when this run
    /// took the lock, is this run's to continue (`--resume`) or remove: yes, unless this run
    /// took the lock over from a run that may only be suspended (judged by its silent
    /// heartbeat, not by its pid). That directory is then left to that run (which removes it if
    /// it wakes: it fails without publishing), and said so; one at the pointer's own path (an
    /// older reshard's) is renamed beside it first, so that the pointer can lead to this run's.
    ///
    /// # Errors
    /// Such a directory cannot be renamed.
    pub(crate) fn may_take(&self, earlier: &Path, pointer: &Path) -> Result<bool> {
        let Some(t) = self.took_over.as_ref() else {
            return Ok(true);
        };
        if t.surely_dead {
            // Only the directory of the run whose death its pid proved: a pointer that leads
            // elsewhere was set by a run that lost the lock in the meantime, which may live.
            let named = earlier
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.rsplit_once('.'))
                .map(|(_, token)| token);
            let other = is_token(&t.from.token)
                && earlier != pointer
                && named.is_some_and(|n| n != t.from.token);
            if !other {
                return Ok(true);
            }
            crate::errln!(
                "reshard: left {} alone: the staging pointer {} leads there, but the run that \
                 held {} ({}, gone) staged elsewhere, so that directory may belong to a run \
                 that still lives; this run stages in a directory of its own",
                earlier.display(),
                pointer.display(),
                self.path.display(),
                t.from.who()
            );
            return Ok(false);
        }
        let mut left = earlier.to_path_buf();
        if earlier == pointer {
            let token = Some(t.from.token.as_str())
                .filter(|t| is_token(t))
                .map_or_else(
                    || format!("pid{}-{}", t.from.pid, t.from.since),
                    str::to_string,
                );
            left = crate::job::destination::staging::run_dir(pointer, &token);
            storage::sink(earlier)
                .rename(earlier, &left)
                .with_context(|| {
                    format!(
                        "{}: cannot move the staging directory of the run that held {} to {}",
                        earlier.display(),
                        self.path.display(),
                        left.display()
                    )
                })?;
        }
        crate::errln!(
            "reshard: left {} alone: it belongs to the run that held {} ({}), which may only be \
             suspended; this run stages in a directory of its own. That run removes it if it \
             wakes (it then fails without publishing); otherwise remove it once that run is \
             surely gone, or point {} at it (ln -sfn) and rerun with --resume to continue it",
            left.display(),
            self.path.display(),
            t.from.who(),
            pointer.display()
        );
        Ok(false)
    }

    /// After a failure: whether the staging directory `staging` is still this run's to clean
    /// up as a failed run does (kept for `--resume`, or removed). If another run took the lock
    /// over, it is not: the directory, named after this run's token, is then removed (this run
    /// made it, and it lost the output; no other run uses it), and the staging pointer, which
    /// leads to the other run's, is left alone.
    pub(crate) fn may_clean_up(&self, staging: &Path) -> bool {
        let lost = self.lost.lock().map(|l| l.is_some()).unwrap_or(true);
        if !lost && self.lock_lost().is_none() {
            return true;
        }
        let mine = read_text(&Staging::at(staging).owner_file())
            .is_ok_and(|m| m.trim() == self.owner.token);
        if mine && storage::sink(staging).remove_dir_all(staging).is_ok() {
            crate::errln!(
                "reshard: removed {}: this run's staging directory, which the run that took \
                 over {} does not use",
                staging.display(),
                self.path.display()
            );
        }
        false
    }
}

impl Drop for OutputLock {
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
/// Why the run whose token is `token` no longer holds the lock at `path` (another run holds
/// it, or it is gone), or `None` while it does: the check of a rank that has the token but not
/// the lock itself.
///
/// # Errors
/// The lock cannot be read, or is not a reshard lock.
pub(crate) fn lost_by_token(path: &Path, token: &str) -> Result<Option<String>> {
    Ok(match read_owner(path)? {
        Some(owner) if owner.token == token => None,
        Some(owner) => Some(format!("{} holds it now", owner.who())),
        None => Some("it was removed".into()),
    })
}

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
/// [`OutputLock::acquire`] takes over at once); true for any other, and for a file there that
/// is not a reshard lock.
pub(crate) fn may_be_held(path: &Path) -> bool {
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
    if let Some(alive) = holder.lives(me) {
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
pub(crate) fn new_token() -> Result<String> {
    let mut bytes = [0u8; 16];
    sys::random_bytes(&mut bytes)
        .context("/dev/urandom: cannot read a token for the output's lock")?;
    Ok(crate::hex::hex(&bytes))
}

/// Whether `s` looks like a token ([`crate::hex::is_token`]: staging's names are checked there,
/// below this module).
pub(crate) use crate::hex::is_token;

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests;
