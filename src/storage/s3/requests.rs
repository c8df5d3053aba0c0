//! Requests to an object store: the one runtime every request blocks on, the client of each
//! bucket (made once by its [`Scheme`]; S3's with its credentials from the `AWS_*` variables, a
//! profile, the role), a request sent again when it broke off in transit, and the errors a
//! request's failure becomes.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use object_store::aws::{AmazonS3, AmazonS3Builder, AmazonS3ConfigKey};
use object_store::path::Path as Key;
use object_store::{ClientConfigKey, ClientOptions, HeaderMap, HeaderValue, RetryConfig};

use super::{Client, Location, Scheme};
use crate::storage::{aws_profile, endpoint};

/// The runtime every request runs on. A thread of its own drives it for good, so that the
/// read-ahead requests spawned on it ([`super::read`]) make progress while the reading
/// threads are busy elsewhere; a thread's own `block_on` polls its future on that thread.
pub(super) fn runtime() -> &'static tokio::runtime::Runtime {
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
pub(super) fn broke_off(e: &object_store::Error) -> bool {
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
pub(super) fn attempts() -> u32 {
    std::env::var("AWS_MAX_ATTEMPTS")
        .ok()
        .and_then(|v| v.trim().parse::<u32>().ok())
        .unwrap_or(10)
        .max(1)
}

/// How long after its first sending a request that broke off is still sent again: a store
/// that stays unreachable fails the run after `object_store`'s own retries (up to 3 minutes),
/// not after those retries times [`attempts`].
pub(super) const AGAIN_WITHIN: Duration = Duration::from_secs(30);

/// Runs the request `op` makes, again while it breaks off ([`broke_off`]) within
/// [`AGAIN_WITHIN`], after 50 ms, then twice as long each time up to 5 s. Only for requests
/// that may be sent twice: reads, and writes whose second sending has the effect of one.
pub(super) async fn again<T, F, Fut>(op: F) -> object_store::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = object_store::Result<T>>,
{
    again_after(Duration::from_millis(50), op).await
}

/// [`again`], the first wait `wait`.
pub(super) async fn again_after<T, F, Fut>(wait: Duration, op: F) -> object_store::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = object_store::Result<T>>,
{
    again_when(broke_off, wait, op).await
}

/// An answer that says the store is busy or failed in passing: `429 Too Many Requests`, or a
/// `5xx` other than `501 Not Implemented` (S3's `SlowDown` is a 503).
#[derive(Debug)]
pub(super) struct Passing(pub(super) String);

impl std::fmt::Display for Passing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Passing {}

/// Whether `e` is an answer worth asking again after a while ([`Passing`]).
pub(super) fn passing(e: &object_store::Error) -> bool {
    matches!(e, object_store::Error::Generic { source, .. } if source.is::<Passing>())
}

/// [`again_after`], sent again after the errors `worth` says are.
pub(super) async fn again_when<T, F, Fut>(
    worth: impl Fn(&object_store::Error) -> bool,
    mut wait: Duration,
    mut op: F,
) -> object_store::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = object_store::Result<T>>,
{
    let first = std::time::Instant::now();
    let mut tries = 1;
    loop {
        match op().await {
            Err(e) if tries < attempts() && first.elapsed() < AGAIN_WITHIN && worth(&e) => {
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(5));
                tries += 1;
            }
            done => return done,
        }
    }
}

pub(super) fn block_on<F: Future>(f: F) -> F::Output {
    runtime().block_on(f)
}

/// The client of `bucket` in the store of `scheme`, made once per process ([`Scheme::client`]).
///
/// # Errors
/// The client cannot be made (a credential the store's variables name is wrong or missing).
pub(super) fn store(scheme: &'static Scheme, bucket: &str) -> io::Result<Arc<dyn Client>> {
    client_of(scheme, bucket, false)
}

