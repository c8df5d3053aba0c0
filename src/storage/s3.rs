//! The S3 backend: `s3://bucket/key` locations in S3 or any S3-compatible store, read through
//! the `object_store` crate (SigV4, the `AWS_*` variables, retries with backoff on 5xx, 503
//! SlowDown and dropped connections).
//!
//! `object_store` is asynchronous; reshard's phases are not. One small current-thread runtime
//! per process runs every request, and each call blocks on it (`block_on` may be entered from
//! several threads at once: the first drives the I/O, the others wait for their own futures).
//!
//! An object store has no directories: a "directory" is a key prefix ending in `/`, listed with
//! ListObjectsV2 and the delimiter `/`. A path's canonical name is its URL: objects have no
//! links or second names.

use std::any::Any;
use std::collections::HashMap;
use std::collections::VecDeque;
use std::ffi::OsString;
use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::multipart::{MultipartStore, PartId};
use object_store::path::Path as Key;
use object_store::{
    GetOptions, GetRange, ObjectMeta, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload,
};
use object_store::{MultipartId, RetryConfig};

use super::{aws_profile, endpoint};
use super::{
    Capabilities, Entry, FileStamp, Input, Kind, Output, Shard, Sink, Source, Stat, Writer,
};

/// The scheme this backend serves.
pub const SCHEME: &str = "s3";

/// How much one ranged GET fetches at least: the tar header walk reads 512 bytes per member,
/// and a request per member would cost a round trip per sample. With this window, indexing a
/// shard of small samples streams it once in 8 MiB requests; a sample larger than the window
/// costs one request of its own.
const READ_AHEAD: usize = 8 << 20;

/// The window of an object's first read: small, as that read may be the only one.
const FIRST_WINDOW: usize = 64 << 10;

/// How many windows an open object requests ahead of the one being read, at most: a stream of
/// one GET at a time waits a round trip and a server's first byte per window; a few in flight
/// keep the connection busy.
const AHEAD_WINDOWS: usize = 4;

/// The bytes of windows requested ahead in one process (one rank), over every open object:
/// the index phase streams up to 32 shards at once, and their read-ahead together stays within
/// this. Not part of `--mem-limit`, as the one window per open object is not.
const AHEAD_BUDGET: usize = 64 << 20;

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
pub fn traffic() -> [u64; 4] {
    let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
    [
        load(&GETS.requests),
        load(&GETS.bytes),
        load(&PUTS.requests),
        load(&PUTS.bytes),
    ]
}

/// The first part size of a multipart upload. S3 takes parts of 5 MiB to 5 GiB (the last one
/// smaller), at most 10,000 of them, and parts of one upload may differ in size: a stream does
/// not know its length up front, so its parts double every [`PARTS_PER_SIZE`] parts
/// ([`Upload::part_size`]); 10,000 parts then carry up to about 16 TiB.
const PART: usize = 16 << 20;

/// How many parts of one size before the size doubles.
const PARTS_PER_SIZE: usize = 1000;

/// The largest part: under S3's 5 GiB.
const MAX_PART: usize = 4 << 30;

/// Buckets and keys of `s3://` locations.
pub struct S3;

/// A location parsed: its bucket and its key (no leading or trailing `/`; empty for the
/// bucket's root).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Location {
    bucket: String,
    key: String,
}

impl Location {
    fn parse(path: &Path) -> io::Result<Location> {
        let text = path.to_str().unwrap_or_default();
        let rest = text
            .strip_prefix("s3://")
            .ok_or_else(|| invalid(path, "expected s3://bucket/key"))?;
        let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(invalid(path, "no bucket named (expected s3://bucket/key)"));
        }
        Ok(Location {
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
        format!("s3://{}/{}", self.bucket, self.key)
    }

    fn store(&self) -> io::Result<Arc<AmazonS3>> {
        store(&self.bucket)
    }
}

fn invalid(path: &Path, why: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("{}: {why}", path.display()),
    )
}

/// The runtime every request runs on. A thread of its own drives it for good, so that the
/// read-ahead requests spawned on it ([`S3Input::top_up`]) make progress while the reading
/// threads are busy elsewhere; a thread's own `block_on` polls its future on that thread.
fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime for S3 requests (a timer and a socket driver)");
        let handle = rt.handle().clone();
        std::thread::Builder::new()
            .name("reshard-s3".into())
            .spawn(move || handle.block_on(std::future::pending::<()>()))
            .expect("a thread to drive S3 requests");
        rt
    })
}

