//! Test harness: a temporary directory per test, and a builder for commands that run the built
//! `reshard` binary, directly or under `mpirun -np N`, with a timeout. A failed expectation
//! panics with the command, its exit status, stdout, stderr and the directory listing.
//!
//! The submodules hold everything else the feature files share, so that those hold only tests:
//! `tar` (archive builders and byte surgery), `verifier` (the independent verifier), `samples`
//! (samples read back through it), `permutation` (the order, written again from its
//! specification), `data` (datasets), `runs` (runs of reshard), `loaders` (checks of the loader
//! indexes, with Python and the real energon), and the harnesses of three areas: `corpus` (real
//! writers' archives), `cluster`, `slurm`.

pub mod cloud;
pub mod cluster;
pub mod corpus;
pub mod data;
pub mod files;
pub mod fuzz;
pub mod loaders;
pub mod lock;
pub mod ops;
pub mod permutation;
pub mod runs;
pub mod s3;
pub mod samples;
pub mod slurm;
pub mod source;
pub mod splits;
pub mod stores;
pub mod tar;
pub mod verifier;

use std::ffi::{OsStr, OsString};
use std::fmt::Write as _;
use std::fs;
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

/// How long any launched command may run before it is killed and the test fails.
pub const TIMEOUT: Duration = Duration::from_secs(120);

/// How long a failing run may take: bad input must stop every rank within seconds.
pub const FAIL_FAST: Duration = Duration::from_secs(30);

/// The rank counts the distributed tests run with.
pub const NPS: [usize; 4] = [1, 2, 3, 4];

/// The built binary under test.
pub fn reshard_exe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_reshard"))
}

/// The `mpirun` on `PATH`. The integration tests are about the distributed job, so a missing
/// launcher is a failure of the environment, reported as such.
pub fn mpirun() -> PathBuf {
    find_on_path("mpirun").unwrap_or_else(|| {
        panic!(
            "mpirun not found on PATH: these tests run reshard under MPI \
             (on Debian/Ubuntu: apt-get install mpich libmpich-dev)"
        )
    })
}

/// Looks `name` up on `PATH`.
pub fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// A temporary directory for one test, removed when dropped.
pub struct Dir {
    _tmp: tempfile::TempDir,
    root: PathBuf,
}

impl Dir {
    /// A fresh, empty directory whose name contains `name`.
    pub fn new(name: &str) -> Dir {
        let tmp = tempfile::Builder::new()
            .prefix(&format!("reshard-test-{name}-"))
            .tempdir()
            .expect("create a temporary directory");
        // Canonical, so that paths the binary prints compare equal to ours.
        let root = fs::canonicalize(tmp.path()).expect("canonicalize the temporary directory");
        Dir { _tmp: tmp, root }
    }

    /// The directory itself.
    pub fn path(&self) -> &Path {
        &self.root
    }

    /// A path inside the directory.
    pub fn join(&self, rel: impl AsRef<Path>) -> PathBuf {
        self.root.join(rel)
    }

    /// Creates a directory (and its parents) inside this one.
    pub fn create_dir(&self, rel: impl AsRef<Path>) -> PathBuf {
        let p = self.join(rel);
        fs::create_dir_all(&p).unwrap_or_else(|e| panic!("create {}: {e}", p.display()));
        p
    }

    /// Writes a file inside the directory, creating its parents.
    pub fn create_bytes(&self, rel: impl AsRef<Path>, bytes: &[u8]) -> PathBuf {
        let p = self.join(rel);
        if let Some(parent) = p.parent() {
            fs::create_dir_all(parent).unwrap();
        }
        fs::write(&p, bytes).unwrap_or_else(|e| panic!("write {}: {e}", p.display()));
        p
    }

    /// `reshard ARGS` with no launcher, run in this directory.
    pub fn command(&self) -> TestCommand {
        TestCommand {
            root: self.root.clone(),
            launcher: None,
            program: reshard_exe().into_os_string(),
            args: Vec::new(),
            envs: Vec::new(),
            removed: Vec::new(),
            timeout: TIMEOUT,
        }
    }

