//! One run at a time per output: rank 0 owns the output's staging directory through a lock file
//! beside it, `.NAME.reshard-lock`, from before it looks at the staging directory until the job
//! has published or given up. Two worlds on one output (`srun --mpi=none` starts one world per
//! task; two users; a rerun while the first run still lives) would race on the staging shards, so
//! the second refuses instead.
//!
//! The lock is created atomically with its content (written aside, then hard-linked into place,
//! which fails if it exists, on NFS too): the owner's host, pid and process start time, and a
//! heartbeat counter the owner rewrites every second. A lock whose owner is dead is stale and
//! taken over: on the same host, by the pid (and its start time, against pid reuse); from another
//! host, when the heartbeat has not moved for [`STALE_AFTER`] (no clocks compared). Takeovers go
//! through a second exclusive file, so that two newcomers never both take one stale lock.

use std::fs;
use std::io::{ErrorKind, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, RecvTimeoutError, Sender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};

/// How long a lock from another host must show no heartbeat to be taken for dead.
pub const STALE_AFTER: Duration = Duration::from_secs(5);

/// How often the owner's heartbeat moves.
const BEAT: Duration = Duration::from_secs(1);

/// Tries before giving up when other runs keep creating and taking over the lock.
const ATTEMPTS: usize = 6;

/// The lock file of the staging directory `staging` (`.NAME.reshard-tmp` -> `.NAME.reshard-lock`).
pub fn lock_path(staging: &Path) -> PathBuf {
    let name = staging.file_name().unwrap_or_default().to_string_lossy();
    let base = name.strip_suffix(".reshard-tmp").unwrap_or(&name);
    staging.with_file_name(format!("{base}.reshard-lock"))
}

/// Who holds a lock.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Owner {
    host: String,
    pid: u32,
    /// The process's start time in clock ticks since boot (0 where unknown).
    start: u64,
    /// Seconds since the epoch when it took the lock.
    since: u64,
    beat: u64,
}

const HEADER: &str = "reshard staging lock\n";

impl Owner {
    fn me() -> Owner {
        let pid = std::process::id();
        Owner {
            host: hostname(),
            pid,
            start: process_start(pid).unwrap_or(0),
            since: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            beat: 0,
        }
    }

    /// The file's content; the beat is last, at a fixed width, so it can be rewritten in place.
    fn render(&self) -> String {
        format!(
            "{HEADER}host {}\npid {}\nstart {}\nsince {}\nbeat {:020}\n",
            self.host, self.pid, self.start, self.since, self.beat
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
            host: field("host")?,
            pid: field("pid")?.parse().ok()?,
            start: field("start")?.parse().ok()?,
            since: field("since")?.parse().ok()?,
            beat: field("beat")?.parse().ok()?,
        })
    }

    /// The same holder, whatever its heartbeat says.
    fn same_holder(&self, other: &Owner) -> bool {
        (&self.host, self.pid, self.start, self.since)
            == (&other.host, other.pid, other.start, other.since)
    }
}

/// What is known of a lock's holder.
#[derive(Debug, PartialEq, Eq)]
enum Holder {
    Alive,
    Dead,
    /// The lock changed hands or went away while it was looked at: look again.
    Changed,
}

/// Rank 0's ownership of the staging directory; dropping it releases the lock.
pub struct StagingLock {
    path: PathBuf,
    owner: Owner,
    stop: Option<Sender<()>>,
    beat: Option<JoinHandle<()>>,
}

impl StagingLock {
    /// Takes the lock `path` for the output `output`, taking over one whose holder is dead.
    ///
    /// # Errors
    /// Another live run holds it (the message names its host and pid, and what to do), or the
    /// lock cannot be created.
    pub fn acquire(path: &Path, output: &Path) -> Result<Self> {
        let me = Owner::me();
        for _ in 0..ATTEMPTS {
            match create_exclusive(path, &me) {
                Ok(()) => return Ok(Self::hold(path, me)),
                Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
                Err(e) => {
                    return Err(e).with_context(|| {
                        format!(
                            "cannot create the staging directory's lock {} (is the output's parent writable?)",
                            path.display()
                        )
                    })
                }
            }
            let Some(holder) = read_owner(path)? else {
                continue;
            };
            match judge(path, &holder, &me.host, STALE_AFTER) {
                Holder::Alive => bail!(busy(output, path, &holder)),
                Holder::Dead => take_over(path, &holder, &me)?,
                Holder::Changed => {}
            }
        }
        bail!(
            "{}: other runs kept taking this output's lock; is another reshard writing {}?",
            path.display(),
            output.display()
        )
    }

