//! Who made a node's copy of the staging directory (node-local `--scratch`,
//! [`crate::job::destination::scratch`]): every rank that makes or uses a copy on its node leaves
//! there, before it writes anything else into it, a small record of its process
//! (`.reshard-makers/RANK`), so that a later run on the same node can tell whether that copy's
//! run is gone. Once the output's lock has changed hands nothing else records that run's pid,
//! and a copy of a run that lost the lock by its silence (suspended, on another node than its
//! successor) may still be read by it.
//!
//! A pid names one process only within one boot and one PID namespace, and only with its start
//! time (pids are reused): a copy is its makers' no more only when every record in it names a
//! process of this boot and PID namespace that is gone. Anything else (a record from another
//! container or boot, none at all: an older reshard's copy, or one cut short as it began) tells
//! nothing, and the copy stays.

use std::io;
use std::path::{Path, PathBuf};

use crate::storage::{self, Kind};
use crate::sys;

/// The directory of the records, at the top of a copy (never uploaded: see
/// [`crate::job::destination::upload`]'s listing of a staged copy).
pub(crate) const DIR_NAME: &str = ".reshard-makers";

const HEADER: &str = "reshard copy maker\n";

/// A process, with what makes its pid meaningful.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Process {
    pub(crate) host: String,
    /// `/proc/sys/kernel/random/boot_id` and the `/proc/self/ns/pid` link (empty where unknown).
    pub(crate) boot: String,
    pub(crate) pidns: String,
    pub(crate) pid: u32,
    /// Its start time in clock ticks since boot (0 where unknown).
    pub(crate) start: u64,
}

impl Process {
    /// This process.
    pub(crate) fn me() -> Process {
        let pid = std::process::id();
        // Empty where `/proc` is not this PID namespace's: its `/proc/PID` is another process.
        let pidns = sys::pid_namespace();
        let start = match pidns.is_empty() {
            true => 0,
            false => sys::process_start(pid).ok().flatten().unwrap_or(0),
        };
        Process {
            host: sys::hostname(),
            boot: sys::boot_id(),
            pidns,
            pid,
            start,
        }
    }

    /// Whether it lives, asked from `here`: `None` where its pid says nothing here (another boot
    /// or PID namespace, or either unknown: `/proc` not `here`'s namespace's, see
    /// [`sys::pid_namespace`]; or its `/proc` entry closed to `here`, `hidepid`). The hostname
    /// says nothing either way: containers on one node may share it, and it may be reused. A
    /// pid in use by a process started at another time is another process.
    pub(crate) fn lives(&self, here: &Process) -> Option<bool> {
        let checkable = !self.boot.is_empty()
            && !self.pidns.is_empty()
            && (&self.boot, &self.pidns) == (&here.boot, &here.pidns);
        checkable.then(|| self.told(sys::process_start(self.pid)))?
    }

    /// Whether it lives, by what `/proc` says of its pid (`start`): `None` where it says nothing.
    fn told(&self, start: io::Result<Option<u64>>) -> Option<bool> {
        match start {
            Ok(Some(start)) => Some(self.start == 0 || start == self.start),
            Ok(None) => Some(false),
            Err(_) => None,
        }
    }

    /// "pid N on HOST", for messages.
    pub(crate) fn who(&self) -> String {
        format!("pid {} on {}", self.pid, self.host)
    }

    fn render(&self) -> String {
        format!(
            "{HEADER}host {}\nboot {}\npidns {}\npid {}\nstart {}\n",
            self.host, self.boot, self.pidns, self.pid, self.start
        )
    }

    fn parse(text: &str) -> Option<Process> {
        let body = text.strip_prefix(HEADER)?;
        let field = |name: &str| {
            body.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
                .map(str::to_string)
        };
        Some(Process {
            host: field("host")?,
            boot: field("boot")?,
            pidns: field("pidns")?,
            pid: field("pid")?.parse().ok()?,
            start: field("start")?.parse().ok()?,
        })
    }
}

/// Where the records of the copy `copy` are.
pub(crate) fn dir(copy: &Path) -> PathBuf {
    copy.join(DIR_NAME)
}

/// Records this process as rank `rank`'s maker of the copy `copy` (which exists).
///
/// # Errors
/// The record cannot be written.
pub(crate) fn record(copy: &Path, rank: usize) -> io::Result<()> {
    let sink = storage::sink(copy);
    sink.create_dir_all(&dir(copy))?;
    let path = dir(copy).join(rank.to_string());
    sink.replace(&path, Process::me().render().as_bytes())
}

/// What the records of a copy tell, asked from this process.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Makers {
    /// Every process recorded is gone, and there is at least one.
    Gone,
    /// This one lives.
    Lives(Process),
    /// Nothing can be told: why, for the message.
    Unknown(String),
}

/// Judges the makers of the copy `copy` from this process.
pub(crate) fn judge(copy: &Path) -> Makers {
    judge_from(copy, &Process::me())
}

