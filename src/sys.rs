//! The system interface below `std`: every `unsafe` call to libc, each behind a small safe
//! function that says what it guarantees, the read loops that retry interrupted reads, and every
//! read of `/proc` (what the kernel says about this host and its processes).
//!
//! Nothing else in the crate calls libc directly, so a reader auditing `unsafe` looks here only
//! (MPI's own FFI stays in `comm::mpi`); nothing else reads `/proc`, so a port to another system
//! starts here.

use std::ffi::CString;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Tells the kernel that `file` is read at scattered offsets, so that it reads ahead nothing
/// (`posix_fadvise(POSIX_FADV_RANDOM)` over the whole file).
///
/// Only a hint: where it is not supported, nothing changes, and no error is reported.
pub(crate) fn advise_random(file: &File) {
    // SAFETY: a valid open descriptor; the call reads no memory of ours.
    unsafe {
        libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM);
    }
}

/// One `copy_file_range(2)` call: copies up to `len` bytes from `src` at `src_offset` to `dst`
/// at `dst_offset` inside the kernel, without moving either file's cursor. Offsets are the
/// kernel's signed `loff_t`.
///
/// Returns the bytes copied, which may be fewer than `len`; 0 means `src` ends at `src_offset`.
///
/// # Errors
/// The raw OS error: `EXDEV`, `EINVAL`, `ENOSYS` or `EOPNOTSUPP` where the filesystems cannot
/// copy in the kernel (the caller falls back to reading and writing), `EINTR` (retry), or a
/// real I/O error.
pub(crate) fn copy_file_range(
    src: &File,
    src_offset: i64,
    dst: &File,
    dst_offset: i64,
    len: usize,
) -> io::Result<usize> {
    let (mut off_in, mut off_out) = (src_offset, dst_offset);
    // SAFETY: valid descriptors and offset pointers that live across the call.
    let n = unsafe {
        libc::copy_file_range(
            src.as_raw_fd(),
            &mut off_in,
            dst.as_raw_fd(),
            &mut off_out,
            len,
            0,
        )
    };
    usize::try_from(n).map_err(|_| io::Error::last_os_error())
}

/// `ioprio_set(2)`'s classes: best effort (levels 0-7, 4 by default) and idle (served only when
/// no one else uses the disk).
pub(crate) const IOPRIO_CLASS_BE: i32 = 2;
pub(crate) const IOPRIO_CLASS_IDLE: i32 = 3;
/// `IOPRIO_WHO_PROCESS`: `ioprio_set` for one task; with id 0, the calling thread.
const IOPRIO_WHO_PROCESS: libc::c_int = 1;

