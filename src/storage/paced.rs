//! The rate limits (`--max-read-rate`, `--max-write-rate`) as a wrapper of the seam: [`Paced`]
//! wraps any backend's [`Source`] and [`Sink`], and the objects they open, and hands every byte
//! they move to [`crate::throttle`]. [`super::source`] and [`super::sink`] hand it out instead
//! of the backend while a limit is set, so no phase paces anything itself and every byte read or
//! written through the seam counts exactly once, whichever phase moves it.
//!
//! Two kinds of call:
//! - transfers (`Input::read_at`, `Output::write_at`, `Output::copy_from`, `Writer`'s writes)
//!   wait until the limits allow their bytes ([`throttle::pace`]);
//! - whole small objects (`Source::read`, `Sink::write`, `replace`, `create_new`, `update`, and
//!   [`super::write_unsynced`]) are counted and charged but never wait ([`throttle::charge`]):
//!   they are markers, locks and heartbeats, which a limit must not delay.
//!
//! Every other call is forwarded as it is. A method added to a trait with a default must be
//! forwarded here too, or the wrapped backend's own answer is lost while a limit is set.

use std::any::Any;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::{
    Capabilities, Entry, FileStamp, Input, OpenInput, Output, Reads, Sink, Source, Stat, Writer,
};
use crate::throttle;

/// A backend whose transfers keep to the run's rate limits.
pub(crate) struct Paced<B: ?Sized + 'static>(pub(crate) &'static B);

impl<B: Source + ?Sized> Source for Paced<B> {
    fn stat(&self, path: &Path) -> io::Result<Stat> {
        self.0.stat(path)
    }

    fn stat_link(&self, path: &Path) -> io::Result<Stat> {
        self.0.stat_link(path)
    }

    fn list(&self, path: &Path) -> io::Result<Vec<Entry>> {
        self.0.list(path)
    }

    fn list_starting(&self, path: &Path, start: &str) -> io::Result<Vec<Entry>> {
        self.0.list_starting(path, start)
    }

    fn canonical(&self, path: &Path) -> io::Result<PathBuf> {
        self.0.canonical(path)
    }

    fn read_link(&self, path: &Path) -> io::Result<PathBuf> {
        self.0.read_link(path)
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        let bytes = self.0.read(path)?;
        throttle::charge(bytes.len() as u64, 0);
        Ok(bytes)
    }

    fn open(&self, path: &Path) -> io::Result<OpenInput> {
        Ok(Arc::new(PacedInput(self.0.open(path)?)))
    }

    fn allocated(&self, path: &Path) -> io::Result<u64> {
        self.0.allocated(path)
    }
}

/// An open input whose reads wait for the read limit.
struct PacedInput(OpenInput);

impl Input for PacedInput {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        // Counted after the read: what the storage served, not what was asked for.
        let n = self.0.read_at(buf, offset)?;
        throttle::pace(n as u64, 0);
        Ok(n)
    }

    fn stamp(&self) -> io::Result<FileStamp> {
        self.0.stamp()
    }

    fn advise_random(&self) {
        self.0.advise_random();
    }

    /// The backend's own object, so that its fast paths ([`Output::copy_from`]) still recognise
    /// it through the wrapper.
    fn as_any(&self) -> &dyn Any {
        self.0.as_any()
    }

    fn reads(&self) -> Reads {
        self.0.reads()
    }
}

impl<B: Sink + ?Sized> Sink for Paced<B> {
    fn capabilities(&self) -> Capabilities {
        self.0.capabilities()
    }

    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        self.0.create_dir_all(path)
    }

    fn create(&self, path: &Path, len: u64) -> io::Result<Box<dyn Output>> {
        Ok(Box::new(PacedOutput(self.0.create(path, len)?)))
    }

    fn reopen(&self, path: &Path) -> io::Result<Box<dyn Output>> {
        Ok(Box::new(PacedOutput(self.0.reopen(path)?)))
    }

    fn write(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        throttle::charge(0, bytes.len() as u64);
        self.0.write(path, bytes)
    }

    fn replace(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        throttle::charge(0, bytes.len() as u64);
        self.0.replace(path, bytes)
    }

    fn create_stream(&self, path: &Path) -> io::Result<Box<dyn Writer>> {
        Ok(Box::new(PacedWriter(self.0.create_stream(path)?)))
    }

    fn create_stream_new(&self, path: &Path) -> io::Result<Box<dyn Writer>> {
        Ok(Box::new(PacedWriter(self.0.create_stream_new(path)?)))
    }

    fn rename_noreplace(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.0.rename_noreplace(from, to)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.0.rename(from, to)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        self.0.sync_dir(dir)
    }

    fn symlink(&self, points_to: &Path, link: &Path) -> io::Result<()> {
        self.0.symlink(points_to, link)
    }

    fn swap(&self, a: &Path, b: &Path) -> io::Result<()> {
        self.0.swap(a, b)
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        self.0.remove_file(path)
    }

    fn tag_of(&self, path: &Path) -> io::Result<Option<String>> {
        self.0.tag_of(path)
    }

    fn remove_file_if(&self, path: &Path, tag: Option<&str>) -> io::Result<bool> {
        self.0.remove_file_if(path, tag)
    }

    fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
        self.0.remove_dir_all(path)
    }

    fn create_new(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        throttle::charge(0, bytes.len() as u64);
        self.0.create_new(path, bytes)
    }

    fn update(
        &self,
        path: &Path,
        change: &mut dyn FnMut(&[u8]) -> Option<Vec<u8>>,
    ) -> io::Result<bool> {
        self.0.update(path, &mut |old| {
            let new = change(old);
            throttle::charge(old.len() as u64, new.as_ref().map_or(0, |n| n.len() as u64));
            new
        })
    }

    fn free_space(&self, path: &Path) -> io::Result<Option<u64>> {
        self.0.free_space(path)
    }

    fn abort_unfinished(&self, dir: &Path) -> io::Result<usize> {
        self.0.abort_unfinished(dir)
    }
}