    /// `mpirun -np N reshard ARGS`, run in this directory.
    pub fn mpi(&self, np: usize) -> TestCommand {
        let mut cmd = self.command();
        cmd.launcher = Some(np);
        cmd
    }

    /// `mpirun -np N WRAPPER… reshard ARGS`: every rank's binary started through a wrapper
    /// (`strace -o …`, say).
    pub fn mpi_through(&self, np: usize, wrapper: &[&str]) -> TestCommand {
        let mut cmd = self.mpi(np);
        cmd.program = wrapper[0].into();
        cmd.args(&wrapper[1..]).arg(reshard_exe());
        cmd
    }

    /// `reshard` under `mpirun -np N`, or with no launcher at all when `np` is `None`.
    pub fn reshard(&self, np: Option<usize>) -> TestCommand {
        match np {
            Some(n) => self.mpi(n),
            None => self.command(),
        }
    }

    /// Any other program (tar, python3), run in this directory with the same timeout.
    pub fn program(&self, program: impl AsRef<OsStr>) -> TestCommand {
        TestCommand {
            root: self.root.clone(),
            launcher: None,
            program: program.as_ref().to_os_string(),
            args: Vec::new(),
            envs: Vec::new(),
            removed: Vec::new(),
            timeout: TIMEOUT,
        }
    }

    /// Runs `reshard generate --output REL ARGS` and returns the shard files it wrote, sorted.
    pub fn generate(&self, rel: &str, args: &[&str]) -> Vec<PathBuf> {
        self.command()
            .args(["generate", "--output", rel])
            .args(args)
            .assert_success();
        tar_files(&self.join(rel))
    }
}

/// The `*.tar` files of a directory, sorted by name.
pub fn tar_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("list {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "tar"))
        .collect();
    files.sort();
    files
}

/// Where an object-store output's bucket (or container) `bucket` is staged on `scratch`:
/// `scratch/reshard-scratch/STORE/bucket`, STORE naming the store (its scheme, and a hash of
/// its endpoint variables); `None` before it exists or if two stores' are there.
pub fn staged_bucket(scratch: &Path, bucket: &str) -> Option<PathBuf> {
    let found: Vec<PathBuf> = std::fs::read_dir(scratch.join("reshard-scratch"))
        .ok()?
        .flatten()
        .map(|e| e.path().join(bucket))
        .filter(|p| p.is_dir())
        .collect();
    (found.len() == 1).then(|| found[0].clone())
}

/// A recursive listing of `root` for failure reports.
pub fn listing(root: &Path) -> String {
    fn walk(root: &Path, dir: &Path, out: &mut String) {
        let Ok(rd) = fs::read_dir(dir) else {
            let _ = writeln!(out, "  (cannot list {})", dir.display());
            return;
        };
        let mut entries: Vec<_> = rd.filter_map(Result::ok).collect();
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let p = e.path();
            let rel = p.strip_prefix(root).unwrap_or(&p).display().to_string();
            match fs::symlink_metadata(&p) {
                Ok(m) if m.is_dir() => {
                    let _ = writeln!(out, "  {rel}/");
                    walk(root, &p, out);
                }
                Ok(m) => {
                    let _ = writeln!(out, "  {rel} ({} bytes)", m.len());
                }
                Err(err) => {
                    let _ = writeln!(out, "  {rel} ({err})");
                }
            }
        }
    }
    let mut out = format!("{}:\n", root.display());
    walk(root, root, &mut out);
    out
}

/// A command to run the binary (or another program) with a timeout.
#[derive(Clone, Debug)]
pub struct TestCommand {
    root: PathBuf,
    launcher: Option<usize>,
    program: OsString,
    args: Vec<OsString>,
    envs: Vec<(OsString, OsString)>,
    /// Variables of the test's environment the command does not get.
    removed: Vec<OsString>,
    timeout: Duration,
}

impl TestCommand {
    pub fn arg(&mut self, arg: impl AsRef<OsStr>) -> &mut Self {
        self.args.push(arg.as_ref().to_os_string());
        self
    }