/// Whether `e` is a request that broke off in transit (an `object_store` `HttpError`: the
/// connection refused, closed or reset, the answer's body cut short, a timeout; never an
/// answer with an error status): what a flaky network or a restarting store does, worth
/// sending again. `object_store` retries some of these itself (while it sends a request and
/// while it streams a GET's body), but not all of them (an error it cannot classify) and not
/// while it reads any other answer's body (a listing): those are sent again here ([`again`]).
fn broke_off(e: &object_store::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        if err.is::<object_store::client::HttpError>() {
            return true;
        }
        source = err.source();
    }
    false
}

/// Attempts in all for a request that broke off ([`broke_off`]): `AWS_MAX_ATTEMPTS`, else 10.
fn attempts() -> u32 {
    std::env::var("AWS_MAX_ATTEMPTS")
        .ok()
        .and_then(|v| v.trim().parse::<u32>().ok())
        .unwrap_or(10)
        .max(1)
}

/// How long after its first sending a request that broke off is still sent again: a store
/// that stays unreachable fails the run after `object_store`'s own retries (up to 3 minutes),
/// not after those retries times [`attempts`].
const AGAIN_WITHIN: Duration = Duration::from_secs(30);

/// Runs the request `op` makes, again while it breaks off ([`broke_off`]) within
/// [`AGAIN_WITHIN`], after 50 ms, then twice as long each time up to 5 s. Only for requests
/// that may be sent twice: reads, and writes whose second sending has the effect of one.
async fn again<T, F, Fut>(op: F) -> object_store::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = object_store::Result<T>>,
{
    again_after(Duration::from_millis(50), op).await
}

/// [`again`], the first wait `wait`.
async fn again_after<T, F, Fut>(mut wait: Duration, mut op: F) -> object_store::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = object_store::Result<T>>,
{
    let first = std::time::Instant::now();
    let mut tries = 1;
    loop {
        match op().await {
            Err(e) if tries < attempts() && first.elapsed() < AGAIN_WITHIN && broke_off(&e) => {
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(5));
                tries += 1;
            }
            done => return done,
        }
    }
}

fn block_on<F: Future>(f: F) -> F::Output {
    runtime().block_on(f)
}

/// The client of `bucket`, made once per process from the environment: the `AWS_*` variables
/// (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_REGION`,
/// `AWS_ENDPOINT_URL` for an S3-compatible store, which implies path-style addressing unless
/// `AWS_VIRTUAL_HOSTED_STYLE_REQUEST=true`), else the instance's or the web identity's role.
fn store(bucket: &str) -> io::Result<Arc<AmazonS3>> {
    static STORES: Mutex<Option<HashMap<String, Arc<AmazonS3>>>> = Mutex::new(None);
    let mut stores = STORES.lock().unwrap_or_else(|e| e.into_inner());
    let stores = stores.get_or_insert_with(HashMap::new);
    if let Some(s) = stores.get(bucket) {
        return Ok(s.clone());
    }
    let builder = AmazonS3Builder::from_env().with_bucket_name(bucket);
    let (mut builder, endpoint) = with_profile(builder, bucket)?;
    if endpoint.starts_with("http://") {
        // A store on the local network or loopback without TLS: the user named it so.
        builder = builder.with_allow_http(true);
    }
    if let Some(attempts) = std::env::var("AWS_MAX_ATTEMPTS")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
    {
        // As the AWS SDKs read it: attempts in all, the first included.
        builder = builder.with_retry(RetryConfig {
            max_retries: attempts.saturating_sub(1),
            ..RetryConfig::default()
        });
    }
    let s = Arc::new(builder.build().map_err(|e| {
        io::Error::other(format!(
            "s3://{bucket}: cannot set up the S3 client ({}); check the AWS_* variables",
            plain(&e)
        ))
    })?);
    stores.insert(bucket.to_string(), s.clone());
    Ok(s)
}

