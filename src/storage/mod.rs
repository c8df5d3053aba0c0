//! The storage seam: where shards are read from ([`Source`]) and where outputs go ([`Sink`]).
//!
//! Every phase and `verify` reach files through these two traits, never through `std::fs`, so a
//! new backend (object storage), a throttle or a fault injector is one new file wrapping or
//! implementing them plus its registration in [`source`] and [`sink`].
//!
//! A location is a path as the user wrote it; its scheme picks the backend. Today that is
//! [`posix`] for every plain path, the object stores of [`OBJECT_STORES`] (`s3://bucket/key`,
//! `gs://bucket/key`, `az://container/key`, all served by the shared code in [`s3`]), and in
//! unit tests [`memory`] for `mem://…`. A backend that
//! lacks something POSIX has (object storage has no rename and no write at an offset) says so in
//! its [`Capabilities`]; the caller asks before it relies on it.

use std::any::Any;
use std::ffi::OsString;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub(crate) use crate::sys::FileStamp;

pub(crate) mod aws_profile;
pub(crate) mod azure;
pub(crate) mod endpoint;
pub(crate) mod gcs;
#[cfg(test)]
pub(crate) mod memory;
pub(crate) mod paced;
pub(crate) mod posix;
pub(crate) mod s3;
mod schemes;
pub(crate) mod spool;

use paced::Paced;
pub(crate) use schemes::{is_object_store, object_scheme, register_source, OBJECT_STORES};
use schemes::{object_store, PACED_OBJECT_STORES};

/// What a location is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    File,
    Dir,
    /// A symbolic link, seen without following it ([`Source::stat_link`], listings).
    Link,
    /// Anything else: a device, a socket, a pipe.
    Other,
}

/// What a stat of a location tells: its kind and its stamp (size, times, identity).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stat {
    pub(crate) kind: Kind,
    pub(crate) stamp: FileStamp,
}

/// One entry of a listing: its name inside the listed directory (or prefix) and its kind, as the
/// listing tells it without following symbolic links.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    pub(crate) name: OsString,
    pub(crate) kind: Kind,
}

/// Where shards (and small metadata files next to them) are read from.
pub(crate) trait Source: Send + Sync {
    /// The kind and stamp of `path`, following symbolic links.
    ///
    /// # Errors
    /// It does not exist or cannot be examined.
    fn stat(&self, path: &Path) -> io::Result<Stat>;

    /// The kind and stamp of `path` itself: a symbolic link is [`Kind::Link`], not what it
    /// points at.
    ///
    /// # Errors
    /// It does not exist or cannot be examined.
    fn stat_link(&self, path: &Path) -> io::Result<Stat>;

    /// The entries of the directory (or prefix) `path`, in no particular order.
    ///
    /// # Errors
    /// It is not a directory or cannot be listed.
    fn list(&self, path: &Path) -> io::Result<Vec<Entry>>;

    /// One name for the object at `path`, the same for every path that names it (two inputs
    /// naming one file are told by it).
    ///
    /// # Errors
    /// It does not exist.
    fn canonical(&self, path: &Path) -> io::Result<PathBuf>;

    /// The whole content of the small file at `path` (an input list, an `index.json`).
    ///
    /// # Errors
    /// It cannot be read.
    fn read(&self, path: &Path) -> io::Result<Vec<u8>>;

    /// Opens the shard at `path` for positioned reads (and, through [`Sequential`], streams).
    ///
    /// # Errors
    /// It cannot be opened.
    fn open(&self, path: &Path) -> io::Result<OpenInput>;

    /// The bytes the object at `path` takes on its storage now (POSIX: its allocated blocks, so
    /// a file sized up front but not yet written takes none). The space check counts what a
    /// resumed run's staging area already holds with it. Added after the first edition of the
    /// seam; by default the object's size, right for a store that bills what was written.
    ///
    /// # Errors
    /// It does not exist or cannot be examined.
    fn allocated(&self, path: &Path) -> io::Result<u64> {
        self.stat(path).map(|s| s.stamp.size)
    }
}

/// An input shard opened by a [`Source`]: shared by the threads that read it.
pub(crate) type OpenInput = Arc<dyn Input>;

/// An open input: read at any offset without a cursor, so threads may share it.
pub(crate) trait Input: Send + Sync {
    /// Reads up to `buf.len()` bytes at `offset`: the count read, 0 at the end.
    ///
    /// # Errors
    /// The read fails.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;

