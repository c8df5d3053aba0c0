//! A toy backend in memory, for unit tests: locations `mem://…` name objects in one map of this
//! process. It proves that the phases reach storage only through the seam: a phase that opened a
//! `mem://` path with `std::fs` would find nothing there.

use std::any::Any;
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use super::{Capabilities, Entry, FileStamp, Input, Kind, Output, Shard, Sink, Source, Stat};

/// The objects of this process, by location.
pub struct Memory;

/// One object: its bytes and its identity (a new object, a new inode).
#[derive(Clone)]
struct Object {
    bytes: Arc<RwLock<Vec<u8>>>,
    ino: u64,
}

#[derive(Default)]
struct Store {
    objects: BTreeMap<PathBuf, Object>,
    dirs: BTreeSet<PathBuf>,
}

static STORE: Mutex<Option<Store>> = Mutex::new(None);
static NEXT_INO: AtomicU64 = AtomicU64::new(1);

fn with<T>(f: impl FnOnce(&mut Store) -> T) -> T {
    f(STORE.lock().unwrap().get_or_insert_with(Store::default))
}

fn not_found(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("{}: no such object", path.display()),
    )
}

/// Puts an object with `bytes` at `path` (replacing what was there).
pub fn put(path: &Path, bytes: Vec<u8>) {
    let object = Object {
        bytes: Arc::new(RwLock::new(bytes)),
        ino: NEXT_INO.fetch_add(1, Ordering::Relaxed),
    };
    with(|s| s.objects.insert(path.to_path_buf(), object));
}

/// The bytes of the object at `path`.
pub fn get(path: &Path) -> Option<Vec<u8>> {
    with(|s| s.objects.get(path).map(|o| o.bytes.read().unwrap().clone()))
}

fn object(path: &Path) -> io::Result<Object> {
    with(|s| s.objects.get(path).cloned()).ok_or_else(|| not_found(path))
}

fn stamp(o: &Object) -> FileStamp {
    let size = o.bytes.read().unwrap().len() as u64;
    FileStamp {
        size,
        ino: o.ino,
        ..FileStamp::default()
    }
}

fn is_dir(s: &Store, path: &Path) -> bool {
    s.dirs.contains(path) || s.objects.keys().any(|k| k.parent() == Some(path))
}

impl Source for Memory {
    fn stat(&self, path: &Path) -> io::Result<Stat> {
        with(|s| {
            if let Some(o) = s.objects.get(path) {
                return Ok(Stat {
                    kind: Kind::File,
                    stamp: stamp(o),
                });
            }
            is_dir(s, path)
                .then_some(Stat {
                    kind: Kind::Dir,
                    stamp: FileStamp::default(),
                })
                .ok_or_else(|| not_found(path))
        })
    }

    fn list(&self, path: &Path) -> io::Result<Vec<Entry>> {
        with(|s| {
            if !is_dir(s, path) {
                return Err(not_found(path));
            }
            let files = s.objects.keys().map(|k| (k, Kind::File));
            let dirs = s.dirs.iter().map(|k| (k, Kind::Dir));
            Ok(files
                .chain(dirs)
                .filter(|(k, _)| k.parent() == Some(path))
                .map(|(k, kind)| Entry {
                    name: k.file_name().map(OsString::from).unwrap_or_default(),
                    kind,
                })
                .collect())
        })
    }

    fn canonical(&self, path: &Path) -> io::Result<PathBuf> {
        Source::stat(self, path)?;
        Ok(path.to_path_buf())
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        get(path).ok_or_else(|| not_found(path))
    }

    fn open(&self, path: &Path) -> io::Result<Shard> {
        Ok(Arc::new(object(path)?))
    }
}