/// The builder with what the named profile of the AWS shared files gives where the variables
/// do not ([`aws_profile`]): the keys, the region (else `us-east-1`) and the endpoint; and the
/// endpoint in use.
///
/// # Errors
/// The profile named cannot be found or gets its keys in a way reshard does not follow.
fn with_profile(
    mut builder: AmazonS3Builder,
    bucket: &str,
) -> io::Result<(AmazonS3Builder, String)> {
    let set = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let profile = aws_profile::selected()?.unwrap_or_default();
    if set("AWS_ACCESS_KEY_ID").is_none() {
        match (&profile.access_key_id, &profile.secret_access_key) {
            (Some(id), Some(secret)) => {
                builder = builder
                    .with_access_key_id(id)
                    .with_secret_access_key(secret);
                if let Some(token) = &profile.session_token {
                    builder = builder.with_token(token);
                }
            }
            _ => {
                if let Some(how) = &profile.other_source {
                    return Err(io::Error::new(
                        io::ErrorKind::PermissionDenied,
                        format!(
                            "s3://{bucket}: the AWS profile {} gets its keys by {how}, which reshard does not follow; export them for it: eval \"$(aws configure export-credentials --profile {} --format env)\"",
                            profile.name, profile.name
                        ),
                    ));
                }
            }
        }
    }
    if set("AWS_REGION").is_none() && set("AWS_DEFAULT_REGION").is_none() {
        builder = builder.with_region(profile.region.as_deref().unwrap_or("us-east-1"));
    }
    let endpoint = set("AWS_ENDPOINT_URL_S3").or_else(|| set("AWS_ENDPOINT_URL"));
    let invalid = |name: &str, e: &str, why: String| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("s3://{bucket}: {}", endpoint::described(name, e, &why)),
        )
    };
    endpoint::check_environment().map_err(|why| {
        io::Error::new(io::ErrorKind::InvalidInput, format!("s3://{bucket}: {why}"))
    })?;
    if let (None, Some(e)) = (&endpoint, &profile.endpoint_url) {
        let name = format!("endpoint_url of the AWS profile {}", profile.name);
        endpoint::check(e).map_err(|why| invalid(&name, e, why))?;
    }
    let endpoint = match (endpoint, &profile.endpoint_url) {
        (Some(e), _) => e,
        (None, Some(e)) => {
            builder = builder.with_endpoint(e);
            e.clone()
        }
        (None, None) => String::new(),
    };
    Ok((builder, endpoint))
}

/// The client's message without its debug decorations.
fn plain(e: &object_store::Error) -> String {
    e.to_string()
}

/// An error of the client for `loc`, as an `io::Error` whose message names the bucket (the
/// caller's context names the whole location, as for a POSIX error) and what to do; never a
/// credential (the client's messages carry URLs and the store's error codes, never the
/// request's headers).
fn error(loc: &Location, e: object_store::Error) -> io::Error {
    use object_store::Error as E;
    match e {
        E::NotFound { .. } => io::Error::new(
            io::ErrorKind::NotFound,
            format!("no such object in bucket {}", loc.bucket),
        ),
        E::PermissionDenied { .. } | E::Unauthenticated { .. } => io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "access denied to bucket {} key {}: check the credentials (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN) and the bucket's policy",
                loc.bucket, loc.key
            ),
        ),
        E::AlreadyExists { .. } => io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!("exists already in bucket {}", loc.bucket),
        ),
        E::NotImplemented { .. } => io::Error::new(
            io::ErrorKind::Unsupported,
            format!(
                "the store of bucket {} cannot do this ({})",
                loc.bucket,
                plain(&e)
            ),
        ),
        E::Precondition { .. } | E::NotModified { .. } => io::Error::other(
            "the object changed while reshard read it (its ETag differs): run again on an input that stays unchanged",
        ),
        e if plain(&e).contains("NoSuchBucket") => io::Error::new(
            io::ErrorKind::NotFound,
            format!("bucket {} does not exist", loc.bucket),
        ),
        e => io::Error::other(plain(&e)),
    }
}

/// A not-found object's better message: when the bucket itself is missing, say so.
fn not_found(loc: &Location, store: &AmazonS3, e: object_store::Error) -> io::Error {
    if !matches!(e, object_store::Error::NotFound { .. }) {
        return error(loc, e);
    }
    let probe = block_on(store.list_with_delimiter(Some(&Key::from("")))).err();
    match probe {
        Some(p)
            if plain(&p).contains("NoSuchBucket")
                || matches!(p, object_store::Error::NotFound { .. }) =>
        {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("bucket {} does not exist", loc.bucket),
            )
        }
        _ => error(loc, e),
    }
}

