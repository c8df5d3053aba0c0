//! Azure Blob Storage: `az://container/key`, served by the shared object-store code of
//! [`super::s3`]; this file makes only the client.
//!
//! Credentials and endpoint as `object_store` reads them from the environment:
//! `AZURE_STORAGE_ACCOUNT_NAME` with `AZURE_STORAGE_ACCOUNT_KEY`, `AZURE_STORAGE_SAS_KEY` or
//! `AZURE_STORAGE_TOKEN`, or a service principal (`AZURE_STORAGE_CLIENT_ID`,
//! `AZURE_STORAGE_CLIENT_SECRET`, `AZURE_STORAGE_TENANT_ID`), else the instance's managed
//! identity; `AZURE_STORAGE_ENDPOINT` for another endpoint; `AZURE_STORAGE_USE_EMULATOR=true`
//! for Azurite (its well-known account, at `AZURITE_BLOB_STORAGE_URL`, else
//! `http://127.0.0.1:10000`).

use std::io;
use std::sync::Arc;

use object_store::azure::{AzureConfigKey, MicrosoftAzureBuilder};

use super::s3::{options_with_headers, retry_from_env, Client, Scheme};

/// The scheme: `az://container/key`.
pub static AZURE: Scheme = Scheme {
    name: "az",
    bucket: "container",
    credentials: "AZURE_STORAGE_ACCOUNT_NAME, AZURE_STORAGE_ACCOUNT_KEY, AZURE_STORAGE_SAS_KEY",
    client,
    // Its client signs a request before it adds the extra headers: a create-only multipart
    // upload is completed at a side name and copied to its object with `If-None-Match: *`.
    create_only: None,
    // An "upload" is uncommitted blocks of the blob, which Azure discards itself after 7 days.
    uploads: None,
    // object_store signs no condition on a delete here: a removal is plain.
    delete_if: None,
    location: &[
        "AZURE_STORAGE_ACCOUNT_NAME",
        "AZURE_STORAGE_ENDPOINT",
        "AZURE_STORAGE_USE_EMULATOR",
        "AZURITE_BLOB_STORAGE_URL",
    ],
};

/// The client of `container`, from the environment.
///
/// # Errors
/// No account is named, or the credentials cannot be read.
fn client(
    container: &str,
    headers: Option<object_store::HeaderMap>,
) -> io::Result<Arc<dyn Client>> {
    let mut builder = MicrosoftAzureBuilder::from_env().with_container_name(container);
    let endpoint = std::env::var("AZURE_STORAGE_ENDPOINT").unwrap_or_default();
    if endpoint.starts_with("http://") {
        // A store on the local network or loopback without TLS: the user named it so.
        builder = builder.with_allow_http(true);
    }
    if let Some(retry) = retry_from_env() {
        builder = builder.with_retry(retry);
    }
    if let Some(headers) = headers {
        let get = |k| builder.get_config_value(&AzureConfigKey::Client(k));
        let options = options_with_headers(&get, headers);
        builder = builder.with_client_options(options);
    }
    let s = builder.build().map_err(|e| {
        io::Error::other(format!(
            "az://{container}: cannot set up the Azure client ({e}); check the AZURE_STORAGE_* variables"
        ))
    })?;
    Ok(Arc::new(s))
}
