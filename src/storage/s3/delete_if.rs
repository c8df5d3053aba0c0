//! S3's conditional DeleteObject (`If-Match` with the ETag the run saw): a removal that takes
//! away only the object the run looked at, never one another run put at that name since.
//! `object_store` sends no condition on a delete; it does sign any request of its client as a
//! presigned URL, which is sent here with the condition, as [`super::uploads`] sends its listing.

use std::time::Duration;

use object_store::client::{HttpConnector, HttpRequest, HttpRequestBody, ReqwestConnector};
use object_store::path::Path as Key;
use object_store::signer::Signer;

use super::requests::{again_when, block_on, broke_off, s3_store};

/// How long a signed removal stays valid: it is sent at once.
const VALID: Duration = Duration::from_secs(300);

/// What a conditional removal did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Removed {
    /// The object was removed, or nothing was at the name.
    Gone,
    /// Another object is at the name now (`412 Precondition Failed`): it is left.
    Changed,
    /// The store refused the condition (`501`, `400`): the caller removes as before.
    NoCondition,
}

/// Removes `key` of the S3 `bucket` only while its ETag is `tag` (its client made as every
/// other request's), sent again while it breaks off or the store is busy.
///
/// # Errors
/// The client cannot be made, or the store answers otherwise.
pub(crate) fn s3_delete_if(bucket: &str, key: &Key, tag: &str) -> object_store::Result<Removed> {
    let (s3, options) = s3_store(bucket, None).map_err(|e| generic(e.to_string()))?;
    block_on(again_when(broke_off, Duration::from_millis(50), || async {
        let http = ReqwestConnector::default().connect(&options)?;
        let url = s3.signed_url(http::Method::DELETE, key, VALID).await?;
        let mut request = HttpRequest::new(HttpRequestBody::empty());
        *request.method_mut() = http::Method::DELETE;
        *request.uri_mut() = url.as_str().parse().map_err(|e| generic(format!("{e}")))?;
        let value = http::HeaderValue::from_str(tag).map_err(|e| generic(format!("{e}")))?;
        request.headers_mut().insert(http::header::IF_MATCH, value);
        let answer = http
            .execute(request)
            .await
            .map_err(|e| generic(e.to_string()))?;
        let status = answer.status();
        match status.as_u16() {
            200..=299 | 404 => Ok(Removed::Gone),
            412 => Ok(Removed::Changed),
            400 | 501 => Ok(Removed::NoCondition),
            _ => {
                let body = answer.into_body().bytes().await.unwrap_or_default();
                Err(generic(format!(
                    "DeleteObject of {key} if its ETag is {tag} answered {status}: {}",
                    String::from_utf8_lossy(&body)
                )))
            }
        }
    }))
}

fn generic(message: String) -> object_store::Error {
    object_store::Error::Generic {
        store: "S3",
        source: message.into(),
    }
}