    /// The stamp of the open object now (what it is, not what the path names now).
    ///
    /// # Errors
    /// It cannot be examined.
    fn stamp(&self) -> io::Result<FileStamp>;

    /// Says that reads will be scattered (headers only), so the backend reads ahead nothing.
    /// Only a hint.
    fn advise_random(&self) {}

    /// The backend's own type, for fast paths between two objects of one backend
    /// ([`Output::copy_from`]).
    fn as_any(&self) -> &dyn Any;
}

/// Reads until `buf` is full or the input ends, at `offset` of `input`: the count read.
/// Interrupted reads are retried.
///
/// # Errors
/// A read fails.
pub(crate) fn read_up_to_at(input: &dyn Input, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match input.read_at(&mut buf[n..], offset + n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// A sequential, seekable stream over an [`Input`]: its own position, so several streams of one
/// open shard never move each other (a `dup`ed descriptor would share its offset).
#[derive(Clone)]
pub(crate) struct Sequential {
    input: OpenInput,
    pos: u64,
}

impl Sequential {
    /// A stream of `input` from its first byte.
    pub(crate) fn new(input: OpenInput) -> Self {
        Sequential { input, pos: 0 }
    }
}

impl Read for Sequential {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.input.read_at(buf, self.pos)?;
        self.pos += n as u64;
        Ok(n)
    }
}

impl Seek for Sequential {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        let base = match to {
            SeekFrom::Start(p) => {
                self.pos = p;
                return Ok(p);
            }
            SeekFrom::Current(d) => (self.pos, d),
            SeekFrom::End(d) => (self.input.stamp()?.size, d),
        };
        self.pos = base
            .0
            .checked_add_signed(base.1)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "seek before byte 0"))?;
        Ok(self.pos)
    }
}

/// What a [`Sink`] can do beyond creating, writing whole objects and removing them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Capabilities {
    /// [`Output::write_at`] at any offset, in any order (POSIX); without it an output is written
    /// front to back once ([`Sink::create_stream`]).
    pub(crate) positioned_writes: bool,
    /// [`Sink::rename_noreplace`] and [`Sink::swap`] are atomic renames; without them the manifest
    /// written last is what "published" means.
    pub(crate) rename: bool,
    /// [`Sink::symlink`] makes symbolic links (the staging pointer, `--link`).
    pub(crate) symlinks: bool,
}

/// Where outputs go: the staging area, its shards and metadata, and their publishing. What is
/// there is examined and read back through the [`Source`] of the same location.
pub(crate) trait Sink: Send + Sync {
    /// What this backend can do; callers ask before relying on renames or positioned writes.
    fn capabilities(&self) -> Capabilities;

    /// Makes the directory (prefix) `path` and its parents; nothing where it exists.
    ///
    /// # Errors
    /// It cannot be made.
    fn create_dir_all(&self, path: &Path) -> io::Result<()>;

    /// Creates the new object `path`, `len` bytes of zeros, for positioned writes.
    ///
    /// # Errors
    /// It exists already (`AlreadyExists`), or cannot be created or sized; `Unsupported`
    /// without [`Capabilities::positioned_writes`].
    fn create(&self, path: &Path, len: u64) -> io::Result<Box<dyn Output>>;

    /// Opens the existing object `path` for positioned writes (what it holds stays).
    ///
    /// # Errors
    /// It does not exist or cannot be opened.
    fn reopen(&self, path: &Path) -> io::Result<Box<dyn Output>>;

    /// Creates (or replaces the content of) the small object `path` with `bytes`, durable when
    /// this returns (a saved index, a marker).
    ///
    /// # Errors
    /// It cannot be created, written or synced.
    fn write(&self, path: &Path, bytes: &[u8]) -> io::Result<()>;

    /// Replaces `path` with `bytes` atomically: a reader sees the old content or the new, never
    /// a part (POSIX: written aside, synced, renamed over, the directory synced).
    ///
    /// # Errors
    /// It cannot be written; what was at `path` stays.
    fn replace(&self, path: &Path, bytes: &[u8]) -> io::Result<()>;

