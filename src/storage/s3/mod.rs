//! The object-store backend: `s3://bucket/key` locations in S3 or any S3-compatible store, and
//! every other store registered in [`crate::storage`]'s table of schemes (`gs://`, `az://`),
//! read through the `object_store` crate (signed requests, the store's own environment
//! variables, retries with backoff on 5xx, 503 SlowDown and dropped connections). What is the
//! same for every store lives here: ranged reads with read-ahead ([`read`]), multipart uploads
//! with their journal ([`multipart`]), listings, requests sent again ([`requests`]); a store
//! adds only its client ([`Scheme::client`]).
//!
//! `object_store` is asynchronous; reshard's phases are not. One small current-thread runtime
//! per process runs every request, and each call blocks on it (`block_on` may be entered from
//! several threads at once: the first drives the I/O, the others wait for their own futures).
//!
//! An object store has no directories: a "directory" is a key prefix ending in `/`, listed with
//! ListObjectsV2 and the delimiter `/`. A path's canonical name is its URL: objects have no
//! links or second names.

use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use object_store::list::{PaginatedListOptions, PaginatedListStore};
use object_store::multipart::MultipartStore;
use object_store::path::Path as Key;
use object_store::{ObjectMeta, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};

use super::{Capabilities, Entry, FileStamp, Kind, OpenInput, Output, Sink, Source, Stat, Writer};

mod delete_if;
pub(crate) mod loose;
mod multipart;
mod read;
mod requests;
mod uploads;

use delete_if::Removed;
pub(crate) use multipart::SIDE;
use multipart::{maybe_ours, object_of, side_of, Upload};
use read::{Ahead, ObjectInput};
use requests::{again, block_on, error, not_found};
pub(crate) use requests::{options_with_headers, retry_from_env, s3_client};

/// What the shared code needs of a store's client: `object_store`'s objects and its multipart
/// uploads. S3, GCS and Azure clients are all of it.
pub(crate) trait Client: ObjectStore + MultipartStore + PaginatedListStore {}

impl<T: ObjectStore + MultipartStore + PaginatedListStore> Client for T {}

/// How a store's client of one bucket is made: from the environment, and with the headers
/// given sent on every request, where there are.
pub(crate) type MakeClient =
    fn(&str, Option<object_store::HeaderMap>) -> io::Result<Arc<dyn Client>>;

/// How a store lists the open multipart uploads of one key of a bucket ([`Scheme::uploads`]).
pub(crate) type ListUploads = fn(&str, &Key) -> object_store::Result<Vec<uploads::Open>>;

/// How a store removes an object only while its ETag is the one given ([`Scheme::delete_if`]).
pub(crate) type DeleteIf = fn(&str, &Key, &str) -> object_store::Result<delete_if::Removed>;

/// One object store as a URL scheme names it: what the shared code needs to know of it.
#[derive(Debug)]
pub(crate) struct Scheme {
    /// The URL scheme, without `://` (`s3`).
    pub(crate) name: &'static str,
    /// What the store calls a bucket (`bucket`, `container`), for messages.
    pub(crate) bucket: &'static str,
    /// The variables that hold its credentials, for the message of a denied request.
    pub(crate) credentials: &'static str,
    /// The client of one bucket, made from the environment; one that sends the headers given
    /// on every request, where there are.
    pub(crate) client: MakeClient,
    /// The header (name, value) that makes a write create only, which the client completing
    /// create-only multipart uploads sends ([`requests::creating_store`]); `None` where the
    /// client would not sign it (such an upload is completed at a side name and copied to its
    /// object only if nothing is there).
    pub(crate) create_only: Option<(&'static str, &'static str)>,
    /// The open multipart uploads of exactly one key in a bucket, where the store can list them
    /// (S3's ListMultipartUploads): how the clearing of a failed run finds an upload whose id
    /// its journal never got ([`multipart::maybe_ours`]).
    pub(crate) uploads: Option<ListUploads>,
    /// Removes an object only while its ETag is the one the run saw (S3's `If-Match` on
    /// DeleteObject), where the store can: a removal checked against the output's lock then
    /// never takes an object another run put there since ([`Sink::remove_file_if`]).
    pub(crate) delete_if: Option<DeleteIf>,
    /// The variables that say which store a bucket name is in (an endpoint, an account): the
    /// same `BUCKET/KEY` under other values is another output ([`Scheme::place`]).
    pub(crate) location: &'static [&'static str],
}

