//! A push's body: `adapter_model.safetensors` serialized from tensors or read from a directory, its SHA-256 and size
//! known before the first byte is sent, and the stream of its chunks.

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use futures::Stream;
use safetensors::Dtype;
use safetensors::tensor::View;
use sha2::{Digest, Sha256};

use super::{AdapterPayload, PUSH_CHUNK_BYTES, Tensor, TensorDtype};
use crate::error::ClientError;

/// Where a failed read of the body is left for the push to report.
pub(super) type ReadFailure = Arc<Mutex<Option<ClientError>>>;

/// The body of one push.
pub(super) struct Body {
    /// `adapter_config.json`.
    pub(super) config_json: String,
    /// Hex SHA-256 of the safetensors bytes.
    pub(super) sha256: String,
    /// How many safetensors bytes follow the header.
    pub(super) total_bytes: u64,
    source: Source,
}

enum Source {
    Memory(Vec<u8>),
    File(PathBuf),
}

impl Body {
    /// Serializes the tensors, or reads the directory's config and hashes its safetensors file (off the runtime).
    pub(super) async fn prepare(payload: AdapterPayload) -> Result<Self, ClientError> {
        match payload {
            AdapterPayload::Tensors { config_json, tensors } => {
                let bytes = tokio::task::spawn_blocking(move || serialize(&tensors))
                    .await
                    .map_err(|err| ClientError::Protocol(format!("serializing the tensors panicked: {err}")))??;
                Ok(Self {
                    config_json,
                    sha256: hex(&Sha256::digest(&bytes)),
                    total_bytes: bytes.len() as u64,
                    source: Source::Memory(bytes),
                })
            }
            AdapterPayload::Directory(dir) => tokio::task::spawn_blocking(move || Self::from_directory(&dir))
                .await
                .map_err(|err| ClientError::Protocol(format!("reading the adapter directory panicked: {err}")))?,
        }
    }

    fn from_directory(dir: &Path) -> Result<Self, ClientError> {
        let config_path = dir.join("adapter_config.json");
        let config_json =
            std::fs::read_to_string(&config_path).map_err(|source| ClientError::Io { path: config_path, source })?;
        let weights = dir.join("adapter_model.safetensors");
        let (sha256, total_bytes) =
            hash_file(&weights).map_err(|source| ClientError::Io { path: weights.clone(), source })?;
        Ok(Self { config_json, sha256, total_bytes, source: Source::File(weights) })
    }

    /// The safetensors bytes in chunks of at most [`PUSH_CHUNK_BYTES`]. A file is read chunk by chunk as the
    /// transport asks for them; a read error ends the stream early and is left in `failure`.
    pub(super) fn chunks(self, failure: ReadFailure) -> impl Stream<Item = Vec<u8>> + Send + 'static {
        enum Next {
            Memory(Vec<u8>, usize),
            File(PathBuf, Option<File>),
        }
        let first = match self.source {
            Source::Memory(bytes) => Next::Memory(bytes, 0),
            Source::File(path) => Next::File(path, None),
        };
        futures::stream::unfold(first, move |next| {
            let failure = failure.clone();
            async move {
                match next {
                    Next::Memory(bytes, offset) if offset < bytes.len() => {
                        let end = (offset + PUSH_CHUNK_BYTES).min(bytes.len());
                        let chunk = bytes[offset..end].to_vec();
                        Some((chunk, Next::Memory(bytes, end)))
                    }
                    Next::Memory(..) => None,
                    Next::File(path, file) => {
                        let read = tokio::task::spawn_blocking(move || {
                            let outcome = read_chunk(&path, file);
                            (path, outcome)
                        })
                        .await;
                        match read {
                            Ok((_, Ok(None))) => None,
                            Ok((path, Ok(Some((chunk, file))))) => Some((chunk, Next::File(path, Some(file)))),
                            Ok((path, Err(source))) => {
                                *failure.lock().unwrap_or_else(std::sync::PoisonError::into_inner) =
                                    Some(ClientError::Io { path, source });
                                None
                            }
                            Err(err) => {
                                *failure.lock().unwrap_or_else(std::sync::PoisonError::into_inner) =
                                    Some(ClientError::Protocol(format!("reading the adapter panicked: {err}")));
                                None
                            }
                        }
                    }
                }
            }
        })
    }
}

/// The next chunk of the file (opened on the first call); `None` at its end.
fn read_chunk(path: &Path, file: Option<File>) -> std::io::Result<Option<(Vec<u8>, File)>> {
    let mut file = match file {
        Some(file) => file,
        None => File::open(path)?,
    };
    let mut chunk = Vec::with_capacity(PUSH_CHUNK_BYTES);
    (&mut file).take(PUSH_CHUNK_BYTES as u64).read_to_end(&mut chunk)?;
    Ok((!chunk.is_empty()).then_some((chunk, file)))
}

/// Hex SHA-256 and size of a file, read in chunks.
fn hash_file(path: &Path) -> std::io::Result<(String, u64)> {
    let mut file = File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buffer = vec![0; PUSH_CHUNK_BYTES];
    let mut total = 0u64;
    loop {
        let read = file.read(&mut buffer)?;
        if read == 0 {
            return Ok((hex(&hasher.finalize()), total));
        }
        hasher.update(&buffer[..read]);
        total += read as u64;
    }
}

/// Lower-case hex.
pub(super) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::with_capacity(bytes.len() * 2), |mut text, byte| {
        let _ = write!(text, "{byte:02x}");
        text
    })
}

/// A tensor as safetensors sees it.
struct TensorView<'a>(&'a Tensor);

impl View for TensorView<'_> {
    fn dtype(&self) -> Dtype {
        match self.0.dtype {
            TensorDtype::F32 => Dtype::F32,
            TensorDtype::F16 => Dtype::F16,
            TensorDtype::BF16 => Dtype::BF16,
        }
    }

    fn shape(&self) -> &[usize] {
        &self.0.shape
    }

    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.0.data)
    }

    fn data_len(&self) -> usize {
        self.0.data.len()
    }
}

/// `adapter_model.safetensors` of `tensors` (no metadata, as `safetensors` writes it): the same tensors give the
/// same bytes, in any order. Refuses, naming the tensor, an empty or repeated name and data that does not fill its
/// shape exactly.
pub(super) fn serialize(tensors: &[Tensor]) -> Result<Vec<u8>, ClientError> {
    if tensors.is_empty() {
        return Err(ClientError::invalid("tensors", "no tensors to push"));
    }
    let mut names = BTreeSet::new();
    for tensor in tensors {
        let field = || format!("tensors[{:?}]", tensor.name);
        if tensor.name.is_empty() {
            return Err(ClientError::invalid("tensors", "a tensor has an empty name"));
        }
        if !names.insert(tensor.name.as_str()) {
            return Err(ClientError::invalid(field(), "the name is given twice"));
        }
        let expected = tensor
            .shape
            .iter()
            .try_fold(tensor.dtype.size(), |bytes, &dim| bytes.checked_mul(dim))
            .ok_or_else(|| ClientError::invalid(field(), format!("shape {:?} is too large", tensor.shape)))?;
        if tensor.data.len() != expected {
            return Err(ClientError::invalid(
                field(),
                format!(
                    "{} bytes of data for shape {:?} of {:?} ({expected} bytes)",
                    tensor.data.len(),
                    tensor.shape,
                    tensor.dtype
                ),
            ));
        }
    }
    safetensors::serialize(tensors.iter().map(|tensor| (tensor.name.as_str(), TensorView(tensor))), None)
        .map_err(|err| ClientError::invalid("tensors", format!("cannot be serialized to safetensors: {err}")))
}
