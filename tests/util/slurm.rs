//! A real Slurm on this machine for the Slurm tests: munged, slurmctld and two slurmd (nodes `n1`
//! and `n2`, 8 CPUs each, on localhost), all from Debian's packages, under a generated
//! `slurm.conf` whose state, spool and log directories live in a temporary directory. Plus the
//! helpers for the scripts of `slurm/` and `examples/consumers/`.
//!
//! One cluster serves the whole test binary: [`slurm_or_skip`] starts it once (about a second)
//! and hands it to one test at a time. It never outlives the binary:
//! - at the binary's exit (libtest ends with `exit`), an `atexit` handler cancels every job, stops
//!   the daemons and removes the directory;
//! - if the binary dies without exiting (killed), the daemons get SIGTERM from the kernel: they are
//!   started with `PR_SET_PDEATHSIG` from a thread that lives as long as the process;
//! - the next start removes the directories of clusters whose test binary is gone, killing any
//!   daemon of theirs still running.

use std::fs::{self, File};
use std::io;
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{find_on_path, noise, skip, Dir, TestCommand};

/// The job states Slurm reports once a job has ended (`scontrol show job`'s JobState).
const ENDED_STATES: &[&str] = &[
    "COMPLETED",
    "CANCELLED",
    "FAILED",
    "TIMEOUT",
    "NODE_FAIL",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
    "OUT_OF_MEMORY",
];

/// The repository root (where Cargo.toml is).
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every shell script of `slurm/` and `examples/consumers/`.
pub fn shell_scripts() -> Vec<PathBuf> {
    scripts(|name| name.ends_with(".sh") || name.ends_with(".sbatch"))
}

/// Every Python script of `slurm/` and `examples/consumers/`.
pub fn python_scripts() -> Vec<PathBuf> {
    scripts(|name| name.ends_with(".py"))
}

fn scripts(wanted: impl Fn(&str) -> bool) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for dir in ["slurm", "examples/consumers"] {
        for e in fs::read_dir(repo().join(dir)).unwrap() {
            let p = e.unwrap().path();
            if wanted(&p.file_name().unwrap().to_string_lossy()) {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// Writes an executable script.
pub fn write_script(path: &Path, text: &str) {
    fs::write(path, text).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(0o755)).unwrap();
}

/// A directory to put first on PATH with a stand-in `module` (environment modules are not part
/// of Slurm and not installed here) that appends its arguments to `calls.log` in the test
/// directory.
pub fn fake_module(dir: &Dir) -> PathBuf {
    let bin = dir.create_dir("fakebin");
    write_script(
        &bin.join("module"),
        &format!(
            "#!/usr/bin/env bash\n# Stand-in for environment modules.\necho \"module $*\" >>'{}'\n",
            dir.join("calls.log").display()
        ),
    );
    bin
}

/// `PATH` with `first` in front.
pub fn path_with(first: &Path) -> std::ffi::OsString {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut paths = vec![first.to_path_buf()];
    paths.extend(std::env::split_paths(&path));
    std::env::join_paths(paths).unwrap()
}

/// The `nsamples` of every shard an index.json lists.
pub fn shard_counts(index: &Value) -> Vec<u64> {
    index["shardlist"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["nsamples"].as_u64().unwrap())
        .collect()
}

/// The nodes of the shared cluster.
pub const NODES: [&str; 2] = ["n1", "n2"];

/// A Slurm program: on PATH, else where Debian installs it (`/usr/sbin` may be missing from a
/// non-login PATH).
fn tool(name: &str) -> Option<PathBuf> {
    find_on_path(name).or_else(|| {
        ["/usr/sbin", "/usr/bin"]
            .iter()
            .map(|d| Path::new(d).join(name))
            .find(|p| p.is_file())
    })
}

const TOOLS: [&str; 9] = [
    "munged",
    "slurmctld",
    "slurmd",
    "srun",
    "sbatch",
    "squeue",
    "scontrol",
    "scancel",
    "sinfo",
];

/// Why a Slurm cannot run here, if it cannot (checked once).
pub fn unavailable() -> Option<&'static str> {
    static WHY: OnceLock<Option<String>> = OnceLock::new();
    WHY.get_or_init(|| {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Some("not running as root (slurmd runs jobs as any user only as root)".into());
        }
        TOOLS
            .iter()
            .find(|t| tool(t).is_none())
            .map(|t| format!("{t} not found (apt-get install slurmctld slurmd slurm-client munge)"))
    })
    .as_deref()
}