    /// Aborts the unfinished uploads that writers to objects under `dir` left (a run that died
    /// with the store unreachable could not abort them): how many. Nothing where writes leave
    /// nothing unfinished behind.
    ///
    /// # Errors
    /// They cannot be listed or aborted.
    fn abort_unfinished(&self, _dir: &Path) -> io::Result<usize> {
        Ok(0)
    }

    /// Creates (or truncates) `path` for writing front to back (on object storage, one
    /// upload). Dropped without [`Writer::finish`], what was written may not be durable.
    ///
    /// # Errors
    /// It cannot be created.
    fn create_stream(&self, path: &Path) -> io::Result<Box<dyn Writer>>;

    /// Renames `from` to `to` only if nothing is at `to`, atomically.
    ///
    /// # Errors
    /// `to` exists (`AlreadyExists`), or the backend cannot rename (`Unsupported`, see
    /// [`Capabilities::rename`]); nothing is renamed.
    fn rename_noreplace(&self, from: &Path, to: &Path) -> io::Result<()>;

    /// Renames `from` to `to` as the backend's plain rename does (POSIX `rename(2)`: a directory
    /// replaces only an empty directory, a file replaces a file).
    ///
    /// # Errors
    /// It cannot, or the backend has no rename (`Unsupported`).
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;

    /// Makes the names in the directory `dir` durable (renames, creations). Nothing where the
    /// backend has no directories.
    ///
    /// # Errors
    /// The sync fails.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;

    /// Creates the symbolic link `link` pointing at `points_to`.
    ///
    /// # Errors
    /// It cannot, or the backend has no links (`Unsupported`).
    fn symlink(&self, points_to: &Path, link: &Path) -> io::Result<()>;

    /// Atomically swaps `a` and `b`.
    ///
    /// # Errors
    /// Either is missing, or the backend cannot (`Unsupported`); nothing is renamed.
    fn swap(&self, a: &Path, b: &Path) -> io::Result<()>;

    /// Removes the object `path`.
    ///
    /// # Errors
    /// It does not exist or cannot be removed.
    fn remove_file(&self, path: &Path) -> io::Result<()>;

    /// Removes the directory (prefix) `path` and everything in it.
    ///
    /// # Errors
    /// It does not exist or something in it cannot be removed.
    fn remove_dir_all(&self, path: &Path) -> io::Result<()>;

    // The methods below came after the first edition of the seam (the output's lock and the
    // space check); each has a default, so a backend written before them still builds.

    /// Creates the small object `path` holding `bytes`, atomically and only if nothing is at
    /// `path`: another run sees nothing or all of `bytes`, never a part, and of two runs creating
    /// it one fails (POSIX: written aside, synced, hard-linked into place, which NFS does
    /// atomically too; object storage: a conditional PUT, `If-None-Match: *`). The output's lock
    /// is made with it.
    ///
    /// # Errors
    /// Something is at `path` (`AlreadyExists`), it cannot be written, or the backend cannot
    /// create exclusively (`Unsupported`, the default).
    fn create_new(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        let _ = (path, bytes);
        Err(io::ErrorKind::Unsupported.into())
    }

    /// Reads the small object `path` and, where `change` returns new content for it, writes
    /// that to the very object read (POSIX: one open file; object storage: a PUT conditional on
    /// the version read), so that an object another run put at `path` in between is never
    /// written. Not atomic for readers; meant for content of fixed width (the lock's heartbeat).
    /// Returns whether it wrote.
    ///
    /// # Errors
    /// Nothing is at `path` (`NotFound`), it cannot be read or written, or the backend cannot
    /// (`Unsupported`, the default).
    fn update(
        &self,
        path: &Path,
        change: &mut dyn FnMut(&[u8]) -> Option<Vec<u8>>,
    ) -> io::Result<bool> {
        let _ = (path, change);
        Err(io::ErrorKind::Unsupported.into())
    }

    /// The bytes that can still be written below `path`, where the backend knows (POSIX:
    /// `statvfs`); `None` where it does not (the default; object storage), and then no run is
    /// refused for space.
    ///
    /// # Errors
    /// The backend knows but cannot tell now.
    fn free_space(&self, path: &Path) -> io::Result<Option<u64>> {
        let _ = path;
        Ok(None)
    }
}

/// An output object open for positioned writes.
pub(crate) trait Output: Send + Sync {
    /// Writes all of `data` at `offset`.
    ///
    /// # Errors
    /// The write fails (disk full, I/O error).
    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()>;