/// An output open for positioned writes whose writes wait for the write limit.
struct PacedOutput(Box<dyn Output>);

impl Output for PacedOutput {
    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        // Paid before the write: no byte reaches the storage ahead of its turn.
        throttle::pace(0, data.len() as u64);
        self.0.write_at(data, offset)
    }

    fn size(&self) -> io::Result<u64> {
        self.0.size()
    }

    fn sync_data(&self) -> io::Result<()> {
        self.0.sync_data()
    }

    fn sync_all(&self) -> io::Result<()> {
        self.0.sync_all()
    }

    fn start_writeback(&self, offset: u64, len: u64) {
        self.0.start_writeback(offset, len);
    }

    /// The copy inside the storage reads and writes each byte once: both limits count it, and
    /// it waits for the slower. `src` is a [`PacedInput`] whose reads are not called here, so
    /// nothing counts twice.
    fn copy_from(
        &self,
        src: &dyn Input,
        src_offset: u64,
        offset: u64,
        len: usize,
    ) -> Option<io::Result<usize>> {
        let copied = self.0.copy_from(src, src_offset, offset, len)?;
        if let Ok(n) = copied {
            throttle::pace(n as u64, n as u64);
        }
        Some(copied)
    }
}

/// An output written front to back whose writes wait for the write limit.
struct PacedWriter(Box<dyn Writer>);

impl Write for PacedWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.0.write(buf)?;
        throttle::pace(0, n as u64);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

impl Writer for PacedWriter {
    fn finish(self: Box<Self>) -> io::Result<u64> {
        self.0.finish()
    }

    fn finish_created(self: Box<Self>) -> io::Result<crate::storage::Created> {
        self.0.finish_created()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::memory::Memory;
    use crate::storage::posix::Posix;
    use std::sync::Mutex;

    /// Through the wrapper, two local files still copy inside the kernel: the output's fast
    /// path finds the backend's own input behind the wrapper ([`PacedInput::as_any`]).
    #[test]
    fn the_in_kernel_copy_survives_the_wrapper() {
        static PACED: Paced<Posix> = Paced(&Posix);
        let dir = tempfile::tempdir().unwrap();
        let (from, to) = (dir.path().join("in"), dir.path().join("out"));
        PACED.write(&from, b"0123456789").unwrap();
        let src = PACED.open(&from).unwrap();
        let out = PACED.create(&to, 10).unwrap();
        let copied = out.copy_from(src.as_ref(), 2, 0, 6);
        assert_eq!(
            copied.map(Result::unwrap),
            Some(6),
            "not copied in the kernel"
        );
        out.sync_all().unwrap();
        assert_eq!(Posix.read(&to).unwrap(), b"234567\0\0\0\0");
        let mut buf = [0u8; 4];
        assert_eq!(src.read_at(&mut buf, 6).unwrap(), 4);
        assert_eq!(&buf, b"6789");
    }

    /// Calls that change nothing a test reads back reach the backend: its answers and its
    /// errors come back as they are, not a success the wrapper made up.
    #[test]
    fn the_backends_answers_and_errors_come_back_through_the_wrapper() {
        static PACED: Paced<Posix> = Paced(&Posix);
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        PACED.write(&file, b"x").unwrap();
        let link = dir.path().join("l");
        PACED.symlink(Path::new("f"), &link).unwrap();
        assert_eq!(
            PACED.canonical(&link).unwrap(),
            Posix.canonical(&file).unwrap()
        );
        let missing = dir.path().join("missing");
        let e = PACED.sync_dir(&missing).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert_eq!(PACED.abort_unfinished(dir.path()).unwrap(), 0);
    }

    /// A stream's flush reaches the backend's writer (the memory backend stores what was
    /// written so far when flushed).
    #[test]
    fn a_flush_reaches_the_backends_writer() {
        static PACED: Paced<Memory> = Paced(&Memory);
        let path = Path::new("mem://paced-flush/s");
        let mut stream = PACED.create_stream(path).unwrap();
        stream.write_all(b"written").unwrap();
        assert!(Memory.read(path).is_err(), "not yet flushed");
        stream.flush().unwrap();
        assert_eq!(Memory.read(path).unwrap(), b"written");
        assert_eq!(stream.finish().unwrap(), 7);
    }

    /// A backend that notes the calls of the trait methods with a default (hints, the abort
    /// of unfinished uploads) and whose syncs fail; no other call is expected of it.
    struct Noting(Mutex<Vec<String>>);

    impl Noting {
        fn leaked() -> &'static Noting {
            Box::leak(Box::new(Noting(Mutex::new(Vec::new()))))
        }

        fn note(&self, call: String) {
            self.0.lock().unwrap().push(call);
        }

        fn noted(&self) -> Vec<String> {
            self.0.lock().unwrap().clone()
        }
    }

