//! The spool: input shards on object storage, fetched once per run, held in memory or on
//! node-local scratch.
//!
//! The index phase streams every byte of an object-store shard to walk its tar headers (the
//! read windows fetch the data between them too), and the exchange reads its samples from the
//! same rank (the indexing rank's share is its reading share). So the index phase fetches each
//! shard whole, once, into memory where it fits a share of the memory budget, else into a spool
//! file of this rank's spool directory, and indexes it from there; [`super::open`] then opens the spooled copy for every later read of that shard in this
//! process (the exchange, keys of `--equalize` and duplicates), so the store sees each input
//! byte once. The copy is written from that one fetch, whose every GET is conditional on the
//! ETag seen when the object was opened; the finish phase checks the object's stamp as before.
//!
//! A [`Spool`] removes its directory and forgets its shards when dropped: at the end of the
//! run, whether it published or failed.

use std::any::Any;
use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use super::{read_up_to_at, sinks, sources, FileStamp, Input, OpenInput};
use crate::size::human_bytes;

/// The bytes one fetch reads at a time (the object's read windows stream ahead of it).
const CHUNK: usize = 1 << 20;

/// The spooled shards of this process, by the path the input names them by.
static SPOOLED: RwLock<Option<HashMap<PathBuf, OpenInput>>> = RwLock::new(None);

/// The spooled copy of the shard at `path`, if a spool of this process holds one.
pub(super) fn spooled(path: &Path) -> Option<OpenInput> {
    let spooled = SPOOLED.read().unwrap_or_else(|e| e.into_inner());
    spooled.as_ref()?.get(path).cloned()
}

/// A rank's spool: the shards it holds in memory, within a share of the memory budget, and in
/// its directory on scratch.
#[derive(Debug)]
pub(crate) struct Spool {
    dir: PathBuf,
    /// Whether shards that do not fit in memory go to `dir` (made, with room for them); off
    /// after the first write there fails.
    disk: AtomicBool,
    /// Bytes of the memory share not yet taken.
    memory_left: AtomicU64,
    /// Bytes spooled in memory and on disk.
    in_memory: AtomicU64,
    on_disk: AtomicU64,
    shards: Mutex<Vec<PathBuf>>,
}

/// Why a shard went to the store instead of the spool: the spool's side failed.
enum Failed {
    /// The object (its read is the caller's error).
    Object(io::Error),
    /// The spool file (the shard is then read from the store).
    Local(io::Error),
}

impl Spool {
    /// A spool in the directory `dir` (made when a shard first goes there), holding in memory
    /// the shards that fit `memory` bytes.
    pub(crate) fn new(dir: PathBuf, memory: u64) -> Spool {
        Spool {
            dir,
            disk: AtomicBool::new(true),
            memory_left: AtomicU64::new(memory),
            in_memory: AtomicU64::new(0),
            on_disk: AtomicU64::new(0),
            shards: Mutex::new(Vec::new()),
        }
    }

    /// Where the spool's files are.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// Bytes of shards held in memory, and in files.
    pub(crate) fn held(&self) -> [u64; 2] {
        [
            self.in_memory.load(Ordering::Relaxed),
            self.on_disk.load(Ordering::Relaxed),
        ]
    }

    /// Fetches the whole object at `path` once, into memory where it fits the share left, else
    /// into the spool file `name`, and from then on serves every [`super::open`] of `path` in
    /// this process from that copy. False where neither could take it (nothing fetched then, or
    /// a spool file that could not be written: said once; the shard is read from the store).
    ///
    /// # Errors
    /// The object cannot be read (or changed while it was read: each GET is conditional on the
    /// version opened), or it ended early.
    pub(crate) fn fetch(&self, path: &Path, name: &str) -> io::Result<bool> {
        let object = super::source(path).open(path)?;
        let stamp = object.stamp()?;
        let copy = if self.take_memory(stamp.size) {
            let mut bytes = vec![0u8; usize::try_from(stamp.size).map_err(io::Error::other)?];
            let read = copy_object(object.as_ref(), path, stamp.size, &mut |chunk, at| {
                bytes[at as usize..at as usize + chunk.len()].copy_from_slice(chunk);
                Ok(())
            });
            if let Err(e) = read {
                self.memory_left.fetch_add(stamp.size, Ordering::AcqRel);
                return Err(e);
            }
            self.in_memory.fetch_add(stamp.size, Ordering::Relaxed);
            Held::Memory(bytes)
        } else if self.disk.load(Ordering::Relaxed) {
            match self.to_file(object.as_ref(), path, stamp.size, name) {
                Ok(local) => Held::File(local),
                Err(Failed::Object(e)) => return Err(e),
                Err(Failed::Local(e)) => {
                    if self.disk.swap(false, Ordering::Relaxed) {
                        crate::errln!(
                            "reshard: warning: the input spool {} cannot take more ({e}): the exchange fetches the shards not spooled from the store again (--scratch sets where it is)",
                            self.dir.display()
                        );
                    }
                    return Ok(false);
                }
            }
        } else {
            return Ok(false);
        };
        let copy = Arc::new(Spooled { copy, stamp });
        self.shards
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(path.to_path_buf());
        let mut spooled = SPOOLED.write().unwrap_or_else(|e| e.into_inner());
        spooled
            .get_or_insert_with(HashMap::new)
            .insert(path.to_path_buf(), copy);
        Ok(true)
    }

