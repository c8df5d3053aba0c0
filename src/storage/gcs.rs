//! Google Cloud Storage: `gs://bucket/key`, served by the shared object-store code of
//! [`super::s3`]; this file makes only the client.
//!
//! Credentials as `object_store` reads them from the environment: `GOOGLE_SERVICE_ACCOUNT`
//! (a service account's JSON file), `GOOGLE_SERVICE_ACCOUNT_KEY` (its JSON text),
//! `GOOGLE_APPLICATION_CREDENTIALS` (application default credentials), else the instance's
//! metadata server. `STORAGE_EMULATOR_HOST` (the variable Google's own libraries read) points
//! every request at an emulator instead, unsigned, as those libraries do.

use std::io;
use std::sync::Arc;

use object_store::gcp::{GcpCredential, GoogleCloudStorageBuilder, GoogleConfigKey};
use object_store::{ClientConfigKey, StaticCredentialProvider};

use super::s3::{options_with_headers, retry_from_env, Client, Scheme};

/// The scheme: `gs://bucket/key`.
pub static GCS: Scheme = Scheme {
    name: "gs",
    bucket: "bucket",
    credentials:
        "GOOGLE_SERVICE_ACCOUNT, GOOGLE_SERVICE_ACCOUNT_KEY, GOOGLE_APPLICATION_CREDENTIALS",
    client,
    // The XML API's condition: the object's generation is 0, i.e. there is none.
    create_only: Some(("x-goog-if-generation-match", "0")),
    // GCS's XML API lists a bucket's multipart uploads too, but object_store signs no such
    // request for it and no emulator answers one: an upload whose id was never journalled
    // stays until a lifecycle rule (AbortIncompleteMultipartUpload) removes it.
    uploads: None,
    // object_store signs no condition on a delete here: a removal is plain.
    delete_if: None,
    location: &["STORAGE_EMULATOR_HOST"],
};

/// The client of `bucket`, from the environment.
///
/// # Errors
/// The credentials the variables name cannot be read.
fn client(bucket: &str, headers: Option<object_store::HeaderMap>) -> io::Result<Arc<dyn Client>> {
    let mut builder = GoogleCloudStorageBuilder::from_env().with_bucket_name(bucket);
    if let Some(host) = std::env::var("STORAGE_EMULATOR_HOST")
        .ok()
        .filter(|h| !h.is_empty())
    {
        let url = if host.contains("://") {
            host
        } else {
            format!("http://{host}")
        };
        // No credential at all: an empty bearer token, never a token request (with
        // `skip_signature` alone, `object_store` 0.14 still asks the metadata server for a
        // token before every PUT and DELETE).
        let anonymous = StaticCredentialProvider::new(GcpCredential {
            bearer: String::new(),
        });
        builder = builder
            .with_base_url(url.trim_end_matches('/'))
            .with_credentials(Arc::new(anonymous));
        if url.starts_with("http://") {
            let allow_http = GoogleConfigKey::Client(ClientConfigKey::AllowHttp);
            builder = builder.with_config(allow_http, "true");
        }
    }
    if let Some(retry) = retry_from_env() {
        builder = builder.with_retry(retry);
    }
    if let Some(headers) = headers {
        let get = |k| builder.get_config_value(&GoogleConfigKey::Client(k));
        let options = options_with_headers(&get, headers);
        builder = builder.with_client_options(options);
    }
    let s = builder.build().map_err(|e| {
        io::Error::other(format!(
            "gs://{bucket}: cannot set up the GCS client ({e}); check the GOOGLE_* variables"
        ))
    })?;
    Ok(Arc::new(s))
}
