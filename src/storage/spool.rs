//! The spool: input shards on object storage, fetched once per run onto node-local scratch.
//!
//! The index phase streams every byte of an object-store shard to walk its tar headers (the
//! read windows fetch the data between them too), and the exchange reads its samples from the
//! same rank (the indexing rank's share is its reading share). So the index phase fetches each
//! shard whole, once, into a spool file of this rank's spool directory, and indexes it from
//! there; [`super::open`] then opens the spooled copy for every later read of that shard in this
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
use std::sync::{Arc, Mutex, RwLock};

use super::{read_up_to_at, sinks, sources, FileStamp, Input, OpenInput};

/// The bytes one fetch reads at a time (the object's read windows stream ahead of it).
const CHUNK: usize = 1 << 20;

/// The spooled shards of this process, by the path the input names them by.
static SPOOLED: RwLock<Option<HashMap<PathBuf, OpenInput>>> = RwLock::new(None);

/// The spooled copy of the shard at `path`, if a spool of this process holds one.
pub(super) fn spooled(path: &Path) -> Option<OpenInput> {
    let spooled = SPOOLED.read().unwrap_or_else(|e| e.into_inner());
    spooled.as_ref()?.get(path).cloned()
}

/// A rank's spool directory and the shards it holds.
#[derive(Debug)]
pub(crate) struct Spool {
    dir: PathBuf,
    shards: Mutex<Vec<PathBuf>>,
}

impl Spool {
    /// A new spool in the directory `dir` (made here; nothing may be there).
    ///
    /// # Errors
    /// The directory cannot be made.
    pub(crate) fn create(dir: PathBuf) -> io::Result<Spool> {
        sinks(&dir).0.create_dir_all(&dir)?;
        Ok(Spool {
            dir,
            shards: Mutex::new(Vec::new()),
        })
    }

    /// Where the spool is.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// The bytes its file system can still take, where that is known.
    ///
    /// # Errors
    /// It cannot be told now.
    pub(crate) fn free_space(&self) -> io::Result<Option<u64>> {
        sinks(&self.dir).0.free_space(&self.dir)
    }

    /// Fetches the whole object at `path` once into the spool file `name`, and from then on
    /// serves every [`super::open`] of `path` in this process from that copy: the stamp of the
    /// version fetched.
    ///
    /// # Errors
    /// The object cannot be read (or changed while it was read: each GET is conditional on the
    /// version opened), or it ended early; the spool file cannot be written or opened.
    pub(crate) fn fetch(&self, path: &Path, name: &str) -> io::Result<FileStamp> {
        let object = super::source(path).open(path)?;
        let stamp = object.stamp()?;
        let local = self.dir.join(name);
        // Not paced: the fetch was (a rate limit is the store's, not the scratch disk's).
        let out = sinks(&local).0.create(&local, stamp.size)?;
        let mut buf = vec![0u8; CHUNK.min(usize::try_from(stamp.size).unwrap_or(CHUNK))];
        let mut at = 0u64;
        while at < stamp.size {
            let want = buf
                .len()
                .min(usize::try_from(stamp.size - at).unwrap_or(usize::MAX));
            let n = read_up_to_at(object.as_ref(), &mut buf[..want], at)?;
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!(
                        "{}: byte offset {at}: expected {} bytes, found the end of the object",
                        path.display(),
                        stamp.size
                    ),
                ));
            }
            out.write_at(&buf[..n], at)?;
            at += n as u64;
        }
        drop(out);
        let copy = Arc::new(Spooled {
            local: sources(&local).0.open(&local)?,
            stamp,
        });
        self.shards
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(path.to_path_buf());
        let mut spooled = SPOOLED.write().unwrap_or_else(|e| e.into_inner());
        spooled
            .get_or_insert_with(HashMap::new)
            .insert(path.to_path_buf(), copy);
        Ok(stamp)
    }
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
        // Its open copies are closed with the map's entries (a reader still holding one keeps
        // reading the unlinked file).
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

/// A spooled shard: the local copy's bytes, the object's stamp (the version fetched).
struct Spooled {
    local: OpenInput,
    stamp: FileStamp,
}

impl Input for Spooled {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.local.read_at(buf, offset)
    }

    fn stamp(&self) -> io::Result<FileStamp> {
        Ok(self.stamp)
    }

    fn advise_random(&self) {
        self.local.advise_random();
    }

    fn as_any(&self) -> &dyn Any {
        // The local file's own type: a sample that stays on its rank is copied from it inside
        // the file system ([`super::Output::copy_from`]).
        self.local.as_any()
    }
}

#[cfg(test)]
mod tests {
    use super::super::memory;
    use super::*;

    /// A shard fetched into the spool is served from the copy (the object may go), with the
    /// object's stamp; dropping the spool removes its directory and serves the store again.
    #[test]
    fn a_spooled_shard_is_read_from_its_copy_until_the_spool_goes() {
        let object = Path::new("mem://spool-test/in/a.tar");
        let bytes: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        memory::put(object, bytes.clone());
        let stamp = super::super::stamp(object).unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("reshard-spool.t-0");
        let spool = Spool::create(dir.clone()).unwrap();
        assert_eq!(spool.fetch(object, "000000").unwrap(), stamp);
        memory::put(object, b"replaced".to_vec());
        let copy = super::super::open(object).unwrap();
        assert_eq!(copy.stamp().unwrap(), stamp, "the version fetched");
        let mut buf = vec![0u8; 1000];
        assert_eq!(
            read_up_to_at(copy.as_ref(), &mut buf, 2_999_500).unwrap(),
            500
        );
        assert_eq!(buf[..500], bytes[2_999_500..]);
        let file = dir.join("000000");
        assert_eq!(sources(&file).0.stat(&file).unwrap().stamp.size, 3_000_000);
        drop(spool);
        let gone = sources(&dir).0.stat(&dir).unwrap_err();
        assert_eq!(gone.kind(), io::ErrorKind::NotFound, "the spool removed");
        let store = super::super::open(object).unwrap();
        assert_eq!(read_up_to_at(store.as_ref(), &mut buf, 0).unwrap(), 8);
    }

    /// A missing object is an error, and nothing is spooled for it.
    #[test]
    fn a_missing_object_is_not_spooled() {
        let tmp = tempfile::tempdir().unwrap();
        let spool = Spool::create(tmp.path().join("s")).unwrap();
        let missing = Path::new("mem://spool-test/none.tar");
        let e = spool.fetch(missing, "000001").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert!(spooled(missing).is_none());
    }
}