    impl Input for &'static Noting {
        fn read_at(&self, _: &mut [u8], _: u64) -> io::Result<usize> {
            unreachable!()
        }
        fn stamp(&self) -> io::Result<FileStamp> {
            unreachable!()
        }
        fn advise_random(&self) {
            self.note("advise_random".into());
        }
        fn as_any(&self) -> &dyn Any {
            self
        }
    }

    impl Output for &'static Noting {
        fn write_at(&self, _: &[u8], _: u64) -> io::Result<()> {
            unreachable!()
        }
        fn size(&self) -> io::Result<u64> {
            unreachable!()
        }
        fn sync_data(&self) -> io::Result<()> {
            Err(io::Error::other("sync_data failed"))
        }
        fn sync_all(&self) -> io::Result<()> {
            Err(io::Error::other("sync_all failed"))
        }
        fn start_writeback(&self, offset: u64, len: u64) {
            self.note(format!("start_writeback {offset} {len}"));
        }
    }

    impl Sink for Noting {
        fn capabilities(&self) -> Capabilities {
            unreachable!()
        }
        fn create_dir_all(&self, _: &Path) -> io::Result<()> {
            unreachable!()
        }
        fn create(&self, _: &Path, _: u64) -> io::Result<Box<dyn Output>> {
            unreachable!()
        }
        fn reopen(&self, _: &Path) -> io::Result<Box<dyn Output>> {
            unreachable!()
        }
        fn write(&self, _: &Path, _: &[u8]) -> io::Result<()> {
            unreachable!()
        }
        fn replace(&self, _: &Path, _: &[u8]) -> io::Result<()> {
            unreachable!()
        }
        fn abort_unfinished(&self, dir: &Path) -> io::Result<usize> {
            self.note(format!("abort_unfinished {}", dir.display()));
            Ok(2)
        }
        fn create_stream(&self, _: &Path) -> io::Result<Box<dyn Writer>> {
            unreachable!()
        }
        fn rename_noreplace(&self, _: &Path, _: &Path) -> io::Result<()> {
            unreachable!()
        }
        fn rename(&self, _: &Path, _: &Path) -> io::Result<()> {
            unreachable!()
        }
        fn sync_dir(&self, _: &Path) -> io::Result<()> {
            unreachable!()
        }
        fn symlink(&self, _: &Path, _: &Path) -> io::Result<()> {
            unreachable!()
        }
        fn swap(&self, _: &Path, _: &Path) -> io::Result<()> {
            unreachable!()
        }
        fn remove_file(&self, _: &Path) -> io::Result<()> {
            unreachable!()
        }
        fn remove_dir_all(&self, _: &Path) -> io::Result<()> {
            unreachable!()
        }
    }

    /// The methods a trait gives a default are forwarded too: a backend's own hints, syncs and
    /// aborts are not lost while a limit is set (the default would hide them).
    #[test]
    fn methods_with_a_default_are_forwarded_not_answered_by_it() {
        let backend = Noting::leaked();
        let input = PacedInput(Arc::new(backend));
        input.advise_random();
        let output = PacedOutput(Box::new(backend));
        output.start_writeback(4096, 512);
        let e = output.sync_data().unwrap_err();
        assert_eq!(e.to_string(), "sync_data failed");
        let e = output.sync_all().unwrap_err();
        assert_eq!(e.to_string(), "sync_all failed");
        let aborted = Paced(backend).abort_unfinished(Path::new("s3://b/out"));
        assert_eq!(aborted.unwrap(), 2);
        assert_eq!(
            backend.noted(),
            [
                "advise_random",
                "start_writeback 4096 512",
                "abort_unfinished s3://b/out"
            ]
        );
    }
}
