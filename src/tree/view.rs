//! A unit of loose files seen as one plain tar shard: synthesized headers, the files' bytes and
//! padding, then the end-of-archive blocks. Nothing is written anywhere: every read is
//! answered from the listing and the files.

use std::any::Any;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use crate::storage::posix::{self, FileFacts};
use crate::storage::s3::loose::Wanted;
use crate::storage::s3::Objects;
use crate::storage::{objects, FileStamp, Input, Kind, Reads};
use crate::tree::header::{copy_header, header_len, padded, HeaderFields, BLOCK};

/// One member of a unit's tar view.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Member {
    /// The member's name in the tar: the sample's key, a dot and the extension.
    pub(crate) name: Vec<u8>,
    /// Where its bytes are: a file's path relative to the root, or the bytes themselves (a
    /// `--label-from-dir` label).
    pub(crate) source: Bytes,
    pub(crate) size: u64,
    pub(crate) mode: u32,
    /// Whole seconds since the epoch (the header's), and the full stamp's nanoseconds (what a
    /// read checks unchanged).
    pub(crate) mtime: i64,
    pub(crate) mtime_ns: i128,
    /// A file's inode; on object storage, a hash of the ETag listed (what a read checks
    /// unchanged with the size); 0 for a label.
    #[serde(default)]
    pub(crate) identity: u64,
    /// A file's status-change time in nanoseconds (a user can set the modification time back,
    /// `touch -r`, `cp -p`, but not this one); on object storage the last-modified time; 0
    /// for a label. Never in a header.
    #[serde(default)]
    pub(crate) ctime_ns: i128,
    /// The file system the walk found a file on, as the host that examined it sees it
    /// ([`posix::volume`]): the inode is compared only by a reader that sees the same (inode
    /// numbers, like device numbers, may differ between hosts). 0: unknown, or not a file.
    /// Not in the digest.
    #[serde(default)]
    pub(crate) volume: u64,
}

/// Where a member's bytes are.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Bytes {
    File(Vec<u8>),
    Inline(Vec<u8>),
}

/// A unit's members in their canonical order, and where each starts in the tar view.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Listing {
    /// The root the members' file paths are relative to.
    pub(crate) root: PathBuf,
    pub(crate) members: Vec<Member>,
    /// Each member's first header byte in the view; not sent between ranks (see [`Listing::new`]).
    #[serde(skip)]
    starts: Vec<u64>,
    #[serde(skip)]
    size: u64,
}

impl Listing {
    /// The listing of `members` (in order) under `root`, with the view's offsets computed.
    pub(crate) fn new(root: PathBuf, members: Vec<Member>) -> Self {
        let mut listing = Listing {
            root,
            members,
            starts: Vec::new(),
            size: 0,
        };
        listing.lay_out();
        listing
    }

    /// The index of the member whose records (header, data, padding) hold `at`, which is
    /// before the end of the members: `hint` when it or the one after it does (a read's
    /// pieces come in order), found by a search otherwise.
    fn member_at(&self, hint: usize, at: u64) -> usize {
        let holds = |i: usize| {
            self.starts.get(i).is_some_and(|&s| s <= at)
                && self.starts.get(i + 1).is_none_or(|&next| at < next)
        };
        match hint {
            i if holds(i) => i,
            i if holds(i + 1) => i + 1,
            // Some member starts at or before `at`: the first starts at 0.
            _ => self.starts.partition_point(|&s| s <= at) - 1,
        }
    }

    /// Computes the offsets again (after a listing was received from another rank).
    pub(crate) fn lay_out(&mut self) {
        let mut at = 0;
        self.starts = Vec::with_capacity(self.members.len());
        for m in &self.members {
            self.starts.push(at);
            at += header_len(&m.fields()) + padded(m.size);
        }
        self.size = at + 2 * BLOCK;
    }

    /// The tar view's size: every member's records and the two end blocks.
    pub(crate) fn size(&self) -> u64 {
        self.size
    }