    /// Takes `len` bytes of the memory share, if that many are left.
    fn take_memory(&self, len: u64) -> bool {
        self.memory_left
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |left| {
                left.checked_sub(len)
            })
            .is_ok()
    }

    /// The object's `len` bytes in the spool file `name`, opened for reading; a file that
    /// could not be written is removed.
    fn to_file(
        &self,
        object: &dyn Input,
        path: &Path,
        len: u64,
        name: &str,
    ) -> Result<OpenInput, Failed> {
        let local = self.dir.join(name);
        // Not paced: the fetch was (a rate limit is the store's, not the scratch disk's).
        let sink = sinks(&local).0;
        sink.create_dir_all(&self.dir).map_err(Failed::Local)?;
        // Room for the shard, with some to spare (other ranks of the node spool there too; a
        // write that finds the disk full all the same lets the shard go as well).
        let free = sink.free_space(&self.dir).map_err(Failed::Local)?;
        if let Some(free) = free.filter(|free| free / 16 * 15 <= len) {
            let why = format!(
                "{} free, the shard takes {}",
                human_bytes(free),
                human_bytes(len)
            );
            return Err(Failed::Local(io::Error::new(
                io::ErrorKind::StorageFull,
                why,
            )));
        }
        let out = sink.create(&local, len).map_err(Failed::Local)?;
        let mut local_failure = None;
        let copied = copy_object(object, path, len, &mut |chunk, at| {
            out.write_at(chunk, at)
                .inspect_err(|e| local_failure = Some(io::Error::new(e.kind(), e.to_string())))
        });
        drop(out);
        let opened = match (copied, local_failure) {
            (Ok(()), _) => sources(&local).0.open(&local).map_err(Failed::Local),
            (Err(_), Some(local)) => Err(Failed::Local(local)),
            (Err(e), None) => Err(Failed::Object(e)),
        };
        if opened.is_err() {
            let _ = sink.remove_file(&local);
        } else {
            self.on_disk.fetch_add(len, Ordering::Relaxed);
        }
        opened
    }
}

/// Reads the `len` bytes of `object` (the shard at `path`) front to back, handing each piece
/// and its offset to `put`.
///
/// # Errors
/// A read or `put` fails, or the object ends early.
fn copy_object(
    object: &dyn Input,
    path: &Path,
    len: u64,
    put: &mut dyn FnMut(&[u8], u64) -> io::Result<()>,
) -> io::Result<()> {
    let mut buf = vec![0u8; CHUNK.min(usize::try_from(len).unwrap_or(CHUNK))];
    let mut at = 0u64;
    while at < len {
        let want = buf
            .len()
            .min(usize::try_from(len - at).unwrap_or(usize::MAX));
        let n = read_up_to_at(object, &mut buf[..want], at)?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "{}: byte offset {at}: expected {len} bytes, found the end of the object",
                    path.display()
                ),
            ));
        }
        put(&buf[..n], at)?;
        at += n as u64;
    }
    Ok(())
}

/// Reads up to `buf.len()` bytes at `offset` of `bytes` held in memory: the count, 0 past the
/// end (as a file's `pread`).
pub(super) fn read_held_at(bytes: &[u8], buf: &mut [u8], offset: u64) -> usize {
    let from = usize::try_from(offset)
        .unwrap_or(usize::MAX)
        .min(bytes.len());
    let n = buf.len().min(bytes.len() - from);
    buf[..n].copy_from_slice(&bytes[from..from + n]);
    n
}

impl Drop for Spool {
    fn drop(&mut self) {
        let shards = std::mem::take(self.shards.get_mut().unwrap_or_else(|e| e.into_inner()));
        {
            let mut spooled = SPOOLED.write().unwrap_or_else(|e| e.into_inner());
            if let Some(map) = spooled.as_mut() {
                for shard in &shards {
                    map.remove(shard);
                }
            }
        }
        // Its copies are dropped with the map's entries (a reader still holding one keeps
        // reading it, an unlinked file included).
        if let Err(e) = sinks(&self.dir).0.remove_dir_all(&self.dir) {
            if e.kind() != io::ErrorKind::NotFound {
                crate::errln!(
                    "reshard: warning: cannot remove the input spool {}: {e}",
                    self.dir.display()
                );
            }
        }
    }
}

