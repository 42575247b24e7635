//! A push's body: `adapter_model.safetensors` serialized from tensors, its SHA-256 and size known before the first
//! byte is sent, or read from a directory in one pass, hashed as it is sent (its size known from the file), and the
//! stream of its chunks.

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use bytes::Bytes;
use futures::Stream;
use safetensors::Dtype;
use safetensors::tensor::View;
use sha2::{Digest, Sha256};

use super::{AdapterPayload, PUSH_CHUNK_BYTES, Tensor, TensorDtype};
use crate::error::ClientError;

/// Where a failed read of the body is left for the push to report.
pub(super) type ReadFailure = Arc<Mutex<Option<ClientError>>>;

/// Where the SHA-256 of a file's bytes is left once the last of them was read (and the file found unchanged).
pub(super) type StreamedDigest = Arc<Mutex<Option<String>>>;

/// The body of one push.
pub(super) struct Body {
    /// `adapter_config.json`.
    pub(super) config_json: String,
    /// Hex SHA-256 of the safetensors bytes, when known before they are sent (tensors serialized here); a file's is
    /// computed as it is read and sent (see [`Body::chunks`]).
    pub(super) sha256: Option<String>,
    /// How many safetensors bytes follow the header.
    pub(super) total_bytes: u64,
    source: Source,
}

enum Source {
    Memory(Bytes),
    File(OpenedFile),
}

/// The weights file, opened, with what identifies its content when it was opened.
struct OpenedFile {
    path: PathBuf,
    file: File,
    identity: FileIdentity,
}

/// What tells that a file was rewritten or replaced: its size, modification time and (on Unix) inode.
#[derive(Debug, PartialEq, Eq)]
struct FileIdentity {
    len: u64,
    modified: Option<SystemTime>,
    inode: Option<(u64, u64)>,
}

impl FileIdentity {
    fn of(metadata: &std::fs::Metadata) -> Self {
        #[cfg(unix)]
        let inode = {
            use std::os::unix::fs::MetadataExt;
            Some((metadata.dev(), metadata.ino()))
        };
        #[cfg(not(unix))]
        let inode = None;
        Self { len: metadata.len(), modified: metadata.modified().ok(), inode }
    }
}

