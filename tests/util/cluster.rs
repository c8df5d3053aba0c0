//! Simulated clusters for the cluster tests: network namespaces on a bridge built by
//! `tests/cluster/simcluster.sh`, each node's link counters, and a job broken mid-exchange.

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;
use std::thread;
use std::time::{Duration, Instant};

use super::{find_on_path, reshard_exe, skip, Dir, RunOutput, TestCommand};

/// The harness script.
pub fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/cluster/simcluster.sh")
}

/// Why simulated clusters cannot run here, if they cannot (checked once).
pub fn unavailable() -> Option<&'static str> {
    static WHY: OnceLock<Option<String>> = OnceLock::new();
    WHY.get_or_init(|| {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Some("not running as root".into());
        }
        for tool in ["ip", "tc", "unshare", "mpiexec"] {
            if find_on_path(tool).is_none() {
                return Some(format!("{tool} not found on PATH"));
            }
        }
        let probe = format!("reshard-probe-{}", std::process::id());
        let ok = Command::new("ip")
            .args(["netns", "add", &probe])
            .output()
            .is_ok_and(|o| o.status.success());
        let _ = Command::new("ip").args(["netns", "del", &probe]).output();
        (!ok).then(|| "`ip netns add` does not work here".into())
    })
    .as_deref()
}

/// Whether the cluster tests can run; prints why `test` is skipped when they cannot.
pub fn cluster_or_skip(test: &str) -> bool {
    match unavailable() {
        None => true,
        Some(why) => {
            skip(test, &format!("needs a simulated cluster, but {why}"));
            false
        }
    }
}

/// One node's link counters: bytes the node received and sent.
#[derive(Debug, Clone, Copy, Default)]
pub struct Link {
    pub rx: u64,
    pub tx: u64,
}

/// A simulated cluster of this test run, removed when dropped (also after a failed assertion).
pub struct Cluster {
    id: u32,
    nodes: usize,
    base: TestCommand,
}

impl Cluster {
    /// Brings up `nodes` nodes, each link capped at `rate` (e.g. "50mbit") if given, under an id
    /// no other running test (of this or another process) holds.
    pub fn up(dir: &Dir, nodes: usize, rate: Option<&str>) -> Cluster {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let pid = std::process::id();
        for _ in 0..250 {
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let id = (pid.wrapping_mul(37).wrapping_add(n.wrapping_mul(101))) % 250 + 1;
            let mut base = dir.program(script());
            base.env("SIMCLUSTER_ID", id.to_string())
                .env("SIMCLUSTER_OWNER", pid.to_string())
                .timeout(Duration::from_secs(60));
            let mut up = base.clone();
            up.args(["up", &nodes.to_string()]).args(rate);
            let out = up.output();
            match out.code() {
                Some(0) => return Cluster { id, nodes, base },
                Some(3) => continue, // another test holds this id
                _ => out.fail("simcluster.sh up failed"),
            }
        }
        panic!("no free simulated-cluster id");
    }

    pub fn command(&self, args: &[&str]) -> TestCommand {
        let mut cmd = self.base.clone();
        cmd.args(args);
        cmd
    }

    /// `reshard ARGS` as `ppn` ranks on every node, in the test's directory.
    pub fn reshard(&self, ppn: usize, args: &[&str]) -> TestCommand {
        let mut cmd = self.command(&["run", &ppn.to_string(), "--"]);
        cmd.arg(reshard_exe()).args(args);
        cmd
    }

    /// Every node's link counters, in node order.
    pub fn links(&self) -> Vec<Link> {
        let out = self.command(&["counters"]).assert_success();
        let links: Vec<Link> = out
            .stdout
            .lines()
            .map(|line| {
                let f: Vec<&str> = line.split_whitespace().collect();
                let num = |i: usize| -> u64 {
                    f.get(i)
                        .and_then(|s| s.parse().ok())
                        .unwrap_or_else(|| out.fail(&format!("bad counters line {line:?}")))
                };
                Link {
                    rx: num(2),
                    tx: num(3),
                }
            })
            .collect();
        out.check(links.len() == self.nodes, "one counters line per node");
        links
    }