/// The client of `bucket` whose every request carries the store's create-only condition
/// ([`Scheme::create_only`]), made once per process: it completes the multipart uploads of
/// [`crate::storage::Sink::create_stream_new`] (`object_store`'s own completion always
/// overwrites; the condition is a header the client signs with the rest).
///
/// # Errors
/// The client cannot be made.
pub(super) fn creating_store(scheme: &'static Scheme, bucket: &str) -> io::Result<Arc<dyn Client>> {
    client_of(scheme, bucket, true)
}

fn client_of(scheme: &'static Scheme, bucket: &str, creating: bool) -> io::Result<Arc<dyn Client>> {
    type Clients = HashMap<(&'static str, String, bool), Arc<dyn Client>>;
    static STORES: Mutex<Option<Clients>> = Mutex::new(None);
    let mut stores = STORES.lock().unwrap_or_else(|e| e.into_inner());
    let stores = stores.get_or_insert_with(HashMap::new);
    let id = (scheme.name, bucket.to_string(), creating);
    if let Some(s) = stores.get(&id) {
        return Ok(s.clone());
    }
    let headers = scheme
        .create_only
        .filter(|_| creating)
        .map(|(name, value)| {
            let mut h = HeaderMap::new();
            h.insert(name, HeaderValue::from_static(value));
            h
        });
    let s = (scheme.client)(bucket, headers)?;
    stores.insert(id, s.clone());
    Ok(s)
}

/// The client settings a builder holds (`get` reads one), carried over to options that also
/// send `headers` on every request: a builder's options are replaced whole, so every setting
/// the environment gave it (a proxy, timeouts, plain HTTP) is copied first.
pub(crate) fn options_with_headers(
    get: &dyn Fn(ClientConfigKey) -> Option<String>,
    headers: HeaderMap,
) -> ClientOptions {
    const KEYS: [&str; 20] = [
        "allow_http",
        "allow_invalid_certificates",
        "disable_system_certificates",
        "connect_timeout",
        "default_content_type",
        "http1_only",
        "http2_only",
        "http2_keep_alive_interval",
        "http2_keep_alive_timeout",
        "http2_keep_alive_while_idle",
        "http2_max_frame_size",
        "pool_idle_timeout",
        "pool_max_idle_per_host",
        "proxy_url",
        "proxy_ca_certificate",
        "proxy_excludes",
        "randomize_addresses",
        "read_timeout",
        "timeout",
        "user_agent",
    ];
    let mut options = ClientOptions::new();
    for key in KEYS
        .iter()
        .filter_map(|k| k.parse::<ClientConfigKey>().ok())
    {
        if let Some(value) = get(key) {
            options = options.with_config(key, value);
        }
    }
    options.with_default_headers(headers)
}

/// The client of the S3 `bucket`, from the environment: the `AWS_*` variables
/// (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_REGION`,
/// `AWS_ENDPOINT_URL` for an S3-compatible store, which implies path-style addressing unless
/// `AWS_VIRTUAL_HOSTED_STYLE_REQUEST=true`), else the instance's or the web identity's role.
///
/// # Errors
/// The named profile cannot be followed, or the client cannot be made.
pub fn s3_client(bucket: &str, headers: Option<HeaderMap>) -> io::Result<Arc<dyn Client>> {
    Ok(Arc::new(s3_store(bucket, headers)?.0))
}

/// The S3 client of `bucket` as [`s3_client`] makes it, and the settings of its HTTP client
/// (a proxy, timeouts, plain HTTP), for a request the client itself does not make
/// ([`super::uploads`]).
///
/// # Errors
/// As [`s3_client`].
pub(super) fn s3_store(
    bucket: &str,
    headers: Option<HeaderMap>,
) -> io::Result<(AmazonS3, ClientOptions)> {
    let builder = AmazonS3Builder::from_env().with_bucket_name(bucket);
    let (mut builder, endpoint) = with_profile(builder, bucket)?;
    if endpoint.starts_with("http://") {
        // A store on the local network or loopback without TLS: the user named it so.
        builder = builder.with_allow_http(true);
    }
    if let Some(retry) = retry_from_env() {
        builder = builder.with_retry(retry);
    }
    let get = |k| builder.get_config_value(&AmazonS3ConfigKey::Client(k));
    let options = options_with_headers(&get, headers.clone().unwrap_or_default());
    if headers.is_some() {
        builder = builder.with_client_options(options.clone());
    }
    let s = builder.build().map_err(|e| {
        io::Error::other(format!(
            "s3://{bucket}: cannot set up the S3 client ({}); check the AWS_* variables",
            plain(&e)
        ))
    })?;
    Ok((s, options))
}

/// The retries `AWS_MAX_ATTEMPTS` asks for, as the AWS SDKs read it (attempts in all, the
/// first included), for every store's client.
pub fn retry_from_env() -> Option<RetryConfig> {
    let attempts = std::env::var("AWS_MAX_ATTEMPTS")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())?;
    Some(RetryConfig {
        max_retries: attempts.saturating_sub(1),
        ..RetryConfig::default()
    })
}