/// Sets the calling thread's I/O priority to `class` and `level` (`ioprio_set(2)`); the threads
/// it starts afterwards inherit it. The kernel's schedulers (BFQ, and CFQ before it) honour it;
/// others (none, mq-deadline) do not.
///
/// # Errors
/// The kernel refuses it (the real-time class needs privileges; these do not).
pub(crate) fn set_io_priority(class: i32, level: i32) -> io::Result<()> {
    // SAFETY: ioprio_set takes three integers and touches no memory of ours.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_ioprio_set,
            IOPRIO_WHO_PROCESS,
            0,
            (class << 13) | level,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
/// The calling thread's I/O priority: (class, level), as [`set_io_priority`] takes them.
///
/// # Errors
/// The kernel refuses to say.
pub(crate) fn io_priority() -> io::Result<(i32, i32)> {
    // SAFETY: ioprio_get takes two integers and touches no memory of ours.
    let rc = unsafe { libc::syscall(libc::SYS_ioprio_get, IOPRIO_WHO_PROCESS, 0) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    let prio = rc as i32;
    Ok((prio >> 13, prio & 0x1fff))
}

/// Sets the calling thread's CPU nice value (`setpriority(2)`; on Linux it is per thread, and
/// the threads it starts afterwards inherit it).
///
/// # Errors
/// The kernel refuses it (lowering the value below the current one needs privileges).
pub(crate) fn set_nice(nice: i32) -> io::Result<()> {
    // SAFETY: setpriority takes integers and touches no memory of ours.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, nice) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Starts writing back the dirty pages of `len` bytes of `file` at `offset`, without waiting
/// for them (`sync_file_range(SYNC_FILE_RANGE_WRITE)`).
///
/// Only a hint, and no durability guarantee: where the filesystem does not support it nothing
/// happens, no error is reported, and a later `fsync` does all the work.
pub(crate) fn start_writeback(file: &File, offset: u64, len: u64) {
    let (Ok(offset), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else {
        return;
    };
    // SAFETY: a valid open descriptor; the call reads no memory of ours.
    unsafe {
        libc::sync_file_range(file.as_raw_fd(), offset, len, libc::SYNC_FILE_RANGE_WRITE);
    }
}

/// Writes `line` and a newline to stderr with one `write(2)` (short lines, up to `PIPE_BUF`
/// bytes, are atomic on a pipe): lines that several ranks print at once through a launcher's
/// relay stay whole, where `eprintln!` writes each piece of its format separately. Errors are
/// ignored, as `eprintln!`'s would end the process.
pub fn stderr_line(line: &str) {
    use std::io::Write;
    let mut text = String::with_capacity(line.len() + 1);
    text.push_str(line);
    text.push('\n');
    let _ = std::io::stderr().lock().write_all(text.as_bytes());
}

/// The bytes an unprivileged user may still write on the file system that holds `path`
/// (`statvfs`: available blocks times the fragment size).
///
/// # Errors
/// `path` contains a NUL byte or cannot be examined.
pub(crate) fn free_space(path: &Path) -> io::Result<u64> {
    let c = CString::new(path.as_os_str().as_bytes())?;
    // SAFETY: a valid NUL-terminated path and a zeroed statvfs that live across the call.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::statvfs(c.as_ptr(), &mut st) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    #[allow(clippy::unnecessary_cast)]
    Ok((st.f_bavail as u64).saturating_mul(st.f_frsize as u64))
}

/// The size of a page of the page cache.
pub(crate) fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(n).ok().filter(|&n| n > 0).unwrap_or(4096)
}

/// Atomically swaps the paths `a` and `b` (Linux `renameat2(RENAME_EXCHANGE)`): afterwards `a`
/// names what `b` named and the other way round, and no observer ever sees either path missing.
/// Relative paths are taken from the current directory.
///
/// # Errors
/// A path contains a NUL byte, either path does not exist, they are on different filesystems,
/// or the kernel or filesystem does not support the exchange (`EINVAL`, `ENOSYS`): nothing is
/// renamed.
pub(crate) fn exchange_paths(a: &Path, b: &Path) -> io::Result<()> {
    renameat2(a, b, libc::RENAME_EXCHANGE)
}

/// Renames `from` to `to` only if nothing is at `to` (Linux `renameat2(RENAME_NOREPLACE)`):
/// whatever appears at `to` is never replaced, however late it appears.
///
/// # Errors
/// `to` exists (`AlreadyExists`), a path contains a NUL byte, or the kernel or filesystem does
/// not support the flag (`EINVAL`, `ENOSYS`; see [`unsupported`]): nothing is renamed.
pub(crate) fn rename_noreplace(from: &Path, to: &Path) -> io::Result<()> {
    renameat2(from, to, libc::RENAME_NOREPLACE)
}

/// Whether `e` says that the kernel or the filesystem does not support a `renameat2` flag.
pub(crate) fn unsupported(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ENOSYS))
}

fn renameat2(a: &Path, b: &Path, flags: libc::c_uint) -> io::Result<()> {
    let ca = CString::new(a.as_os_str().as_bytes())?;
    let cb = CString::new(b.as_os_str().as_bytes())?;
    // SAFETY: both are valid NUL-terminated paths that live across the call; AT_FDCWD is
    // ignored for absolute paths.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            ca.as_ptr(),
            libc::AT_FDCWD,
            cb.as_ptr(),
            flags,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Stops the whole process, every thread of it, with `SIGSTOP` (as a node that froze would),
/// returning only if and when something sends it `SIGCONT`. For fault injection in tests (a
/// user's build, without the `test-hooks` feature, has none).
#[cfg(feature = "test-hooks")]
pub(crate) fn stop_process() {
    // SAFETY: raise(2) on this process; no memory of ours is involved.
    unsafe {
        libc::raise(libc::SIGSTOP);
    }
}

/// Kills the whole process with `SIGKILL`, as the OOM killer or a lost node would: nothing of
/// it runs again. For fault injection in tests.
#[cfg(feature = "test-hooks")]
pub(crate) fn kill_process() -> ! {
    // SAFETY: raise(2) on this process; no memory of ours is involved.
    unsafe {
        libc::raise(libc::SIGKILL);
    }
    unreachable!("SIGKILL cannot be caught")
}

/// Ends the process at once with `code` (`_exit(2)`): no destructors, no atexit handlers, no
/// flushing of stdio buffers, so it cannot block in a library's teardown (MPI's, say).
pub(crate) fn exit_now(code: i32) -> ! {
    // SAFETY: _exit never returns and touches no memory of ours.
    unsafe { libc::_exit(code) }
}

/// The first stop signal (SIGINT, SIGTERM) this process received since [`catch_stop_signals`].
static STOP_SIGNAL: AtomicI32 = AtomicI32::new(0);

/// From now on SIGINT and SIGTERM only record that they came ([`stop_signal`]), so that the job
/// can checkpoint and end in order; a second one ends the process at once with status 128 + the
/// signal's number, as the default action would report it. Interrupted system calls restart.
///
/// # Errors
/// `sigaction` failed (the signals keep their default action).
pub fn catch_stop_signals() -> io::Result<()> {
    extern "C" fn on_stop(signal: libc::c_int) {
        if STOP_SIGNAL.swap(signal, Ordering::SeqCst) != 0 {
            // SAFETY: _exit is async-signal-safe.
            unsafe { libc::_exit(128 + signal) }
        }
    }
    for signal in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: installs a handler that only swaps an atomic or calls _exit, both
        // async-signal-safe.
        let rc = unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_stop as extern "C" fn(libc::c_int) as libc::sighandler_t;
            action.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(signal, &action, std::ptr::null_mut())
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The stop signal this process received, if any (see [`catch_stop_signals`]).
pub fn stop_signal() -> Option<i32> {
    Some(STOP_SIGNAL.load(Ordering::SeqCst)).filter(|&s| s != 0)
}

/// The name of a stop signal, for messages.
pub(crate) fn signal_name(signal: i32) -> String {
    match signal {
        libc::SIGINT => "SIGINT".into(),
        libc::SIGTERM => "SIGTERM".into(),
        n => format!("signal {n}"),
    }
}

/// A thread of this process, as [`park_thread`] names it.
pub(crate) type Thread = libc::pthread_t;

/// The calling thread.
pub(crate) fn current_thread() -> Thread {
    // SAFETY: pthread_self has no preconditions.
    unsafe { libc::pthread_self() }
}

/// Stops `thread` for good: it waits in a signal handler until the process exits. Returns
/// whether it did within a second.
pub(crate) fn park_thread(thread: Thread) -> bool {
    static PARKED: AtomicBool = AtomicBool::new(false);
    extern "C" fn wait_forever(_: libc::c_int) {
        PARKED.store(true, Ordering::SeqCst);
        loop {
            // SAFETY: pause(2) is async-signal-safe.
            unsafe {
                libc::pause();
            }
        }
    }
    let signal = libc::SIGRTMIN() + 3;
    // SAFETY: installs a handler that only stores an atomic and pauses (async-signal-safe), then
    // signals a thread of this process that is alive (the process has not begun to exit).
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = wait_forever as extern "C" fn(libc::c_int) as libc::sighandler_t;
        libc::sigemptyset(&mut action.sa_mask);
        if libc::sigaction(signal, &action, std::ptr::null_mut()) != 0
            || libc::pthread_kill(thread, signal) != 0
        {
            return false;
        }
    }
    let asked = Instant::now();
    while !PARKED.load(Ordering::SeqCst) {
        if asked.elapsed() > Duration::from_secs(1) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    true
}

/// The Unix stream socket open at `fd`, borrowed: dropping it does not close the descriptor,
/// which stays its owner's. For a descriptor inherited open for the life of the process (the
/// PMI socket hydra gives a rank, [`crate::comm::hydra`]).
pub(crate) fn borrow_unix_stream(
    fd: std::os::fd::RawFd,
) -> std::mem::ManuallyDrop<std::os::unix::net::UnixStream> {
    use std::os::fd::FromRawFd;
    // SAFETY: the caller names a descriptor open for the life of the process; ManuallyDrop
    // keeps it from being closed here, so its owner's use of it is unchanged.
    std::mem::ManuallyDrop::new(unsafe { std::os::unix::net::UnixStream::from_raw_fd(fd) })
}

/// This host's name, or `unknown-host` where the kernel does not say (one word: it is written
/// into the lock file and into messages).
pub(crate) fn hostname() -> String {
    Some(proc_line("/proc/sys/kernel/hostname"))
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown-host".into())
}

/// This boot's id (`/proc/sys/kernel/random/boot_id`), empty where unknown: a pid names the same
/// process only within one boot.
pub(crate) fn boot_id() -> String {
    proc_line("/proc/sys/kernel/random/boot_id")
}

/// This process's PID namespace (the `/proc/self/ns/pid` link, `pid:[4026531836]`), empty where
/// unknown: a pid names the same process only within one namespace. Unknown too where the procfs
/// mounted at `/proc` is not this namespace's (`unshare --pid --fork` without `--mount-proc`):
/// `/proc/PID` there names another namespace's processes, so no pid of this one can be looked
/// up in it.
pub(crate) fn pid_namespace() -> String {
    if !own_proc(
        std::fs::read_link("/proc/self").ok().as_deref(),
        std::process::id(),
    ) {
        return String::new();
    }
    std::fs::read_link("/proc/self/ns/pid")
        .map(|l| l.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Whether the procfs at `/proc` is this process's namespace's: its `/proc/self` link (`me`)
/// names this process's pid, `getpid()`.
fn own_proc(me: Option<&Path>, pid: u32) -> bool {
    me.and_then(Path::to_str)
        .is_some_and(|me| me.parse::<u32>().is_ok_and(|me| me == pid))
}

/// The start time of process `pid` (clock ticks since boot): `Some` if it lives, `None` if it is
/// gone. A zombie (exited, not yet reaped: common in containers whose init does not reap) is.
///
/// # Errors
/// `/proc` does not say: its entry cannot be read (`hidepid`: another user's process, whose
/// entry is there but closed), or it cannot be read as a process's `stat`.
pub(crate) fn process_start(pid: u32) -> io::Result<Option<u64>> {
    start_of(std::fs::read_to_string(format!("/proc/{pid}/stat")))
}

fn start_of(stat: io::Result<String>) -> io::Result<Option<u64>> {
    let stat = match stat {
        Ok(stat) => stat,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let unreadable = || io::Error::other("not a process's stat");
    // Fields 3 (state) and 22; the command name (field 2) may hold spaces and parentheses.
    let mut fields = stat[stat.rfind(')').ok_or_else(unreadable)? + 1..].split_whitespace();
    if matches!(fields.next(), Some("Z" | "X" | "x")) {
        return Ok(None);
    }
    let start = fields.nth(18).and_then(|f| f.parse().ok());
    start.map(Some).ok_or_else(unreadable)
}

/// Fills `buf` from the OS's random source (`/dev/urandom`).
///
/// # Errors
/// It cannot be read.
pub(crate) fn random_bytes(buf: &mut [u8]) -> io::Result<()> {
    std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(buf))
}

/// A file of this machine itself, not of the job's storage (a system font), whole.
///
/// # Errors
/// It cannot be read.
pub(crate) fn read_machine_file(path: &Path) -> io::Result<Vec<u8>> {
    std::fs::read(path)
}

/// The highest peak resident set size that [`restart_peak_rss`] has cleared: the kernel's peak
/// then starts again from the current size, but this process's peak is still the larger one.
static PEAK_BEFORE_RESTART: AtomicU64 = AtomicU64::new(0);

/// A `kB` field of `/proc/self/status` (`VmHWM:`, `VmRSS:`), in bytes.
fn status_bytes(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// This process's peak resident set size in bytes (VmHWM, or a higher peak from before a
/// [`restart_peak_rss`]), if the platform reports it.
pub fn peak_rss() -> Option<u64> {
    status_bytes("VmHWM:").map(|b| b.max(PEAK_BEFORE_RESTART.load(Ordering::Relaxed)))
}

/// This process's resident set size now, in bytes (VmRSS).
pub(crate) fn resident() -> Option<u64> {
    status_bytes("VmRSS:")
}

/// The peak resident set size since the last restart (or the start), in bytes; then the kernel's
/// peak starts again from the current size (`5` into `/proc/self/clear_refs`), so that the next
/// call reports the next period's peak alone. [`peak_rss`] still reports the whole run's.
pub(crate) fn restart_peak_rss() -> Option<u64> {
    let peak = status_bytes("VmHWM:")?;
    PEAK_BEFORE_RESTART.fetch_max(peak, Ordering::Relaxed);
    std::fs::write("/proc/self/clear_refs", "5").ok()?;
    Some(peak)
}

/// CPU seconds this process used so far, user and system, over all its threads.
pub(crate) fn cpu_seconds() -> f64 {
    // SAFETY: getrusage writes the struct it is given; zeroed is a valid rusage.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_SELF and a valid pointer; the call cannot fail with these.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
}

/// A one-line `/proc` file, trimmed; empty if it cannot be read.
fn proc_line(path: &str) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Reads until `buf` is full or the input ends; returns the count read. Interrupted reads are
/// retried.
///
/// # Errors
/// A read fails (other than by an interruption).
pub(crate) fn read_up_to<R: Read + ?Sized>(r: &mut R, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// [`read_up_to`] with positioned reads: fills `buf` from `offset` of `file` (fewer bytes where
/// the file ends) without moving its cursor, so threads may share the file.
///
/// # Errors
/// A read fails (other than by an interruption).
pub(crate) fn read_up_to_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    read_up_to(&mut At { file, offset }, buf)
}

/// Opens `name` (a relative path, usually one name) under the open directory `dir` for reading,
/// non-blocking (`openat(2)` with `O_RDONLY | O_NONBLOCK | O_CLOEXEC`): the path is resolved
/// from `dir`, so a caller that opens many files of one directory walks the directory's own
/// path once, not once a file.
///
/// # Errors
/// `name` holds a NUL byte, or the open fails.
pub(crate) fn open_nonblocking_at(dir: &File, name: &[u8]) -> io::Result<File> {
    use std::os::fd::FromRawFd;
    let name = CString::new(name)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a name with a NUL byte"))?;
    let flags = libc::O_RDONLY | libc::O_NONBLOCK | libc::O_CLOEXEC;
    // SAFETY: a valid descriptor and a NUL-terminated name that lives across the call.
    let fd = unsafe { libc::openat(dir.as_raw_fd(), name.as_ptr(), flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just opened and nothing else owns it.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// A [`Read`] over positioned reads of a shared file.
struct At<'f> {
    file: &'f File,
    offset: u64,
}

impl Read for At<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = std::os::unix::fs::FileExt::read_at(self.file, buf, self.offset)?;
        self.offset += n as u64;
        Ok(n)
    }
}

/// What tells cheaply that a file was replaced or rewritten: its size, modification and
/// status-change times and its inode. A rewrite in place keeps the size but moves the times (the
/// change time cannot be set back by a user); a replacement by rename changes the inode.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FileStamp {
    pub(crate) size: u64,
    pub(crate) mtime_ns: i128,
    pub(crate) ctime_ns: i128,
    /// Only compared where one host took both stamps: device numbers, and on some network
    /// and FUSE file systems inode numbers, differ between hosts.
    pub(crate) dev: u64,
    /// What tells this file from another that replaced it at the same path: the inode on a
    /// file system, a hash of the ETag of an object, a counter in memory. Recorded as `ino`
    /// (checkpoint records hold stamps).
    #[serde(rename = "ino")]
    pub(crate) identity: u64,
}

impl FileStamp {
    /// The stamp of a file from its metadata.
    pub(crate) fn of(meta: &std::fs::Metadata) -> Self {
        use std::os::unix::fs::MetadataExt;
        let ns = |s: i64, n: i64| i128::from(s) * 1_000_000_000 + i128::from(n);
        FileStamp {
            size: meta.len(),
            mtime_ns: ns(meta.mtime(), meta.mtime_nsec()),
            ctime_ns: ns(meta.ctime(), meta.ctime_nsec()),
            dev: meta.dev(),
            identity: meta.ino(),
        }
    }

    /// What differs from `then` to `self` (now), for a message; empty when nothing does. The
    /// device and inode count only when `same_host` took both stamps.
    pub(crate) fn changes_since(&self, then: &FileStamp, same_host: bool) -> String {
        let mut what = Vec::new();
        if self.size != then.size {
            what.push(format!("size {} -> {} bytes", then.size, self.size));
        }
        if self.mtime_ns != then.mtime_ns {
            what.push("modification time".to_string());
        }
        if self.ctime_ns != then.ctime_ns {
            what.push("status-change time".to_string());
        }
        if same_host && (self.dev, self.identity) != (then.dev, then.identity) {
            what.push("inode (replaced by another file)".to_string());
        }
        what.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_priority_is_set_for_the_thread_and_inherited() {
        // On a thread of its own: the test thread's priority stays as it was.
        std::thread::spawn(|| {
            set_io_priority(IOPRIO_CLASS_IDLE, 0).unwrap();
            assert_eq!(io_priority().unwrap().0, IOPRIO_CLASS_IDLE);
            let child = std::thread::spawn(|| io_priority().unwrap().0);
            assert_eq!(child.join().unwrap(), IOPRIO_CLASS_IDLE);
            set_io_priority(IOPRIO_CLASS_BE, 7).unwrap();
            assert_eq!(io_priority().unwrap(), (IOPRIO_CLASS_BE, 7));
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_live_process_has_a_start_time_and_a_zombie_none() {
        assert!(process_start(std::process::id())
            .unwrap()
            .is_some_and(|t| t > 0));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        // Exited but not reaped yet: a zombie, as a dead rank is under an init that never reaps.
        let stat = format!("/proc/{pid}/stat");
        while !std::fs::read_to_string(&stat).unwrap().contains(") Z") {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(process_start(pid).unwrap(), None);
        child.wait().unwrap();
        assert_eq!(process_start(pid).unwrap(), None);
    }

    #[test]
    fn this_host_and_process_as_proc_says() {
        let host = hostname();
        assert!(
            !host.is_empty() && !host.contains(char::is_whitespace),
            "{host}"
        );
        assert!(pid_namespace().starts_with("pid:["), "{}", pid_namespace());
        assert_eq!(boot_id().len(), 36, "{}", boot_id());
        assert!(peak_rss().is_some_and(|b| b > 0));
    }

    #[test]
    fn a_restarted_peak_counts_the_next_period_alone_and_the_whole_peak_stays() {
        let before = restart_peak_rss().unwrap();
        // 256 MiB touched, then freed: the period's peak holds it, the next period's does not.
        let big = vec![1u8; 256 << 20];
        std::hint::black_box(&big);
        drop(big);
        let period = restart_peak_rss().unwrap();
        assert!(period >= 256 << 20, "{period}");
        let next = restart_peak_rss().unwrap();
        assert!(next < period - (128 << 20), "{next} after {period}");
        assert!(peak_rss().unwrap() >= period.max(before));
        assert!(resident().unwrap() > 0 && cpu_seconds() > 0.0);
    }

    #[test]
    fn reads_up_to_the_end_at_any_offset() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let data: Vec<u8> = (0..5000u32).map(|i| i as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let file = File::open(&path).unwrap();
        let mut buf = vec![0u8; 3000];
        assert_eq!(read_up_to_at(&file, &mut buf, 1000).unwrap(), 3000);
        assert_eq!(buf, data[1000..4000]);
        assert_eq!(read_up_to_at(&file, &mut buf, 4000).unwrap(), 1000);
        assert_eq!(buf[..1000], data[4000..]);
        assert_eq!(read_up_to_at(&file, &mut buf, 9000).unwrap(), 0);
    }

    #[test]
    fn exchange_paths_swaps_two_directories() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        std::fs::create_dir(&a).unwrap();
        std::fs::create_dir(&b).unwrap();
        std::fs::write(a.join("in_a"), b"").unwrap();
        match exchange_paths(&a, &b) {
            Ok(()) => assert!(b.join("in_a").exists() && !a.join("in_a").exists()),
            // A filesystem without RENAME_EXCHANGE: nothing renamed.
            Err(_) => assert!(a.join("in_a").exists()),
        }
    }

    #[test]
    fn rename_noreplace_never_replaces() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        std::fs::create_dir(&a).unwrap();
        std::fs::create_dir(&b).unwrap();
        // Even an empty directory, which rename(2) would replace, stays.
        let e = rename_noreplace(&a, &b).unwrap_err();
        assert!(
            e.kind() == io::ErrorKind::AlreadyExists || unsupported(&e),
            "{e}"
        );
        assert!(a.is_dir() && b.is_dir());
        std::fs::remove_dir(&b).unwrap();
        match rename_noreplace(&a, &b) {
            Ok(()) => assert!(b.is_dir() && !a.exists()),
            Err(e) => assert!(unsupported(&e) && a.is_dir(), "{e}"),
        }
    }

    #[test]
    fn a_procfs_whose_self_is_not_getpid_is_not_this_namespaces() {
        // `unshare --pid --fork` without `--mount-proc`: getpid() is 1, /proc/self the host's.
        assert!(!own_proc(Some(Path::new("7694")), 1));
        assert!(!own_proc(None, 1));
        assert!(!own_proc(Some(Path::new("self")), 1));
        assert!(own_proc(Some(Path::new("7694")), 7694));
        assert!(own_proc(
            std::fs::read_link("/proc/self").ok().as_deref(),
            std::process::id()
        ));
        assert!(!pid_namespace().is_empty());
    }

    #[test]
    fn a_closed_proc_entry_says_nothing_of_the_process() {
        let closed = io::Error::from(io::ErrorKind::PermissionDenied);
        assert!(start_of(Err(closed)).is_err(), "hidepid: not gone");
        let gone = io::Error::from(io::ErrorKind::NotFound);
        assert_eq!(start_of(Err(gone)).unwrap(), None);
        let stat = "12 (a (b) c) S 1 12 12 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 4242 1 1";
        assert_eq!(start_of(Ok(stat.into())).unwrap(), Some(4242));
        let zombie = stat.replace(") S ", ") Z ");
        assert_eq!(start_of(Ok(zombie)).unwrap(), None);
        assert!(start_of(Ok("garbage".into())).is_err());
    }
}
