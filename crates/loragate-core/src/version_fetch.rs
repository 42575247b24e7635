//! Fetching the files of a version another replica pushed: with a state store shared by replicas, a pushed version's
//! files live in the adapter store of the replica that received the push (its record names that replica, see
//! [`crate::state::RecordedSource::holder`]); every other replica fetches them from it before it serves the version.
//! The coordinator consumes the [`VersionFetcher`] trait defined here; the binary implements it over HTTP
//! (`GET /v1/lora_adapters/{name}/versions/{version}/{file}` on the holder), so the core depends on no front.

use std::fmt;

use async_trait::async_trait;
use futures::stream::BoxStream;

use crate::contract::{AdapterName, AdapterVersion};
use crate::state::ReplicaRecord;

/// Why a file could not be fetched (the holder unreachable, refusing, or the transfer broken): retried, and shown
/// as the adapter's `weights_error` while it lasts.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct FetchError(pub String);

/// A file's bytes as they arrive, in chunks of any size.
pub type FileChunks = BoxStream<'static, Result<Vec<u8>, FetchError>>;

/// Reads a retained version's files from another replica.
#[async_trait]
pub trait VersionFetcher: Send + Sync + fmt::Debug + 'static {
    /// Opens `file` (`adapter_config.json` or `adapter_model.safetensors`) of `name`'s `version` on `holder`; the
    /// returned stream yields its bytes. The caller checks them (header, layout, size and SHA-256).
    async fn fetch(
        &self,
        holder: &ReplicaRecord,
        name: &AdapterName,
        version: AdapterVersion,
        file: &'static str,
    ) -> Result<FileChunks, FetchError>;
}