    pub fn args<I, A>(&mut self, args: I) -> &mut Self
    where
        I: IntoIterator<Item = A>,
        A: AsRef<OsStr>,
    {
        for a in args {
            self.arg(a);
        }
        self
    }

    /// Sets an environment variable for the command (and, under mpirun, every rank).
    pub fn env(&mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> &mut Self {
        self.envs
            .push((key.as_ref().to_os_string(), value.as_ref().to_os_string()));
        self
    }

    /// Keeps the environment variable `key` from the command (and every rank).
    pub fn env_remove(&mut self, key: impl AsRef<OsStr>) -> &mut Self {
        self.removed.push(key.as_ref().to_os_string());
        self
    }

    /// Overrides the default [`TIMEOUT`].
    pub fn timeout(&mut self, timeout: Duration) -> &mut Self {
        self.timeout = timeout;
        self
    }

    /// The command line as a shell would show it.
    pub fn describe(&self) -> String {
        let mut words: Vec<String> = Vec::new();
        if let Some(np) = self.launcher {
            words.extend([mpirun().display().to_string(), "-np".into(), np.to_string()]);
        }
        words.push(self.program.to_string_lossy().into_owned());
        words.extend(self.args.iter().map(|a| a.to_string_lossy().into_owned()));
        words
            .iter()
            .map(|w| {
                if w.is_empty() || w.contains(|c: char| c.is_whitespace() || "'\"{}*@$".contains(c))
                {
                    format!("'{w}'")
                } else {
                    w.clone()
                }
            })
            .collect::<Vec<_>>()
            .join(" ")
    }

    fn build(&self) -> Command {
        let mut cmd = match self.launcher {
            Some(np) => {
                let mut c = Command::new(mpirun());
                c.arg("-np").arg(np.to_string()).arg(&self.program);
                c
            }
            None => Command::new(&self.program),
        };
        cmd.args(&self.args)
            .current_dir(&self.root)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Harmless for MPICH; lets OpenMPI's mpirun run as root and oversubscribe.
            .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
            .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
            .env("OMPI_MCA_rmaps_base_oversubscribe", "1")
            // Every rank of these jobs is on this host: UCX opens loopback only. Left to choose,
            // it opens every addressed interface, and the simulated cluster's bridge (with the
            // host's address for its S3 server) vanishing mid-MPI_Init failed a job at start
            // ("init_worker No such device": 11 of 25 launches while such a bridge came and went).
            // The cluster's own launches set their devices themselves.
            .env("UCX_NET_DEVICES", "lo")
            .envs(self.envs.iter().map(|(k, v)| (k, v)))
            // Its own process group, so that a timeout kills the launcher and every rank.
            .process_group(0);
        for key in &self.removed {
            cmd.env_remove(key);
        }
        cmd
    }

    /// Runs the command to completion, or kills it (and its whole process group) when it
    /// exceeds its timeout, which fails the test: a hang is a failure.
    pub fn output(&self) -> RunOutput {
        let started = Instant::now();
        let mut child = self
            .build()
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", self.describe()));
        let stdout = drain(child.stdout.take().unwrap());
        let stderr = drain(child.stderr.take().unwrap());
        let status = loop {
            if let Some(status) = child.try_wait().expect("wait for the child") {
                break Some(status);
            }
            if started.elapsed() > self.timeout {
                let pgid = i32::try_from(child.id()).expect("pid fits i32");
                // SAFETY: kill(2) on the process group this test created for the child.
                unsafe {
                    libc::kill(-pgid, libc::SIGKILL);
                }
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            thread::sleep(Duration::from_millis(10));
        };
        let elapsed = started.elapsed();
        let grace = Duration::from_secs(5);
        let out = RunOutput {
            command: self.describe(),
            root: self.root.clone(),
            status,
            stdout: stdout.recv_timeout(grace).unwrap_or_default(),
            stderr: stderr.recv_timeout(grace).unwrap_or_default(),
            elapsed,
        };
        if out.status.is_none() {
            out.fail(&format!(
                "timed out after {:.1} s (limit {} s): a hang is a failure",
                elapsed.as_secs_f64(),
                self.timeout.as_secs()
            ));
        }
        out
    }

    /// Runs the command and requires exit code 0.
    pub fn assert_success(&self) -> RunOutput {
        let out = self.output();
        if out.code() != Some(0) {
            out.fail("expected success");
        }
        out
    }

    /// Runs the command and requires the exit code `code`.
    pub fn assert_code(&self, code: i32) -> RunOutput {
        let out = self.output();
        if out.code() != Some(code) {
            out.fail(&format!("expected exit code {code}"));
        }
        out
    }
}

/// Reads a pipe to its end on a helper thread, so that neither pipe can fill up and block the
/// child; the text arrives on the returned channel.
fn drain(mut pipe: impl Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = pipe.read_to_end(&mut buf);
        let _ = tx.send(String::from_utf8_lossy(&buf).into_owned());
    });
    rx
}