/// Where a spooled shard's bytes are.
enum Held {
    Memory(Vec<u8>),
    File(OpenInput),
}

/// A spooled shard: its copy, and the object's stamp (the version fetched).
struct Spooled {
    copy: Held,
    stamp: FileStamp,
}

impl Input for Spooled {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        match &self.copy {
            Held::File(local) => local.read_at(buf, offset),
            Held::Memory(bytes) => Ok(read_held_at(bytes, buf, offset)),
        }
    }

    fn stamp(&self) -> io::Result<FileStamp> {
        Ok(self.stamp)
    }

    fn advise_random(&self) {
        if let Held::File(local) = &self.copy {
            local.advise_random();
        }
    }

    fn as_any(&self) -> &dyn Any {
        match &self.copy {
            // The local file's own type: a sample that stays on its rank is copied from it
            // inside the file system ([`super::Output::copy_from`]).
            Held::File(local) => local.as_any(),
            Held::Memory(_) => self,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::memory;
    use super::*;

    /// An object of `len` bytes at `path`, in memory: its bytes.
    fn object(path: &Path, len: u32) -> Vec<u8> {
        let bytes: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        memory::put(path, bytes.clone());
        bytes
    }

    fn not_found(path: &Path) -> bool {
        sources(path).0.stat(path).map_err(|e| e.kind()).err() == Some(io::ErrorKind::NotFound)
    }

    /// A shard fetched into the spool is served from the copy, whatever the store holds now,
    /// with the stamp of the version fetched; dropping the spool forgets it and removes the
    /// directory, and the store serves the path again.
    fn served_from_the_copy(memory_share: u64, name: &str) {
        let path = PathBuf::from(format!("mem://spool-test/{name}.tar"));
        let bytes = object(&path, 3_000_000);
        let stamp = super::super::stamp(&path).unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("reshard-spool.t.0");
        let spool = Spool::new(dir.clone(), memory_share);
        assert!(spool.fetch(&path, "000000").unwrap());
        memory::put(&path, b"replaced".to_vec());
        let copy = super::super::open(&path).unwrap();
        assert_eq!(copy.stamp().unwrap(), stamp, "the version fetched");
        let mut buf = vec![0u8; 1000];
        assert_eq!(
            read_up_to_at(copy.as_ref(), &mut buf, 2_999_500).unwrap(),
            500
        );
        assert_eq!(buf[..500], bytes[2_999_500..]);
        assert_eq!(
            copy.read_at(&mut buf, 3_000_000).unwrap(),
            0,
            "0 at the end"
        );
        let file = dir.join("000000");
        if memory_share == 0 {
            assert_eq!(spool.held(), [0, 3_000_000]);
            assert_eq!(sources(&file).0.stat(&file).unwrap().stamp.size, 3_000_000);
        } else {
            assert_eq!(spool.held(), [3_000_000, 0]);
            assert!(not_found(&dir), "nothing on disk");
        }
        drop(spool);
        assert!(not_found(&dir), "the spool removed");
        let store = super::super::open(&path).unwrap();
        assert_eq!(read_up_to_at(store.as_ref(), &mut buf, 0).unwrap(), 8);
    }

    #[test]
    fn a_shard_spooled_on_disk_is_read_from_its_copy_until_the_spool_goes() {
        served_from_the_copy(0, "on-disk");
    }

    #[test]
    fn a_shard_spooled_in_memory_is_read_from_its_copy_until_the_spool_goes() {
        served_from_the_copy(4_000_000, "in-memory");
    }

    /// A missing object is an error, and nothing is spooled for it. A shard that fits neither
    /// the memory share left nor the room on the spool's file system is not fetched: the store
    /// serves it, and the next one too.
    #[test]
    fn what_the_spool_cannot_take_is_read_from_the_store() {
        let tmp = tempfile::tempdir().unwrap();
        let spool = Spool::new(tmp.path().join("s"), 0);
        let missing = Path::new("mem://spool-test/none.tar");
        let e = spool.fetch(missing, "000001").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert!(spooled(missing).is_none());

        let shards = ["a", "b", "c"].map(|n| PathBuf::from(format!("mem://spool-test/{n}.tar")));
        for shard in &shards {
            object(shard, 1000);
        }
        let dir = Path::new("mem://spool-test-scratch/reshard-spool.t.1");
        memory::set_capacity(Path::new("mem://spool-test-scratch"), 1000);
        let spool = Spool::new(dir.to_path_buf(), 1500);
        assert!(spool.fetch(&shards[0], "a").unwrap(), "in memory");
        assert!(
            !spool.fetch(&shards[1], "b").unwrap(),
            "1000 bytes free are too few"
        );
        assert!(!spool.fetch(&shards[2], "c").unwrap(), "not tried again");
        assert!(spooled(&shards[0]).is_some() && spooled(&shards[1]).is_none());
        assert_eq!(spool.held(), [1000, 0]);
    }
}