impl Scheme {
    /// A name for the store this environment's `BUCKET/KEY`s are in, for local paths: the
    /// scheme, and where any of its [`location`](Scheme::location) variables is set, a hash of
    /// their values (`s3-6f1c0a9e2b4d`), so that two outputs of the same name in two stores
    /// (two endpoints, two accounts) never share a path on `--scratch`.
    pub(crate) fn place(&self) -> String {
        let set: Vec<(&str, String)> = self
            .location
            .iter()
            .filter_map(|v| Some((*v, std::env::var(v).ok().filter(|x| !x.is_empty())?)))
            .collect();
        if set.is_empty() {
            return self.name.to_string();
        }
        use md5::Digest;
        let mut h = md5::Md5::new();
        for (name, value) in &set {
            h.update(name.as_bytes());
            h.update([0]);
            h.update(value.as_bytes());
            h.update([0]);
        }
        let hex = crate::hex::hex(&h.finalize()[..6]);
        format!("{}-{hex}", self.name)
    }
}

/// The S3 scheme: `s3://bucket/key`, its client from the `AWS_*` variables and profiles.
pub(crate) static S3: Scheme = Scheme {
    name: "s3",
    bucket: "bucket",
    credentials: "AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN",
    client: s3_client,
    create_only: Some(("if-none-match", "*")),
    uploads: Some(uploads::s3_uploads),
    delete_if: Some(delete_if::s3_delete_if),
    // A profile may name its own endpoint (`endpoint_url`).
    location: &["AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_PROFILE"],
};

/// GETs and their bytes, PUTs (and parts) and theirs, in this process: the run's summary
/// reports them per GiB moved ([`traffic`]).
static GETS: Counter = Counter::new();
static PUTS: Counter = Counter::new();

/// A count of requests and of their bytes.
struct Counter {
    requests: AtomicU64,
    bytes: AtomicU64,
}

impl Counter {
    const fn new() -> Counter {
        Counter {
            requests: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
        }
    }
}

fn count(counter: &Counter, bytes: usize) {
    counter.requests.fetch_add(1, Ordering::Relaxed);
    counter.bytes.fetch_add(bytes as u64, Ordering::Relaxed);
}

/// This process's requests so far: (GETs, bytes they read, PUTs and parts, bytes they wrote).
pub(crate) fn traffic() -> [u64; 4] {
    let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
    [
        load(&GETS.requests),
        load(&GETS.bytes),
        load(&PUTS.requests),
        load(&PUTS.bytes),
    ]
}

/// Buckets and keys of the locations of one object store (its [`Scheme`]).
pub(crate) struct Objects(pub &'static Scheme);

/// A location parsed: its store, its bucket and its key (no leading or trailing `/`; empty for
/// the bucket's root).
#[derive(Debug, Clone)]
struct Location {
    scheme: &'static Scheme,
    bucket: String,
    key: String,
}

impl Location {
    fn parse(path: &Path, scheme: &'static Scheme) -> io::Result<Location> {
        let text = path.to_str().unwrap_or_default();
        let name = scheme.name;
        let (bucket_word, rest) = (scheme.bucket, text.strip_prefix(name));
        let rest = rest
            .and_then(|r| r.strip_prefix("://"))
            .ok_or_else(|| invalid(path, &format!("expected {name}://{bucket_word}/key")))?;
        let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(invalid(
                path,
                &format!("no {bucket_word} named (expected {name}://{bucket_word}/key)"),
            ));
        }
        Ok(Location {
            scheme,
            bucket: bucket.to_string(),
            key: key.trim_matches('/').to_string(),
        })
    }

    /// The key as the client takes it.
    fn object(&self) -> io::Result<Key> {
        Key::parse(&self.key).map_err(|_| {
            invalid(
                Path::new(&self.url()),
                "the key has an empty, '.' or '..' part",
            )
        })
    }

    fn url(&self) -> String {
        format!("{}://{}/{}", self.scheme.name, self.bucket, self.key)
    }

    fn store(&self) -> io::Result<Arc<dyn Client>> {
        requests::store(self.scheme, &self.bucket)
    }
}