    /// A digest of what the walk saw: every member's name, source, size, mode, times and
    /// identity, in order (not its [`Member::volume`], which names the walking host). A resumed
    /// run checks each unit unchanged by it.
    pub(crate) fn digest(&self) -> u128 {
        use md5::Digest;
        let seen: Vec<_> = self
            .members
            .iter()
            .map(|m| {
                let times = (m.mtime, m.mtime_ns, m.ctime_ns);
                (&m.name, &m.source, m.size, m.mode, times, m.identity)
            })
            .collect();
        // The encoding goes straight into the hash: the same bytes as encoding it whole first
        // (what resume records hold), without that copy of the listing, grown by doubling.
        let mut hash = md5::Md5::new();
        let _ =
            bincode::serde::encode_into_std_write(&seen, &mut hash, bincode::config::standard());
        u128::from_be_bytes(hash.finalize().into())
    }

    /// The stamp the view reports: its size; no times, no identity (each file is checked
    /// unchanged when it is read instead).
    pub(crate) fn stamp(&self) -> FileStamp {
        FileStamp {
            size: self.size,
            mtime_ns: 0,
            ctime_ns: 0,
            dev: 0,
            identity: 0,
        }
    }
}

impl Member {
    /// What the walk saw of the member's file: its size, times and identity.
    pub(crate) fn stamp(&self) -> FileStamp {
        FileStamp {
            size: self.size,
            mtime_ns: self.mtime_ns,
            ctime_ns: self.ctime_ns,
            dev: 0,
            identity: self.identity,
        }
    }

    /// The member's key: every member is named `KEY.EXT` by the walk, whatever the key rule.
    pub(crate) fn key(&self) -> &[u8] {
        crate::tar::key::sample_key(&self.name).unwrap_or(&self.name)
    }

    fn fields(&self) -> HeaderFields<'_> {
        HeaderFields {
            name: &self.name,
            size: self.size,
            mode: self.mode,
            mtime: self.mtime,
        }
    }
}

/// The open tar view of a unit.
pub(crate) struct View {
    listing: Arc<Listing>,
    /// The object store that holds the listing's root, if one does (a read of a file system's
    /// files asks no store).
    store: Option<&'static Objects>,
    /// Set by [`Input::advise_random`] (the index phase, which walks headers only): on object
    /// storage too, a read then ends where the next object's data starts (see `read_at`).
    headers_only: AtomicBool,
    /// The directories of the files opened last (see [`open_file`]).
    dirs: Mutex<OpenDirs>,
}

impl View {
    pub(crate) fn new(listing: Arc<Listing>) -> Self {
        View {
            store: objects(&listing.root),
            listing,
            headers_only: AtomicBool::new(false),
            dirs: Mutex::default(),
        }
    }
}

/// At most this many directories of a unit stay open: a `--key-regex` unit's samples take
/// their files from several directories (`images/K.jpg` beside `captions/K.txt`), and each
/// directory is opened once for all of them, not once a file.
const OPEN_DIRS: usize = 8;

/// Directories of a unit (relative to its root) open, the most recently used last.
#[derive(Default)]
pub(crate) struct OpenDirs {
    held: Vec<(Vec<u8>, Arc<posix::LooseDir>)>,
    /// How many directories were opened.
    opened: u64,
}

/// Opens the file `rel` (relative to the listing's root) from its directory, which `dirs`
/// keeps open with the few used last: a unit's files come directory by directory (or, with
/// `--key-regex`, from a few directories in turn), so each directory's path is resolved once
/// and each file by its name alone (at 200,000 files under `/dev/shm/lf-bench/tree/DIR/`, the
/// lookups of the whole path were about 3% of a run's CPU). A directory renamed or replaced
/// during the run is still the one whose files were listed; each file is checked against its
/// listing after it is read.
fn open_file(
    listing: &Listing,
    dirs: &Mutex<OpenDirs>,
    rel: &[u8],
) -> io::Result<posix::LooseFile> {
    let (parent, name) = match rel.iter().rposition(|&b| b == b'/') {
        Some(i) => (&rel[..i], &rel[i + 1..]),
        None => (&rel[..0], rel),
    };
    let mut open = dirs.lock().unwrap_or_else(|p| p.into_inner());
    let dir = match open.held.iter().rposition(|(p, _)| p == parent) {
        Some(i) => {
            let used = open.held.remove(i);
            let dir = used.1.clone();
            open.held.push(used);
            dir
        }
        None => {
            let dir = Arc::new(posix::LooseDir::new(&file_path(&listing.root, parent))?);
            if open.held.len() == OPEN_DIRS {
                open.held.remove(0);
            }
            open.held.push((parent.to_vec(), dir.clone()));
            open.opened += 1;
            dir
        }
    };
    drop(open);
    dir.open(name)
}