    /// Bytes received by all nodes together.
    pub fn received(&self) -> u64 {
        self.links().iter().map(|l| l.rx).sum()
    }

    /// The pids of processes named `name` inside node `node`.
    pub fn pids(&self, node: usize, name: &str) -> Vec<i32> {
        let out = self
            .command(&["pids", &node.to_string(), name])
            .assert_success();
        out.stdout
            .split_whitespace()
            .map(|p| p.parse().expect("a pid"))
            .collect()
    }

    /// The host's address on the cluster's bridge: where the nodes reach a server of the test.
    pub fn host_address(&self) -> String {
        let out = self.command(&["host-address"]).assert_success();
        out.stdout.trim().to_string()
    }

    pub fn link_down(&self, node: usize) {
        self.command(&["link", &node.to_string(), "down"])
            .assert_success();
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // Not through TestCommand: a failure here must not panic while a test unwinds.
        let status = Command::new(script())
            .arg("down")
            .env("SIMCLUSTER_ID", self.id.to_string())
            .status();
        if !status.as_ref().is_ok_and(|s| s.success()) {
            eprintln!("simcluster {}: `down` failed ({status:?})", self.id);
        }
    }
}

/// Bytes in a MiB, for the traffic report.
pub const MIB: f64 = 1024.0 * 1024.0;

/// Samples in big enough pieces, on links slow enough, that the exchange of the lost-node tests
/// takes seconds: time to break a node in the middle of it.
pub const LOST_NODE_RATE: &str = "50mbit";

/// Starts `job` on its own thread and returns once data flows between the nodes (the exchange
/// is under way), with the handle of the running job.
pub fn start_exchange(
    cluster: &Cluster,
    job: TestCommand,
) -> (thread::JoinHandle<RunOutput>, Instant) {
    let baseline = cluster.received();
    let started = Instant::now();
    let handle = thread::spawn(move || job.output());
    // Metadata is a few KiB; megabytes mean samples are moving.
    while cluster.received() < baseline + (2 << 20) {
        if handle.is_finished() {
            let out = handle.join().unwrap();
            out.fail("the job ended before its exchange could be interrupted");
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the exchange did not start within 60 s"
        );
        thread::sleep(Duration::from_millis(50));
    }
    (handle, started)
}

/// What must hold after a node was lost: the job ended by itself, non-zero, and published
/// nothing. Returns the output.
pub fn ended_without_output(
    dir: &Dir,
    handle: thread::JoinHandle<RunOutput>,
    lost_at: Instant,
    within: Duration,
) -> (RunOutput, Duration) {
    let out = handle.join().expect("the job thread");
    let took = lost_at.elapsed();
    out.check(out.status.is_some(), "the job hung");
    out.check(
        out.code() != Some(0),
        "the job succeeded although a node was lost",
    );
    out.check(
        took <= within,
        &format!(
            "the job took {:.1} s to end after the node was lost (bound {} s)",
            took.as_secs_f64(),
            within.as_secs()
        ),
    );
    out.check(
        !dir.join("out").exists(),
        "an output was published after a lost node",
    );
    (out, took)
}

/// `reshard run` of the lost-node tests (`in` to `out`, 6 shards, a 4 MiB budget, and `extra`)
/// as one rank per node, with 90 s to end.
pub fn lost_node_job(cluster: &Cluster, extra: &[&str]) -> TestCommand {
    let mut args = vec![
        "run",
        "--input",
        "in",
        "--output",
        "out",
        "--shards",
        "6",
        "--seed",
        "1",
        "--mem-limit",
        "4MiB",
    ];
    args.extend_from_slice(extra);
    let mut job = cluster.reshard(1, &args);
    job.timeout(Duration::from_secs(90));
    job
}
