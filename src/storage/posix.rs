//! The POSIX backend: local and network file systems through `std::fs` and [`crate::sys`].
//! The only file that touches `std::fs` for storage.

use std::any::Any;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::{
    Capabilities, Entry, FileStamp, Input, Kind, Output, Shard, Sink, Source, Stat, Writer,
};
use crate::sys;

/// Files and directories of the operating system.
pub struct Posix;

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

impl Source for Posix {
    fn stat(&self, path: &Path) -> io::Result<Stat> {
        fs::metadata(path).map(|m| stat_of(&m))
    }

    fn stat_link(&self, path: &Path) -> io::Result<Stat> {
        fs::symlink_metadata(path).map(|m| stat_of(&m))
    }

    fn list(&self, path: &Path) -> io::Result<Vec<Entry>> {
        let mut out = Vec::new();
        for entry in fs::read_dir(path)? {
            let entry = entry?;
            // The type from the directory entry itself (no stat where the file system says).
            let kind = entry.file_type().map_or(Kind::Other, kind);
            out.push(Entry {
                name: entry.file_name(),
                kind,
            });
        }
        Ok(out)
    }

    fn canonical(&self, path: &Path) -> io::Result<PathBuf> {
        fs::canonicalize(path)
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        fs::read(path)
    }

    fn open(&self, path: &Path) -> io::Result<Shard> {
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

impl Sink for Posix {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            positioned_writes: true,
            rename: true,
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

    fn publish(&self, from: &Path, to: &Path) -> io::Result<()> {
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

    fn exchange(&self, a: &Path, b: &Path) -> io::Result<()> {
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