/// A stamp from an object's metadata: its size, its modification time, and a hash of its ETag
/// in place of the inode, so that a replaced object with the same size and second differs.
/// The hash (64-bit FNV-1a) is the same in every build: saved indexes and checkpoints keep it.
fn stamp_of(meta: &ObjectMeta) -> FileStamp {
    let mtime = i128::from(meta.last_modified.timestamp_nanos_opt().unwrap_or(0));
    let tag = meta.e_tag.as_deref().unwrap_or_default();
    let hash = tag.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    FileStamp {
        size: meta.size,
        mtime_ns: mtime,
        ctime_ns: mtime,
        dev: 0,
        ino: hash,
    }
}

impl S3 {
    fn head(&self, loc: &Location) -> io::Result<ObjectMeta> {
        let store = loc.store()?;
        let key = loc.object()?;
        block_on(again(|| store.head(&key))).map_err(|e| not_found(loc, &store, e))
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

    /// The objects and sub-prefixes directly under the prefix `loc` (as a directory).
    fn list_under(&self, loc: &Location) -> io::Result<(Vec<ObjectMeta>, Vec<Key>)> {
        let store = loc.store()?;
        let prefix = loc.object()?;
        let listed = block_on(again(|| store.list_with_delimiter(Some(&prefix))))
            .map_err(|e| error(loc, e))?;
        Ok((listed.objects, listed.common_prefixes))
    }
}

impl Source for S3 {
    fn stat(&self, path: &Path) -> io::Result<Stat> {
        let loc = Location::parse(path)?;
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
                format!("no such object or prefix in bucket {}", loc.bucket),
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
        let loc = Location::parse(path)?;
        let (objects, prefixes) = self.list_under(&loc)?;
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

    fn canonical(&self, path: &Path) -> io::Result<PathBuf> {
        let loc = Location::parse(path)?;
        Ok(PathBuf::from(loc.url().trim_end_matches('/')))
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        let loc = Location::parse(path)?;
        let store = loc.store()?;
        let key = loc.object()?;
        let got = block_on(again(|| async { store.get(&key).await?.bytes().await }));
        if let Ok(b) = &got {
            count(&GETS, b.len());
        }
        got.map(|b| b.to_vec())
            .map_err(|e| not_found(&loc, &store, e))
    }

    fn open(&self, path: &Path) -> io::Result<Shard> {
        let loc = Location::parse(path)?;
        let meta = self.head(&loc)?;
        Ok(Arc::new(S3Input {
            store: loc.store()?,
            key: loc.object()?,
            loc,
            meta,
            ahead: Mutex::new(Ahead::default()),
        }))
    }
}

/// The bytes of the last read-ahead: `data` from `start`.
#[derive(Default)]
struct Window {
    start: u64,
    data: Vec<u8>,
}

impl Window {
    fn holds(&self, offset: u64) -> bool {
        offset >= self.start && offset < self.start + self.data.len() as u64
    }
}

/// The windows of one open object: the one being read, and the next ones, requested ahead.
#[derive(Default)]
struct Ahead {
    window: Window,
    /// Whether a second window was needed: until then nothing is requested ahead.
    streaming: bool,
    /// Each starting where the one before it ends, the first where `window` ends.
    queue: VecDeque<Pending>,
}

/// A window requested ahead: its range, the request under way, and its share of the
/// process's read-ahead budget, given back when it becomes the window being read or is dropped.
struct Pending {
    range: std::ops::Range<u64>,
    task: tokio::task::JoinHandle<object_store::Result<Vec<u8>>>,
    _reserved: Reserved,
}

impl Drop for Pending {
    fn drop(&mut self) {
        // Not read (a jump elsewhere, or the object closed): the request is of no use.
        self.task.abort();
    }
}

/// Bytes of the read-ahead budget ([`AHEAD_BUDGET`]) held.
struct Reserved(usize);

/// Bytes of every open object's windows requested ahead, in this process.
static AHEAD_HELD: AtomicUsize = AtomicUsize::new(0);

impl Reserved {
    /// `n` bytes of the budget, if that many are free.
    fn take(n: usize) -> Option<Reserved> {
        AHEAD_HELD
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                (held + n <= AHEAD_BUDGET).then_some(held + n)
            })
            .ok()
            .map(|_| Reserved(n))
    }
}

