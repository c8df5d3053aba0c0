//! What the tests' object stores have in common: a server on loopback that lives as long as the
//! test binary, and a [`Store`], the store as the tests' Python client reaches it (buckets made,
//! trees uploaded and downloaded, keys listed). SeaweedFS's S3 (`util::s3`, through boto3),
//! Azurite and fake-gcs-server (`util::cloud`, through their REST APIs) are each a client script
//! that takes `OP BUCKET ARGS…` and the environment that points it at its server.

use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, OnceLock};
use std::time::{Duration, Instant};
use std::{fs, thread};

use super::{skip, Dir, RunOutput, TestCommand};

/// A store the tests' Python client reaches. Its client runs `mb BUCKET`, `put BUCKET DIR
/// PREFIX`, `get BUCKET PREFIX DIR` and `ls BUCKET PREFIX` (and whatever else the store's own
/// methods ask of it).
pub trait Store {
    /// The environment that points reshard at the store.
    fn env(&self) -> Vec<(&'static str, String)>;

    /// The store's client in `dir`, its environment set, to be given `OP BUCKET ARGS…`.
    fn client_command(&self, dir: &Dir) -> TestCommand;

    /// `cmd` with the environment that points reshard at the store.
    fn with_env<'a>(&self, cmd: &'a mut TestCommand) -> &'a mut TestCommand {
        for (k, v) in self.env() {
            cmd.env(k, v);
        }
        cmd
    }

    /// Runs the client with `args`, which must succeed.
    fn client(&self, dir: &Dir, args: &[&str]) -> RunOutput {
        self.client_command(dir).args(args).assert_success()
    }

    /// A new bucket (an Azure container) whose name tells the test, made once the server
    /// takes writes.
    fn bucket(&self, dir: &Dir, test: &str) -> String {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let mut name: String = test
            .chars()
            .filter(char::is_ascii_alphanumeric)
            .take(40)
            .map(|c| c.to_ascii_lowercase())
            .collect();
        name += &format!("-{}", NEXT.fetch_add(1, Ordering::Relaxed));
        self.client(dir, &["mb", &name]);
        name
    }

    /// Uploads every file under `from` to `bucket/prefix/…`.
    fn put(&self, dir: &Dir, from: &Path, bucket: &str, prefix: &str) {
        self.client(dir, &["put", bucket, from.to_str().unwrap(), prefix]);
    }

    /// Downloads every object under `bucket/prefix/` into `to`.
    fn get(&self, dir: &Dir, bucket: &str, prefix: &str, to: &Path) {
        self.client(dir, &["get", bucket, prefix, to.to_str().unwrap()]);
    }

    /// The keys under `bucket/prefix` (every key that starts with it), in order.
    fn keys(&self, dir: &Dir, bucket: &str, prefix: &str) -> Vec<String> {
        let out = self.client(dir, &["ls", bucket, prefix]);
        out.stdout.lines().map(str::to_string).collect()
    }
}

/// The test binary's server in `cell`, started by `start` on first use; `None` where it cannot
/// start (after reporting `test` skipped for want of what `missing` says).
pub fn started<T: Send + Sync>(
    cell: &'static OnceLock<Option<T>>,
    start: fn() -> Option<T>,
    test: &str,
    missing: &str,
) -> Option<&'static T> {
    let found = cell.get_or_init(start).as_ref();
    if found.is_none() {
        skip(test, missing);
    }
    found
}

/// `n` distinct free ports on loopback (held open together so that they differ).
pub fn free_ports(n: usize) -> Vec<u16> {
    let held: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("bind a loopback port"))
        .collect();
    held.iter()
        .map(|l| l.local_addr().unwrap().port())
        .collect()
}

/// Makes the process `cmd` starts receive SIGKILL when the thread that started it ends.
pub fn dies_with_its_thread(cmd: &mut Command) {
    // SAFETY: prctl(2) in the child before exec, async-signal-safe, on the child alone.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
}

/// The command that starts a server on its ports, its data in the directory given.
pub type MakeCommand = Box<dyn Fn(&[u16], &Path) -> Command + Send>;

/// A server to start: the command for its `ports` and data directory, how many ports it
/// takes, which of them says it is up once something listens there, and how long a start may
/// take.
pub struct Launch {
    pub name: &'static str,
    pub make: MakeCommand,
    pub ports: usize,
    pub listens_on: usize,
    pub patience: Duration,
}

/// Starts the server `launch` makes on fresh ports, its data in `data` (its output beside it,
/// in `DATA.log` and `DATA.err`), until one start listens: a start may lose a port picked
/// free to another process (two copies of the suite at once) and exit. Three tries.
pub fn start_listening(launch: &Launch, data: &Path) -> (Command, Child, Vec<u16>) {
    let mut failures = String::new();
    for _ in 0..3 {
        let ports = free_ports(launch.ports);
        let mut cmd = (launch.make)(&ports, data);
        cmd.stdin(Stdio::null())
            .stdout(fs::File::create(data.with_extension("log")).unwrap())
            .stderr(fs::File::create(data.with_extension("err")).unwrap());
        dies_with_its_thread(&mut cmd);
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", launch.name));
        let started = Instant::now();
        while started.elapsed() < launch.patience {
            if std::net::TcpStream::connect(("127.0.0.1", ports[launch.listens_on])).is_ok() {
                return (cmd, child, ports);
            }
            if let Ok(Some(status)) = child.try_wait() {
                let err = fs::read_to_string(data.with_extension("err")).unwrap_or_default();
                let tail: Vec<&str> = err.lines().rev().take(5).collect();
                failures += &format!("{} exited ({status}): {tail:?}\n", launch.name);
                break;
            }
            thread::sleep(Duration::from_millis(200));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
    panic!("{} did not listen:\n{failures}", launch.name);
}

/// Starts the server `launch` makes for the rest of the test binary, its data in a temporary
/// directory named after it and this process; returns its ports once it listens. The thread
/// that starts it lives as long as the binary, so that the server, killed when that thread
/// ends, never outlives the tests.
pub fn serve(launch: Launch) -> Vec<u16> {
    remove_dead_servers_data(launch.name);
    let data = std::env::temp_dir().join(format!(
        "reshard-test-{}-{}",
        launch.name,
        std::process::id()
    ));
    let _ = fs::remove_dir_all(&data);
    fs::create_dir_all(&data).unwrap();
    let (tx, rx) = mpsc::channel();
    let name = launch.name;
    thread::spawn(move || {
        let (_cmd, _child, ports) = start_listening(&launch, &data);
        let _ = tx.send(ports);
        loop {
            thread::park();
        }
    });
    rx.recv()
        .unwrap_or_else(|_| panic!("the {name} server never listened"))
}

/// The data directories (and logs) that the `name` servers of test binaries that have ended
/// left behind: each server dies with its binary, its data stays.
fn remove_dead_servers_data(name: &str) {
    let Ok(entries) = fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    let prefix = format!("reshard-test-{name}-");
    for e in entries.flatten() {
        let file = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = file.strip_prefix(&prefix) else {
            continue;
        };
        let pid = pid.trim_end_matches(".log").trim_end_matches(".err");
        if pid.parse::<u32>().is_ok() && !Path::new("/proc").join(pid).exists() {
            let _ = fs::remove_dir_all(e.path());
            let _ = fs::remove_file(e.path());
        }
    }
}
