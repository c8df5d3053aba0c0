//! The job across a network: ranks on several simulated nodes (network namespaces on a bridge,
//! built by `tests/cluster/simcluster.sh`) talk TCP through each node's own link, whose byte
//! counters show what crossed it. Needs root, working `ip netns` and MPICH's `mpiexec`; where
//! any is missing the tests print why and pass without running.

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;
use std::thread;
use std::time::{Duration, Instant};

use crate::run::run;
use crate::util::{find_on_path, reshard_exe, skip, Dir, RunOutput, TestCommand};
use crate::verify::{assert_same_output, verify, Expected};

/// The harness script.
fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/cluster/simcluster.sh")
}

/// Why simulated clusters cannot run here, if they cannot (checked once).
fn unavailable() -> Option<&'static str> {
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
fn cluster_or_skip(test: &str) -> bool {
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
struct Link {
    rx: u64,
    tx: u64,
}

/// A simulated cluster of this test run, removed when dropped (also after a failed assertion).
struct Cluster {
    id: u32,
    nodes: usize,
    base: TestCommand,
}

impl Cluster {
    /// Brings up `nodes` nodes, each link capped at `rate` (e.g. "50mbit") if given, under an id
    /// no other running test (of this or another process) holds.
    fn up(dir: &Dir, nodes: usize, rate: Option<&str>) -> Cluster {
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

    fn command(&self, args: &[&str]) -> TestCommand {
        let mut cmd = self.base.clone();
        cmd.args(args);
        cmd
    }

    /// `reshard ARGS` as `ppn` ranks on every node, in the test's directory.
    fn reshard(&self, ppn: usize, args: &[&str]) -> TestCommand {
        let mut cmd = self.command(&["run", &ppn.to_string(), "--"]);
        cmd.arg(reshard_exe()).args(args);
        cmd
    }

    /// Every node's link counters, in node order.
    fn links(&self) -> Vec<Link> {
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
    fn received(&self) -> u64 {
        self.links().iter().map(|l| l.rx).sum()
    }

    /// The pids of processes named `name` inside node `node`.
    fn pids(&self, node: usize, name: &str) -> Vec<i32> {
        let out = self
            .command(&["pids", &node.to_string(), name])
            .assert_success();
        out.stdout
            .split_whitespace()
            .map(|p| p.parse().expect("a pid"))
            .collect()
    }

    fn link_down(&self, node: usize) {
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

/// Generates an uneven dataset of about `size` in `rel` and returns its shards.
fn dataset(dir: &Dir, rel: &str, size: &str, mean: &str, shards: usize) -> Vec<PathBuf> {
    dir.generate(
        rel,
        &[
            "--shards",
            &shards.to_string(),
            "--total-size",
            size,
            "--mean-size",
            mean,
            "--skew",
            "2",
            "--long-names-every",
            "7",
            "--seed",
            "8",
        ],
    )
}

const MIB: f64 = 1024.0 * 1024.0;

/// 3 nodes x 2 ranks: the output is byte-identical to one rank's, and what crosses each node's
/// link is what the scaling model predicts, (1 - 1/nodes) * D / nodes plus the metadata.
#[test]
fn three_nodes_match_one_rank_and_the_traffic_model() {
    if !cluster_or_skip("three_nodes_match_one_rank_and_the_traffic_model") {
        return;
    }
    let started = Instant::now();
    let dir = Dir::new("cluster-model");
    let inputs = dataset(&dir, "in", "24MiB", "64KiB", 36);
    let (shards, seed) = (12, 3);
    run(&dir, None, &["in"], "one", shards, seed, &[]);

    let (nodes, ppn) = (3, 2);
    let cluster = Cluster::up(&dir, nodes, None);
    let before = cluster.links();
    let out = cluster
        .reshard(
            ppn,
            &[
                "run",
                "--input",
                "in",
                "--output",
                "out",
                "--shards",
                &shards.to_string(),
                "--seed",
                &seed.to_string(),
                "--report",
                "report.json",
            ],
        )
        .assert_success();
    let after = cluster.links();
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("report.json")).unwrap()).unwrap();
    let per_rank = report["per_rank"].as_array().unwrap();
    out.check(per_rank.len() == nodes * ppn, "one report entry per rank");
    // Hydra places ranks in blocks: node i runs ranks i*ppn .. (i+1)*ppn.
    let node_sum = |node: usize, key: &str| -> f64 {
        per_rank[node * ppn..(node + 1) * ppn]
            .iter()
            .map(|r| r[key].as_u64().unwrap() as f64)
            .sum()
    };

    let v = verify(
        &Expected::new(dir.path(), &inputs, shards, seed, nodes * ppn),
        &dir.join("out"),
    );
    assert_same_output(&dir.join("one"), &dir.join("out"), &["ranks"]);

    let data = v.index["reshard"]["sample_bytes"].as_u64().unwrap() as f64;
    let samples = v.order.len() as f64;
    let n = nodes as f64;
    let cross = 1.0 - 1.0 / n;
    // Each sample's (position, length) travels once to its writer: 16 bytes.
    let model = cross * data / n + cross * samples * 16.0 / n;
    println!(
        "{nodes} nodes x {ppn} ranks, D = {:.2} MiB in {samples} samples; model per node: \
         (1 - 1/{nodes}) * D / {nodes} + metadata = {:.2} MiB",
        data / MIB,
        model / MIB
    );
    for (i, (b, a)) in before.iter().zip(&after).enumerate() {
        let (rx, tx) = ((a.rx - b.rx) as f64, (a.tx - b.tx) as f64);
        // The same model with this node's actual shares: of the W bytes its ranks write, the
        // part its own ranks read (R / D of it, the permutation being uniform) stays local.
        let (read, written) = (node_sum(i, "bytes_read"), node_sum(i, "bytes_written"));
        let own = written * (1.0 - read / data) + cross * samples * 16.0 / n;
        println!(
            "node {i}: received {:.2} MiB = {:.2}x the model, {:.2}x its own share \
             ({:.2} MiB: reads {:.2} MiB, writes {:.2} MiB); sent {:.2} MiB",
            rx / MIB,
            rx / model,
            rx / own,
            own / MIB,
            read / MIB,
            written / MIB,
            tx / MIB
        );
        out.check(
            (0.7 * model..=1.6 * model).contains(&rx),
            &format!(
                "node {i} received {rx} bytes over its link, the model says {model:.0}: \
                 outside 0.7..1.6 x (did the ranks talk through shared memory, or resend?)"
            ),
        );
        out.check(
            (0.8 * own..=1.25 * own).contains(&rx),
            &format!(
                "node {i} received {rx} bytes over its link, {own:.0} expected from what its \
                 ranks read and write: outside 0.8..1.25 x"
            ),
        );
    }
    println!(
        "took {:.1} s (job {:.1} s)",
        started.elapsed().as_secs_f64(),
        out.elapsed.as_secs_f64()
    );
}

/// Samples in big enough pieces, on links slow enough, that the exchange of the lost-node tests
/// takes seconds: time to break a node in the middle of it.
const LOST_NODE_RATE: &str = "50mbit";

/// Starts `job` on its own thread and returns once data flows between the nodes (the exchange
/// is under way), with the handle of the running job.
fn start_exchange(cluster: &Cluster, job: TestCommand) -> (thread::JoinHandle<RunOutput>, Instant) {
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
fn ended_without_output(
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

fn lost_node_job(cluster: &Cluster, extra: &[&str]) -> TestCommand {
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

/// 3 nodes x 1 rank; one node's rank is killed mid-exchange: the launcher ends the whole job at
/// once, non-zero, and nothing appears at the output path.
#[test]
fn a_rank_killed_mid_exchange_ends_the_job() {
    if !cluster_or_skip("a_rank_killed_mid_exchange_ends_the_job") {
        return;
    }
    let dir = Dir::new("cluster-kill");
    dataset(&dir, "in", "40MiB", "256KiB", 6);
    let cluster = Cluster::up(&dir, 3, Some(LOST_NODE_RATE));
    let (handle, started) = start_exchange(&cluster, lost_node_job(&cluster, &[]));

    let victims = cluster.pids(2, "reshard");
    assert!(!victims.is_empty(), "no reshard rank found on node 2");
    let killed = Instant::now();
    for pid in &victims {
        // SAFETY: kill(2) on a rank this test started, inside its own cluster.
        unsafe {
            libc::kill(*pid, libc::SIGKILL);
        }
    }
    let (out, took) = ended_without_output(&dir, handle, killed, Duration::from_secs(15));
    // The launcher kills every rank, so none is left to remove the (hidden) staging directory;
    // the next run into the same output replaces it.
    let staging = dir.join(".out.reshard-tmp").exists();
    // Rank 0 named the staging directory as the job started, so the log says what is left.
    out.stderr_has(".out.reshard-tmp");
    println!(
        "killed node 2's rank {:.1} s into the job; the job ended {:.2} s later with {} \
         (staging directory left behind: {staging})",
        (killed - started).as_secs_f64(),
        took.as_secs_f64(),
        out.status.unwrap()
    );
}

/// 3 nodes x 1 rank; one node's link goes down mid-exchange, so its rank neither answers nor
/// dies: the stall watchdog must end the job, non-zero, with nothing published.
#[test]
fn a_node_whose_link_goes_down_ends_the_job() {
    if !cluster_or_skip("a_node_whose_link_goes_down_ends_the_job") {
        return;
    }
    let help = Dir::new("cluster-help")
        .command()
        .args(["run", "--help"])
        .assert_success();
    if !help.stdout.contains("--stall-timeout") {
        // Without a watchdog the surviving ranks wait for the lost one forever.
        skip(
            "a_node_whose_link_goes_down_ends_the_job",
            "reshard has no --stall-timeout",
        );
        return;
    }
    let dir = Dir::new("cluster-link");
    dataset(&dir, "in", "40MiB", "256KiB", 6);
    let cluster = Cluster::up(&dir, 3, Some(LOST_NODE_RATE));
    let stall = 5;
    let job = lost_node_job(&cluster, &["--stall-timeout", &stall.to_string()]);
    let (handle, started) = start_exchange(&cluster, job);

    let cut = Instant::now();
    cluster.link_down(2);
    let (out, took) = ended_without_output(&dir, handle, cut, Duration::from_secs(stall + 15));
    out.stderr_has("--stall-timeout");
    let left = cluster.pids(2, "reshard").len();
    println!(
        "cut node 2's link {:.1} s into the job; the job ended {:.2} s later with {} \
         ({left} rank(s) still running on the cut-off node, removed with the cluster)",
        (cut - started).as_secs_f64(),
        took.as_secs_f64(),
        out.status.unwrap()
    );
    println!(
        "stderr: {}",
        out.stderr
            .lines()
            .filter(|l| l.contains("error"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// 3 nodes x 1 rank, without the preloaded finalize shim: MPICH 4.0 over UCX TCP then hangs in
/// MPI_Finalize in a good part of the runs, after the output is published. Every run must still
/// end by itself within seconds of publishing, with status 0 and a valid output.
#[test]
fn jobs_end_although_mpi_finalize_hangs() {
    if !cluster_or_skip("jobs_end_although_mpi_finalize_hangs") {
        return;
    }
    let dir = Dir::new("cluster-finalize");
    let inputs = dataset(&dir, "in", "4MiB", "32KiB", 6);
    let (nodes, runs, deadline) = (3, 8, 3);
    let cluster = Cluster::up(&dir, nodes, None);
    let mut hung = 0;
    let mut after_publish = Vec::new();
    for run in 0..runs {
        let out = format!("out{run}");
        let mut job = cluster.reshard(
            1,
            &[
                "run", "--input", "in", "--output", &out, "--shards", "4", "--seed", "5",
            ],
        );
        job.env("SIMCLUSTER_SHIM", "0")
            .env("RESHARD_FINALIZE_TIMEOUT", deadline.to_string())
            .timeout(Duration::from_secs(60));
        let handle = thread::spawn(move || job.output());
        let target = dir.join(&out);
        let mut published = None;
        while !handle.is_finished() {
            if published.is_none() && target.exists() {
                published = Some(Instant::now());
            }
            thread::sleep(Duration::from_millis(20));
        }
        let res = handle.join().expect("the job thread");
        let ended = Instant::now();
        res.check(res.status.is_some(), "the job hung after publishing");
        res.check(res.code() == Some(0), "a finished job must exit 0");
        let took = ended - published.unwrap_or(ended);
        res.check(
            took < Duration::from_secs(deadline + 10),
            &format!(
                "the job ended {:.1} s after publishing its output",
                took.as_secs_f64()
            ),
        );
        if res.stderr.contains("MPI_Finalize did not return") {
            hung += 1;
            res.stderr_has("exiting with status 0");
        }
        verify(&Expected::new(dir.path(), &inputs, 4, 5, nodes), &target);
        after_publish.push(format!("{:.1}", took.as_secs_f64()));
    }
    println!(
        "{runs} runs on {nodes} nodes without the shim: MPI_Finalize hung in {hung}; each job ended \
         this many seconds after publishing (deadline {deadline} s): {}",
        after_publish.join(", ")
    );
}
