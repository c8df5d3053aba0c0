//! The POSIX backend: local and network file systems through `std::fs` and [`crate::sys`].
//! The only file that touches `std::fs` for storage.

use std::any::Any;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::{
    Capabilities, Entry, FileStamp, Input, Kind, OpenInput, Output, Sink, Source, Stat, Writer,
};
use crate::sys;

/// Files and directories of the operating system.
pub(crate) struct Posix;

fn kind(t: fs::FileType) -> Kind {
    if t.is_symlink() {
        Kind::Link
    } else if t.is_file() {
        Kind::File
    } else if t.is_dir() {
        Kind::Dir
    } else {
        Kind::Other
    }
}

fn stat_of(meta: &fs::Metadata) -> Stat {
    Stat {
        kind: kind(meta.file_type()),
        stamp: FileStamp::of(meta),
    }
}

/// The entries of the directory `path` as it reads them (`getdents` a buffer at a time, in
/// the file system's order): a directory of any size is listed holding one buffer of it.
///
/// # Errors
/// The directory cannot be opened; an item, an entry that cannot be read.
pub(crate) fn entries(path: &Path) -> io::Result<impl Iterator<Item = io::Result<Entry>>> {
    Ok(fs::read_dir(path)?.map(|entry| {
        let entry = entry?;
        // The type from the directory entry itself (no stat where the file system says).
        let kind = entry.file_type().map_or(Kind::Other, kind);
        Ok(Entry {
            name: entry.file_name(),
            kind,
        })
    }))
}

impl Source for Posix {
    fn stat(&self, path: &Path) -> io::Result<Stat> {
        fs::metadata(path).map(|m| stat_of(&m))
    }

    fn stat_link(&self, path: &Path) -> io::Result<Stat> {
        fs::symlink_metadata(path).map(|m| stat_of(&m))
    }

    fn list(&self, path: &Path) -> io::Result<Vec<Entry>> {
        entries(path)?.collect()
    }

    fn canonical(&self, path: &Path) -> io::Result<PathBuf> {
        fs::canonicalize(path)
    }

    fn read_link(&self, path: &Path) -> io::Result<PathBuf> {
        fs::read_link(path)
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        fs::read(path)
    }

    fn open(&self, path: &Path) -> io::Result<OpenInput> {
        Ok(Arc::new(PosixInput(File::open(path)?)))
    }

    fn allocated(&self, path: &Path) -> io::Result<u64> {
        use std::os::unix::fs::MetadataExt;
        fs::metadata(path).map(|m| m.blocks() * 512)
    }
}

/// An input file open for reading.
struct PosixInput(File);

impl Input for PosixInput {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.0.read_at(buf, offset)
    }

    fn stamp(&self) -> io::Result<FileStamp> {
        self.0.metadata().map(|m| FileStamp::of(&m))
    }

    fn advise_random(&self) {
        sys::advise_random(&self.0);
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// What a loose file's tar header takes from the file system (`--input-files`, see
/// [`crate::tree`]): its kind, stamp and permission bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FileFacts {
    pub kind: Kind,
    pub stamp: FileStamp,
    /// The permission bits (`st_mode & 0o7777`).
    pub mode: u32,
    /// The file system as the host that examined the file sees it ([`volume`]); 0 where
    /// unknown (an object).
    pub volume: u64,
}

fn facts_of(meta: &fs::Metadata) -> FileFacts {
    use std::os::unix::fs::PermissionsExt;
    let stamp = FileStamp::of(meta);
    FileFacts {
        kind: kind(meta.file_type()),
        stamp,
        mode: meta.permissions().mode() & 0o7777,
        volume: volume(stamp.dev),
    }
}

/// The file system of device `dev` as this host sees it: a hash of this boot's id and the
/// device number, never 0; 0 where the boot id is unknown. Two hosts never see the same one,
/// so a file's inode is compared only by a host that sees the file system its listing saw
/// (inode numbers, like device numbers, may differ between hosts on network and FUSE file
/// systems).
pub(crate) fn volume(dev: u64) -> u64 {
    static HOST: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let host = *HOST.get_or_init(|| {
        use md5::Digest;
        let boot = sys::boot_id();
        if boot.is_empty() {
            return 0;
        }
        let d = md5::Md5::digest(boot.as_bytes());
        u64::from_le_bytes(d[..8].try_into().expect("eight bytes")) | 1
    });
    if host == 0 {
        return 0;
    }
    // splitmix64's finalizer over the host and the device.
    let mut z = host ^ dev.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (z ^ (z >> 31)).max(1)
}

/// The facts of `path`: one `stat` (`follow`) or `lstat`.
///
/// # Errors
/// It does not exist or cannot be examined.
pub fn facts(path: &Path, follow: bool) -> io::Result<FileFacts> {
    let meta = if follow {
        fs::metadata(path)?
    } else {
        fs::symlink_metadata(path)?
    };
    Ok(facts_of(&meta))
}