    /// The object's size now.
    ///
    /// # Errors
    /// It cannot be examined.
    fn size(&self) -> io::Result<u64>;

    /// Makes the data written so far durable (the length does not change).
    ///
    /// # Errors
    /// The sync fails.
    fn sync_data(&self) -> io::Result<()>;

    /// Makes the data and the metadata (length, times) durable.
    ///
    /// # Errors
    /// The sync fails.
    fn sync_all(&self) -> io::Result<()>;

    /// Starts writing `len` bytes at `offset` back to the disk without waiting. Only a hint.
    fn start_writeback(&self, _offset: u64, _len: u64) {}

    /// The fast path for a sample that stays on its rank: copies up to `len` bytes at
    /// `src_offset` of `src` to `offset` of this output inside the backend (`copy_file_range`
    /// between two local files). `None` where this pair of objects has no such path, or it
    /// turned out unsupported: the caller reads and writes instead.
    fn copy_from(
        &self,
        _src: &dyn Input,
        _src_offset: u64,
        _offset: u64,
        _len: usize,
    ) -> Option<io::Result<usize>> {
        None
    }
}

/// An output written front to back ([`Sink::create_stream`]).
pub(crate) trait Writer: Write + Send {
    /// Makes everything written durable and ends the object: its size.
    ///
    /// # Errors
    /// The sync (the upload's completion) fails.
    fn finish(self: Box<Self>) -> io::Result<u64>;
}

/// The scheme of `path` (`mem` for `mem://…`), if it names one.
fn scheme(path: &Path) -> Option<&str> {
    let s = path.to_str()?;
    let (scheme, _) = s.split_once("://")?;
    // RFC 3986's letter then letters and digits (`s3`), in lower case.
    let mut bytes = scheme.bytes();
    let first = bytes.next().is_some_and(|b| b.is_ascii_lowercase());
    (first && bytes.all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())).then_some(scheme)
}

/// Whether `path` names a file of the POSIX file system (no scheme): a file there is one by its
/// device and inode, whatever path names it.
pub fn is_file_system(path: &Path) -> bool {
    scheme(path).is_none()
}

/// The backend that holds `path`: its scheme picks it; a plain path is POSIX. While the run has
/// a rate limit, the backend wrapped in [`Paced`].
pub(crate) fn source(path: &Path) -> &'static dyn Source {
    paced_while_limited(sources(path))
}

/// The backend that `path` is written to: its scheme picks it; a plain path is POSIX. While the
/// run has a rate limit, the backend wrapped in [`Paced`].
pub(crate) fn sink(path: &Path) -> &'static dyn Sink {
    paced_while_limited(sinks(path))
}

/// Of a backend and its [`Paced`] twin, the twin while the run has a rate limit.
fn paced_while_limited<T: ?Sized>((backend, paced): (&'static T, &'static T)) -> &'static T {
    if crate::throttle::limited() {
        paced
    } else {
        backend
    }
}

/// The backend that holds `path`, as it is and wrapped in [`Paced`].
fn sources(path: &Path) -> (&'static dyn Source, &'static dyn Source) {
    if let Some(pair) = schemes::registered(scheme(path)) {
        return pair;
    }
    #[cfg(test)]
    if scheme(path) == Some("mem") {
        return (&memory::Memory, &Paced(&memory::Memory));
    }
    match object_store(path) {
        Some(i) => (&OBJECT_STORES[i], &PACED_OBJECT_STORES[i]),
        None => (&posix::Posix, &Paced(&posix::Posix)),
    }
}

/// The backend that `path` is written to, as it is and wrapped in [`Paced`].
fn sinks(path: &Path) -> (&'static dyn Sink, &'static dyn Sink) {
    #[cfg(test)]
    if scheme(path) == Some("mem") {
        return (&memory::Memory, &Paced(&memory::Memory));
    }
    match object_store(path) {
        Some(i) => (&OBJECT_STORES[i], &PACED_OBJECT_STORES[i]),
        None => (&posix::Posix, &Paced(&posix::Posix)),
    }
}

/// Opens the shard at `path` in its [`source`], or the copy a [`spool::Spool`] fetched.
///
/// # Errors
/// It cannot be opened.
pub(crate) fn open(path: &Path) -> io::Result<OpenInput> {
    match spool::spooled(path) {
        Some(copy) => Ok(copy),
        None => source(path).open(path),
    }
}

