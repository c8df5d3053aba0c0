//! Attacks on one run per output: a run held in its finish phase, its rank 0 stopped as a
//! scheduler suspends a job, its lock made unwritable, and a second run started in another UTS
//! and PID namespace (a container on the same node, with the same hostname).

use std::fs;
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::data::sized;
use super::{mpirun, reshard_exe, Dir, RunOutput, TestCommand, TIMEOUT};

/// The output every run here writes.
pub const OUT: &str = "out";

/// Small inputs: the attacks are about the lock, not the data.
pub fn inputs(dir: &Dir) {
    sized(dir, "in", "2MiB", "16KiB", 4);
}

/// The arguments of every run here, after `run`.
pub fn run_args(out: &str) -> Vec<String> {
    [
        "run", "--input", "in", "--output", out, "--shards", "3", "--seed", "5",
    ]
    .map(String::from)
    .to_vec()
}

/// Where run A's stderr goes, so that a test can read it while A runs.
pub const A_STDERR: &str = "a.stderr";

/// Where run A is held until the test lets it go.
#[derive(Clone, Copy, Debug)]
pub enum Hold {
    /// At the start of its finish phase (`RESHARD_TEST_PAUSE_FINISH`).
    Finish,
    /// Between its finish and publish phases (`RESHARD_TEST_PAUSE_PUBLISH`).
    Publish,
}

impl Hold {
    /// The marker a paused rank leaves in the staging directory.
    pub fn marker(self, rank: usize) -> String {
        match self {
            Hold::Finish => format!(".paused-{rank}"),
            Hold::Publish => format!(".paused-publish-{rank}"),
        }
    }

    fn var(self) -> &'static str {
        match self {
            Hold::Finish => "RESHARD_TEST_PAUSE_FINISH",
            Hold::Publish => "RESHARD_TEST_PAUSE_PUBLISH",
        }
    }
}

/// Run A under `mpirun -np 2`, held at `hold` until the test lets it go (see [`release`]);
/// returns once rank 0 is paused, with the running job. Its stderr goes to [`A_STDERR`] (see
/// [`a_stderr`]).
pub fn paused_run(dir: &Dir, hold: Hold) -> JoinHandle<RunOutput> {
    let mut cmd = dir.program("sh");
    cmd.args(["-c", r#"exec "$@" 2>"$0""#, A_STDERR])
        .arg(mpirun())
        .args(["-np", "2"])
        .arg(reshard_exe())
        .args(run_args(OUT))
        .env(hold.var(), "600")
        .timeout(TIMEOUT * 2);
    let job = std::thread::spawn(move || cmd.output());
    // Every rank: a rank that paused after `release` would sleep out the whole pause, and one
    // still on its way there may yet write into the staging directory.
    wait_until("both ranks of run A pause", || {
        (0..2).all(|rank| staging(dir).join(hold.marker(rank)).exists())
    });
    job
}

/// What run A has written to its stderr so far.
pub fn a_stderr(dir: &Dir) -> String {
    fs::read_to_string(dir.join(A_STDERR)).unwrap_or_default()
}

/// Ends the pause of every rank whose marker is in `staging`, wherever it is held.
pub fn release(staging: &Path) {
    for rank in 0..4 {
        for hold in [Hold::Finish, Hold::Publish] {
            let _ = fs::remove_file(staging.join(hold.marker(rank)));
        }
    }
}

pub fn staging(dir: &Dir) -> PathBuf {
    dir.join(format!(".{OUT}.reshard-tmp"))
}

pub fn lock(dir: &Dir) -> PathBuf {
    dir.join(format!(".{OUT}.reshard-lock"))
}

/// A field of the lock file (`pid`, `token`, `beat`), as the file holds it now.
pub fn lock_field(dir: &Dir, name: &str) -> String {
    let text = fs::read_to_string(lock(dir)).expect("the lock exists");
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {name} in the lock:\n{text}"))
        .to_string()
}

/// `reshard ARGS` without a launcher, in new UTS, PID and mount namespaces (with their own
/// /proc), under this host's name: how a container on the same node sees the world. Not as
/// the namespace's init (pid 1), which ignores the signals a test hook sends itself.
pub fn in_namespaces(dir: &Dir, args: &[String]) -> TestCommand {
    let host = fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let mut cmd = dir.program("unshare");
    cmd.args(["--uts", "--pid", "--fork", "--mount-proc", "sh", "-c"])
        .arg(r#"hostname "$1" && shift && "$@"; exit $?"#)
        .args(["sh", host.trim()])
        .arg(reshard_exe())
        .args(args);
    cmd
}

/// The reshard processes running in `dir` (by their working directory) that are stopped
/// (SIGSTOP), as seen from here.
pub fn stopped_in(dir: &Dir) -> Vec<i32> {
    let mut pids = Vec::new();
    for e in fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let here = fs::read_link(e.path().join("cwd")).is_ok_and(|c| c == dir.path());
        let ours = fs::read_link(e.path().join("exe")).is_ok_and(|x| x == reshard_exe());
        let stat = fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        let state = stat
            .rfind(')')
            .and_then(|at| stat[at + 1..].split_whitespace().next());
        if here && ours && state == Some("T") {
            pids.push(pid);
        }
    }
    pids
}

/// Processes held stopped (SIGSTOP) for as long as this lives: dropped, even by a failing
/// test, it lets them go on (SIGCONT), so that none is left stopped for good.
pub struct Stopped(Vec<i32>);

impl Stopped {
    /// Stops `pid` (SIGSTOP).
    pub fn stop(pid: i32) -> Stopped {
        signal(pid, libc::SIGSTOP);
        Stopped(vec![pid])
    }

    /// Processes that are stopped already.
    pub fn already(pids: Vec<i32>) -> Stopped {
        Stopped(pids)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        for &pid in &self.0 {
            signal(pid, libc::SIGCONT);
        }
    }
}

fn signal(pid: i32, signal: i32) {
    // SAFETY: kill(2) on a process this test started; one that has ended already is no error.
    unsafe {
        libc::kill(pid, signal);
    }
}

/// Waits until `cond` holds: generously, since a loaded machine is slow, never a fixed delay.
pub fn wait_until(what: &str, cond: impl Fn() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < TIMEOUT, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `chattr +i` on a file for as long as this lives: no process may write it, as when a network
/// filesystem fails writes for a while.
pub struct Immutable(PathBuf);

impl Immutable {
    /// `None` where the filesystem has no such attribute.
    pub fn set(path: &Path) -> Option<Immutable> {
        chattr("+i", path).then(|| Immutable(path.to_path_buf()))
    }
}

impl Drop for Immutable {
    fn drop(&mut self) {
        chattr("-i", &self.0);
    }
}

fn chattr(how: &str, path: &Path) -> bool {
    std::process::Command::new("chattr")
        .arg(how)
        .arg(path)
        .status()
        .is_ok_and(|s| s.success())
}