/// The builder with what the named profile of the AWS shared files gives where the variables
/// do not ([`aws_profile`]): the keys, the region (else `us-east-1`) and the endpoint; and the
/// endpoint in use.
///
/// # Errors
/// The profile named cannot be found or gets its keys in a way reshard does not follow.
pub(super) fn with_profile(
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
pub(super) fn plain(e: &object_store::Error) -> String {
    e.to_string()
}

/// Whether a store's answer says the bucket (container) itself is missing.
fn no_bucket(e: &object_store::Error) -> bool {
    let text = plain(e);
    text.contains("NoSuchBucket") || text.contains("ContainerNotFound")
}

/// An error of the client for `loc`, as an `io::Error` whose message names the bucket (the
/// caller's context names the whole location, as for a POSIX error) and what to do; never a
/// credential (the client's messages carry URLs and the store's error codes, never the
/// request's headers).
pub(super) fn error(loc: &Location, e: object_store::Error) -> io::Error {
    use object_store::Error as E;
    let word = loc.scheme.bucket;
    match e {
        E::NotFound { .. } => io::Error::new(
            io::ErrorKind::NotFound,
            format!("no such object in {word} {}", loc.bucket),
        ),
        E::PermissionDenied { .. } | E::Unauthenticated { .. } => {
            explained(loc, &e).unwrap_or_else(|| denied(loc))
        }
        E::AlreadyExists { .. } => io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!("exists already in {word} {}", loc.bucket),
        ),
        E::NotImplemented { .. } => io::Error::new(
            io::ErrorKind::Unsupported,
            format!(
                "the store of {word} {} cannot do this ({})",
                loc.bucket,
                plain(&e)
            ),
        ),
        E::Precondition { .. } | E::NotModified { .. } => io::Error::other(
            "the object changed while reshard read it (its ETag differs): run again on an input that stays unchanged",
        ),
        e if no_bucket(&e) => io::Error::new(
            io::ErrorKind::NotFound,
            format!("{word} {} does not exist", loc.bucket),
        ),
        e => explained(loc, &e).unwrap_or_else(|| io::Error::other(plain(&e))),
    }
}

