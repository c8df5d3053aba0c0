//! S3's conditional DeleteObject (`If-Match` with the ETag the run saw): a removal that takes
//! away only the object the run looked at, never one another run put at that name since.
//! `object_store` sends no condition on a delete; it does sign any request of its client as a
//! presigned URL, which is sent here with the condition, as [`super::uploads`] sends its listing.

use std::time::Duration;

use object_store::aws::AmazonS3;
use object_store::client::{HttpConnector, HttpRequest, HttpRequestBody, ReqwestConnector};
use object_store::path::Path as Key;
use object_store::signer::Signer;
use object_store::ClientOptions;

use std::sync::atomic::{AtomicBool, Ordering};

use super::requests::{again_when, block_on, broke_off, passing, s3_store, Passing};

/// How long a signed removal stays valid: it is sent at once.
const VALID: Duration = Duration::from_secs(300);

/// What a conditional removal did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Removed {
    /// The object was removed, or nothing was at the name.
    Gone,
    /// Another object is at the name now (`412 Precondition Failed`): it is left.
    Changed,
    /// The store has no conditional DeleteObject (`501 Not Implemented`, or a `400` that
    /// says `NotImplemented`): the caller removes as before, and a warning says so once.
    NoCondition,
}

/// Removes `key` of the S3 `bucket` only while its ETag is `tag` (its client made as every
/// other request's), sent again while it breaks off, the store is busy or failed in passing
/// (`429`, a `5xx` but `501`: S3's `SlowDown` is a 503) or answers that a concurrent request
/// conflicted (`409`, which AWS documents for conditional deletes), as `object_store` sends its
/// own requests again.
///
/// # Errors
/// The client cannot be made, or the store answers otherwise.
pub(crate) fn s3_delete_if(bucket: &str, key: &Key, tag: &str) -> object_store::Result<Removed> {
    let (s3, options) = s3_store(bucket, None).map_err(|e| generic(e.to_string()))?;
    block_on(delete_if(&s3, &options, key, tag))
}

/// [`s3_delete_if`] with the client `s3` and its `options`.
async fn delete_if(
    s3: &AmazonS3,
    options: &ClientOptions,
    key: &Key,
    tag: &str,
) -> object_store::Result<Removed> {
    let worth = |e: &object_store::Error| broke_off(e) || passing(e);
    again_when(worth, Duration::from_millis(100), || async {
        let http = ReqwestConnector::default().connect(options)?;
        let url = s3.signed_url(http::Method::DELETE, key, VALID).await?;
        let mut request = HttpRequest::new(HttpRequestBody::empty());
        *request.method_mut() = http::Method::DELETE;
        *request.uri_mut() = url.as_str().parse().map_err(|e| generic(format!("{e}")))?;
        let value = http::HeaderValue::from_str(tag).map_err(|e| generic(format!("{e}")))?;
        request.headers_mut().insert(http::header::IF_MATCH, value);
        // The transport's error itself, so that one that broke off is sent again.
        let answer = http
            .execute(request)
            .await
            .map_err(|e| object_store::Error::Generic {
                store: "S3",
                source: Box::new(e),
            })?;
        let status = answer.status();
        let body = answer.into_body().bytes().await.unwrap_or_default();
        let body = String::from_utf8_lossy(&body);
        let said =
            || format!("DeleteObject of {key} if its ETag is {tag} answered {status}: {body}");
        match status.as_u16() {
            200..=299 | 404 => Ok(Removed::Gone),
            412 => Ok(Removed::Changed),
            501 => Ok(no_condition(&said())),
            400 if body.contains("NotImplemented") => Ok(no_condition(&said())),
            409 | 429 | 500..=599 => Err(object_store::Error::Generic {
                store: "S3",
                source: Box::new(Passing(said())),
            }),
            _ => Err(generic(said())),
        }
    })
    .await
}

/// [`Removed::NoCondition`], warned of once per process: a removal here is then checked, not
/// conditional (docs/guarantees.md).
fn no_condition(said: &str) -> Removed {
    static WARNED: AtomicBool = AtomicBool::new(false);
    if !WARNED.swap(true, Ordering::Relaxed) {
        crate::errln!(
            "reshard: warning: the store has no conditional DeleteObject ({said}): a removal at the output's names is made after a check of the lock, not only while the object is the one looked at"
        );
    }
    Removed::NoCondition
}

fn generic(message: String) -> object_store::Error {
    object_store::Error::Generic {
        store: "S3",
        source: message.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::s3::uploads::tests::{answering_each, client};

    /// The removal is a signed DELETE sent with the ETag as `If-Match`; a store that is busy,
    /// failed in passing or saw a conflicting request (429, 5xx but 501, 409) is asked again
    /// and its next answer taken; 412 says another object is there; only a store without the
    /// call (501, or a 400 saying `NotImplemented`) has the caller remove as before, and any
    /// other refusal is an error.
    #[test]
    fn a_conditional_removal_is_asked_again_while_the_store_is_busy_and_refusals_told_apart() {
        let key = Key::from("out/shard-000001.tar");
        let tag = "\"9b2cf535f27731c974343645a3985328\"";
        let (endpoint, served) = answering_each(&[
            ("503 Slow Down", "<Error><Code>SlowDown</Code></Error>"),
            (
                "409 Conflict",
                "<Error><Code>ConditionalRequestConflict</Code></Error>",
            ),
            ("429 Too Many Requests", ""),
            ("204 No Content", ""),
        ]);
        let (s3, options) = client(&endpoint);
        let got = block_on(delete_if(&s3, &options, &key, tag)).unwrap();
        assert_eq!(got, Removed::Gone);
        let requests = served.join().unwrap();
        assert_eq!(requests.len(), 4, "{requests:?}");
        assert!(
            requests[3].starts_with("DELETE /b/out/shard-000001.tar?"),
            "{requests:?}"
        );
        for (status, body, expected) in [
            ("404 Not Found", "", Some(Removed::Gone)),
            ("412 Precondition Failed", "", Some(Removed::Changed)),
            ("501 Not Implemented", "", Some(Removed::NoCondition)),
            (
                "400 Bad Request",
                "<Code>NotImplemented</Code>",
                Some(Removed::NoCondition),
            ),
            ("400 Bad Request", "<Code>InvalidArgument</Code>", None),
            ("403 Forbidden", "", None),
        ] {
            let (endpoint, served) = answering_each(&[(status, body)]);
            let (s3, options) = client(&endpoint);
            let got = block_on(delete_if(&s3, &options, &key, tag));
            served.join().unwrap();
            match expected {
                Some(removed) => assert_eq!(got.unwrap(), removed, "{status}"),
                None => assert!(got.is_err(), "{status}: {got:?}"),
            }
        }
    }
}