fn invalid(path: &Path, why: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("{}: {why}", path.display()),
    )
}

/// A stamp from an object's metadata: its size, its modification time, and a hash of its ETag
/// in place of the inode, so that a replaced object with the same size and second differs.
/// The hash (64-bit FNV-1a) is the same in every build: saved indexes and checkpoints keep it.
fn stamp_of(meta: &ObjectMeta) -> FileStamp {
    let mtime = i128::from(meta.last_modified.timestamp_nanos_opt().unwrap_or(0));
    let hash = e_tag_identity(meta.e_tag.as_deref().unwrap_or_default());
    FileStamp {
        size: meta.size,
        mtime_ns: mtime,
        ctime_ns: mtime,
        dev: 0,
        identity: hash,
    }
}

/// The identity of an object's stamp from its ETag however the store spells it (64-bit
/// FNV-1a), the one place its quotes are normalised: Azure's listing spells an ETag bare and its
/// GET answer quoted, and a store's answer to a create may differ from its HEAD alike, so the
/// tag is hashed quoted (as S3 spells it: the identities saved indexes already keep).
pub(crate) fn e_tag_identity(tag: &str) -> u64 {
    let bare = tag.trim_matches('"');
    std::iter::once(b'"')
        .chain(bare.bytes())
        .chain(std::iter::once(b'"'))
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        })
}

impl Objects {
    /// `path` parsed as a location of this store.
    fn parse(&self, path: &Path) -> io::Result<Location> {
        Location::parse(path, self.0)
    }

    fn head(&self, loc: &Location) -> io::Result<ObjectMeta> {
        let store = loc.store()?;
        let key = loc.object()?;
        block_on(again(|| store.head(&key))).map_err(|e| not_found(loc, &*store, e))
    }

    /// Whether any object's key starts with the prefix `loc/` (one page of a listing at most).
    fn has_objects(&self, loc: &Location) -> io::Result<bool> {
        use futures_util::StreamExt;
        let store = loc.store()?;
        let prefix = loc.object()?;
        let first = block_on(again(|| async {
            store.list(Some(&prefix)).next().await.transpose()
        }));
        match first {
            Ok(found) => Ok(found.is_some()),
            Err(e) => Err(error(loc, e)),
        }
    }

    /// The objects and sub-prefixes directly under the prefix `loc` (as a directory) whose
    /// names start with `start`: one listing of the keys that start with `loc/start`, page by
    /// page (`object_store`'s own listing takes whole path segments only).
    fn list_names_starting(&self, loc: &Location, start: &str) -> io::Result<Vec<Entry>> {
        let store = loc.store()?;
        let prefix = if loc.key.is_empty() {
            start.to_string()
        } else {
            format!("{}/{start}", loc.key)
        };
        let name = |k: &Key| OsString::from(k.filename().unwrap_or_default());
        let mut entries = Vec::new();
        let mut page_token = None;
        loop {
            let opts = PaginatedListOptions {
                delimiter: Some("/".into()),
                page_token: page_token.take(),
                ..PaginatedListOptions::default()
            };
            let page = block_on(again(|| store.list_paginated(Some(&prefix), opts.clone())))
                .map_err(|e| error(loc, e))?;
            let files = page.result.objects.iter().map(|o| Entry {
                name: name(&o.location),
                kind: Kind::File,
            });
            let dirs = page.result.common_prefixes.iter().map(|p| Entry {
                name: name(p),
                kind: Kind::Dir,
            });
            entries.extend(files.chain(dirs));
            match page.page_token {
                Some(next) => page_token = Some(next),
                None => return Ok(entries),
            }
        }
    }