/// What a finished command did.
#[derive(Debug)]
pub struct RunOutput {
    pub command: String,
    root: PathBuf,
    /// `None` when the command was killed for exceeding its timeout.
    pub status: Option<ExitStatus>,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
}

impl RunOutput {
    /// The exit code (`None` when killed by a signal or the timeout).
    pub fn code(&self) -> Option<i32> {
        self.status.and_then(|s| s.code())
    }

    /// A report of the run, for failure messages.
    pub fn report(&self) -> String {
        format!(
            "command: {}\ncwd: {}\nstatus: {}\nelapsed: {:.2} s\n--- stdout ---\n{}\n--- stderr ---\n{}\n--- directory ---\n{}",
            self.command,
            self.root.display(),
            match self.status {
                Some(s) => s.to_string(),
                None => "killed (timeout)".to_string(),
            },
            self.elapsed.as_secs_f64(),
            self.stdout,
            self.stderr,
            listing(&self.root)
        )
    }

    /// Fails the test with `why` and the full report.
    #[track_caller]
    pub fn fail(&self, why: &str) -> ! {
        panic!("\n{why}\n{}", self.report())
    }

    /// Requires `cond`, failing with `why` and the report otherwise.
    #[track_caller]
    pub fn check(&self, cond: bool, why: &str) {
        if !cond {
            self.fail(why);
        }
    }

    /// Requires stderr to contain `needle`.
    #[track_caller]
    pub fn stderr_has(&self, needle: &str) {
        self.check(
            self.stderr.contains(needle),
            &format!("expected stderr to contain {needle:?}"),
        );
    }

    /// Requires stdout and stderr to hold no Rust debug text ([`debug_text`]).
    #[track_caller]
    pub fn no_debug_text(&self) {
        for text in [&self.stdout, &self.stderr] {
            if let Some(found) = debug_text(text) {
                self.fail(&format!("Rust debug text in a message: {found:?}"));
            }
        }
    }

    /// Requires some rank to have said `needle` on stderr, where several ranks print the same
    /// line at once: each word of `needle` must appear, in order, within one stretch of at most
    /// 1 KiB. A line written in several `write(2)` calls (one per piece of its format string) may
    /// be interleaved with another rank's pieces, but its words keep their order; a line written
    /// in one call matches as well.
    #[track_caller]
    pub fn stderr_says(&self, needle: &str) {
        self.check(
            says(&self.stderr, needle),
            &format!("expected some rank to say {needle:?} on stderr"),
        );
    }
}

/// The first piece of `text` shaped like Rust's `{:?}` of a struct or an enum variant with a
/// value: `Name { field:` or `Name(12)` / `Name("x")` / `Some(`.
pub fn debug_text(text: &str) -> Option<String> {
    let b = text.as_bytes();
    let word = |i: usize| b[i].is_ascii_alphanumeric() || b[i] == b'_';
    for (i, &c) in b.iter().enumerate() {
        // A capitalized identifier starting here.
        if !c.is_ascii_uppercase() || (i > 0 && word(i - 1)) {
            continue;
        }
        let mut j = i;
        while j < b.len() && word(j) {
            j += 1;
        }
        let rest = &text[j..];
        let value = rest.strip_prefix('(').is_some_and(|r| {
            let r = r.trim_start_matches('"');
            let n = r.bytes().take_while(u8::is_ascii_alphanumeric).count();
            n > 0 && (r[n..].starts_with(')') || r[n..].starts_with('"'))
        });
        let fields = rest.strip_prefix(" { ").is_some_and(|r| {
            let n = r
                .bytes()
                .take_while(|&c| c.is_ascii_alphanumeric() || c == b'_')
                .count();
            n > 0 && r[n..].starts_with(':')
        });
        if value || fields {
            return Some(text[i..(j + 24).min(text.len())].to_string());
        }
    }
    None
}