/// What the client's error `e` means for the user, in one line that says what to set: a
/// wrong secret or key (the store's error code, which a listing returns inside its XML), no
/// credentials at all (the client then asks the cloud's instance metadata service, which is
/// not there), and a store that cannot be reached. With no endpoint set, the store is AWS's
/// own, which is seldom what a user of another store meant: each message then says so.
/// `None`: no more to say than the client's message.
fn explained(loc: &Location, e: &object_store::Error) -> Option<io::Error> {
    use io::ErrorKind::PermissionDenied;
    if loc.scheme.name != "s3" {
        // The variables named below are S3's.
        return None;
    }
    let text = plain(e);
    let bucket = &loc.bucket;
    let endpoint = endpoint_set();
    let aws = if endpoint.is_none() { AWS_OWN } else { "" };
    let said =
        |kind, why: String| Some(io::Error::new(kind, format!("bucket {bucket}: {why}{aws}")));
    // First: the metadata service's own refusal reads like the store's.
    let metadata = [
        "169.254.169.254",
        "169.254.170.2",
        "/latest/api/token",
        "/latest/meta-data/",
    ];
    if metadata.iter().any(|m| text.contains(m)) {
        return said(PermissionDenied, "no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE); without them the client asked the cloud's instance metadata service, and none answered".into());
    }
    if text.contains("SignatureDoesNotMatch") {
        return said(PermissionDenied, "the store refused the request's signature (SignatureDoesNotMatch): AWS_SECRET_ACCESS_KEY is not the secret of AWS_ACCESS_KEY_ID; set the pair the store issued".into());
    }
    if text.contains("InvalidAccessKeyId") {
        return said(PermissionDenied, "the store does not know the key in AWS_ACCESS_KEY_ID (InvalidAccessKeyId); set a key the store issued, with its AWS_SECRET_ACCESS_KEY".into());
    }
    if text.contains("ExpiredToken") || text.contains("InvalidToken") {
        return said(PermissionDenied, "the session token has expired or is not valid; set fresh AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN".into());
    }
    if text.contains("<Code>AccessDenied</Code>") {
        return Some(denied(loc));
    }
    if !broke_off(e) {
        return None;
    }
    let url = text
        .split_whitespace()
        .find(|w| w.starts_with("http://") || w.starts_with("https://"))?;
    let host = url.splitn(4, '/').take(3).collect::<Vec<_>>().join("/");
    match endpoint {
        None => said(io::ErrorKind::ConnectionRefused, format!("cannot reach the store at {host}")),
        Some(e) => said(
            io::ErrorKind::ConnectionRefused,
            format!("cannot reach the store at {host}: is it running, and is the endpoint {e} (AWS_ENDPOINT_URL) right?"),
        ),
    }
}

/// What an S3 error adds when no endpoint is set.
const AWS_OWN: &str = "; no endpoint is set (AWS_ENDPOINT_URL), so the store is AWS's own: for another store set AWS_ENDPOINT_URL to its address";

/// A denied request with nothing more specific to say.
fn denied(loc: &Location) -> io::Error {
    let word = loc.scheme.bucket;
    let aws = loc.scheme.name == "s3" && endpoint_set().is_none();
    io::Error::new(
        io::ErrorKind::PermissionDenied,
        format!(
            "access denied to {word} {} key {}: check the credentials ({}) and the {word}'s policy{}",
            loc.bucket,
            loc.key,
            loc.scheme.credentials,
            if aws { AWS_OWN } else { "" }
        ),
    )
}

/// The endpoint the variables or the named profile set, as [`with_profile`] takes it.
fn endpoint_set() -> Option<String> {
    let set = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let endpoint = set("AWS_ENDPOINT_URL_S3").or_else(|| set("AWS_ENDPOINT_URL"));
    endpoint.or_else(|| aws_profile::selected().ok().flatten()?.endpoint_url)
}

/// A not-found object's better message: when the bucket itself is missing, say so.
pub(super) fn not_found(loc: &Location, store: &dyn Client, e: object_store::Error) -> io::Error {
    if !matches!(e, object_store::Error::NotFound { .. }) {
        return error(loc, e);
    }
    let probe = block_on(store.list_with_delimiter(Some(&Key::from("")))).err();
    match probe {
        Some(p) if no_bucket(&p) || matches!(p, object_store::Error::NotFound { .. }) => {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("{} {} does not exist", loc.scheme.bucket, loc.bucket),
            )
        }
        _ => error(loc, e),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use super::*;

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