impl Input for View {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let listing = &*self.listing;
        let batched = self.store.is_some() && !self.headers_only.load(Ordering::Relaxed);
        let mut done = 0;
        // On object storage, the data the read covers, filled once the headers and padding
        // are: its GETs are then in flight together.
        let mut data: Vec<DataPiece> = Vec::new();
        let mut member = 0;
        while done < buf.len() && offset + (done as u64) < listing.size {
            let at = offset + done as u64;
            match read_piece(listing, &mut member, &mut buf[done..], at) {
                Piece::Filled(n) => done += n,
                // A read never runs on into a file's bytes (a short read, which callers that
                // want more repeat): a walk of the headers alone, the index pass, then opens
                // no file and sends no GET. On object storage only where the reader said so
                // (`advise_random`): the exchange's windows of many small objects are then one
                // read, their GETs in flight together.
                Piece::Data { starts_file, .. } if done > 0 && starts_file && !batched => break,
                Piece::Data {
                    member, from, len, ..
                } => {
                    let range = done..done + len;
                    match self.store {
                        Some(_) => data.push((member, from, range)),
                        None => read_data(
                            listing,
                            &self.dirs,
                            &listing.members[member],
                            &mut buf[range],
                            from,
                        )?,
                    }
                    done += len;
                }
            }
        }
        if let Some(store) = self.store {
            fill_objects(store, listing, buf, &data)?;
        }
        Ok(done)
    }

    fn stamp(&self) -> io::Result<FileStamp> {
        Ok(self.listing.stamp())
    }

    fn advise_random(&self) {
        self.headers_only.store(true, Ordering::Relaxed);
    }

    fn reads(&self) -> Reads {
        if objects(&self.listing.root).is_some() {
            Reads::Batched
        } else {
            Reads::PerSample
        }
    }

    fn checks_itself(&self) -> bool {
        true
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// A member's data a read covers: the member's index, the offset in its data, and where its
/// bytes go in the read's buffer.
type DataPiece = (usize, u64, std::ops::Range<usize>);

/// What a read finds at a byte of the view.
enum Piece {
    /// The count of bytes filled from there to the end of the piece (header, padding, the
    /// end blocks) or of the buffer.
    Filled(usize),
    /// `len` bytes of member `member`'s data from byte `from` of it, not read yet;
    /// `starts_file`: they start a file's data.
    Data {
        member: usize,
        from: u64,
        len: usize,
        starts_file: bool,
    },
}

/// Fills the start of `buf` with the view's bytes at `at` up to the end of the piece (header,
/// padding) that holds `at`, or says which member's data is there. `member`: the member the
/// last piece was of, and then this one's.
fn read_piece(listing: &Listing, member: &mut usize, buf: &mut [u8], at: u64) -> Piece {
    let end_of_members = listing.size - 2 * BLOCK;
    if at >= end_of_members {
        let n = buf.len().min((listing.size - at) as usize);
        buf[..n].fill(0);
        return Piece::Filled(n);
    }
    let i = listing.member_at(*member, at);
    *member = i;
    let m = &listing.members[i];
    let start = listing.starts[i];
    let fields = m.fields();
    let data_start = start + header_len(&fields);
    let data_end = data_start + m.size;
    let member_end = data_start + padded(m.size);
    if at < data_start {
        return Piece::Filled(copy_header(&fields, (at - start) as usize, buf));
    }
    if at < data_end {
        return Piece::Data {
            member: i,
            from: at - data_start,
            len: buf.len().min((data_end - at) as usize),
            starts_file: at == data_start && matches!(m.source, Bytes::File(_)),
        };
    }
    let n = buf.len().min((member_end - at) as usize);
    buf[..n].fill(0);
    Piece::Filled(n)
}

/// Fills the data `pieces` (member index, offset in the member, bytes of `buf`) of a read of
/// `listing`'s view: labels from the listing, objects by ranged GETs, all in flight at once up
/// to the store's bound.
///
/// # Errors
/// A GET fails, or an object is not the one listed (see [`Objects::get_many`]).
fn fill_objects(
    store: &Objects,
    listing: &Listing,
    buf: &mut [u8],
    pieces: &[DataPiece],
) -> std::io::Result<()> {
    let mut paths = Vec::new();
    for (i, _, _) in pieces {
        let m: &Member = &listing.members[*i];
        if let Bytes::File(rel) = &m.source {
            paths.push(file_path(&listing.root, rel));
        }
    }
    let mut next_path = paths.iter();
    let mut wanted = Vec::with_capacity(paths.len());
    for (i, offset, range) in pieces {
        let m = &listing.members[*i];
        match &m.source {
            Bytes::Inline(bytes) => {
                let from = *offset as usize;
                buf[range.clone()].copy_from_slice(&bytes[from..from + range.len()]);
            }
            Bytes::File(_) => wanted.push(Wanted {
                path: next_path.next().expect("one path per file piece"),
                range: *offset..*offset + range.len() as u64,
                listed: m.stamp(),
            }),
        }
    }
    let got = store.get_many(&wanted)?;
    let files = pieces
        .iter()
        .filter(|(i, _, _)| matches!(listing.members[*i].source, Bytes::File(_)));
    for ((_, _, range), bytes) in files.zip(got) {
        buf[range.clone()].copy_from_slice(&bytes);
    }
    Ok(())
}

/// Reads `buf.len()` bytes at `offset` of a member's content: a label's bytes, or the file's,
/// checked unchanged since the walk once the bytes are read (a file that changed, vanished or
/// became something else is an error naming it; its bytes are never used).
///
/// One `open`, one `pread` and one `fstat` a file: the `fstat` after the read sees any change
/// made before the file was opened or while it was read (the kind, size and modification time
/// are compared with the listing's, not with an earlier `fstat`), and the read cannot block
/// on what is not a regular file (see [`posix::LooseDir::open`]). When the read fails or ends
/// early, what the `fstat` says explains it if it can ("no longer a regular file" rather than
/// the `pread`'s `ESPIPE`).
fn read_data(
    listing: &Listing,
    dirs: &Mutex<OpenDirs>,
    m: &Member,
    buf: &mut [u8],
    offset: u64,
) -> io::Result<()> {
    let rel = match &m.source {
        Bytes::Inline(bytes) => {
            buf.copy_from_slice(&bytes[offset as usize..offset as usize + buf.len()]);
            return Ok(());
        }
        Bytes::File(rel) => rel,
    };
    // Its path is made only for a message: at 200,000 files of 8 KiB, joining each to the
    // root was 2% of a run's user time.
    let failed = |what: String| {
        let path = file_path(&listing.root, rel);
        io::Error::other(format!("{}: {what}", path.display()))
    };
    let file = open_file(listing, dirs, rel).map_err(|e| {
        failed(format!(
            "cannot open ({e}); it was listed as a file of {} bytes",
            m.size
        ))
    })?;
    let read = file.read_at(buf, offset);
    let now = file
        .facts()
        .map_err(|e| failed(format!("cannot stat: {e}")))?;
    unchanged(m, &now).map_err(failed)?;
    let n = read.map_err(|e| failed(format!("read at byte {offset}: {e}")))?;
    if n < buf.len() {
        return Err(failed(format!(
            "ended at byte {} while {} were listed: it changed during the run",
            offset + n as u64,
            m.size
        )));
    }
    Ok(())
}

/// Whether the open file is the regular file the walk listed, as it was: the same kind, size,
/// modification and status-change times, and (where the reader sees the file system the walk
/// saw, [`Member::volume`]) the same inode; else what changed. A file rewritten at its size
/// with its modification time put back (`touch -r`, `cp -p`, `rsync -t`) still has a new
/// status-change time, which no user can set; one replaced by rename has another inode.
fn unchanged(m: &Member, now: &FileFacts) -> Result<(), String> {
    let since = "since it was listed";
    if now.kind != Kind::File {
        return Err(format!("it is no longer a regular file {since}"));
    }
    if now.stamp.size != m.size {
        return Err(format!(
            "it changed: size {} -> {} bytes {since}",
            m.size, now.stamp.size
        ));
    }
    if now.stamp.mtime_ns != m.mtime_ns {
        return Err(format!("it changed: its modification time moved {since}"));
    }
    if m.volume != 0 && now.volume == m.volume && now.stamp.identity != m.identity {
        return Err(format!(
            "it was replaced {since}: another file (inode {}, listed {}) is at its path, \
             with the size and modification time listed",
            now.stamp.identity, m.identity
        ));
    }
    if now.stamp.ctime_ns != m.ctime_ns {
        return Err(format!(
            "it changed: its status-change time (ctime) moved {since}, its size and \
             modification time as listed (rewritten and its time put back, or its mode, \
             owner or links changed)"
        ));
    }
    Ok(())
}

/// The path of the file `rel` (relative, as bytes) under `root`.
pub(crate) fn file_path(root: &Path, rel: &[u8]) -> PathBuf {
    use std::os::unix::ffi::OsStrExt;
    root.join(std::ffi::OsStr::from_bytes(rel))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::Sequential;
    use crate::tar::reader::HeaderReader;
    use std::time::{Duration, UNIX_EPOCH};

    fn member(name: &str, source: Bytes, size: u64) -> Member {
        Member {
            name: name.as_bytes().to_vec(),
            source,
            size,
            mode: 0o644,
            mtime: 1,
            mtime_ns: 1_000_000_000,
            identity: 0,
            ctime_ns: 0,
            volume: 0,
        }
    }

    /// The digest is its definition: MD5 over the bincode encoding (standard config) of the
    /// members' (name, source, size, mode, (mtime, mtime_ns, ctime_ns), identity), in order;
    /// the volume (which names the walking host) left out, every other field in.
    #[test]
    fn a_listing_digest_is_md5_of_its_members_facts_without_the_volume() {
        use md5::Digest;
        let mut file = member("a.jpg", Bytes::File(b"d/a.jpg".to_vec()), 8000);
        (file.identity, file.ctime_ns, file.volume) = (77, 5_000_000_123, 9);
        let members = vec![file, member("a.cls", Bytes::Inline(b"3".to_vec()), 1)];
        let seen: Vec<_> = members
            .iter()
            .map(|m| {
                let times = (m.mtime, m.mtime_ns, m.ctime_ns);
                (
                    m.name.clone(),
                    m.source.clone(),
                    m.size,
                    m.mode,
                    times,
                    m.identity,
                )
            })
            .collect();
        let bytes = bincode::serde::encode_to_vec(&seen, bincode::config::standard()).unwrap();
        let want = u128::from_be_bytes(md5::Md5::digest(&bytes).into());
        let digest = |members: Vec<Member>| Listing::new(PathBuf::from("/r"), members).digest();
        assert_eq!(digest(members.clone()), want);
        // Pinned as a value too: resume records hold it, so a change of its form must raise
        // `checkpoint::RECORD_FORMAT` (a staging of the earlier form is then refused by version).
        assert_eq!(
            format!("{want:032x}"),
            "4fa1e6a5f6ca849ea1f0d738c9068fd1",
            "the listing digest's form changed: raise checkpoint::RECORD_FORMAT and pin the new value"
        );
        let mut other_host = members.clone();
        other_host[0].volume = 10;
        assert_eq!(digest(other_host), want);
        type Change = fn(&mut Member);
        let changes: [Change; 7] = [
            |m| m.name.push(b'x'),
            |m| m.source = Bytes::File(b"d/b.jpg".to_vec()),
            |m| m.size += 1,
            |m| m.mode = 0o600,
            |m| m.mtime_ns += 1,
            |m| m.ctime_ns += 1,
            |m| m.identity += 1,
        ];
        for change in changes {
            let mut changed = members.clone();
            change(&mut changed[0]);
            assert_ne!(digest(changed), want);
        }
    }

    /// Sets the modification time of `path` back to `m`'s, as `touch -r` does, until its
    /// status-change time is not `m`'s (the kernel's clock may not have moved since `m` was
    /// listed).
    fn restore_mtime(path: &Path, m: &Member) {
        let listed = UNIX_EPOCH + Duration::from_nanos(m.mtime_ns as u64);
        loop {
            let f = std::fs::File::options().write(true).open(path).unwrap();
            f.set_modified(listed).unwrap();
            let now = posix::facts(path, false).unwrap().stamp;
            assert_eq!(now.mtime_ns, m.mtime_ns);
            if now.ctime_ns != m.ctime_ns {
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// A file is checked against its listing once it is read (one `fstat`, after the `pread`):
    /// an unchanged one is read whole; one rewritten at the same size (its modification time
    /// put back or not), replaced by rename, cut, removed, or replaced by a FIFO or a directory
    /// is refused naming it and saying what changed, and the FIFO's read does not block.
    #[test]
    fn a_file_is_checked_against_its_listing_after_it_is_read() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        let listed = |name: &str, bytes: &[u8]| {
            let path = root.join(name);
            std::fs::write(&path, bytes).unwrap();
            let facts = posix::facts(&path, true).unwrap();
            let mut m = member(
                name,
                Bytes::File(name.as_bytes().to_vec()),
                facts.stamp.size,
            );
            m.mtime_ns = facts.stamp.mtime_ns;
            m.ctime_ns = facts.stamp.ctime_ns;
            m.identity = facts.stamp.identity;
            m.volume = facts.volume;
            (path, m)
        };
        let listing = Listing::new(root.to_path_buf(), Vec::new());
        let dirs = Mutex::default();
        let read = |m: &Member| {
            let mut buf = vec![0; m.size as usize];
            read_data(&listing, &dirs, m, &mut buf, 0)
                .map(|()| buf)
                .map_err(|e| e.to_string())
        };
        let (_, same) = listed("same.bin", b"unchanged bytes");
        assert_eq!(read(&same).unwrap(), b"unchanged bytes");
        // From one directory to another and back: each file from its own (the view keeps the
        // directories used last open), never a namesake in another.
        std::fs::create_dir_all(root.join("sub/deeper")).unwrap();
        let (_, deeper) = listed("sub/deeper/same.bin", b"other bytes, longer");
        let (_, sub) = listed("sub/same.bin", b"a third file");
        for (m, bytes) in [
            (&deeper, &b"other bytes, longer"[..]),
            (&sub, b"a third file"),
            (&same, b"unchanged bytes"),
            (&deeper, b"other bytes, longer"),
        ] {
            assert_eq!(read(m).unwrap(), bytes);
        }
        let mut refused = Vec::new();
        let (path, m) = listed("rewritten.bin", b"0123456789");
        std::fs::write(&path, b"9876543210").unwrap();
        let f = std::fs::File::options().write(true).open(&path).unwrap();
        f.set_modified(std::time::UNIX_EPOCH + std::time::Duration::from_secs(7))
            .unwrap();
        refused.push((
            m,
            "it changed: its modification time moved since it was listed",
        ));
        let (path, m) = listed("cut.bin", b"0123456789");
        std::fs::write(&path, b"012").unwrap();
        refused.push((m, "it changed: size 10 -> 3 bytes since it was listed"));
        let (path, m) = listed("gone.bin", b"0123456789");
        std::fs::remove_file(&path).unwrap();
        refused.push((m, "cannot open"));
        let (path, m) = listed("fifo.bin", b"0123456789");
        std::fs::remove_file(&path).unwrap();
        let made = std::process::Command::new("mkfifo").arg(&path).status();
        assert!(made.unwrap().success());
        refused.push((m, "it is no longer a regular file since it was listed"));
        let (path, m) = listed("dir.bin", b"0123456789");
        std::fs::remove_file(&path).unwrap();
        std::fs::create_dir(&path).unwrap();
        refused.push((m, "it is no longer a regular file since it was listed"));
        // Rewritten at the same size, or replaced by rename, with the modification time put
        // back (`touch -r`): the status-change time, and the inode, tell.
        let (path, m) = listed("restored.bin", b"0123456789");
        std::fs::write(&path, b"9876543210").unwrap();
        restore_mtime(&path, &m);
        refused.push((
            m,
            "its status-change time (ctime) moved since it was listed",
        ));
        let (path, m) = listed("renamed.bin", b"0123456789");
        let aside = root.join("renamed.new");
        std::fs::write(&aside, b"9876543210").unwrap();
        restore_mtime(&aside, &m);
        std::fs::rename(&aside, &path).unwrap();
        refused.push((
            m.clone(),
            "it was replaced since it was listed: another file",
        ));
        // Listed on another host (another volume): the inode is not compared, the rest is.
        let mut elsewhere = m;
        let facts = posix::facts(&path, false).unwrap();
        (elsewhere.ctime_ns, elsewhere.volume) = (facts.stamp.ctime_ns, elsewhere.volume ^ 1);
        assert_eq!(read(&elsewhere).unwrap(), b"9876543210");
        for (m, says) in refused {
            let err = read(&m).unwrap_err();
            let name = std::str::from_utf8(&m.name).unwrap();
            assert!(err.contains(name) && err.contains(says), "{name}: {err}");
        }
    }

    /// A unit whose samples take their files from a few directories in turn (as a
    /// `--key-regex` unit of `jpgs/K.jpg`, `txts/K.txt` does) opens each directory once; one
    /// of more directories than are kept open still reads every file from its own directory.
    #[test]
    fn files_from_a_few_directories_in_turn_open_each_directory_once() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        let dirs_count = OPEN_DIRS + 2;
        let mut members = Vec::new();
        for k in 0..5 {
            for d in 0..dirs_count {
                let rel = format!("d{d}/k{k}.bin");
                std::fs::create_dir_all(root.join(format!("d{d}"))).unwrap();
                std::fs::write(root.join(&rel), rel.as_bytes()).unwrap();
                let facts = posix::facts(&root.join(&rel), false).unwrap();
                let mut m = member(&rel, Bytes::File(rel.as_bytes().to_vec()), facts.stamp.size);
                m.mtime_ns = facts.stamp.mtime_ns;
                (m.ctime_ns, m.identity) = (facts.stamp.ctime_ns, facts.stamp.identity);
                members.push((d, m));
            }
        }
        let listing = Listing::new(root.to_path_buf(), Vec::new());
        let read_all = |dirs: &Mutex<OpenDirs>, within: usize| {
            for (_, m) in members.iter().filter(|(d, _)| *d < within) {
                let mut buf = vec![0; m.size as usize];
                read_data(&listing, dirs, m, &mut buf, 0).unwrap();
                assert_eq!(buf, m.name, "{}", String::from_utf8_lossy(&m.name));
            }
            dirs.lock().unwrap().opened
        };
        assert_eq!(read_all(&Mutex::default(), 4), 4);
        // Ten directories in turn, eight kept: each file still from its own.
        assert!(read_all(&Mutex::default(), dirs_count) >= dirs_count as u64);
    }

    /// The index pass reads only headers: it indexes a unit whose files are gone (a read of
    /// any file's bytes would fail naming it), so it opens none.
    #[test]
    fn indexing_a_unit_opens_no_file() {
        let gone = std::env::temp_dir().join("reshard-no-such-root-for-view-test");
        let members = vec![
            member("a.jpg", Bytes::File(b"a.jpg".to_vec()), 8000),
            member("a.cls", Bytes::Inline(b"3".to_vec()), 1),
            member("b.jpg", Bytes::File(b"b.jpg".to_vec()), 300),
            member("b.txt", Bytes::File(b"b.txt".to_vec()), 0),
            member("c.jpg", Bytes::File(b"c.jpg".to_vec()), 70_000),
        ];
        let listing = Arc::new(Listing::new(gone, members));
        let size = listing.size();
        let view: crate::storage::OpenInput = Arc::new(View::new(listing.clone()));
        let index =
            crate::tar::index::index_reader(HeaderReader::new(Sequential::new(view.clone())), size)
                .expect("a header walk that reads no file");
        assert_eq!(index.samples.len(), 3);
        // A read of the bytes themselves still goes to the file, and fails naming it.
        let mut buf = vec![0; 4096];
        let err = crate::storage::read_up_to_at(&*view, &mut buf, 0).unwrap_err();
        assert!(err.to_string().contains("a.jpg"), "{err}");
    }
}