/// Whether the words of `needle` occur in `text` in order, within 1 KiB of where the first one
/// occurs (see [`RunOutput::stderr_says`]).
pub fn says(text: &str, needle: &str) -> bool {
    let words: Vec<&str> = needle.split_whitespace().collect();
    let Some(first) = words.first() else {
        return true;
    };
    text.match_indices(first).any(|(start, _)| {
        let window = &text[start..];
        let window = &window[..floor_char_boundary(window, 1024)];
        let mut at = 0;
        words.iter().all(|w| match window[at..].find(w) {
            Some(i) => {
                at += i + w.len();
                true
            }
            None => false,
        })
    })
}

/// The largest index at most `max` that starts a character of `s` (or its length).
fn floor_char_boundary(s: &str, max: usize) -> usize {
    if max >= s.len() {
        return s.len();
    }
    (0..=max)
        .rev()
        .find(|&i| s.is_char_boundary(i))
        .unwrap_or(0)
}

/// A snapshot of every file below a directory (relative path → bytes), to prove that a run left
/// it untouched.
pub fn snapshot(root: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<(PathBuf, Vec<u8>)>) {
        for e in fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(root).unwrap().to_path_buf();
            if p.is_dir() {
                out.push((rel.join(""), Vec::new()));
                walk(root, &p, out);
            } else {
                out.push((rel, fs::read(&p).unwrap()));
            }
        }
    }
    let mut out = Vec::new();
    if root.is_dir() {
        walk(root, root, &mut out);
    } else {
        out.push((PathBuf::new(), fs::read(root).unwrap()));
    }
    out.sort();
    out
}

/// What a directory tree looks like from outside: every entry below `root` and `root` itself
/// (relative path, kind, size, modification time), without following symbolic links. Equal
/// states before and after a command show it created, removed and wrote nothing there (a
/// directory's modification time changes with any entry created or removed in it).
pub fn tree_state(root: &Path) -> Vec<(PathBuf, char, u64, std::time::SystemTime)> {
    fn walk(root: &Path, path: &Path, out: &mut Vec<(PathBuf, char, u64, std::time::SystemTime)>) {
        let meta =
            fs::symlink_metadata(path).unwrap_or_else(|e| panic!("stat {}: {e}", path.display()));
        let kind = if meta.is_dir() {
            'd'
        } else if meta.file_type().is_symlink() {
            'l'
        } else {
            'f'
        };
        let rel = path.strip_prefix(root).unwrap().to_path_buf();
        out.push((rel, kind, meta.len(), meta.modified().unwrap()));
        if kind == 'd' {
            for e in fs::read_dir(path).unwrap() {
                walk(root, &e.unwrap().path(), out);
            }
        }
    }
    let mut out = Vec::new();
    walk(root, root, &mut out);
    out.sort();
    out
}

/// Deterministic pseudo-random bytes (xorshift), for payloads and garbage inputs.
pub fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// Reports that a test (or a part of it) cannot run here, and why. With `RESHARD_NO_SKIP=1` in
/// the environment (CI sets it) that is a failure: the test panics with `reason`. Otherwise it
/// prints one line, `SKIPPED <test>: <reason>`, straight to the process's stderr (the harness
/// captures `eprintln!`, not this), and the caller returns or leaves the part out.
#[track_caller]
pub fn skip(test: &str, reason: &str) {
    if std::env::var_os("RESHARD_NO_SKIP").is_some_and(|v| v == "1") {
        panic!("{test} cannot run: {reason} (RESHARD_NO_SKIP=1: skipping is a failure)");
    }
    // Loud: the test command still says ok, so this line is all there is to see.
    let line = format!(
        "SKIPPED {test}: {reason} -- THIS TEST DID NOT RUN (examples/quickstart.sh installs what the tests need; RESHARD_NO_SKIP=1 makes a skip fail)\n"
    );
    let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
}