/// A loose file open for reading (see [`LooseDir::open`]).
pub struct LooseFile(File);

/// A directory of loose files open for opening them ([`LooseDir::open`]); `O_PATH`: it is
/// never read.
pub struct LooseDir(File);

impl LooseDir {
    /// Opens the directory at `path` (a link to a directory is followed).
    ///
    /// # Errors
    /// It cannot be opened, or is not a directory.
    pub fn new(path: &Path) -> io::Result<LooseDir> {
        use std::os::unix::fs::OpenOptionsExt;
        let dir = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH | libc::O_DIRECTORY)
            .open(path)?;
        Ok(LooseDir(dir))
    }

    /// Opens the loose file `name` (relative) in this directory for reading, without
    /// examining it: its path is resolved from the directory, not again from the root. The
    /// caller checks its [`LooseFile::facts`] after reading and uses no byte of anything but the
    /// regular file it listed. `O_NONBLOCK`, so that a FIFO or device put where a regular file
    /// was listed never blocks the open or a read (a `pread` of a FIFO fails at once, `ESPIPE`).
    ///
    /// # Errors
    /// It cannot be opened.
    pub fn open(&self, name: &[u8]) -> io::Result<LooseFile> {
        sys::open_nonblocking_at(&self.0, name).map(LooseFile)
    }
}

impl LooseFile {
    /// Reads until `buf` is full or the file ends, at `offset`: the count read.
    ///
    /// # Errors
    /// A read fails.
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        sys::read_up_to_at(&self.0, buf, offset)
    }

    /// The facts of the open file now (`fstat`).
    ///
    /// # Errors
    /// It cannot be examined.
    pub fn facts(&self) -> io::Result<FileFacts> {
        Ok(facts_of(&self.0.metadata()?))
    }
}

impl Sink for Posix {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            positioned_writes: true,
            rename: true,
            symlinks: true,
        }
    }

    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        fs::create_dir_all(path)
    }

    fn create(&self, path: &Path, len: u64) -> io::Result<Box<dyn Output>> {
        let file = OpenOptions::new().write(true).create_new(true).open(path)?;
        file.set_len(len)?;
        Ok(Box::new(PosixOutput(file)))
    }

    fn reopen(&self, path: &Path) -> io::Result<Box<dyn Output>> {
        let file = OpenOptions::new().write(true).open(path)?;
        Ok(Box::new(PosixOutput(file)))
    }

    fn write(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        let mut file = File::create(path)?;
        file.write_all(bytes)?;
        file.sync_all()
    }

    fn replace(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        let tmp = path.with_extension("tmp");
        let mut file = File::create(&tmp)?;
        file.write_all(bytes)?;
        file.sync_data()?;
        fs::rename(&tmp, path)?;
        self.sync_dir(path.parent().unwrap_or(Path::new(".")))
    }

    fn create_stream(&self, path: &Path) -> io::Result<Box<dyn Writer>> {
        Ok(Box::new(File::create(path)?))
    }

    fn rename_noreplace(&self, from: &Path, to: &Path) -> io::Result<()> {
        sys::rename_noreplace(from, to)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        fs::rename(from, to)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
    }

    fn symlink(&self, points_to: &Path, link: &Path) -> io::Result<()> {
        std::os::unix::fs::symlink(points_to, link)
    }

    fn swap(&self, a: &Path, b: &Path) -> io::Result<()> {
        sys::exchange_paths(a, b)
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        fs::remove_file(path)
    }

    fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
        fs::remove_dir_all(path)
    }

    fn create_new(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        use std::hash::{Hash, Hasher};
        // Written aside, then linked into place: O_EXCL alone would show a reader an empty
        // file. The aside name is the content's hash (a lock holds its run's token, so two runs
        // never share it, on other hosts either).
        let mut h = std::collections::hash_map::DefaultHasher::new();
        bytes.hash(&mut h);
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        let tmp = path.with_file_name(format!("{name}.{:016x}", h.finish()));
        let written = File::create(&tmp).and_then(|mut f| {
            f.write_all(bytes)?;
            f.sync_all()?;
            fs::hard_link(&tmp, path)
        });
        let _ = fs::remove_file(&tmp);
        written
    }

    fn update(
        &self,
        path: &Path,
        change: &mut dyn FnMut(&[u8]) -> Option<Vec<u8>>,
    ) -> io::Result<bool> {
        use std::io::Read;
        // Opened and closed each time, so that the write reaches a network file system's
        // server at once.
        let mut f = OpenOptions::new().read(true).write(true).open(path)?;
        let mut old = Vec::new();
        f.read_to_end(&mut old)?;
        let Some(new) = change(&old) else {
            return Ok(false);
        };
        // Only from the first byte that differs (a heartbeat moves a few digits at the end).
        let same = old.iter().zip(&new).take_while(|(a, b)| a == b).count();
        f.write_all_at(&new[same..], same as u64)?;
        if new.len() < old.len() {
            f.set_len(new.len() as u64)?;
        }
        Ok(true)
    }

    fn free_space(&self, path: &Path) -> io::Result<Option<u64>> {
        sys::free_space(path).map(Some)
    }
}