    /// Starts the heartbeat of a lock just created.
    fn hold(path: &Path, owner: Owner) -> Self {
        let (stop, stopped) = channel::<()>();
        let (p, mut o) = (path.to_path_buf(), owner.clone());
        let beat = std::thread::spawn(move || {
            while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(BEAT) {
                o.beat += 1;
                if !rewrite_beat(&p, &o) {
                    // Not ours any more (removed by hand): nothing left to keep alive.
                    return;
                }
            }
        });
        StagingLock {
            path: path.to_path_buf(),
            owner,
            stop: Some(stop),
            beat: Some(beat),
        }
    }
}

impl Drop for StagingLock {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.beat.take() {
            let _ = t.join();
        }
        if read_owner(&self.path)
            .ok()
            .flatten()
            .is_some_and(|o| o.same_holder(&self.owner))
        {
            let _ = fs::remove_file(&self.path);
        }
    }
}

/// Why this run stops, and what to do.
fn busy(output: &Path, lock: &Path, holder: &Owner) -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    format!(
        "--output {}: another reshard run is writing it (pid {} on {}, for {} s); two runs must \
         not write one output, so this one stops without touching it. Wait for that run to end, \
         or choose another --output. Started by `srun --mpi=none`, or any launcher that starts \
         each task as a world of its own, every task is a run of its own: see slurm/README.md. \
         If no such run is alive, remove {}",
        output.display(),
        holder.pid,
        holder.host,
        now.saturating_sub(holder.since),
        lock.display()
    )
}

/// Creates `path` holding `owner`, atomically and only if it does not exist.
fn create_exclusive(path: &Path, owner: &Owner) -> std::io::Result<()> {
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let tmp = path.with_file_name(format!("{name}.{}.{}", owner.host, owner.pid));
    let mut f = fs::File::create(&tmp)?;
    let written = f
        .write_all(owner.render().as_bytes())
        .and_then(|()| f.sync_all())
        .and_then(|()| fs::hard_link(&tmp, path));
    let _ = fs::remove_file(&tmp);
    written
}

