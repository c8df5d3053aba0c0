//! S3's ListMultipartUploads of one key: the uploads a run may have started and died before it
//! journalled their ids ([`super::multipart`]). `object_store` has no call for it; it does sign
//! any request of its client as a presigned URL ([`Signer::signed_url_opts`]), with that
//! client's own credentials provider (variables, profile, session token, role), region,
//! endpoint and addressing style, so the request is the client's in all but its sending,
//! which an HTTP client made from the S3 client's own settings does.

use std::time::Duration;

use chrono::{DateTime, Utc};
use object_store::aws::AmazonS3;
use object_store::client::{HttpConnector, HttpRequest, HttpRequestBody, ReqwestConnector};
use object_store::path::Path as Key;
use object_store::signer::{SignedUrlOptions, Signer};
use object_store::ClientOptions;
use serde::Deserialize;

use super::requests::{again_when, block_on, broke_off, passing, s3_store, Passing};

/// An upload still open: its id and when the store says it was started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Open {
    pub(crate) id: String,
    pub(crate) initiated: DateTime<Utc>,
}

/// How long a signed listing request stays valid: it is sent at once.
const VALID: Duration = Duration::from_secs(300);

/// The open multipart uploads of exactly `key` in the S3 `bucket`, its client made as every
/// other request's ([`super::Scheme::uploads`]).
///
/// # Errors
/// The client cannot be made, a request fails, or its answer is not a listing.
pub(crate) fn s3_uploads(bucket: &str, key: &Key) -> object_store::Result<Vec<Open>> {
    let (s3, options) = s3_store(bucket, None).map_err(generic_err)?;
    block_on(listed(&s3, &options, key))
}

/// [`open_uploads`], asked again while the request breaks off or the store answers that it is
/// busy or failed in passing ([`Passing`]), as `object_store` does its own requests: after
/// 100 ms, then twice as long each time, `AWS_MAX_ATTEMPTS` times in all if set (else 10),
/// for at most 30 s ([`super::requests::again_when`]).
async fn listed(
    s3: &AmazonS3,
    options: &ClientOptions,
    key: &Key,
) -> object_store::Result<Vec<Open>> {
    let worth = |e: &object_store::Error| broke_off(e) || passing(e);
    again_when(worth, Duration::from_millis(100), || {
        open_uploads(s3, options, key)
    })
    .await
}

/// The open multipart uploads of exactly `key` in the bucket of `s3` (a listing by the prefix
/// `key` also names longer keys: those are left out), page by page.
///
/// # Errors
/// A request fails, or its answer is not a listing.
async fn open_uploads(
    s3: &AmazonS3,
    options: &ClientOptions,
    key: &Key,
) -> object_store::Result<Vec<Open>> {
    let http = ReqwestConnector::default().connect(options)?;
    let mut open = Vec::new();
    let mut from: Option<(String, String)> = None;
    loop {
        let mut query = vec![("uploads", String::new()), ("prefix", key.to_string())];
        if let Some((key_marker, id_marker)) = from.take() {
            query.push(("key-marker", key_marker));
            query.push(("upload-id-marker", id_marker));
        }
        let opts = SignedUrlOptions::new().with_query(query);
        let url = s3
            .signed_url_opts(http::Method::GET, &Key::from(""), VALID, &opts)
            .await?;
        let mut request = HttpRequest::new(HttpRequestBody::empty());
        *request.uri_mut() = url.as_str().parse().map_err(|e| generic(format!("{e}")))?;
        let answer = http.execute(request).await.map_err(generic_err)?;
        let status = answer.status();
        let body = answer.into_body().bytes().await.map_err(generic_err)?;
        let text = String::from_utf8_lossy(&body);
        if !status.is_success() {
            let said = format!("ListMultipartUploads of {key} answered {status}: {text}");
            return Err(match status.as_u16() {
                // The bucket's policy may allow uploads but not this listing
                // (s3:ListBucketMultipartUploads); a store may not have it at all.
                403 => object_store::Error::PermissionDenied {
                    path: key.to_string(),
                    source: said.into(),
                },
                405 | 501 => object_store::Error::NotSupported {
                    source: said.into(),
                },
                429 | 500..=599 => generic_err(Passing(said)),
                _ => generic(said),
            });
        }
        let page = parse(&text)?;
        open.extend(
            page.uploads
                .into_iter()
                .filter(|u| u.0 == key.as_ref())
                .map(|u| u.1),
        );
        match page.next {
            Some(next) => from = Some(next),
            None => return Ok(open),
        }
    }
}