impl Input for Object {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let bytes = self.bytes.read().unwrap();
        let from = usize::try_from(offset)
            .unwrap_or(usize::MAX)
            .min(bytes.len());
        let n = buf.len().min(bytes.len() - from);
        buf[..n].copy_from_slice(&bytes[from..from + n]);
        Ok(n)
    }

    fn stamp(&self) -> io::Result<FileStamp> {
        Ok(stamp(self))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Output for Object {
    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        let mut bytes = self.bytes.write().unwrap();
        let at = usize::try_from(offset).map_err(|_| io::ErrorKind::InvalidInput)?;
        if bytes.len() < at + data.len() {
            bytes.resize(at + data.len(), 0);
        }
        bytes[at..at + data.len()].copy_from_slice(data);
        Ok(())
    }

    fn size(&self) -> io::Result<u64> {
        Ok(self.bytes.read().unwrap().len() as u64)
    }

    fn sync_data(&self) -> io::Result<()> {
        Ok(())
    }

    fn sync_all(&self) -> io::Result<()> {
        Ok(())
    }
}

/// A stream that becomes the object at its path when dropped.
struct Pending {
    path: PathBuf,
    bytes: Vec<u8>,
}

impl Write for Pending {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        put(&self.path, self.bytes.clone());
        Ok(())
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        put(&self.path, std::mem::take(&mut self.bytes));
    }
}

/// Where `path`, at or under `from`, is once `from` is renamed to `to`.
fn moved_to(path: &Path, from: &Path, to: &Path) -> PathBuf {
    match path.strip_prefix(from) {
        Ok(rel) if !rel.as_os_str().is_empty() => to.join(rel),
        _ => to.to_path_buf(),
    }
}

impl Sink for Memory {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            positioned_writes: true,
            rename: true,
        }
    }

    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        with(|s| {
            for dir in path.ancestors().filter(|d| !d.as_os_str().is_empty()) {
                s.dirs.insert(dir.to_path_buf());
            }
        });
        Ok(())
    }

    fn create(&self, path: &Path, len: u64) -> io::Result<Box<dyn Output>> {
        if with(|s| s.objects.contains_key(path)) {
            return Err(io::ErrorKind::AlreadyExists.into());
        }
        let len = usize::try_from(len).map_err(|_| io::ErrorKind::InvalidInput)?;
        put(path, vec![0; len]);
        Ok(Box::new(object(path)?))
    }

    fn reopen(&self, path: &Path) -> io::Result<Box<dyn Output>> {
        Ok(Box::new(object(path)?))
    }

    fn write(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        put(path, bytes.to_vec());
        Ok(())
    }

    fn replace(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        put(path, bytes.to_vec());
        Ok(())
    }

    fn create_stream(&self, path: &Path) -> io::Result<Box<dyn Write + Send>> {
        Ok(Box::new(Pending {
            path: path.to_path_buf(),
            bytes: Vec::new(),
        }))
    }

    fn publish(&self, from: &Path, to: &Path) -> io::Result<()> {
        with(|s| {
            if s.objects.contains_key(to) || is_dir(s, to) {
                return Err(io::ErrorKind::AlreadyExists.into());
            }
            let moved: Vec<PathBuf> = s
                .objects
                .keys()
                .filter(|k| k.starts_with(from))
                .cloned()
                .collect();
            if moved.is_empty() && !s.dirs.contains(from) {
                return Err(not_found(from));
            }
            for k in moved {
                let o = s.objects.remove(&k).expect("listed");
                s.objects.insert(moved_to(&k, from, to), o);
            }
            let dirs: Vec<PathBuf> = s
                .dirs
                .iter()
                .filter(|d| d.starts_with(from))
                .cloned()
                .collect();
            for d in dirs {
                s.dirs.remove(&d);
                s.dirs.insert(moved_to(&d, from, to));
            }
            Ok(())
        })
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let _ = self.remove_file(to);
        self.publish(from, to)
    }

    fn sync_dir(&self, _dir: &Path) -> io::Result<()> {
        Ok(())
    }

    fn symlink(&self, _points_to: &Path, _link: &Path) -> io::Result<()> {
        Err(io::ErrorKind::Unsupported.into())
    }

    fn exchange(&self, _a: &Path, _b: &Path) -> io::Result<()> {
        Err(io::ErrorKind::Unsupported.into())
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        with(|s| {
            s.objects
                .remove(path)
                .map(drop)
                .ok_or_else(|| not_found(path))
        })
    }

    fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
        with(|s| {
            s.objects.retain(|k, _| !k.starts_with(path));
            s.dirs.retain(|k| !k.starts_with(path));
        });
        Ok(())
    }
}