/// The holder named in `path`, or `None` if it does not exist (any more).
///
/// # Errors
/// It cannot be read, or it is not a reshard lock (then it is left alone).
fn read_owner(path: &Path) -> Result<Option<Owner>> {
    match fs::read_to_string(path) {
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

/// Whether the holder of the lock at `path` lives: on this host by its pid, elsewhere by its
/// heartbeat, watched for `window`.
fn judge(path: &Path, holder: &Owner, my_host: &str, window: Duration) -> Holder {
    if holder.host == my_host {
        let alive = process_start(holder.pid)
            .is_some_and(|start| holder.start == 0 || start == holder.start);
        return if alive { Holder::Alive } else { Holder::Dead };
    }
    let watched = Instant::now();
    while watched.elapsed() < window {
        std::thread::sleep(Duration::from_millis(200));
        match read_owner(path) {
            Ok(Some(now)) if now.same_holder(holder) => {
                if now.beat != holder.beat {
                    return Holder::Alive;
                }
            }
            _ => return Holder::Changed,
        }
    }
    Holder::Dead
}

/// Removes the stale lock of `dead`, unless another newcomer is doing so (then the caller looks
/// again).
fn take_over(path: &Path, dead: &Owner, me: &Owner) -> Result<()> {
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let guard = path.with_file_name(format!("{name}.takeover"));
    match create_exclusive(&guard, me) {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::AlreadyExists => {
            // A takeover takes milliseconds; a guard left by a newcomer that died is removed
            // once its holder is known dead on this host, else it is waited for.
            let holder = read_owner(&guard)?;
            let dead = holder.is_some_and(|h| {
                h.host == me.host && judge(&guard, &h, &me.host, Duration::ZERO) == Holder::Dead
            });
            if dead {
                let _ = fs::remove_file(&guard);
            } else {
                std::thread::sleep(Duration::from_secs(1));
            }
            return Ok(());
        }
        Err(e) => {
            return Err(e).with_context(|| format!("{}: cannot create", guard.display()));
        }
    }
    if read_owner(path)?.is_some_and(|now| now.same_holder(dead)) {
        crate::errln!(
            "reshard: taking over {}: its run (pid {} on {}) is gone",
            path.display(),
            dead.pid,
            dead.host
        );
        let _ = fs::remove_file(path);
    }
    let _ = fs::remove_file(&guard);
    Ok(())
}

/// Moves the heartbeat of the lock at `path` if `owner` still holds it. Opened and closed each
/// time, so that the write reaches a network filesystem's server at once.
fn rewrite_beat(path: &Path, owner: &Owner) -> bool {
    if !read_owner(path)
        .ok()
        .flatten()
        .is_some_and(|o| o.same_holder(owner))
    {
        return false;
    }
    let text = owner.render();
    let at = text.rfind("beat ").expect("rendered") + "beat ".len();
    fs::OpenOptions::new()
        .write(true)
        .open(path)
        .and_then(|f| f.write_all_at(&text.as_bytes()[at..], at as u64))
        .is_ok()
}

/// The start time of process `pid` (clock ticks since boot), if it lives. A zombie (exited, not
/// yet reaped: common in containers whose init does not reap) does not.
fn process_start(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields 3 (state) and 22; the command name (field 2) may hold spaces and parentheses.
    let mut fields = stat[stat.rfind(')')? + 1..].split_whitespace();
    if matches!(fields.next(), Some("Z" | "X" | "x")) {
        return None;
    }
    fields.nth(18)?.parse().ok()
}

fn hostname() -> String {
    fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "unknown-host".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_live_process_has_a_start_time_and_a_zombie_none() {
        assert!(process_start(std::process::id()).is_some_and(|t| t > 0));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        // Exited but not reaped yet: a zombie, as a dead rank is under an init that never reaps.
        let stat = format!("/proc/{pid}/stat");
        while !fs::read_to_string(&stat).unwrap().contains(") Z") {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(process_start(pid), None);
        child.wait().unwrap();
        assert_eq!(process_start(pid), None);
    }

    #[test]
    fn the_lock_is_named_after_the_staging_directory() {
        assert_eq!(
            lock_path(Path::new("/d/.out.reshard-tmp")),
            Path::new("/d/.out.reshard-lock")
        );
    }

    #[test]
    fn one_holder_at_a_time_and_a_dead_one_is_replaced() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join(".out.reshard-lock");
        let lock = StagingLock::acquire(&path, Path::new("out")).unwrap();
        let again = StagingLock::acquire(&path, Path::new("out")).map(|_| ());
        let msg = format!("{:#}", again.unwrap_err());
        assert!(
            msg.contains("another reshard run")
                && msg.contains(&format!("pid {}", std::process::id())),
            "{msg}"
        );
        drop(lock);
        assert!(!path.exists(), "released");
        // A lock of a process that is gone (beyond any pid_max).
        let mut dead = Owner::me();
        dead.pid = u32::MAX - 1;
        create_exclusive(&path, &dead).unwrap();
        let lock = StagingLock::acquire(&path, Path::new("out")).unwrap();
        assert_eq!(read_owner(&path).unwrap().unwrap().pid, std::process::id());
        drop(lock);
    }

    #[test]
    fn another_host_is_judged_by_its_heartbeat() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join(".x.reshard-lock");
        let mut other = Owner::me();
        other.host = "elsewhere".into();
        create_exclusive(&path, &other).unwrap();
        // Silent: dead after the window.
        let window = Duration::from_millis(600);
        assert_eq!(judge(&path, &other, &hostname(), window), Holder::Dead);
        // Beating: alive.
        let (p, o) = (path.clone(), other.clone());
        let beating = std::thread::spawn(move || {
            let mut o = o;
            for _ in 0..5 {
                std::thread::sleep(Duration::from_millis(100));
                o.beat += 1;
                rewrite_beat(&p, &o);
            }
        });
        assert_eq!(judge(&path, &other, &hostname(), window), Holder::Alive);
        beating.join().unwrap();
        assert!(Owner::parse(&other.render()).is_some_and(|o| o == other));
    }
}