impl Drop for Reserved {
    fn drop(&mut self) {
        AHEAD_HELD.fetch_sub(self.0, Ordering::AcqRel);
    }
}

/// An object open for ranged reads: the version seen when it was opened (every GET carries
/// `If-Match` with its ETag, so a replaced object fails the read instead of mixing versions).
struct S3Input {
    store: Arc<AmazonS3>,
    loc: Location,
    key: Key,
    meta: ObjectMeta,
    ahead: Mutex<Ahead>,
}

impl S3Input {
    /// The request for the bytes `range` of the object, one GET, not yet under way.
    fn request(
        &self,
        range: std::ops::Range<u64>,
    ) -> impl Future<Output = object_store::Result<Vec<u8>>> + Send + 'static {
        let options = GetOptions {
            if_match: self.meta.e_tag.clone(),
            range: Some(GetRange::Bounded(range)),
            ..GetOptions::default()
        };
        let (store, key) = (self.store.clone(), self.key.clone());
        async move {
            let got =
                again(|| async { store.get_opts(&key, options.clone()).await?.bytes().await })
                    .await?;
            count(&GETS, got.len());
            Ok(got.to_vec())
        }
    }

    /// The bytes `from..to` of the object: one GET per [`READ_AHEAD`] bytes, all in flight at
    /// once.
    fn fetch(&self, from: u64, to: u64) -> io::Result<Vec<u8>> {
        let step = READ_AHEAD as u64;
        let parts: Vec<_> = (from..to)
            .step_by(READ_AHEAD)
            .map(|at| self.request(at..(at + step).min(to)))
            .collect();
        let got = block_on(futures_util::future::try_join_all(parts));
        got.map(|parts| parts.concat())
            .map_err(|e| error(&self.loc, e))
    }

    /// The window that holds `offset`: the current one, the next one requested ahead (the
    /// stream goes on), or else (a jump) one fetched now, with what was requested ahead dropped.
    fn seek(&self, ahead: &mut Ahead, offset: u64) -> io::Result<()> {
        if ahead.window.holds(offset) {
            return Ok(());
        }
        while let Some(next) = ahead.queue.pop_front() {
            if !next.range.contains(&offset) {
                continue;
            }
            let start = next.range.start;
            let mut next = next;
            let got = block_on(&mut next.task)
                .map_err(|e| io::Error::other(format!("{}: {e}", self.loc.url())))?;
            ahead.window = Window {
                start,
                data: got.map_err(|e| error(&self.loc, e))?,
            };
            return Ok(());
        }
        // The first read of an object may be its only one (telling a shard's codec from its
        // first bytes, before or after the data is read elsewhere): a small window, and a
        // stream, with windows requested ahead, from the second on.
        let first = ahead.window.data.is_empty() && !ahead.streaming;
        ahead.streaming = !first;
        let len = if first { FIRST_WINDOW } else { READ_AHEAD };
        let to = (offset + len as u64).min(self.meta.size);
        ahead.window = Window {
            start: offset,
            data: self.fetch(offset, to)?,
        };
        Ok(())
    }

    /// Requests the windows after the ones held, up to [`AHEAD_WINDOWS`] of them, while the
    /// process's read-ahead budget has room: a stream then waits for one request's latency
    /// only at its start, not at every window.
    fn top_up(&self, ahead: &mut Ahead) {
        if !ahead.streaming {
            return;
        }
        let window_end = ahead.window.start + ahead.window.data.len() as u64;
        let mut next = ahead.queue.back().map_or(window_end, |p| p.range.end);
        while ahead.queue.len() < AHEAD_WINDOWS && next < self.meta.size {
            let end = (next + READ_AHEAD as u64).min(self.meta.size);
            let Some(reserved) = Reserved::take((end - next) as usize) else {
                return;
            };
            ahead.queue.push_back(Pending {
                range: next..end,
                task: runtime().spawn(self.request(next..end)),
                _reserved: reserved,
            });
            next = end;
        }
    }
}