/// The stamp of `path` in its [`source`] now.
///
/// # Errors
/// It cannot be examined.
pub(crate) fn stamp(path: &Path) -> io::Result<FileStamp> {
    source(path).stat(path).map(|s| s.stamp)
}

/// Writes the small object `path` front to back with `bytes`, not waiting until it is durable
/// (what `std::fs::write` does on POSIX): for files that a later sync covers or that may be lost
/// in a crash (a shard's loader index before the finish phase's sync, a watchdog heartbeat).
///
/// # Errors
/// It cannot be created or written.
pub(crate) fn write_unsynced(path: &Path, bytes: &[u8]) -> io::Result<()> {
    // A small file (a heartbeat among them): counted against the write limit but never waiting
    // for it, as [`Paced`]'s other small objects.
    crate::throttle::charge(0, bytes.len() as u64);
    sinks(path).0.create_stream(path)?.write_all(bytes)
}

/// The modification time of `stamp` in nanoseconds since the epoch, 0 before it (how plan
/// records and saved indexes note a file's version).
pub(crate) fn mtime_ns(stamp: &FileStamp) -> u128 {
    u128::try_from(stamp.mtime_ns).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemes_pick_backends() {
        assert_eq!(scheme(Path::new("mem://t/a.tar")), Some("mem"));
        assert_eq!(scheme(Path::new("s3://bucket/a.tar")), Some("s3"));
        assert_eq!(scheme(Path::new("3s://bucket/a.tar")), None);
        assert_eq!(scheme(Path::new("/data/a.tar")), None);
        assert_eq!(scheme(Path::new("./x://y")), None);
    }

    /// What the lock and the space check ask of a backend, the same on POSIX and in memory.
    fn lock_and_space_methods(root: &Path) {
        lock_and_space_methods_of(root, source(root), sink(root));
        // The same through the rate limits' wrapper: each later method forwarded, not answered
        // by the trait's default.
        lock_and_space_methods_of(root, sources(root).1, sinks(root).1);
    }

    fn lock_and_space_methods_of(root: &Path, source: &dyn Source, sink: &dyn Sink) {
        sink.create_dir_all(root).unwrap();
        let lock = root.join("lock");
        sink.create_new(&lock, b"run A beat 0").unwrap();
        let again = sink.create_new(&lock, b"run B beat 0").unwrap_err();
        assert_eq!(again.kind(), io::ErrorKind::AlreadyExists);
        assert_eq!(source.read(&lock).unwrap(), b"run A beat 0");
        // Nothing left beside it (POSIX writes aside first).
        let names: Vec<_> = source
            .list(root)
            .unwrap()
            .into_iter()
            .map(|e| e.name)
            .collect();
        assert_eq!(names, [OsString::from("lock")]);

        let beat = |to: &'static [u8]| {
            move |old: &[u8]| old.starts_with(b"run A").then(|| [&old[..11], to].concat())
        };
        assert!(sink.update(&lock, &mut beat(b"1")).unwrap());
        assert_eq!(source.read(&lock).unwrap(), b"run A beat 1");
        sink.remove_file(&lock).unwrap();
        sink.create_new(&lock, b"run B beat 7").unwrap();
        assert!(
            !sink.update(&lock, &mut beat(b"2")).unwrap(),
            "not A's any more"
        );
        assert_eq!(source.read(&lock).unwrap(), b"run B beat 7");
        sink.remove_file(&lock).unwrap();
        let gone = sink.update(&lock, &mut beat(b"3")).unwrap_err();
        assert_eq!(gone.kind(), io::ErrorKind::NotFound);

        let shard = root.join("shard");
        let out = sink.create(&shard, 1 << 20).unwrap();
        let before = source.allocated(&shard).unwrap();
        out.write_at(&[1u8; 8192], 0).unwrap();
        out.sync_all().unwrap();
        assert!(source.allocated(&shard).unwrap() >= before.max(8192));
        sink.remove_dir_all(root).unwrap();
    }

    #[test]
    fn lock_and_space_methods_in_memory() {
        let root = Path::new("mem://lock-and-space");
        lock_and_space_methods(root);
        assert_eq!(sink(root).free_space(root).unwrap(), None, "unknown");
        memory::set_capacity(root, 1000);
        memory::put(&root.join("a"), vec![0; 300]);
        for sink in [sink(root), sinks(root).1] {
            assert_eq!(sink.free_space(&root.join("x")).unwrap(), Some(700));
        }
    }

    #[test]
    fn lock_and_space_methods_on_posix() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("d");
        lock_and_space_methods(&root);
        for sink in [sink(tmp.path()), sinks(tmp.path()).1] {
            assert!(sink.free_space(tmp.path()).unwrap().is_some());
        }
    }

    /// What a backend offers beyond the contract every backend keeps: POSIX has symbolic links
    /// and atomic swaps, the memory backend answers `Unsupported` and changes nothing.
    #[derive(Clone, Copy)]
    struct Offers {
        links_and_swap: bool,
    }

    /// Runs `contract` on a new POSIX directory and on the `mem://` prefix `name`, each through
    /// the backend itself and through the rate limits' wrapper, so that both backends keep one
    /// contract and the wrapper forwards every method (not the trait's default).
    fn on_every_backend(name: &str, contract: fn(&Path, &dyn Source, &dyn Sink, Offers)) {
        let tmp = tempfile::tempdir().unwrap();
        let mem = PathBuf::from(format!("mem://{name}"));
        let posix = Offers {
            links_and_swap: true,
        };
        let memory = Offers {
            links_and_swap: false,
        };
        for (base, offers) in [(tmp.path(), posix), (mem.as_path(), memory)] {
            let (source, sink) = (sources(base), sinks(base));
            contract(&base.join("plain"), source.0, sink.0, offers);
            contract(&base.join("paced"), source.1, sink.1, offers);
        }
    }

    fn not_found(source: &dyn Source, path: &Path) -> bool {
        source.stat(path).map_err(|e| e.kind()).err() == Some(io::ErrorKind::NotFound)
    }

    /// Directories are made with their parents; `write` replaces the whole content (a shorter
    /// one leaves nothing of the longer behind); `replace` leaves nothing beside the file; a
    /// stream's `finish` says its length; a listing names every entry with its kind; an open
    /// input reads at any offset, up to the end and then 0, and its stamp is the path's.
    fn written_objects_read_back(root: &Path, source: &dyn Source, sink: &dyn Sink, _: Offers) {
        sink.create_dir_all(&root.join("sub/deeper")).unwrap();
        for dir in [
            root.to_path_buf(),
            root.join("sub"),
            root.join("sub/deeper"),
        ] {
            assert_eq!(
                source.stat(&dir).unwrap().kind,
                Kind::Dir,
                "{}",
                dir.display()
            );
        }

        let a = root.join("a");
        sink.write(&a, b"the first and longer content").unwrap();
        sink.write(&a, b"0123456789").unwrap();
        assert_eq!(source.read(&a).unwrap(), b"0123456789");
        let stat = source.stat(&a).unwrap();
        assert_eq!((stat.kind, stat.stamp.size), (Kind::File, 10));

        let b = root.join("b.json");
        sink.replace(&b, b"the old content").unwrap();
        sink.replace(&b, b"new").unwrap();
        assert_eq!(source.read(&b).unwrap(), b"new");

        let c = root.join("c");
        let mut stream = sink.create_stream(&c).unwrap();
        for part in [&b"front "[..], b"to ", b"back"] {
            stream.write_all(part).unwrap();
        }
        assert_eq!(stream.finish().unwrap(), 13, "the stream's length");
        assert_eq!(source.read(&c).unwrap(), b"front to back");

        let mut listed = source.list(root).unwrap();
        listed.sort_by(|x, y| x.name.cmp(&y.name));
        let entry = |name: &str, kind| Entry {
            name: name.into(),
            kind,
        };
        let want = [
            entry("a", Kind::File),
            entry("b.json", Kind::File),
            entry("c", Kind::File),
            entry("sub", Kind::Dir),
        ];
        assert_eq!(listed, want, "every entry, and nothing left beside b.json");

        let input = source.open(&a).unwrap();
        input.advise_random();
        let mut buf = [0u8; 4];
        assert_eq!(input.read_at(&mut buf, 3).unwrap(), 4);
        assert_eq!(&buf, b"3456");
        assert_eq!(input.read_at(&mut buf, 8).unwrap(), 2, "up to the end");
        assert_eq!(&buf[..2], b"89");
        assert_eq!(input.read_at(&mut buf, 10).unwrap(), 0, "0 at the end");
        assert_eq!(input.stamp().unwrap(), source.stat(&a).unwrap().stamp);

        let missing = root.join("missing");
        assert!(not_found(source, &missing));
        assert_eq!(
            source.read(&missing).unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
        let Err(e) = source.open(&missing) else {
            panic!("{} opened", missing.display())
        };
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn every_backend_reads_back_what_was_written() {
        on_every_backend("written-objects", written_objects_read_back);
    }

    /// `create` makes a new object of zeros of the length asked and refuses one that exists
    /// (touching nothing in it); `write_at` places bytes at their offset, past the end too;
    /// `size` follows; `reopen` keeps what the object holds.
    fn outputs_take_bytes_at_their_offsets(
        root: &Path,
        source: &dyn Source,
        sink: &dyn Sink,
        _: Offers,
    ) {
        sink.create_dir_all(root).unwrap();
        let shard = root.join("shard");
        let out = sink.create(&shard, 100).unwrap();
        assert_eq!(out.size().unwrap(), 100);
        assert_eq!(source.read(&shard).unwrap(), [0u8; 100]);
        out.write_at(b"xyz", 10).unwrap();
        out.write_at(b"end", 200).unwrap();
        assert_eq!(out.size().unwrap(), 203, "a write past the end extends it");
        out.start_writeback(0, 203);
        out.sync_data().unwrap();
        out.sync_all().unwrap();
        drop(out);

        let Err(again) = sink.create(&shard, 5) else {
            panic!("{} created twice", shard.display())
        };
        assert_eq!(again.kind(), io::ErrorKind::AlreadyExists);
        let out = sink.reopen(&shard).unwrap();
        assert_eq!(out.size().unwrap(), 203, "neither truncated nor resized");
        out.write_at(b"Q", 0).unwrap();
        drop(out);
        let mut want = vec![0u8; 203];
        want[0] = b'Q';
        want[10..13].copy_from_slice(b"xyz");
        want[200..].copy_from_slice(b"end");
        assert_eq!(source.read(&shard).unwrap(), want);

        let Err(e) = sink.reopen(&root.join("missing")) else {
            panic!("a missing object reopened")
        };
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn every_backend_writes_outputs_at_offsets_and_creates_only_new_ones() {
        on_every_backend("outputs", outputs_take_bytes_at_their_offsets);
    }

    /// `rename_noreplace` moves a directory only where nothing is (not over a user's directory, an empty
    /// one or a file), `rename` replaces a file, `exchange` swaps two directories where the
    /// backend can (else `Unsupported`, nothing moved), a link points where it was told, and
    /// the removals remove exactly what they name.
    fn names_move_only_as_documented(
        root: &Path,
        source: &dyn Source,
        sink: &dyn Sink,
        offers: Offers,
    ) {
        let (staging, taken) = (root.join("staging"), root.join("taken"));
        sink.create_dir_all(&staging).unwrap();
        sink.write(&staging.join("shard"), b"new output").unwrap();
        sink.create_dir_all(&taken).unwrap();
        sink.write(&taken.join("shard"), b"a user's file").unwrap();
        sink.create_dir_all(&root.join("empty")).unwrap();
        sink.write(&root.join("file"), b"a file").unwrap();
        for occupied in ["taken", "empty", "file"] {
            let refused = sink
                .rename_noreplace(&staging, &root.join(occupied))
                .unwrap_err();
            assert_eq!(refused.kind(), io::ErrorKind::AlreadyExists, "{occupied}");
        }
        assert_eq!(source.read(&taken.join("shard")).unwrap(), b"a user's file");
        assert_eq!(source.read(&root.join("file")).unwrap(), b"a file");
        assert_eq!(source.read(&staging.join("shard")).unwrap(), b"new output");

        let out = root.join("out");
        sink.rename_noreplace(&staging, &out).unwrap();
        assert!(not_found(source, &staging));
        assert_eq!(source.read(&out.join("shard")).unwrap(), b"new output");

        sink.write(&root.join("next"), b"next").unwrap();
        sink.rename(&root.join("next"), &root.join("file")).unwrap();
        assert!(not_found(source, &root.join("next")));
        assert_eq!(source.read(&root.join("file")).unwrap(), b"next");

        let swapped = sink.swap(&out, &taken);
        let linked = sink.symlink(Path::new("out"), &root.join("current"));
        if offers.links_and_swap {
            swapped.unwrap();
            assert_eq!(source.read(&out.join("shard")).unwrap(), b"a user's file");
            assert_eq!(source.read(&taken.join("shard")).unwrap(), b"new output");
            let one_missing = sink.swap(&out, &root.join("missing")).unwrap_err();
            assert_eq!(one_missing.kind(), io::ErrorKind::NotFound);
            assert_eq!(source.read(&out.join("shard")).unwrap(), b"a user's file");

            linked.unwrap();
            let current = root.join("current");
            assert_eq!(source.stat_link(&current).unwrap().kind, Kind::Link);
            assert_eq!(source.stat(&current).unwrap().kind, Kind::Dir);
            assert_eq!(
                source.read(&current.join("shard")).unwrap(),
                b"a user's file"
            );
            sink.remove_file(&current).unwrap();
            assert!(not_found(source, &current));
            assert_eq!(source.stat(&out).unwrap().kind, Kind::Dir, "the link only");
        } else {
            for refused in [swapped, linked] {
                assert_eq!(refused.unwrap_err().kind(), io::ErrorKind::Unsupported);
            }
            assert_eq!(source.read(&out.join("shard")).unwrap(), b"new output");
            assert!(not_found(source, &root.join("current")));
        }

        sink.remove_file(&root.join("file")).unwrap();
        assert!(not_found(source, &root.join("file")));
        let twice = sink.remove_file(&root.join("file")).unwrap_err();
        assert_eq!(twice.kind(), io::ErrorKind::NotFound);
        sink.remove_dir_all(&out).unwrap();
        assert!(not_found(source, &out.join("shard")) && not_found(source, &out));
        assert_eq!(
            source.stat(&taken).unwrap().kind,
            Kind::Dir,
            "only what was named"
        );
        sink.sync_dir(root).unwrap();
    }

    #[test]
    fn every_backend_moves_names_only_as_documented() {
        on_every_backend("names", names_move_only_as_documented);
    }

    /// `update` hands `change` the content and writes what it returns: a change anywhere (the
    /// first byte and the last, the middle the same), a shorter content (nothing of the old
    /// left after it), a longer one; `None` writes nothing and says so.
    fn updates_rewrite_the_content_in_place(
        root: &Path,
        source: &dyn Source,
        sink: &dyn Sink,
        _: Offers,
    ) {
        sink.create_dir_all(root).unwrap();
        let beat = root.join("beat");
        sink.write(&beat, b"abcdef").unwrap();
        let steps: [(&[u8], &[u8]); 3] = [
            (b"abcdef", b"xbcdeZ"),
            (b"xbcdeZ", b"xbc"),
            (b"xbc", b"xbc and more"),
        ];
        for (old, new) in steps {
            let mut seen = Vec::new();
            let wrote = sink.update(&beat, &mut |was| {
                seen = was.to_vec();
                Some(new.to_vec())
            });
            assert!(wrote.unwrap());
            assert_eq!(seen, old, "the content handed to the change");
            assert_eq!(source.read(&beat).unwrap(), new);
        }
        assert!(
            !sink.update(&beat, &mut |_| None).unwrap(),
            "nothing to write"
        );
        assert_eq!(source.read(&beat).unwrap(), b"xbc and more");
    }

    #[test]
    fn every_backend_updates_in_place_from_what_it_read() {
        on_every_backend("updates", updates_rewrite_the_content_in_place);
    }

    #[test]
    fn sequential_streams_do_not_move_each_other() {
        let path = Path::new("mem://seq/a");
        memory::put(path, b"0123456789".to_vec());
        let shard = open(path).unwrap();
        let (mut a, mut b) = (Sequential::new(shard.clone()), Sequential::new(shard));
        let mut buf = [0u8; 4];
        a.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"0123");
        b.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"0123");
        a.seek(SeekFrom::End(-2)).unwrap();
        let mut rest = Vec::new();
        a.read_to_end(&mut rest).unwrap();
        assert_eq!(rest, b"89");
        assert!(a.seek(SeekFrom::Current(-100)).is_err());
    }
}
