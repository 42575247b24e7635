//! How a replica fetches a version another replica pushed (the core's [`VersionFetcher`]): over HTTP, from the
//! holder's `GET /v1/lora_adapters/{name}/versions/{version}/{file}`, presenting this server's own `--admin-key` (the
//! replicas sharing a state store are expected to share it; without one, no key is sent). The holder's address is
//! the `http_addr` it announced (`ListReplicas`).

use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use loragate_core::{AdapterName, AdapterVersion, FetchError, FileChunks, Key, ReplicaRecord, VersionFetcher};

/// How long connecting to the holder may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the holder may send nothing while a file is read.
const READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Fetches version files from other replicas over HTTP.
#[derive(Debug)]
pub(crate) struct HttpVersionFetcher {
    client: reqwest::Client,
    admin_key: Option<Key>,
}

impl HttpVersionFetcher {
    /// A fetcher presenting `admin_key` (this server's `--admin-key`), if any.
    pub(crate) fn new(admin_key: Option<Key>) -> Result<Self, reqwest::Error> {
        let client = reqwest::Client::builder().connect_timeout(CONNECT_TIMEOUT).read_timeout(READ_TIMEOUT).build()?;
        Ok(Self { client, admin_key })
    }
}

#[async_trait]
impl VersionFetcher for HttpVersionFetcher {
    async fn fetch(
        &self,
        holder: &ReplicaRecord,
        name: &AdapterName,
        version: AdapterVersion,
        file: &'static str,
    ) -> Result<FileChunks, FetchError> {
        let failed = |what: String| FetchError(format!("replica {} at {}: {what}", holder.id, holder.http_addr));
        let mut url = reqwest::Url::parse(&format!("http://{}/", holder.http_addr))
            .map_err(|err| failed(format!("not an HTTP address: {err}")))?;
        url.path_segments_mut().map_err(|()| failed("not an HTTP address".into()))?.clear().extend([
            "v1",
            "lora_adapters",
            name.as_str(),
            "versions",
            &version.0.to_string(),
            file,
        ]);
        let mut request = self.client.get(url);
        if let Some(key) = &self.admin_key {
            request = request.bearer_auth(key.expose_secret());
        }
        let response = request.send().await.map_err(|err| failed(format!("GET {file}: {err}")))?;
        let status = response.status();
        if !status.is_success() {
            let body = response.text().await.unwrap_or_default();
            let excerpt: String = body.chars().take(300).collect();
            return Err(failed(format!("GET {file} answered {status}: {excerpt}")));
        }
        let holder = (holder.id.clone(), holder.http_addr.clone());
        Ok(response
            .bytes_stream()
            .map(move |chunk| {
                chunk
                    .map(|bytes| bytes.to_vec())
                    .map_err(|err| FetchError(format!("replica {} at {}: reading {file}: {err}", holder.0, holder.1)))
            })
            .boxed())
    }
}
