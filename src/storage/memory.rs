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

use super::{
    Capabilities, Entry, FileStamp, Input, Kind, OpenInput, Output, Sink, Source, Stat, Writer,
};

/// The objects of this process, by location.
pub(crate) struct Memory;

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
    /// The size of a part of the store (a prefix), where a test set one ([`set_capacity`]).
    capacity: BTreeMap<PathBuf, u64>,
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
pub(crate) fn put(path: &Path, bytes: Vec<u8>) {
    let object = Object {
        bytes: Arc::new(RwLock::new(bytes)),
        ino: NEXT_INO.fetch_add(1, Ordering::Relaxed),
    };
    with(|s| s.objects.insert(path.to_path_buf(), object));
}

/// Gives the part of the store under `prefix` a size: [`Sink::free_space`] of a path under it
/// then says what the objects under `prefix` leave of it (each test its own prefix).
pub(crate) fn set_capacity(prefix: &Path, bytes: u64) {
    with(|s| s.capacity.insert(prefix.to_path_buf(), bytes));
}

/// The bytes of the object at `path`.
pub(crate) fn get(path: &Path) -> Option<Vec<u8>> {
    with(|s| s.objects.get(path).map(|o| o.bytes.read().unwrap().clone()))
}

fn object(path: &Path) -> io::Result<Object> {
    with(|s| s.objects.get(path).cloned()).ok_or_else(|| not_found(path))
}