impl Body {
    /// Serializes the tensors, or opens the directory's safetensors file and reads its config (off the runtime).
    pub(super) async fn prepare(payload: AdapterPayload) -> Result<Self, ClientError> {
        match payload {
            AdapterPayload::Tensors { config_json, tensors } => {
                let bytes = tokio::task::spawn_blocking(move || serialize(&tensors))
                    .await
                    .map_err(|err| ClientError::Protocol(format!("serializing the tensors panicked: {err}")))??;
                Ok(Self {
                    config_json,
                    sha256: Some(hex(&Sha256::digest(&bytes))),
                    total_bytes: bytes.len() as u64,
                    source: Source::Memory(bytes.into()),
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
        let path = dir.join("adapter_model.safetensors");
        let io = |source| ClientError::Io { path: path.clone(), source };
        let file = File::open(&path).map_err(io)?;
        let identity = FileIdentity::of(&file.metadata().map_err(io)?);
        Ok(Self {
            config_json,
            sha256: None,
            total_bytes: identity.len,
            source: Source::File(OpenedFile { path, file, identity }),
        })
    }

    /// The safetensors bytes in chunks of at most [`PUSH_CHUNK_BYTES`]. A file is read chunk by chunk as the
    /// transport asks for them and hashed as it is read; before its last chunk goes out the file is checked
    /// unchanged since it was opened (size, modification time, inode), and its SHA-256 is left in `digest`. A read
    /// error or a changed file ends the stream early (the server refuses the short body, so nothing is installed)
    /// and is left in `failure`.
    pub(super) fn chunks(
        self,
        failure: ReadFailure,
        digest: StreamedDigest,
    ) -> impl Stream<Item = Bytes> + Send + 'static {
        enum Next {
            Memory(Bytes, usize),
            File(Box<FileReader>),
            Done,
        }
        let first = match self.source {
            Source::Memory(bytes) => Next::Memory(bytes, 0),
            Source::File(opened) => Next::File(Box::new(FileReader::new(opened))),
        };
        futures::stream::unfold(first, move |next| {
            let failure = failure.clone();
            let digest = digest.clone();
            async move {
                match next {
                    Next::Memory(bytes, offset) if offset < bytes.len() => {
                        let end = (offset + PUSH_CHUNK_BYTES).min(bytes.len());
                        let chunk = bytes.slice(offset..end);
                        Some((chunk, Next::Memory(bytes, end)))
                    }
                    Next::Memory(..) | Next::Done => None,
                    Next::File(mut reader) => {
                        let read = tokio::task::spawn_blocking(move || {
                            let outcome = reader.next_chunk();
                            (reader, outcome)
                        })
                        .await;
                        let fail = |error| {
                            *failure.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(error);
                            None
                        };
                        match read {
                            Ok((_, Ok(None))) => None,
                            Ok((reader, Ok(Some(chunk)))) => {
                                if let Some(sha256) = reader.digest() {
                                    *digest.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(sha256);
                                    return Some((chunk.into(), Next::Done));
                                }
                                Some((chunk.into(), Next::File(reader)))
                            }
                            Ok((_, Err(error))) => fail(error),
                            Err(err) => fail(ClientError::Protocol(format!("reading the adapter panicked: {err}"))),
                        }
                    }
                }
            }
        })
    }
}

/// Reads an opened weights file chunk by chunk, hashing what it read (blocking).
struct FileReader {
    opened: OpenedFile,
    hasher: Sha256,
    read: u64,
    /// The hex SHA-256, once the last chunk was read and the file found unchanged.
    digest: Option<String>,
}

impl FileReader {
    fn new(opened: OpenedFile) -> Self {
        Self { opened, hasher: Sha256::new(), read: 0, digest: None }
    }

    /// The file's SHA-256, once its last chunk was read.
    fn digest(&self) -> Option<String> {
        self.digest.clone()
    }

    /// The next chunk (`None` once the file was read whole). The last one is answered only if the file is unchanged
    /// since it was opened: rewritten, grown, shrunk or replaced is an error.
    fn next_chunk(&mut self) -> Result<Option<Vec<u8>>, ClientError> {
        let total = self.opened.identity.len;
        let remaining = total - self.read;
        if remaining == 0 && self.digest.is_some() {
            return Ok(None);
        }
        let want = usize::try_from(remaining).unwrap_or(usize::MAX).min(PUSH_CHUNK_BYTES);
        let mut chunk = Vec::with_capacity(want);
        (&mut self.opened.file).take(want as u64).read_to_end(&mut chunk).map_err(|source| self.io(source))?;
        self.read += chunk.len() as u64;
        if chunk.len() < want {
            return Err(self.changed(format!("it ended after {} of its {total} bytes", self.read)));
        }
        self.hasher.update(&chunk);
        if self.read == total {
            self.check_unchanged()?;
            self.digest = Some(hex(&std::mem::take(&mut self.hasher).finalize()));
        }
        Ok(Some(chunk))
    }

    /// Fails unless the open file and the file at its path are still the file opened, as it was.
    fn check_unchanged(&mut self) -> Result<(), ClientError> {
        let mut probe = [0u8; 1];
        if self.opened.file.read(&mut probe).map_err(|source| self.io(source))? != 0 {
            return Err(self.changed("it grew while it was read".to_owned()));
        }
        let open = FileIdentity::of(&self.opened.file.metadata().map_err(|source| self.io(source))?);
        let at_path = FileIdentity::of(&std::fs::metadata(&self.opened.path).map_err(|source| self.io(source))?);
        if open != self.opened.identity || at_path != self.opened.identity {
            return Err(self.changed("it was modified or replaced while it was read".to_owned()));
        }
        Ok(())
    }

    fn io(&self, source: std::io::Error) -> ClientError {
        ClientError::Io { path: self.opened.path.clone(), source }
    }

    fn changed(&self, why: String) -> ClientError {
        self.io(std::io::Error::other(format!("the file changed during the push ({why}); nothing was installed")))
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