impl Writer for File {
    fn finish(self: Box<Self>) -> io::Result<u64> {
        self.sync_all()?;
        Ok(self.metadata()?.len())
    }
}

/// An output file open for positioned writes.
struct PosixOutput(File);

impl Output for PosixOutput {
    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        self.0.write_all_at(data, offset)
    }

    fn size(&self) -> io::Result<u64> {
        self.0.metadata().map(|m| m.len())
    }

    fn sync_data(&self) -> io::Result<()> {
        self.0.sync_data()
    }

    fn sync_all(&self) -> io::Result<()> {
        self.0.sync_all()
    }

    fn start_writeback(&self, offset: u64, len: u64) {
        sys::start_writeback(&self.0, offset, len);
    }

    fn copy_from(
        &self,
        src: &dyn Input,
        src_offset: u64,
        offset: u64,
        len: usize,
    ) -> Option<io::Result<usize>> {
        let src = &src.as_any().downcast_ref::<PosixInput>()?.0;
        let offsets = i64::try_from(src_offset).and_then(|i| Ok((i, i64::try_from(offset)?)));
        let Ok((off_in, off_out)) = offsets else {
            return Some(Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "offset overflow",
            )));
        };
        loop {
            match sys::copy_file_range(src, off_in, &self.0, off_out, len) {
                Ok(n) => return Some(Ok(n)),
                Err(e) => match e.raw_os_error() {
                    // The file systems cannot copy in the kernel: read and write instead.
                    Some(libc::EXDEV | libc::EINVAL | libc::ENOSYS | libc::EOPNOTSUPP) => {
                        return None
                    }
                    Some(libc::EINTR) => {}
                    _ => return Some(Err(e)),
                },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! What only the POSIX backend has: links, kinds other than files and directories, one
    //! canonical name, allocated blocks, the free space and the in-kernel copy. The contract
    //! both backends keep is tested in `storage::tests`.
    use std::os::unix::fs::symlink;
    use std::os::unix::net::UnixListener;

    use super::*;
    use crate::storage::memory::{self, Memory};

    fn kind_or_error(stat: io::Result<Stat>) -> Result<Kind, io::ErrorKind> {
        stat.map(|s| s.kind).map_err(|e| e.kind())
    }

    /// `stat` follows links and `stat_link` does not (a dangling link is a link, not nothing);
    /// a listing tells each entry's own kind; a socket is neither file, directory nor link.
    #[test]
    fn kinds_are_told_with_and_without_following_links() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        fs::write(d.join("file"), b"12345").unwrap();
        fs::create_dir(d.join("dir")).unwrap();
        symlink("file", d.join("to-file")).unwrap();
        symlink("dir", d.join("to-dir")).unwrap();
        symlink("nothing", d.join("dangling")).unwrap();
        let _socket = UnixListener::bind(d.join("socket")).unwrap();

        let (file, dir, link, other) = (
            Ok(Kind::File),
            Ok(Kind::Dir),
            Ok(Kind::Link),
            Ok(Kind::Other),
        );
        let kinds = [
            ("dangling", Err(io::ErrorKind::NotFound), link),
            ("dir", dir, dir),
            ("file", file, file),
            ("socket", other, other),
            ("to-dir", dir, link),
            ("to-file", file, link),
        ];
        for (name, followed, itself) in kinds {
            let path = d.join(name);
            assert_eq!(kind_or_error(Posix.stat(&path)), followed, "stat {name}");
            assert_eq!(
                kind_or_error(Posix.stat_link(&path)),
                itself,
                "stat_link {name}"
            );
        }
        let through_link = Posix.stat(&d.join("to-file")).unwrap().stamp;
        assert_eq!(through_link, Posix.stat(&d.join("file")).unwrap().stamp);
        let link_itself = Posix.stat_link(&d.join("to-file")).unwrap().stamp;
        assert_eq!(
            link_itself.size, 4,
            "the link's own size: its target's name"
        );

        let mut listed = Posix.list(d).unwrap();
        listed.sort_by(|a, b| a.name.cmp(&b.name));
        let listed: Vec<_> = listed.into_iter().map(|e| (e.name, Ok(e.kind))).collect();
        let want: Vec<(std::ffi::OsString, _)> = kinds
            .iter()
            .map(|&(name, _, itself)| (name.into(), itself))
            .collect();
        assert_eq!(listed, want);
        assert!(Posix.list(&d.join("file")).is_err(), "not a directory");
    }

    /// Every path that names one file has the same canonical name, absolute.
    #[test]
    fn one_file_has_one_canonical_name() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        fs::create_dir(d.join("dir")).unwrap();
        fs::write(d.join("dir/f"), b"").unwrap();
        symlink("dir/f", d.join("link")).unwrap();
        let name = Posix.canonical(&d.join("dir/f")).unwrap();
        assert!(
            name.is_absolute() && name.ends_with("dir/f"),
            "{}",
            name.display()
        );
        for other in ["link", "dir/../dir/./f"] {
            assert_eq!(Posix.canonical(&d.join(other)).unwrap(), name, "{other}");
        }
        let missing = Posix.canonical(&d.join("missing")).unwrap_err();
        assert_eq!(missing.kind(), io::ErrorKind::NotFound);
    }

    /// A file sized up front takes no blocks until written; written, it takes at least its
    /// bytes, counted in 512-byte blocks.
    #[test]
    fn allocated_counts_the_blocks_written_not_the_length() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("shard");
        let out = Posix.create(&path, 1 << 20).unwrap();
        out.sync_all().unwrap();
        let sized = Posix.allocated(&path).unwrap();
        assert!(sized < 1 << 20, "{sized} bytes allocated before any write");
        out.write_at(&[1u8; 65536], 0).unwrap();
        out.sync_all().unwrap();
        let written = Posix.allocated(&path).unwrap();
        assert!(
            written >= 65536 && written % 512 == 0,
            "{written} bytes allocated"
        );
    }

    /// A directory that is not there cannot be synced, nor a file replaced in it (nothing is
    /// written); the free space of a path that is not there is an error, not a number.
    #[test]
    fn syncs_replacements_and_free_space_fail_where_nothing_is() {
        let tmp = tempfile::tempdir().unwrap();
        let missing = tmp.path().join("missing");
        Posix.sync_dir(tmp.path()).unwrap();
        assert_eq!(
            Posix.sync_dir(&missing).unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
        let replace = Posix.replace(&missing.join("f"), b"x").unwrap_err();
        assert_eq!(replace.kind(), io::ErrorKind::NotFound);
        assert!(
            Posix.free_space(tmp.path()).unwrap().is_some(),
            "statvfs knows"
        );
        let free = Posix.free_space(&missing).unwrap_err();
        assert_eq!(free.kind(), io::ErrorKind::NotFound);
        assert_eq!(
            Posix.capabilities(),
            Capabilities {
                positioned_writes: true,
                rename: true,
                symlinks: true,
            }
        );
    }

    /// Between two local files the copy happens in the kernel, each range at its offsets, and
    /// says how much it copied (0 past the source's end). Offsets the kernel cannot take are
    /// an error; an input of another backend, or one the kernel cannot copy from (a device),
    /// is declined (`None`: the caller reads and writes) and nothing is written.
    #[test]
    fn copy_from_copies_between_local_files_and_declines_other_inputs() {
        let tmp = tempfile::tempdir().unwrap();
        let (from, to) = (tmp.path().join("in"), tmp.path().join("out"));
        fs::write(&from, b"0123456789").unwrap();
        let input = Posix.open(&from).unwrap();
        let out = Posix.create(&to, 12).unwrap();
        let copy = |src: &dyn Input, src_offset, offset, len| {
            out.copy_from(src, src_offset, offset, len)
                .map(|r| r.map_err(|e| e.kind()))
        };
        assert_eq!(copy(input.as_ref(), 6, 1, 4), Some(Ok(4)));
        assert_eq!(copy(input.as_ref(), 0, 8, 3), Some(Ok(3)));
        assert_eq!(copy(input.as_ref(), 10, 0, 5), Some(Ok(0)), "past the end");
        let too_far = Some(Err(io::ErrorKind::InvalidInput));
        assert_eq!(copy(input.as_ref(), u64::MAX, 0, 1), too_far);
        assert_eq!(copy(input.as_ref(), 0, u64::MAX, 1), too_far);

        let in_memory = Path::new("mem://posix-copy/in");
        memory::put(in_memory, b"abc".to_vec());
        assert_eq!(
            copy(Memory.open(in_memory).unwrap().as_ref(), 0, 0, 3),
            None
        );
        let device = Posix.open(Path::new("/dev/zero")).unwrap();
        assert_eq!(copy(device.as_ref(), 0, 0, 3), None);

        out.sync_all().unwrap();
        let want = [&[0u8][..], b"6789", &[0; 3], b"012", &[0]].concat();
        assert_eq!(
            fs::read(&to).unwrap(),
            want,
            "each range at its offset, the rest zeros"
        );
    }
}