    /// The objects and sub-prefixes directly under the prefix `loc` (as a directory).
    fn list_under(&self, loc: &Location) -> io::Result<(Vec<ObjectMeta>, Vec<Key>)> {
        let store = loc.store()?;
        let prefix = loc.object()?;
        let listed = block_on(again(|| store.list_with_delimiter(Some(&prefix))))
            .map_err(|e| error(loc, e))?;
        Ok((listed.objects, listed.common_prefixes))
    }
}

impl Source for Objects {
    fn stat(&self, path: &Path) -> io::Result<Stat> {
        let loc = self.parse(path)?;
        if !loc.key.is_empty() && !path.to_string_lossy().ends_with('/') {
            let store = loc.store()?;
            let key = loc.object()?;
            match block_on(again(|| store.head(&key))) {
                Ok(meta) => {
                    return Ok(Stat {
                        kind: Kind::File,
                        stamp: stamp_of(&meta),
                    })
                }
                Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(error(&loc, e)),
            }
        }
        // No object by that name: a prefix with an object under it is a directory (the listing
        // of a missing bucket fails naming it). Objects, not sub-prefixes: some stores (SeaweedFS)
        // keep a folder whose objects were all removed.
        if !self.has_objects(&loc)? {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "no such object or prefix in {} {}",
                    loc.scheme.bucket, loc.bucket
                ),
            ));
        }
        Ok(Stat {
            kind: Kind::Dir,
            stamp: FileStamp::default(),
        })
    }

    fn stat_link(&self, path: &Path) -> io::Result<Stat> {
        Source::stat(self, path)
    }

    fn list(&self, path: &Path) -> io::Result<Vec<Entry>> {
        let loc = self.parse(path)?;
        let (objects, prefixes) = self.list_under(&loc)?;
        // A folder some stores (SeaweedFS) keep once its objects are gone lists as an object
        // named like the prefix itself: nothing under it to read or remove.
        let prefix = loc.object()?;
        let objects: Vec<_> = objects
            .into_iter()
            .filter(|o| o.location != prefix)
            .collect();
        let name = |k: &Key| OsString::from(k.filename().unwrap_or_default());
        let files = objects.iter().map(|o| Entry {
            name: name(&o.location),
            kind: Kind::File,
        });
        let dirs = prefixes.iter().map(|p| Entry {
            name: name(p),
            kind: Kind::Dir,
        });
        Ok(files.chain(dirs).collect())
    }

    fn list_starting(&self, path: &Path, start: &str) -> io::Result<Vec<Entry>> {
        let loc = self.parse(path)?;
        self.list_names_starting(&loc, start)
    }

    fn canonical(&self, path: &Path) -> io::Result<PathBuf> {
        let loc = self.parse(path)?;
        Ok(PathBuf::from(loc.url().trim_end_matches('/')))
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        let loc = self.parse(path)?;
        let store = loc.store()?;
        let key = loc.object()?;
        let got = block_on(again(|| async { store.get(&key).await?.bytes().await }));
        if let Ok(b) = &got {
            count(&GETS, b.len());
        }
        got.map(|b| b.to_vec())
            .map_err(|e| not_found(&loc, &*store, e))
    }

    fn open(&self, path: &Path) -> io::Result<OpenInput> {
        let loc = self.parse(path)?;
        let meta = self.head(&loc)?;
        Ok(Arc::new(ObjectInput {
            store: loc.store()?,
            key: loc.object()?,
            loc,
            meta,
            ahead: Mutex::new(Ahead::default()),
        }))
    }
}

fn unsupported(path: &Path, what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::Unsupported,
        format!("{}: object storage has no {what}", path.display()),
    )
}