impl Input for S3Input {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let size = self.meta.size;
        if offset >= size || buf.is_empty() {
            return Ok(0);
        }
        let want = buf
            .len()
            .min(usize::try_from(size - offset).unwrap_or(usize::MAX));
        let mut ahead = self.ahead.lock().unwrap_or_else(|e| e.into_inner());
        let streaming = ahead.window.holds(offset)
            || ahead
                .queue
                .front()
                .is_some_and(|p| p.range.contains(&offset));
        if want >= READ_AHEAD && !streaming {
            // A large read elsewhere (a large sample, a chunk) goes straight into the caller's
            // buffer, its GETs in flight at once.
            drop(ahead);
            let data = self.fetch(offset, offset + want as u64)?;
            buf[..data.len()].copy_from_slice(&data);
            return Ok(data.len());
        }
        self.seek(&mut ahead, offset)?;
        self.top_up(&mut ahead);
        let window = &ahead.window;
        let from = usize::try_from(offset - window.start).unwrap_or(usize::MAX);
        // Up to the window's end: the caller reads on ([`super::read_up_to_at`]) from the next.
        let n = want.min(window.data.len().saturating_sub(from));
        buf[..n].copy_from_slice(&window.data[from..from + n]);
        Ok(n)
    }

    fn stamp(&self) -> io::Result<FileStamp> {
        Ok(stamp_of(&self.meta))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

fn unsupported(path: &Path, what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::Unsupported,
        format!("{}: object storage has no {what}", path.display()),
    )
}

impl S3 {
    fn put(&self, path: &Path, bytes: &[u8], mode: PutMode) -> io::Result<()> {
        let loc = Location::parse(path)?;
        let store = loc.store()?;
        let key = loc.object()?;
        let payload = PutPayload::from(bytes.to_vec());
        count(&PUTS, bytes.len());
        block_on(store.put_opts(&key, payload, PutOptions::from(mode)))
            .map(|_| ())
            .map_err(|e| error(&loc, e))
    }
}