/// One page of a listing: (key, upload) of each upload, and where the next page starts.
#[derive(Debug)]
struct Page {
    uploads: Vec<(String, Open)>,
    next: Option<(String, String)>,
}

/// The answer's XML, as S3 documents it (`ListMultipartUploadsResult`).
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Listing {
    #[serde(default)]
    upload: Vec<Upload>,
    #[serde(default)]
    is_truncated: bool,
    next_key_marker: Option<String>,
    next_upload_id_marker: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Upload {
    key: String,
    upload_id: String,
    initiated: String,
}

fn parse(xml: &str) -> object_store::Result<Page> {
    // Any other document (a proxy's page, another call's answer) would read as an empty one.
    if !is_listing(xml) {
        let start: String = xml.chars().take(200).collect();
        return Err(generic(format!(
            "a ListMultipartUploads answer that is not one: {start:?}"
        )));
    }
    let listing: Listing = quick_xml::de::from_str(xml).map_err(|e| {
        generic(format!(
            "a ListMultipartUploads answer that is not one ({e})"
        ))
    })?;
    let mut uploads = Vec::new();
    for u in listing.upload {
        let initiated = DateTime::parse_from_rfc3339(&u.initiated)
            .map_err(|e| {
                generic(format!(
                    "upload {}: Initiated {:?}: {e}",
                    u.upload_id, u.initiated
                ))
            })?
            .with_timezone(&Utc);
        let open = Open {
            id: u.upload_id,
            initiated,
        };
        uploads.push((u.key, open));
    }
    let next = match (
        listing.is_truncated,
        listing.next_key_marker,
        listing.next_upload_id_marker,
    ) {
        (true, Some(k), Some(id)) => Some((k, id)),
        (true, ..) => return Err(generic(
            "a truncated ListMultipartUploads answer without NextKeyMarker and NextUploadIdMarker"
                .into(),
        )),
        (false, ..) => None,
    };
    Ok(Page { uploads, next })
}

/// Whether the document's root element is a `ListMultipartUploadsResult`.
fn is_listing(xml: &str) -> bool {
    use quick_xml::events::Event;
    let mut reader = quick_xml::Reader::from_str(xml);
    loop {
        match reader.read_event() {
            Ok(Event::Start(e) | Event::Empty(e)) => {
                return e.local_name().as_ref() == b"ListMultipartUploadsResult"
            }
            Ok(Event::Eof) | Err(_) => return false,
            Ok(_) => {}
        }
    }
}

fn generic(message: String) -> object_store::Error {
    generic_err(std::io::Error::other(message))
}

fn generic_err(e: impl std::error::Error + Send + Sync + 'static) -> object_store::Error {
    object_store::Error::Generic {
        store: "S3",
        source: Box::new(e),
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A one-request HTTP server on loopback that answers `status` with `body`: its address,
    /// and the request line it was sent.
    fn answering(status: &str, body: &str) -> (String, std::thread::JoinHandle<String>) {
        let (address, served) = answering_each(&[(status, body)]);
        (
            address,
            std::thread::spawn(move || served.join().unwrap().remove(0)),
        )
    }

    /// An HTTP server on loopback that answers one request with each (status, body) of
    /// `answers` in turn: its address, and the request lines it was sent.
    pub(in crate::storage::s3) fn answering_each(
        answers: &[(&str, &str)],
    ) -> (String, std::thread::JoinHandle<Vec<String>>) {
        use std::io::{BufRead, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = format!("http://{}", listener.local_addr().unwrap());
        let answers: Vec<String> = answers
            .iter()
            .map(|(status, body)| {
                format!(
                    "HTTP/1.1 {status}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                )
            })
            .collect();
        let served = std::thread::spawn(move || {
            let mut requests = Vec::new();
            for answer in answers {
                let (conn, _) = listener.accept().unwrap();
                let mut reader = std::io::BufReader::new(conn);
                let mut first = String::new();
                reader.read_line(&mut first).unwrap();
                let mut line = String::new();
                while reader.read_line(&mut line).unwrap() > 2 {
                    line.clear();
                }
                reader.get_mut().write_all(answer.as_bytes()).unwrap();
                requests.push(first);
            }
            requests
        });
        (address, served)
    }

    /// A store that is busy (429) or failed in passing (a 5xx but 501) is asked again, and
    /// its next answer taken; a refusal, a missing call or a bad request is not asked again.
    #[test]
    fn a_listing_is_asked_again_after_a_busy_or_failing_store_only() {
        let key = Key::from("out/shard-000001.tar");
        let listing = r#"<ListMultipartUploadsResult><IsTruncated>false</IsTruncated>
<Upload><Key>out/shard-000001.tar</Key><UploadId>u1</UploadId><Initiated>2026-11-29T05:00:00.000Z</Initiated></Upload>
</ListMultipartUploadsResult>"#;
        let slow = "<Error><Code>SlowDown</Code></Error>";
        let (endpoint, served) = answering_each(&[
            ("503 Slow Down", slow),
            ("429 Too Many Requests", ""),
            ("500 Internal Server Error", ""),
            ("200 OK", listing),
        ]);
        let (s3, options) = client(&endpoint);
        let open = block_on(listed(&s3, &options, &key)).unwrap();
        assert_eq!(open.len(), 1, "{open:?}");
        assert_eq!(served.join().unwrap().len(), 4);
        for (status, again) in [
            ("429 Too Many Requests", true),
            ("500 Internal Server Error", true),
            ("502 Bad Gateway", true),
            ("503 Slow Down", true),
            ("400 Bad Request", false),
            ("403 Forbidden", false),
            ("404 Not Found", false),
            ("501 Not Implemented", false),
        ] {
            let (endpoint, served) = answering(status, "");
            let (s3, options) = client(&endpoint);
            let got = block_on(open_uploads(&s3, &options, &key)).unwrap_err();
            served.join().unwrap();
            assert_eq!(passing(&got), again, "{status}: {got}");
        }
        // Not an answer at all: not asked again either.
        let (endpoint, served) = answering("200 OK", "<html>a proxy's page</html>");
        let (s3, options) = client(&endpoint);
        let got = block_on(listed(&s3, &options, &key)).unwrap_err();
        served.join().unwrap();
        assert!(!passing(&got), "{got}");
        assert!(got.to_string().contains("not one"), "{got}");
    }

    /// The S3 client of bucket `b` at `endpoint`, path-style as with AWS_ENDPOINT_URL.
    pub(in crate::storage::s3) fn client(endpoint: &str) -> (AmazonS3, ClientOptions) {
        let s3 = object_store::aws::AmazonS3Builder::new()
            .with_endpoint(endpoint)
            .with_allow_http(true)
            .with_bucket_name("b")
            .with_region("us-east-1")
            .with_access_key_id("AKIDEXAMPLE")
            .with_secret_access_key("wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY")
            .with_token("session-token")
            .build()
            .unwrap();
        (s3, ClientOptions::new().with_allow_http(true))
    }

    /// The request is a signed GET of the bucket with `uploads` and the key as its prefix (the
    /// session token signed in); the answer's uploads of exactly that key are taken; a refusal
    /// (403) and a store without the call (501) are told from other failures.
    #[test]
    fn a_keys_open_uploads_are_listed_by_a_signed_request_and_refusals_told_apart() {
        let key = Key::from("out/shard-000001.tar");
        let listing = r#"<ListMultipartUploadsResult><IsTruncated>false</IsTruncated>
<Upload><Key>out/shard-000001.tar</Key><UploadId>u1</UploadId><Initiated>2026-11-29T05:00:00.000Z</Initiated></Upload>
<Upload><Key>out/shard-000001.tar.mine</Key><UploadId>u2</UploadId><Initiated>2026-11-29T05:00:00.000Z</Initiated></Upload>
</ListMultipartUploadsResult>"#;
        let (endpoint, served) = answering("200 OK", listing);
        let (s3, options) = client(&endpoint);
        let open = block_on(open_uploads(&s3, &options, &key)).unwrap();
        let ids: Vec<&str> = open.iter().map(|u| u.id.as_str()).collect();
        assert_eq!(ids, ["u1"]);
        let request = served.join().unwrap();
        assert!(
            request.starts_with("GET /b/?uploads=&prefix=out%2Fshard-000001.tar&"),
            "{request}"
        );
        for signed in [
            "X-Amz-Algorithm=AWS4-HMAC-SHA256",
            "X-Amz-Credential=AKIDEXAMPLE%2F",
            "X-Amz-Security-Token=session-token",
            "X-Amz-Signature=",
        ] {
            assert!(request.contains(signed), "{signed} in {request}");
        }
        let denied = "<Error><Code>AccessDenied</Code></Error>";
        for (status, body, expected) in [
            ("403 Forbidden", denied, "denied"),
            ("501 Not Implemented", "", "unsupported"),
            ("500 Internal Server Error", "", "other"),
        ] {
            let (endpoint, served) = answering(status, body);
            let (s3, options) = client(&endpoint);
            let got = block_on(open_uploads(&s3, &options, &key)).unwrap_err();
            served.join().unwrap();
            let kind = match got {
                object_store::Error::PermissionDenied { .. } => "denied",
                object_store::Error::NotSupported { .. } => "unsupported",
                _ => "other",
            };
            assert_eq!(kind, expected, "{status}: {got}");
        }
    }

    /// The example answer of AWS's ListMultipartUploads reference (its first example), with an
    /// escaped key added: every upload with its key, id and time, and the next page's markers.
    #[test]
    fn a_listing_gives_each_uploads_key_id_and_start() {
        let xml = r#"<?xml version="1.0" encoding="UTF-8"?>
<ListMultipartUploadsResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">
  <Bucket>bucket</Bucket>
  <KeyMarker></KeyMarker>
  <UploadIdMarker></UploadIdMarker>
  <NextKeyMarker>my-movie.m2ts</NextKeyMarker>
  <NextUploadIdMarker>YW55IGlkZWEgd2h5IGVsdmluZydzIHVwbG9hZCBmYWlsZWQ</NextUploadIdMarker>
  <MaxUploads>3</MaxUploads>
  <IsTruncated>true</IsTruncated>
  <Upload>
    <Key>my-divisor</Key>
    <UploadId>XMgbGlrZSBlbHZpbmcncyBub3QgaGF2aW5nIG11Y2ggbHVjaw</UploadId>
    <Initiator>
      <ID>arn:aws:iam::111122223333:user/user1-11111a31-17b5-4fb7-9df5-b111111f13de</ID>
      <DisplayName>user1-11111a31-17b5-4fb7-9df5-b111111f13de</DisplayName>
    </Initiator>
    <Owner>
      <ID>75aa57f09aa0c8caeab4f8c24e99d10f8e7faeebf76c078efc7c6caea54ba06a</ID>
      <DisplayName>OwnerDisplayName</DisplayName>
    </Owner>
    <StorageClass>STANDARD</StorageClass>
    <Initiated>2010-11-10T20:48:33.000Z</Initiated>
  </Upload>
  <Upload>
    <Key>a &amp; b/shard.tar</Key>
    <UploadId>b4</UploadId>
    <StorageClass>STANDARD</StorageClass>
    <Initiated>2010-11-10T20:49:33.000Z</Initiated>
  </Upload>
</ListMultipartUploadsResult>"#;
        let page = parse(xml).unwrap();
        let at = |s: &str| DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc);
        assert_eq!(
            page.uploads,
            vec![
                (
                    "my-divisor".to_string(),
                    Open {
                        id: "XMgbGlrZSBlbHZpbmcncyBub3QgaGF2aW5nIG11Y2ggbHVjaw".into(),
                        initiated: at("2010-11-10T20:48:33Z"),
                    }
                ),
                (
                    "a & b/shard.tar".to_string(),
                    Open {
                        id: "b4".into(),
                        initiated: at("2010-11-10T20:49:33Z"),
                    }
                ),
            ]
        );
        assert_eq!(
            page.next,
            Some((
                "my-movie.m2ts".into(),
                "YW55IGlkZWEgd2h5IGVsdmluZydzIHVwbG9hZCBmYWlsZWQ".into()
            ))
        );
        // The last page, and an empty one.
        let last = xml.replace("<IsTruncated>true", "<IsTruncated>false");
        assert_eq!(parse(&last).unwrap().next, None);
        let empty = r#"<ListMultipartUploadsResult><Bucket>b</Bucket><IsTruncated>false</IsTruncated></ListMultipartUploadsResult>"#;
        assert!(parse(empty).unwrap().uploads.is_empty());
        // Only a listing is one.
        for other in [
            "<html>a proxy's page</html>",
            "<Error><Code>x</Code></Error>",
            "",
            "{}",
        ] {
            assert!(parse(other).is_err(), "{other}");
        }
        // A truncated page must say where the next one starts.
        let cut = xml.replace("<NextKeyMarker>my-movie.m2ts</NextKeyMarker>", "");
        assert!(parse(&cut).is_err());
    }
}