impl Objects {
    fn put(&self, path: &Path, bytes: &[u8], mode: PutMode) -> io::Result<()> {
        let loc = self.parse(path)?;
        let store = loc.store()?;
        let key = loc.object()?;
        let payload = PutPayload::from(bytes.to_vec());
        count(&PUTS, bytes.len());
        block_on(store.put_opts(&key, payload, PutOptions::from(mode)))
            .map(|_| ())
            .map_err(|e| error(&loc, e))
    }
}

impl Objects {
    /// Aborts the uploads of `key` its `journals` name, then removes them: how many uploads.
    /// Each upload has a journal of its own ([`multipart::journal_of`]). A journal without an
    /// id is an intent (its run died before or right after it started the upload): the uploads
    /// of exactly `key` such a run may have started, since the earliest intent, are aborted
    /// where the store can list them ([`Scheme::uploads`]); elsewhere they stay until the store
    /// expires them (docs/storage.md).
    fn abort_journalled(
        &self,
        loc: &Location,
        store: &dyn Client,
        key: &Key,
        journals: &[&ObjectMeta],
    ) -> io::Result<usize> {
        let mut ids = std::collections::BTreeSet::new();
        let mut intent: Option<&ObjectMeta> = None;
        for journal in journals {
            let id = block_on(again(|| async {
                store.get(&journal.location).await?.bytes().await
            }))
            .map_err(|e| error(loc, e))?;
            if !id.is_empty() {
                ids.insert(String::from_utf8_lossy(&id).into_owned());
            } else if intent.is_none_or(|i| journal.last_modified < i.last_modified) {
                intent = Some(journal);
            }
        }
        if let (Some(journal), Some(list)) = (intent, loc.scheme.uploads) {
            use object_store::Error as E;
            match list(&loc.bucket, key) {
                Ok(open) => ids.extend(
                    maybe_ours(open, journal.last_modified)
                        .into_iter()
                        .map(|u| u.id),
                ),
                // Not the run's to fail: before the intent was journalled, no run needed the
                // listing, and a later run could not list either.
                Err(e @ (E::PermissionDenied { .. } | E::NotSupported { .. })) => {
                    crate::errln!(
                        "reshard: warning: {}://{}/{key}: an earlier run may have left a multipart upload open there, and the store refused to list them ({}): it stays until a lifecycle rule of the {} aborts it",
                        loc.scheme.name,
                        loc.bucket,
                        requests::plain(&e),
                        loc.scheme.bucket
                    );
                }
                Err(e) => return Err(unlisted(loc, &journal.location, key, &e)),
            }
        }
        block_on(async {
            for id in &ids {
                match store.abort_multipart(key, id).await {
                    // Gone already (completed, aborted, or expired by a lifecycle rule).
                    Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                    Err(e) => return Err(e),
                }
            }
            for journal in journals {
                store.delete(&journal.location).await?;
            }
            Ok(())
        })
        .map_err(|e| error(loc, e))?;
        Ok(ids.len())
    }
}

/// The error of a listing of `key`'s open uploads that failed other than by a refusal, for the
/// intent `journal`: the journal stays, so that no run forgets the upload it may stand for, and
/// the message says how to let it go (docs/storage.md).
fn unlisted(loc: &Location, journal: &Key, key: &Key, e: &object_store::Error) -> io::Error {
    io::Error::other(format!(
        "{}://{}/{journal}: an earlier run journalled there that it was starting a multipart upload of {key}, and the listing of that key's open uploads failed ({}); removing that journal object lets the next run go on (an upload that run started then stays open until a lifecycle rule of the {} aborts it)",
        loc.scheme.name,
        loc.bucket,
        requests::plain(e),
        loc.scheme.bucket
    ))
}