/// Whether python3 is available; reports a skip of `what` (see [`skip`]) when it is not.
pub fn have_python(what: &str) -> bool {
    let ok = find_on_path("python3").is_some();
    if !ok {
        skip(what, "python3 not found on PATH");
    }
    ok
}

/// A Python interpreter that can import webdataset, for reading outputs back the way a training
/// job does: `$RESHARD_TEST_PYTHON` when set (it must work), else the venv `.ci/run` makes at
/// `target/pyenv`; `None` when there is neither.
pub fn test_python() -> Option<PathBuf> {
    let works = |py: &Path| {
        Command::new(py)
            .args(["-c", "import webdataset"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if let Some(py) = std::env::var_os("RESHARD_TEST_PYTHON") {
        let py = PathBuf::from(py);
        assert!(
            works(&py),
            "RESHARD_TEST_PYTHON={} cannot import webdataset",
            py.display()
        );
        return Some(py);
    }
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/pyenv/bin/python");
    works(&venv).then_some(venv)
}

/// Copies the directory `from` into `to` (created), subdirectories included.
pub fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap_or_else(|e| panic!("create {}: {e}", to.display()));
    for e in fs::read_dir(from).unwrap_or_else(|e| panic!("list {}: {e}", from.display())) {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            fs::copy(e.path(), &target)
                .unwrap_or_else(|err| panic!("copy {}: {err}", e.path().display()));
        }
    }
}

/// The `index.json` of the output directory `out`, parsed; panics naming the file when it is
/// missing or not JSON.
pub fn index_json(out: &Path) -> serde_json::Value {
    let path = out.join("index.json");
    let bytes = fs::read(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{}: not JSON: {e}", path.display()))
}

/// Runs `f` with a fresh tmpfs of `size` mounted at `at` (root only; `None` where mounting is
/// not possible here), unmounting it afterwards.
pub fn with_tmpfs<T>(at: &Path, size: &str, ro: bool, f: impl FnOnce() -> T) -> Option<T> {
    fs::create_dir_all(at).unwrap();
    let opts = format!("size={size}{}", if ro { ",ro" } else { "" });
    let ok = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", &opts, "tmpfs"])
        .arg(at)
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        skip(
            &format!("the tmpfs part of a test ({})", at.display()),
            "cannot mount a tmpfs here (needs root)",
        );
        return None;
    }
    let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    let _ = std::process::Command::new("umount").arg(at).status();
    Some(out.unwrap_or_else(|p| std::panic::resume_unwind(p)))
}

/// `v`, sorted.
pub fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

/// Copies the output `from` to `name` and damages the copy.
pub fn damaged<T>(dir: &Dir, from: &str, name: &str, damage: impl FnOnce(&Path) -> T) -> T {
    let out = dir.create_dir(name);
    copy_dir(&dir.join(from), &out);
    damage(&out)
}

/// Rewrites the `index.json` of `out` as `f` edits it.
pub fn edit_index(out: &Path, f: impl FnOnce(&mut serde_json::Value)) {
    let mut v = index_json(out);
    f(&mut v);
    fs::write(
        out.join("index.json"),
        serde_json::to_vec_pretty(&v).unwrap(),
    )
    .unwrap();
}

/// Runs `cmd` and samples, from outside, the peak resident set (`VmHWM` in `/proc/PID/status`)
/// of every `reshard` process whose working directory is `dir` (the ranks under `mpirun`, which
/// runs them where it was started) while it runs. Returns the output and each rank process's
/// last sampled `VmHWM` in bytes. `VmHWM` only grows, so the last sample is the peak up to a
/// moment before the process ended; none of a rank's memory is taken from its own report.
pub fn output_with_peaks(cmd: &TestCommand, dir: &Path) -> (RunOutput, Vec<u64>) {
    use std::collections::BTreeMap;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let done = Arc::clone(&done);
        let dir = dir.to_path_buf();
        let exe = reshard_exe();
        thread::spawn(move || {
            let mut peaks: BTreeMap<u32, u64> = BTreeMap::new();
            while !done.load(Ordering::Relaxed) {
                for (pid, hwm) in rank_peaks(&exe, &dir) {
                    let p = peaks.entry(pid).or_default();
                    *p = (*p).max(hwm);
                }
                thread::sleep(Duration::from_millis(5));
            }
            peaks.into_values().collect::<Vec<u64>>()
        })
    };
    let out = cmd.output();
    done.store(true, Ordering::Relaxed);
    (out, sampler.join().expect("the sampler thread"))
}