/// The shared cluster, for one test at a time (other tests' jobs would compete for its CPUs and
/// make timings and `squeue` listings flaky). Every job a previous test left is cancelled first.
pub struct SlurmLock {
    _turn: MutexGuard<'static, ()>,
    pub slurm: &'static Slurm,
}

impl std::ops::Deref for SlurmLock {
    type Target = Slurm;
    fn deref(&self) -> &Slurm {
        self.slurm
    }
}

/// The shared cluster (started on first use), or `None` after reporting a skip of `test`.
pub fn slurm_or_skip(test: &str) -> Option<SlurmLock> {
    if let Some(why) = unavailable() {
        skip(test, &format!("needs a real Slurm, but {why}"));
        return None;
    }
    static TURN: Mutex<()> = Mutex::new(());
    static SHARED: OnceLock<Slurm> = OnceLock::new();
    extern "C" fn stop_shared() {
        if let Some(s) = SHARED.get() {
            s.stop();
        }
    }
    let turn = TURN.lock().unwrap_or_else(PoisonError::into_inner);
    let slurm = SHARED.get_or_init(|| {
        let s = Slurm::start(&NODES);
        // SAFETY: registers a handler (a plain extern "C" fn) to run at exit.
        unsafe {
            libc::atexit(stop_shared);
        }
        s
    });
    slurm.cancel_all();
    Some(SlurmLock { _turn: turn, slurm })
}

/// A running Slurm: its directory and configuration, and the daemons it started.
pub struct Slurm {
    root: PathBuf,
    conf: PathBuf,
    nodes: Vec<String>,
    daemons: Mutex<Vec<(String, Child)>>,
}

impl Slurm {
    /// Starts munged, slurmctld and one slurmd per node, and waits until every node is idle.
    /// Panics, with the daemons' logs, when that does not happen within 30 s.
    pub fn start(nodes: &[&str]) -> Slurm {
        reap_stale();
        let root = std::env::temp_dir().join(format!(
            "reshard-slurm-{}-{}",
            std::process::id(),
            nodes.join("-")
        ));
        let _ = fs::remove_dir_all(&root);
        for sub in ["state", "log", "run"] {
            fs::create_dir_all(root.join(sub)).unwrap();
        }
        for n in nodes {
            fs::create_dir_all(root.join("spool").join(n)).unwrap();
        }
        fs::write(root.join("owner"), std::process::id().to_string()).unwrap();
        let slurm = Slurm {
            conf: root.join("slurm.conf"),
            root,
            nodes: nodes.iter().map(|n| n.to_string()).collect(),
            daemons: Mutex::new(Vec::new()),
        };
        slurm.start_munge();
        fs::write(&slurm.conf, slurm.config()).unwrap();
        let conf = slurm.conf.to_str().unwrap().to_string();
        slurm.daemon("slurmctld", &["-D", "-f", &conf]);
        for n in nodes {
            slurm.daemon(&format!("slurmd-{n}"), &["-D", "-N", n, "-f", &conf]);
        }
        slurm.wait_idle(Duration::from_secs(30));
        slurm
    }