impl Sink for Objects {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            positioned_writes: false,
            rename: false,
            symlinks: false,
        }
    }

    fn create_dir_all(&self, _path: &Path) -> io::Result<()> {
        // A prefix exists once an object is under it.
        Ok(())
    }

    fn create(&self, path: &Path, _len: u64) -> io::Result<Box<dyn Output>> {
        Err(unsupported(path, "writes at an offset"))
    }

    fn reopen(&self, path: &Path) -> io::Result<Box<dyn Output>> {
        Err(unsupported(path, "writes at an offset"))
    }

    fn write(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        self.put(path, bytes, PutMode::Overwrite)
    }

    fn replace(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        // A PUT is atomic: a reader sees the old object or the new one.
        self.put(path, bytes, PutMode::Overwrite)
    }

    fn create_new(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        self.put(path, bytes, PutMode::Create).map_err(|e| {
            if e.kind() == io::ErrorKind::Unsupported {
                io::Error::new(
                    io::ErrorKind::Unsupported,
                    format!(
                        "{e}: reshard needs conditional writes (PUT with If-None-Match) to make sure one run at a time writes an output"
                    ),
                )
            } else {
                e
            }
        })
    }

    fn update(
        &self,
        path: &Path,
        change: &mut dyn FnMut(&[u8]) -> Option<Vec<u8>>,
    ) -> io::Result<bool> {
        let loc = self.parse(path)?;
        let store = loc.store()?;
        let key = loc.object()?;
        let (meta, bytes) = block_on(again(|| async {
            let got = store.get(&key).await?;
            let meta = got.meta.clone();
            got.bytes().await.map(|b| (meta, b))
        }))
        .map_err(|e| error(&loc, e))?;
        count(&GETS, bytes.len());
        let Some(new) = change(&bytes) else {
            return Ok(false);
        };
        // Conditional on the ETag read (`If-Match`): another run's lock put in its place
        // meanwhile is never overwritten.
        let version = object_store::UpdateVersion {
            e_tag: meta.e_tag,
            version: meta.version,
        };
        count(&PUTS, new.len());
        let opts = PutOptions::from(PutMode::Update(version));
        match block_on(store.put_opts(&key, PutPayload::from(new.clone()), opts)) {
            Ok(_) => Ok(true),
            // Changed since it was read: the next look tells by whom.
            Err(object_store::Error::Precondition { .. }) => Ok(false),
            // A store without conditional PUT on a version: the check above stands alone.
            Err(object_store::Error::NotImplemented { .. }) => {
                self.put(path, &new, PutMode::Overwrite).map(|()| true)
            }
            Err(e) => Err(error(&loc, e)),
        }
    }

    fn create_stream(&self, path: &Path) -> io::Result<Box<dyn Writer>> {
        let loc = self.parse(path)?;
        Ok(Box::new(Upload {
            store: loc.store()?,
            key: loc.object()?,
            loc,
            buf: Vec::new(),
            upload: None,
            written: 0,
            create_only: false,
            side: None,
        }))
    }

    fn create_stream_new(&self, path: &Path) -> io::Result<Box<dyn Writer>> {
        let loc = self.parse(path)?;
        let key = loc.object()?;
        let side = loc.scheme.create_only.is_none().then(|| side_of(&key));
        Ok(Box::new(Upload {
            store: loc.store()?,
            key,
            loc,
            buf: Vec::new(),
            upload: None,
            written: 0,
            create_only: true,
            side,
        }))
    }

    fn rename_noreplace(&self, from: &Path, _to: &Path) -> io::Result<()> {
        Err(unsupported(from, "rename"))
    }

    fn rename(&self, from: &Path, _to: &Path) -> io::Result<()> {
        Err(unsupported(from, "rename"))
    }

    fn sync_dir(&self, _dir: &Path) -> io::Result<()> {
        // A completed PUT is durable.
        Ok(())
    }

    fn symlink(&self, _points_to: &Path, link: &Path) -> io::Result<()> {
        Err(unsupported(link, "symbolic links"))
    }

    fn swap(&self, a: &Path, _b: &Path) -> io::Result<()> {
        Err(unsupported(a, "rename"))
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        let loc = self.parse(path)?;
        let store = loc.store()?;
        let key = loc.object()?;
        block_on(again(|| store.delete(&key))).map_err(|e| error(&loc, e))
    }

    fn tag_of(&self, path: &Path) -> io::Result<Option<String>> {
        let loc = self.parse(path)?;
        let store = loc.store()?;
        let key = loc.object()?;
        let meta = block_on(again(|| store.head(&key))).map_err(|e| error(&loc, e))?;
        Ok(meta.e_tag)
    }

    fn remove_file_if(&self, path: &Path, tag: Option<&str>) -> io::Result<bool> {
        let loc = self.parse(path)?;
        if let (Some(tag), Some(delete_if)) = (tag, loc.scheme.delete_if) {
            let key = loc.object()?;
            match delete_if(&loc.bucket, &key, tag).map_err(|e| error(&loc, e))? {
                Removed::Gone => return Ok(true),
                Removed::Changed => return Ok(false),
                Removed::NoCondition => {}
            }
        }
        match self.remove_file(path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(true),
        }
    }

    fn abort_unfinished(&self, dir: &Path) -> io::Result<usize> {
        let loc = self.parse(dir)?;
        let store = loc.store()?;
        let prefix = loc.object()?;
        let all: Vec<ObjectMeta> = block_on(again(|| {
            use futures_util::TryStreamExt;
            store.list(Some(&prefix)).try_collect()
        }))
        .map_err(|e| error(&loc, e))?;
        // Every journal of a key together: one listing serves all its intents.
        let mut journals: std::collections::BTreeMap<Key, Vec<&ObjectMeta>> = Default::default();
        for meta in &all {
            if let Some(key) = object_of(&meta.location) {
                journals.entry(key).or_default().push(meta);
            }
        }
        let mut aborted = 0;
        for (key, journals) in &journals {
            aborted += self.abort_journalled(&loc, &*store, key, journals)?;
        }
        Ok(aborted)
    }

    fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
        let loc = self.parse(path)?;
        let store = loc.store()?;
        let prefix = loc.object()?;
        block_on(async {
            use futures_util::TryStreamExt;
            let keys: Vec<ObjectMeta> = again(|| store.list(Some(&prefix)).try_collect()).await?;
            for meta in keys {
                store.delete(&meta.location).await?;
            }
            Ok(())
        })
        .map_err(|e| error(&loc, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_parse_into_bucket_and_key() {
        let parse = |p: &str| Location::parse(Path::new(p), &S3);
        let loc = parse("s3://data/train/a-0.tar").unwrap();
        assert_eq!(loc.bucket, "data");
        assert_eq!(loc.key, "train/a-0.tar");
        assert_eq!(loc.url(), "s3://data/train/a-0.tar");
        let root = parse("s3://data/").unwrap();
        assert_eq!(root.key, "");
        assert_eq!(parse("s3://data/train/").unwrap().key, "train");
        assert!(parse("s3:///k").is_err());
        assert!(parse("/local/k").is_err());
        assert!(parse("s3x://data/k").is_err(), "another scheme");
        let bad = parse("s3://data/a//b").unwrap();
        assert!(bad.object().is_err());
    }

    /// A listing that failed for an intent names the journal object, and says that removing it
    /// lets the next run go on.
    #[test]
    fn a_failed_listing_names_the_journal_to_remove() {
        let loc = Location::parse(Path::new("s3://data/out"), &S3).unwrap();
        let journal = Key::from("out/.reshard-multipart/shard.tar.1-2-3");
        let key = Key::from("out/shard.tar");
        let e = object_store::Error::Generic {
            store: "S3",
            source: "answered 400 Bad Request".into(),
        };
        let said = unlisted(&loc, &journal, &key, &e).to_string();
        for part in [
            "s3://data/out/.reshard-multipart/shard.tar.1-2-3:",
            "multipart upload of out/shard.tar",
            "400 Bad Request",
            "removing that journal object lets the next run go on",
            "lifecycle rule of the bucket",
        ] {
            assert!(said.contains(part), "{part} in {said}");
        }
    }
}