/// The `/proc` directories of the processes running `exe` in `dir` right now.
fn processes_in(exe: &Path, dir: &Path) -> Vec<(u32, PathBuf)> {
    let Ok(procs) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    procs
        .filter_map(Result::ok)
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let p = e.path();
            let running = fs::read_link(p.join("exe")).ok()?;
            // A binary rebuilt meanwhile reads as "PATH (deleted)".
            let running = running.to_string_lossy();
            let ours = running.starts_with(&*exe.to_string_lossy())
                && fs::read_link(p.join("cwd")).ok()? == dir;
            ours.then_some((pid, p))
        })
        .collect()
}

/// The pids of the `reshard` processes running in `dir` right now, with their rank (`PMI_RANK`
/// in their environment, which mpirun sets; `None` without a launcher).
pub fn reshard_processes(dir: &Path) -> Vec<(u32, Option<usize>)> {
    processes_in(&reshard_exe(), dir)
        .into_iter()
        .map(|(pid, p)| {
            let env = fs::read(p.join("environ")).unwrap_or_default();
            let rank = env
                .split(|&b| b == 0)
                .find_map(|v| v.strip_prefix(b"PMI_RANK="))
                .and_then(|r| std::str::from_utf8(r).ok()?.parse().ok());
            (pid, rank)
        })
        .collect()
}

/// The pids of every process whose working directory is `dir` right now: under `mpirun`, the
/// launcher, its proxies and the ranks (each in a process group of its own), as a scheduler that
/// suspends a job stops them all.
pub fn job_processes(dir: &Path) -> Vec<u32> {
    let Ok(procs) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut pids: Vec<u32> = procs
        .filter_map(Result::ok)
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            (fs::read_link(e.path().join("cwd")).ok()? == dir).then_some(pid)
        })
        .collect();
    pids.sort_unstable();
    pids
}

/// Sends `signal` to the process `pid`.
pub fn signal(pid: u32, signal: i32) {
    let pid = i32::try_from(pid).expect("pid fits i32");
    // SAFETY: kill(2) on a reshard process this test started.
    let rc = unsafe { libc::kill(pid, signal) };
    assert_eq!(rc, 0, "kill({pid}, {signal}) failed");
}

/// Sends `signal` to the process `pid` unless it has already exited (it may, between a listing
/// of a job's processes and the signal: a killed rank's launcher ends the others); whether it
/// was sent.
pub fn signal_if_alive(pid: u32, signal: i32) -> bool {
    let pid = i32::try_from(pid).expect("pid fits i32");
    // SAFETY: kill(2) on a reshard process this test started.
    let rc = unsafe { libc::kill(pid, signal) };
    let gone = std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
    assert!(rc == 0 || gone, "kill({pid}, {signal}) failed");
    rc == 0
}

/// `(pid, VmHWM in bytes)` of the processes running `exe` in `dir` right now.
fn rank_peaks(exe: &Path, dir: &Path) -> Vec<(u32, u64)> {
    processes_in(exe, dir)
        .into_iter()
        .filter_map(|(pid, p)| {
            let status = fs::read_to_string(p.join("status")).ok()?;
            let kib: u64 = status
                .lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))?
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse()
                .ok()?;
            Some((pid, kib << 10))
        })
        .collect()
}