impl Sink for S3 {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            positioned_writes: false,
            rename: false,
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
        let loc = Location::parse(path)?;
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
        let loc = Location::parse(path)?;
        Ok(Box::new(Upload {
            store: loc.store()?,
            key: loc.object()?,
            loc,
            buf: Vec::new(),
            upload: None,
            written: 0,
        }))
    }

    fn publish(&self, from: &Path, _to: &Path) -> io::Result<()> {
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

    fn exchange(&self, a: &Path, _b: &Path) -> io::Result<()> {
        Err(unsupported(a, "rename"))
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        let loc = Location::parse(path)?;
        let store = loc.store()?;
        let key = loc.object()?;
        block_on(again(|| store.delete(&key))).map_err(|e| error(&loc, e))
    }

    fn abort_unfinished(&self, dir: &Path) -> io::Result<usize> {
        let loc = Location::parse(dir)?;
        let store = loc.store()?;
        let prefix = loc.object()?;
        block_on(async {
            use futures_util::TryStreamExt;
            let all: Vec<ObjectMeta> = again(|| store.list(Some(&prefix)).try_collect()).await?;
            let mut aborted = 0;
            for journal in all.iter().map(|m| &m.location) {
                let Some(key) = object_of(journal) else {
                    continue;
                };
                let id = store.get(journal).await?.bytes().await?;
                let id = String::from_utf8_lossy(&id).into_owned();
                match store.abort_multipart(&key, &id).await {
                    // Gone already (completed, aborted, or expired by a lifecycle rule).
                    Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                    Err(e) => return Err(e),
                }
                store.delete(journal).await?;
                aborted += 1;
            }
            Ok(aborted)
        })
        .map_err(|e| error(&loc, e))
    }

    fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
        let loc = Location::parse(path)?;
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

/// The folder, beside a multipart upload's object, of the journal objects that name unfinished
/// uploads: a run that died with the server (and could not abort) leaves its upload ids there
/// for the next run to abort ([`Sink::abort_unfinished`]).
const JOURNAL: &str = ".reshard-multipart";

/// The journal object of a multipart upload to `key`.
fn journal_of(key: &Key) -> Key {
    let text = key.as_ref();
    let (dir, name) = text.rsplit_once('/').unwrap_or(("", text));
    let path = if dir.is_empty() {
        format!("{JOURNAL}/{name}")
    } else {
        format!("{dir}/{JOURNAL}/{name}")
    };
    Key::from(path.as_str())
}

/// The object a journal object `journal` speaks for.
fn object_of(journal: &Key) -> Option<Key> {
    let text = journal.as_ref();
    let (dir, name) = text
        .rsplit_once(&format!("/{JOURNAL}/"))
        .or_else(|| text.strip_prefix(&format!("{JOURNAL}/")).map(|n| ("", n)))?;
    let path = if dir.is_empty() {
        name.to_string()
    } else {
        format!("{dir}/{name}")
    };
    Key::parse(path).ok()
}

/// An object written front to back: one PUT when it stays under a part, else a multipart
/// upload whose parts go out as they fill, its id in a journal object until it is completed or
/// aborted. Dropped unfinished, its upload is aborted, so no parts are left behind to be billed.
struct Upload {
    store: Arc<AmazonS3>,
    loc: Location,
    key: Key,
    buf: Vec<u8>,
    /// The multipart upload's id and its parts so far.
    upload: Option<(MultipartId, Vec<PartId>)>,
    written: u64,
}

impl Upload {
    /// The size of the part after `sent` parts.
    fn part_size(sent: usize) -> usize {
        let doublings = u32::try_from(sent / PARTS_PER_SIZE).unwrap_or(u32::MAX);
        PART.checked_shl(doublings)
            .unwrap_or(MAX_PART)
            .min(MAX_PART)
    }

    fn sent(&self) -> usize {
        self.upload.as_ref().map_or(0, |u| u.1.len())
    }

    /// Starts the multipart upload and journals its id.
    fn start(&self) -> object_store::Result<MultipartId> {
        block_on(async {
            let id = self.store.create_multipart(&self.key).await?;
            let journal = PutPayload::from(id.clone().into_bytes());
            self.store.put(&journal_of(&self.key), journal).await?;
            Ok(id)
        })
    }

    /// Sends the first `n` bytes of the buffer as the next part.
    fn send_part(&mut self, n: usize) -> io::Result<()> {
        if self.upload.is_none() {
            let id = self.start().map_err(|e| error(&self.loc, e))?;
            self.upload = Some((id, Vec::new()));
        }
        let rest = self.buf.split_off(n);
        let data = PutPayload::from(std::mem::replace(&mut self.buf, rest));
        count(&PUTS, data.content_length());
        let (id, parts) = self.upload.as_mut().expect("started above");
        let part = block_on(again(|| {
            self.store
                .put_part(&self.key, id, parts.len(), data.clone())
        }));
        parts.push(part.map_err(|e| error(&self.loc, e))?);
        Ok(())
    }
}

impl io::Write for Upload {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.buf.extend_from_slice(data);
        self.written += data.len() as u64;
        while self.buf.len() >= Upload::part_size(self.sent()) {
            self.send_part(Upload::part_size(self.sent()))?;
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Writer for Upload {
    fn finish(mut self: Box<Self>) -> io::Result<u64> {
        if self.upload.is_none() {
            let payload = PutPayload::from(std::mem::take(&mut self.buf));
            count(&PUTS, payload.content_length());
            block_on(again(|| self.store.put(&self.key, payload.clone())))
                .map_err(|e| error(&self.loc, e))?;
            return Ok(self.written);
        }
        if !self.buf.is_empty() {
            self.send_part(self.buf.len())?;
        }
        let (id, parts) = self.upload.take().expect("a multipart upload");
        let done = block_on(async {
            self.store.complete_multipart(&self.key, &id, parts).await?;
            self.store.delete(&journal_of(&self.key)).await
        });
        if let Err(e) = done {
            abort(&self.store, &self.key, &id);
            return Err(error(&self.loc, e));
        }
        Ok(self.written)
    }
}

/// Aborts the multipart upload `id` of `key` and removes its journal; quietly, on a failure
/// path (an abort that fails leaves the journal for the next run).
fn abort(store: &AmazonS3, key: &Key, id: &MultipartId) {
    let _ = block_on(async {
        store.abort_multipart(key, id).await?;
        store.delete(&journal_of(key)).await
    });
}

impl Drop for Upload {
    fn drop(&mut self) {
        if let Some((id, _)) = self.upload.take() {
            // Unfinished: its parts would stay (and be billed) until aborted.
            abort(&self.store, &self.key, &id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_parse_into_bucket_and_key() {
        let loc = Location::parse(Path::new("s3://data/train/a-0.tar")).unwrap();
        assert_eq!(loc.bucket, "data");
        assert_eq!(loc.key, "train/a-0.tar");
        let root = Location::parse(Path::new("s3://data/")).unwrap();
        assert_eq!(root.key, "");
        assert_eq!(
            Location::parse(Path::new("s3://data/train/")).unwrap().key,
            "train"
        );
        assert!(Location::parse(Path::new("s3:///k")).is_err());
        assert!(Location::parse(Path::new("/local/k")).is_err());
        let bad = Location::parse(Path::new("s3://data/a//b")).unwrap();
        assert!(bad.object().is_err());
    }

    #[test]
    fn journals_name_their_objects() {
        for key in ["out/x/shard-000001.tar", "shard.tar", "a/b/c/d.tar"] {
            let key = Key::parse(key).unwrap();
            let journal = journal_of(&key);
            assert!(journal.as_ref().contains(JOURNAL), "{journal}");
            assert_eq!(object_of(&journal), Some(key));
        }
        assert_eq!(object_of(&Key::parse("out/x/shard.tar").unwrap()), None);
    }

    #[test]
    fn parts_respect_the_stores_limits() {
        assert_eq!(Upload::part_size(0), PART);
        const { assert!(PART >= 5 << 20) };
        // 10,000 parts carry more than 10 TiB; no part exceeds 5 GiB.
        let total: u64 = (0..10_000).map(|i| Upload::part_size(i) as u64).sum();
        assert!(total > 10 << 40, "{total}");
        assert!((0..10_000).all(|i| Upload::part_size(i) <= 5 << 30));
    }

    /// An error of `object_store` as a request that broke off in transit returns it.
    fn in_transit() -> object_store::Error {
        let cut = io::Error::new(io::ErrorKind::ConnectionReset, "reset by peer");
        object_store::Error::Generic {
            store: "S3",
            source: Box::new(object_store::client::HttpError::new(
                object_store::client::HttpErrorKind::Interrupted,
                cut,
            )),
        }
    }

    #[test]
    fn requests_that_broke_off_in_transit_are_told_from_answers() {
        assert!(broke_off(&in_transit()));
        // Deeper in the chain, as object_store wraps it.
        let wrapped = object_store::Error::Generic {
            store: "S3",
            source: Box::new(in_transit()),
        };
        assert!(broke_off(&wrapped));
        let answered = object_store::Error::NotFound {
            path: "k".into(),
            source: "no such key".into(),
        };
        assert!(!broke_off(&answered));
        let other = object_store::Error::Generic {
            store: "S3",
            source: Box::new(io::Error::other("SlowDown")),
        };
        assert!(!broke_off(&other));
    }

    #[test]
    fn requests_that_broke_off_are_sent_again_and_answers_are_not() {
        use std::sync::atomic::AtomicU32;
        let sent = AtomicU32::new(0);
        let ms = Duration::from_millis(1);
        // Two sendings break off, the third is answered.
        let got = block_on(again_after(ms, || async {
            match sent.fetch_add(1, Ordering::Relaxed) {
                0 | 1 => Err(in_transit()),
                n => Ok(n),
            }
        }));
        assert_eq!(got.unwrap(), 2);
        assert_eq!(sent.load(Ordering::Relaxed), 3);
        // An answer (here: not found) is final.
        sent.store(0, Ordering::Relaxed);
        let got: object_store::Result<()> = block_on(again_after(ms, || async {
            sent.fetch_add(1, Ordering::Relaxed);
            Err(object_store::Error::NotFound {
                path: "k".into(),
                source: "no such key".into(),
            })
        }));
        assert!(matches!(got, Err(object_store::Error::NotFound { .. })));
        assert_eq!(sent.load(Ordering::Relaxed), 1);
        // Never more than the attempts (10 unless AWS_MAX_ATTEMPTS says otherwise).
        sent.store(0, Ordering::Relaxed);
        let started = std::time::Instant::now();
        let got: object_store::Result<()> = block_on(again_after(ms, || async {
            sent.fetch_add(1, Ordering::Relaxed);
            Err(in_transit())
        }));
        assert!(got.is_err());
        assert_eq!(sent.load(Ordering::Relaxed), attempts());
        // The backoff doubles from its first wait: 9 waits from 1 ms are 511 ms.
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_millis(511) / 2,
            "{waited:?} for {} attempts",
            attempts()
        );
    }
}
