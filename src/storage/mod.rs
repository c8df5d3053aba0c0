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
pub(crate) use s3::e_tag_identity;
pub(crate) use schemes::{
    is_object_store, object_place, object_scheme, objects, register_source, OBJECT_STORES,
};
use schemes::{object_store, PACED_OBJECT_STORES};

/// What a location is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
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

    /// The entries of the directory (or prefix) `path` whose names start with `start`. An object
    /// store asks for only those (a listing of the prefix `path/start`), not for the whole
    /// directory; by default the directory's listing, filtered (what a file system reads anyway).
    ///
    /// # Errors
    /// It is not a directory or cannot be listed.
    fn list_starting(&self, path: &Path, start: &str) -> io::Result<Vec<Entry>> {
        let mut entries = self.list(path)?;
        entries.retain(|e| e.name.to_string_lossy().starts_with(start));
        Ok(entries)
    }

    /// One name for the object at `path`, the same for every path that names it (two inputs
    /// naming one file are told by it).
    ///
    /// # Errors
    /// It does not exist.
    fn canonical(&self, path: &Path) -> io::Result<PathBuf>;

    /// What the symbolic link at `path` holds, as written (one level, not resolved). A store
    /// without symbolic links has none to read.
    ///
    /// # Errors
    /// It is not a symbolic link, or it cannot be read.
    fn read_link(&self, path: &Path) -> io::Result<PathBuf> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("{}: no symbolic links here", path.display()),
        ))
    }

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

    /// How the exchange reads its samples best ([`Reads`]).
    fn reads(&self) -> Reads {
        Reads::Stream
    }

    /// Whether the input's tar records are made from a listing as they are read (a view of
    /// loose files), not stored: its headers cannot change during a run, and every member's
    /// bytes are checked against the listing by the read itself, so a reader need not walk a
    /// sample's headers again to see that it is still the sample indexed.
    fn checks_itself(&self) -> bool {
        false
    }
}

/// How the exchange reads an input's samples best.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reads {
    /// Consecutive bytes of one object (a tar shard): small samples through a large read
    /// window, this rank's own samples copied inside the storage where it can.
    Stream,
    /// Bytes gathered from many local files, each read whole by its own `pread` (a view of
    /// loose files): a sample is read straight into its place in the send buffer (through a
    /// window its bytes would only be copied once more), and never copied inside the storage
    /// (there is no one file to copy from).
    PerSample,
    /// Bytes gathered from many objects of a store: through the read window, whose objects
    /// are fetched together, and never copied inside the storage.
    Batched,
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

impl Capabilities {
    /// The one predicate of how an output's life commits on this sink: where it can neither
    /// write at offsets nor rename (an object store), the output is assembled elsewhere (on
    /// `--scratch`) and committed by creating its manifest last; else its staging directory is
    /// renamed into place (`job::destination::life`).
    pub(crate) fn commits_by_manifest(self) -> bool {
        !(self.positioned_writes && self.rename)
    }
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

    /// [`Sink::create_stream`] that only creates: the object comes into being at
    /// [`Writer::finish`] only if nothing is at `path` then (object storage: `If-None-Match: *`
    /// on the PUT and on the multipart upload's completion), so that it never replaces an
    /// object another run made. What a run writes at an output's final names goes through it.
    ///
    /// # Errors
    /// It cannot be started, or the backend cannot create exclusively (`Unsupported`, the
    /// default).
    fn create_stream_new(&self, path: &Path) -> io::Result<Box<dyn Writer>> {
        let _ = path;
        Err(io::ErrorKind::Unsupported.into())
    }

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

    /// The ETag of the object `path` as its store spells it, for [`Sink::remove_file_if`];
    /// `None` where the backend keeps none (a file system).
    ///
    /// # Errors
    /// It does not exist (`NotFound`) or cannot be looked at.
    fn tag_of(&self, path: &Path) -> io::Result<Option<String>> {
        let _ = path;
        Ok(None)
    }

    /// Removes the object `path` only while it is the one whose ETag is `tag` (from
    /// [`Sink::tag_of`]), where the store makes a removal conditional (S3's `If-Match`); else,
    /// or without a tag, as [`Sink::remove_file`]. Whether nothing of that object is there any
    /// more: `false` when another object is at the name now, which stays.
    ///
    /// # Errors
    /// It cannot be removed.
    fn remove_file_if(&self, path: &Path, tag: Option<&str>) -> io::Result<bool> {
        let _ = tag;
        match self.remove_file(path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(true),
        }
    }

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

    /// [`Writer::finish`], and what the store says of the object it made: its size and, on an
    /// object store, its ETag (what a run records of every object it created, to find it again
    /// as it left it before it commits).
    ///
    /// # Errors
    /// As [`Writer::finish`]; for a writer of [`Sink::create_stream_new`], something was at its
    /// path before it completed (`AlreadyExists`).
    fn finish_created(self: Box<Self>) -> io::Result<Created> {
        self.finish().map(|size| Created { size, e_tag: None })
    }
}

/// An object a writer made: its size and the store's ETag of it (none on a file system).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Created {
    pub(crate) size: u64,
    pub(crate) e_tag: Option<String>,
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
mod tests;