/// [`judge`], asked from `here`.
pub(crate) fn judge_from(copy: &Path, here: &Process) -> Makers {
    let dir = dir(copy);
    let source = storage::source(&dir);
    let entries = match source.list(&dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Makers::Unknown(format!("{}: cannot list ({e})", dir.display())),
    };
    if entries.is_empty() {
        return Makers::Unknown(
            "it records no process that made it (an older reshard's copy, or one cut short as \
             it began)"
                .into(),
        );
    }
    let mut unknown = None;
    for e in entries {
        let path = dir.join(&e.name);
        let made = (e.kind == Kind::File)
            .then(|| source.read(&path).ok())
            .flatten()
            .and_then(|bytes| Process::parse(&String::from_utf8_lossy(&bytes)));
        let Some(made) = made else {
            unknown
                .get_or_insert_with(|| format!("{}: not a record reshard wrote", path.display()));
            continue;
        };
        match made.lives(here) {
            Some(true) => return Makers::Lives(made),
            Some(false) => {}
            None => {
                unknown.get_or_insert_with(|| {
                    format!(
                        "it was made by {}, in another boot or PID namespace, whose pid cannot \
                         be checked from here",
                        made.who()
                    )
                });
            }
        }
    }
    unknown.map_or(Makers::Gone, Makers::Unknown)
}

/// A process of this boot and PID namespace that has ended (its pid reaped), for the tests.
#[cfg(test)]
pub(crate) fn ended() -> Process {
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    Process {
        pid,
        start: 1,
        ..Process::me()
    }
}

/// Records `p` as the maker `name` of the copy `copy`, for the tests.
#[cfg(test)]
pub(crate) fn write(copy: &Path, name: &str, p: &Process) {
    let sink = storage::sink(copy);
    sink.create_dir_all(&dir(copy)).unwrap();
    sink.replace(&dir(copy).join(name), p.render().as_bytes())
        .unwrap();
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn a_record_reads_back_and_names_this_process() {
        let tmp = tempfile::tempdir().unwrap();
        record(tmp.path(), 3).unwrap();
        let text = fs::read_to_string(dir(tmp.path()).join("3")).unwrap();
        let me = Process::me();
        assert_eq!(Process::parse(&text), Some(me.clone()));
        assert_eq!(me.lives(&me), Some(true));
        assert_eq!(judge(tmp.path()), Makers::Lives(me));
    }

    #[test]
    fn a_proc_entry_closed_to_this_process_tells_nothing() {
        let me = Process::me();
        let closed = io::Error::from(io::ErrorKind::PermissionDenied);
        assert_eq!(me.told(Err(closed)), None, "hidepid: not gone");
        assert_eq!(me.told(Ok(None)), Some(false));
        assert_eq!(me.told(Ok(Some(me.start))), Some(true));
        assert_eq!(me.told(Ok(Some(me.start + 1))), Some(false));
    }

    #[test]
    fn a_copy_is_its_makers_no_more_only_when_every_one_is_provably_gone() {
        let tmp = tempfile::tempdir().unwrap();
        let copy = tmp.path();
        let me = Process::me();
        // No record at all: an older reshard's copy.
        assert!(matches!(judge(copy), Makers::Unknown(why) if why.contains("records no process")));
        write(copy, "0", &ended());
        assert_eq!(judge(copy), Makers::Gone);
        // Its pid reused by a process started at another time: gone too.
        let reused = Process {
            start: me.start + 1,
            ..me.clone()
        };
        write(copy, "1", &reused);
        assert_eq!(judge(copy), Makers::Gone);
        // One rank that lives keeps it.
        write(copy, "2", &me);
        assert_eq!(judge(copy), Makers::Lives(me.clone()));
        fs::remove_file(dir(copy).join("2")).unwrap();
        // A rank in another PID namespace, or boot, or one whose namespace is unknown: its pid
        // says nothing here, so nothing is told.
        for other in [
            Process {
                pidns: "pid:[1]".into(),
                ..ended()
            },
            Process {
                boot: "another-boot".into(),
                ..ended()
            },
            Process {
                pidns: String::new(),
                ..ended()
            },
        ] {
            write(copy, "3", &other);
            assert!(
                matches!(judge(copy), Makers::Unknown(why) if why.contains("another boot or PID namespace")),
                "{other:?}"
            );
        }
        // Asked from another namespace, a record of this one tells nothing either.
        fs::remove_file(dir(copy).join("3")).unwrap();
        let elsewhere = Process {
            pidns: "pid:[1]".into(),
            ..me.clone()
        };
        assert!(matches!(judge_from(copy, &elsewhere), Makers::Unknown(_)));
        // A file that is not a record: nothing is told.
        fs::write(dir(copy).join("4"), b"the user's").unwrap();
        assert!(matches!(judge(copy), Makers::Unknown(why) if why.contains("not a record")));
    }
}