    fn start_munge(&self) {
        let key = self.root.join("munge.key");
        fs::write(&key, noise(u64::from(std::process::id()), 1024)).unwrap();
        fs::set_permissions(&key, fs::Permissions::from_mode(0o600)).unwrap();
        let r = |p: &str| self.root.join(p).to_str().unwrap().to_string();
        self.daemon(
            "munged",
            &[
                "-F",
                &format!("--key-file={}", r("munge.key")),
                &format!("--socket={}", r("run/munge.sock")),
                &format!("--pid-file={}", r("run/munged.pid")),
                &format!("--log-file={}", r("log/munged.log")),
                &format!("--seed-file={}", r("run/munge.seed")),
            ],
        );
        let started = Instant::now();
        while !self.root.join("run/munge.sock").exists() {
            if started.elapsed() > Duration::from_secs(10) {
                panic!(
                    "munged did not create its socket within 10 s\n{}",
                    self.logs()
                );
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// slurm.conf: root runs everything; processes tracked by process group and no task plugin
    /// (no cgroups needed); `config_overrides` lets each node claim 8 CPUs on a smaller machine;
    /// `CR_CPU` lets jobs share a node; `MpiDefault=none`, as on many clusters; a scheduler pass
    /// at most every 0.1 s (default 2 s) and batch jobs scheduled at once: a job whose dependency
    /// is met starts within about a second, not three.
    fn config(&self) -> String {
        let root = self.root.display();
        let mut text = format!(
            "ClusterName=reshardtest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={root}/run/munge.sock
CredType=cred/munge
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/run/slurmctld.pid
SlurmdPidFile={root}/run/slurmd-%n.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd-%n.log
ProctrackType=proctrack/pgid
TaskPlugin=task/none
SlurmdParameters=config_overrides
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
KillWait=5
SchedulerType=sched/backfill
SchedulerParameters=sched_min_interval=100000,batch_sched_delay=0
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
",
            ctld_port = free_port(),
        );
        // Nodes on one host: each slurmd (started with -N NAME) listens on its own port.
        for n in &self.nodes {
            text += &format!(
                "NodeName={n} NodeHostname=localhost NodeAddr=127.0.0.1 Port={} CPUs=8 State=UNKNOWN\n",
                free_port()
            );
        }
        text += "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n";
        text
    }

    /// Starts a daemon in the foreground, its output in `log/NAME.out`.
    fn daemon(&self, name: &str, args: &[&str]) {
        let program = name.split('-').next().unwrap();
        let out = File::create(self.root.join(format!("log/{name}.out"))).unwrap();
        let mut cmd = Command::new(tool(program).unwrap());
        cmd.args(args)
            .env("SLURM_CONF", &self.conf)
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out);
        let child = spawn_daemon(cmd)
            .unwrap_or_else(|e| panic!("cannot start {program}: {e}\n{}", self.logs()));
        let mut pids = fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(self.root.join("pids"))
            .unwrap();
        io::Write::write_all(&mut pids, format!("{}\n", child.id()).as_bytes()).unwrap();
        self.daemons
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((name.to_string(), child));
    }

    fn wait_idle(&self, within: Duration) {
        let started = Instant::now();
        loop {
            let out = self
                .client("sinfo")
                .args(["-h", "-N", "-o", "%N %T"])
                .output();
            let states: Vec<String> = out.map_or_else(
                |_| Vec::new(),
                |o| {
                    String::from_utf8_lossy(&o.stdout)
                        .lines()
                        .map(str::to_string)
                        .collect()
                },
            );
            let idle = self
                .nodes
                .iter()
                .all(|n| states.iter().any(|l| *l == format!("{n} idle")));
            if idle {
                return;
            }
            if started.elapsed() > within {
                panic!(
                    "the Slurm nodes were not idle within {} s (sinfo: {states:?})\n{}",
                    within.as_secs(),
                    self.logs()
                );
            }
            thread::sleep(Duration::from_millis(100));
        }
    }

    /// A Slurm client command for the harness itself (not a test's command).
    fn client(&self, name: &str) -> Command {
        let mut cmd = Command::new(tool(name).unwrap());
        cmd.env("SLURM_CONF", &self.conf).stdin(Stdio::null());
        cmd
    }

    /// The tail of every daemon's log, for failure messages.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        let mut files: Vec<PathBuf> = fs::read_dir(self.root.join("log"))
            .map(|rd| rd.filter_map(Result::ok).map(|e| e.path()).collect())
            .unwrap_or_default();
        files.sort();
        for f in files {
            let text = fs::read_to_string(&f).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            out += &format!("--- {} ---\n", f.display());
            for l in &lines[lines.len().saturating_sub(15)..] {
                out += l;
                out.push('\n');
            }
        }
        out
    }

    /// `PROGRAM` (srun, sbatch, scancel, ...) run in the test's directory against this cluster.
    pub fn program(&self, dir: &Dir, program: &str) -> TestCommand {
        let mut cmd = dir.program(tool(program).unwrap_or_else(|| program.into()));
        cmd.env("SLURM_CONF", &self.conf);
        cmd
    }

    /// `srun -N 1 --mpi=MPI -n TASKS reshard ARGS` in the test's directory.
    pub fn srun(&self, dir: &Dir, mpi: &str, tasks: usize, args: &[&str]) -> TestCommand {
        let mut cmd = self.program(dir, "srun");
        cmd.args(["-N", "1", &format!("--mpi={mpi}"), "-n", &tasks.to_string()])
            .arg(super::reshard_exe())
            .args(args);
        cmd
    }

    /// `scontrol show job ID` as key-value pairs (JobState, ExitCode, Dependency, StartTime, ...).
    pub fn job(&self, id: u64) -> Vec<(String, String)> {
        let out = self
            .client("scontrol")
            .args(["show", "job", "-o", &id.to_string()])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .filter_map(|w| w.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// One field of `scontrol show job ID`.
    pub fn job_field(&self, id: u64, key: &str) -> String {
        self.job(id)
            .into_iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v)
            .unwrap_or_default()
    }

    /// Waits until every one of `ids` is in a final state, or those left have waited for
    /// dependencies alone for 3 s (a failed job leaves the jobs after it pending for good); false
    /// if some are still active after `within`.
    pub fn wait_jobs(&self, ids: &[u64], within: Duration) -> bool {
        let started = Instant::now();
        let mut stuck_since: Option<Instant> = None;
        loop {
            let waiting: Vec<(String, String)> = ids
                .iter()
                .map(|&id| (self.job_field(id, "JobState"), self.job_field(id, "Reason")))
                // Only a final state ends the wait; anything else is a job still alive. A job
                // with a state flag prints the flag instead of RUNNING (SIGNALING while
                // `--signal`'s signal is pending, STAGE_OUT, RESIZING, REQUEUED, ...), so a list
                // of the live states let the time-limit test take a signalled job for an ended
                // one and then read it RUNNING (under a load of 20, with a copy of the suite
                // beside it). No state at all is a query that failed (slurmctld busy).
                .filter(|(state, _)| !ENDED_STATES.contains(&state.as_str()))
                .collect();
            if waiting.is_empty() {
                return true;
            }
            let on_dependencies = waiting
                .iter()
                .all(|(state, reason)| state == "PENDING" && reason.starts_with("Dependency"));
            if !on_dependencies {
                stuck_since = None;
            } else if stuck_since.get_or_insert_with(Instant::now).elapsed()
                > Duration::from_secs(3)
            {
                return true;
            }
            if started.elapsed() > within {
                return false;
            }
            thread::sleep(Duration::from_millis(200));
        }
    }

    /// The ids of the jobs Slurm still lists as pending or running.
    pub fn queue(&self) -> Vec<u64> {
        let out = self
            .client("squeue")
            .args(["-h", "-o", "%i"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        out.split_whitespace()
            .filter_map(|w| w.parse().ok())
            .collect()
    }

    /// Cancels every job and waits (at most 15 s: KillWait is 5 s) until none is left.
    pub fn cancel_all(&self) {
        let started = Instant::now();
        loop {
            let jobs = self.queue();
            if jobs.is_empty() || started.elapsed() > Duration::from_secs(15) {
                return;
            }
            let _ = self
                .client("scancel")
                .args(jobs.iter().map(u64::to_string))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
            thread::sleep(Duration::from_millis(200));
        }
    }

    /// Cancels every job, stops the daemons (SIGTERM, then SIGKILL after 5 s) and removes the
    /// cluster's directory. Idempotent.
    pub fn stop(&self) {
        let mut daemons =
            std::mem::take(&mut *self.daemons.lock().unwrap_or_else(PoisonError::into_inner));
        if daemons.is_empty() {
            return;
        }
        self.cancel_all();
        // Nodes first, then the controller, then munge, which they all authenticate through.
        daemons.reverse();
        for (name, child) in &mut daemons {
            stop_child(name, child);
        }
        let _ = fs::remove_dir_all(&self.root);
    }
}

impl Drop for Slurm {
    fn drop(&mut self) {
        self.stop();
    }
}

fn stop_child(name: &str, child: &mut Child) {
    let pid = i32::try_from(child.id()).expect("pid fits i32");
    // SAFETY: kill(2) on a child of this process that has not been waited for.
    unsafe {
        libc::kill(pid, libc::SIGTERM);
    }
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(5) {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        thread::sleep(Duration::from_millis(20));
    }
    eprintln!("slurm harness: {name} did not stop within 5 s of SIGTERM: killing it");
    let _ = child.kill();
    let _ = child.wait();
}

/// A TCP port on 127.0.0.1 that nothing listens on right now.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// Starts a daemon from a thread that lives as long as the process, with SIGTERM as its
/// parent-death signal: the kernel stops it when this test binary dies, however it dies. (The
/// signal follows the thread that forked, so it cannot be a test's thread, which ends with the
/// test.)
fn spawn_daemon(mut cmd: Command) -> io::Result<Child> {
    type Request = (Command, mpsc::Sender<io::Result<Child>>);
    static KEEPER: OnceLock<Mutex<mpsc::Sender<Request>>> = OnceLock::new();
    // SAFETY: prctl is async-signal-safe, as code between fork and exec must be.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let keeper = KEEPER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Request>();
        thread::Builder::new()
            .name("slurm-daemons".into())
            .spawn(move || {
                // The sender lives in a static, so this loop never ends.
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
            })
            .expect("start the daemon thread");
        Mutex::new(tx)
    });
    let (reply, answer) = mpsc::channel();
    keeper
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .send((cmd, reply))
        .expect("the daemon thread");
    answer.recv().expect("the daemon thread")
}

/// Removes the directories of clusters whose test binary is gone, first killing any of their
/// daemons still running (a pid is only killed if its command line names that directory).
fn reap_stale() {
    let Ok(entries) = fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for e in entries.filter_map(Result::ok) {
        let dir = e.path();
        if !e
            .file_name()
            .to_string_lossy()
            .starts_with("reshard-slurm-")
        {
            continue;
        }
        let owner = fs::read_to_string(dir.join("owner")).unwrap_or_default();
        let alive = owner
            .trim()
            .parse::<u32>()
            .is_ok_and(|pid| Path::new(&format!("/proc/{pid}")).exists());
        if alive {
            continue;
        }
        let dir_name = dir.to_string_lossy().into_owned();
        for pid in fs::read_to_string(dir.join("pids"))
            .unwrap_or_default()
            .split_whitespace()
            .filter_map(|p| p.parse::<i32>().ok())
        {
            let cmdline = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            if String::from_utf8_lossy(&cmdline).contains(&dir_name) {
                // SAFETY: kill(2) on a daemon a dead test binary started, identified above.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                }
            }
        }
        let _ = fs::remove_dir_all(&dir);
    }
}

impl Slurm {
    /// Submits `slurm/SCRIPT` with `sbatch -o job.out SBATCH_ARGS` in the test's directory, with
    /// `vars` in the environment sbatch passes on to the job, the binary under test as `RESHARD`
    /// and the stand-in `module` first on `PATH`, and waits for the job to end (polling: `sbatch
    /// --wait` backs off to 10 s between looks).
    pub fn script_job(
        &self,
        dir: &Dir,
        script: &str,
        sbatch_args: &[&str],
        vars: &[(&str, &str)],
    ) -> BatchJob {
        let mut cmd = self.program(dir, "sbatch");
        cmd.args(["--parsable", "-o", "job.out"])
            .args(sbatch_args)
            .arg(repo().join(script))
            .env("PATH", path_with(&fake_module(dir)))
            .env("RESHARD", super::reshard_exe())
            .env("RANK_REPORT", repo().join("slurm/rank-report.py"));
        for (k, v) in vars {
            cmd.env(k, v);
        }
        let submitted = cmd.assert_success();
        let id = submitted
            .stdout
            .trim()
            .split(';')
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| submitted.fail("no job id from sbatch --parsable"));
        let ended = self.wait_jobs(&[id], Duration::from_secs(120));
        assert!(ended, "job {id} did not end within 120 s\n{}", self.logs());
        let code = self.job_field(id, "ExitCode");
        BatchJob {
            id,
            state: self.job_field(id, "JobState"),
            code: code.split(':').next().and_then(|c| c.parse().ok()),
            log: fs::read_to_string(dir.join("job.out")).unwrap_or_default(),
        }
    }

    /// `slurm/epoch-loop.sh` with `vars`, every job submitted held (`--hold`): returns every job id
    /// it printed with the job's name and the ids it depends on (afterok), as Slurm holds them.
    pub fn submit_epoch_loop(
        &self,
        dir: &Dir,
        vars: &[(&str, &str)],
    ) -> Vec<(u64, String, Vec<u64>)> {
        write_script(&dir.join("train.sbatch"), TRAIN);
        let mut cmd = self.program(dir, "bash");
        cmd.arg(repo().join("slurm/epoch-loop.sh"))
            .env("TRAIN_SCRIPT", "train.sbatch")
            .env("RESHARD_SBATCH", repo().join("slurm/reshard.sbatch"))
            .env("RESHARD", super::reshard_exe())
            .env("RANK_REPORT", repo().join("slurm/rank-report.py"))
            .env("INPUT", "input")
            .env("DATA_ROOT", "data")
            .env("SHARDS", "4")
            .env("SEED", "5")
            .env("SRUN_MPI", "pmi2")
            .env("REPORT", "")
            .env("SBATCH_ARGS", "--hold --nodes=1")
            .env(
                "RESHARD_SBATCH_ARGS",
                "--ntasks-per-node=2 --output=reshuffle-%j.out",
            )
            .env("TRAIN_SBATCH_ARGS", "--ntasks=1 --output=train-%j.out");
        for (k, v) in vars {
            cmd.env(k, v);
        }
        let res = cmd.assert_success();
        // "epoch 1: training job 15 (after 14:13)"
        let ids: Vec<u64> = res
            .stdout
            .lines()
            .filter_map(|l| {
                l.split_once(" job ")?
                    .1
                    .split_whitespace()
                    .next()?
                    .parse()
                    .ok()
            })
            .collect();
        ids.iter()
            .map(|&id| {
                let deps = self.job_field(id, "Dependency");
                // "afterok:14_*(unfulfilled),afterok:13_*(unfulfilled)" or "(null)"
                let after: Vec<u64> = deps
                    .split("afterok:")
                    .skip(1)
                    .filter_map(|d| {
                        let digits: String = d.chars().take_while(char::is_ascii_digit).collect();
                        digits.parse().ok()
                    })
                    .collect();
                (id, self.job_field(id, "JobName"), after)
            })
            .collect()
    }
}

/// A small dataset: 5 shards, 301 samples of about 1 KiB.
pub fn dataset(dir: &Dir) -> Vec<PathBuf> {
    dir.generate(
        "input",
        &[
            "--shards",
            "5",
            "--samples",
            "301",
            "--mean-size",
            "1KiB",
            "--skew",
            "1",
            "--seed",
            "4",
        ],
    )
}

/// A batch job that ended: its state and exit code as Slurm reports them, and its output.
#[derive(Debug)]
pub struct BatchJob {
    pub id: u64,
    pub state: String,
    pub code: Option<i32>,
    pub log: String,
}

impl BatchJob {
    /// Requires `cond`, failing with `why`, the job's state and its output otherwise.
    #[track_caller]
    pub fn check(&self, cond: bool, why: &str) {
        assert!(
            cond,
            "{why}\njob {}: {}, exit code {:?}\n--- job output ---\n{}",
            self.id, self.state, self.code, self.log
        );
    }
}

/// The training stand-in of the epoch-loop tests: it fails unless its epoch's data is complete,
/// and records what it read.
const TRAIN: &str = r#"#!/usr/bin/env bash
# A training stand-in: reads its epoch's data, as a training job would.
set -euo pipefail
test -f "$DATA/index.json"
echo "$EPOCH $DATA $(find "$DATA" -maxdepth 1 -name '*.tar' | wc -l)" >>trained.log
"#;