fn stamp(o: &Object) -> FileStamp {
    let size = o.bytes.read().unwrap().len() as u64;
    FileStamp {
        size,
        identity: o.ino,
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

    fn stat_link(&self, path: &Path) -> io::Result<Stat> {
        Source::stat(self, path)
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

    fn open(&self, path: &Path) -> io::Result<OpenInput> {
        Ok(Arc::new(object(path)?))
    }

    fn allocated(&self, path: &Path) -> io::Result<u64> {
        Ok(stamp(&object(path)?).size)
    }
}

impl Input for Object {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let bytes = self.bytes.read().unwrap();
        Ok(super::spool::read_held_at(&bytes, buf, offset))
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

/// A stream that becomes the object at its path: when dropped, or with `create_only`
/// ([`Sink::create_stream_new`]) when finished and only if nothing is there then.
struct Pending {
    path: PathBuf,
    bytes: Vec<u8>,
    create_only: bool,
}

impl Write for Pending {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        if !self.create_only {
            put(&self.path, self.bytes.clone());
        }
        Ok(())
    }
}

impl Writer for Pending {
    fn finish(self: Box<Self>) -> io::Result<u64> {
        if self.create_only {
            create_new(&self.path, &self.bytes)?;
            return Ok(self.bytes.len() as u64);
        }
        // Dropping it puts it.
        Ok(self.bytes.len() as u64)
    }
}

/// Makes the object at `path` from `bytes` only if nothing is there.
fn create_new(path: &Path, bytes: &[u8]) -> io::Result<()> {
    with(|s| {
        if s.objects.contains_key(path) {
            return Err(io::ErrorKind::AlreadyExists.into());
        }
        let object = Object {
            bytes: Arc::new(RwLock::new(bytes.to_vec())),
            ino: NEXT_INO.fetch_add(1, Ordering::Relaxed),
        };
        s.objects.insert(path.to_path_buf(), object);
        Ok(())
    })
}

impl Drop for Pending {
    fn drop(&mut self) {
        if !self.create_only {
            put(&self.path, std::mem::take(&mut self.bytes));
        }
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
            symlinks: false,
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

    fn create_stream(&self, path: &Path) -> io::Result<Box<dyn Writer>> {
        Ok(Box::new(Pending {
            path: path.to_path_buf(),
            bytes: Vec::new(),
            create_only: false,
        }))
    }

    fn create_stream_new(&self, path: &Path) -> io::Result<Box<dyn Writer>> {
        Ok(Box::new(Pending {
            path: path.to_path_buf(),
            bytes: Vec::new(),
            create_only: true,
        }))
    }

    fn rename_noreplace(&self, from: &Path, to: &Path) -> io::Result<()> {
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
        self.rename_noreplace(from, to)
    }

    fn sync_dir(&self, _dir: &Path) -> io::Result<()> {
        Ok(())
    }

    fn symlink(&self, _points_to: &Path, _link: &Path) -> io::Result<()> {
        Err(io::ErrorKind::Unsupported.into())
    }

    fn swap(&self, _a: &Path, _b: &Path) -> io::Result<()> {
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

    fn create_new(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        create_new(path, bytes)
    }

    fn update(
        &self,
        path: &Path,
        change: &mut dyn FnMut(&[u8]) -> Option<Vec<u8>>,
    ) -> io::Result<bool> {
        // The object found, not whatever is at `path` when the change is ready.
        let found = object(path)?;
        let mut bytes = found.bytes.write().unwrap();
        let Some(new) = change(&bytes) else {
            return Ok(false);
        };
        *bytes = new;
        Ok(true)
    }

    fn free_space(&self, path: &Path) -> io::Result<Option<u64>> {
        Ok(with(|s| {
            let (prefix, size) = path.ancestors().find_map(|a| s.capacity.get_key_value(a))?;
            let used: u64 = (s.objects.iter())
                .filter(|(k, _)| k.starts_with(prefix))
                .map(|(_, o)| o.bytes.read().unwrap().len() as u64)
                .sum();
            Some(size.saturating_sub(used))
        }))
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::path::Path;

    use super::{get, put};
    use crate::output::{OutputShards, ShardNames};
    use crate::plan::{ShardLayout, ShardPlan};
    use crate::tar::{index_file, keys_at, TarStream};

    /// A tar of `samples` (key, one member's data each, `.bin`).
    fn tar_of(samples: &[(&str, &[u8])]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (key, data) in samples {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            h.set_cksum();
            b.append_data(&mut h, format!("{key}.bin"), *data).unwrap();
        }
        b.into_inner().unwrap()
    }

    /// The pipeline's storage steps on `mem://` locations, which the file system does not have:
    /// expanding a directory spec, indexing plain and compressed shards, reading keys and sample
    /// bytes back, and writing an output shard with positioned writes and `copy_in` (whose
    /// `copy_file_range` fast path this backend lacks, so it reads and writes).
    #[test]
    fn shards_are_listed_indexed_read_and_written_through_the_seam() {
        let dir = Path::new("mem://pipeline/in");
        put(
            &dir.join("0.tar"),
            tar_of(&[("a", b"A"), ("b", &[7u8; 700])]),
        );
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&tar_of(&[("c", b"C")])).unwrap();
        put(&dir.join("1.tar.gz"), gz.finish().unwrap());
        put(&dir.join("notes.txt"), b"not a shard".to_vec());
        assert!(
            !dir.join("0.tar").exists(),
            "no such file on the file system"
        );

        let paths = crate::input::expand_specs(&["mem://pipeline/in".to_string()]).unwrap();
        assert_eq!(paths, [dir.join("0.tar"), dir.join("1.tar.gz")]);
        let (plain, packed) = (
            index_file(&paths[0]).unwrap(),
            index_file(&paths[1]).unwrap(),
        );
        assert_eq!((plain.samples.len(), packed.samples.len()), (2, 1));
        let spans: Vec<(u64, u64)> = plain.samples.iter().map(|s| (s.start, s.len)).collect();
        assert_eq!(keys_at(&paths[0], &spans).unwrap(), ["a", "b"]);
        let c = packed.samples[0];
        assert_eq!(keys_at(&paths[1], &[(c.start, c.len)]).unwrap(), ["c"]);

        // Every sample's bytes, read front to back as verify reads them.
        let mut want = Vec::new();
        for (path, index) in [(&paths[0], &plain), (&paths[1], &packed)] {
            let mut stream = TarStream::open(path).unwrap();
            for s in &index.samples {
                let mut bytes = Vec::new();
                stream.read(s.start - stream.pos(), |_| {}).unwrap();
                stream.read(s.len, |b| bytes.extend_from_slice(b)).unwrap();
                want.push(bytes);
            }
        }

        // One output shard of the three samples, in the order c, b, a.
        let lens = vec![
            want[2].len() as u64,
            want[1].len() as u64,
            want[0].len() as u64,
        ];
        let layout = ShardLayout::new(&ShardPlan::by_count(3, 1, 1), 0, lens);
        let out = Path::new("mem://pipeline/out");
        let names = ShardNames::Prefix("shard".into());
        let shards = OutputShards::create(out, &names, &layout).unwrap();
        shards
            .write_at(0, layout.place(0).unwrap().0, &want[2])
            .unwrap();
        let input = super::super::open(&paths[0]).unwrap();
        for (p, s) in [(1, plain.samples[1]), (2, plain.samples[0])] {
            let at = layout.place(p).unwrap().0;
            shards
                .copy_in(0, at, input.as_ref(), &paths[0], s.start, s.len)
                .unwrap();
        }
        shards.sync().unwrap();
        let written = get(&out.join("shard-000000.tar")).unwrap();
        let body = [want[2].clone(), want[1].clone(), want[0].clone()].concat();
        assert_eq!(written[..body.len()], body[..]);
        assert_eq!(
            written.len(),
            body.len() + 1024,
            "the trailer's two zero blocks"
        );
        assert!(written[body.len()..].iter().all(|&b| b == 0));
        let out_index = index_file(&out.join("shard-000000.tar")).unwrap();
        let spans: Vec<(u64, u64)> = out_index.samples.iter().map(|s| (s.start, s.len)).collect();
        let keys = keys_at(&out.join("shard-000000.tar"), &spans).unwrap();
        assert_eq!(keys, ["c", "b", "a"]);
    }
}
