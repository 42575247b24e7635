//! How an adapter version's files reach a worker: a [`Delivery`] is the path the workers read (as they see it) and,
//! for a version pushed to the coordinator, its files in the coordinator's adapter store, which the coordinator
//! streams to each worker itself (a `loragate worker` over its gRPC channel, an HTTP worker through its
//! `loragate agent`), with the SHA-256 every receiver must answer.

use std::path::PathBuf;

use futures::stream::{BoxStream, StreamExt};
use loragate_core::{AdapterSource, CONFIG_FILE, Sha256, WEIGHTS_FILE};

use crate::worker::WorkerError;

/// The size of the chunks the weights are streamed in: under glibc's mmap threshold, which the server pins at 128 KiB
/// (`loragate::return_large_frees_to_the_os`), so that the read buffers, the encoded messages and a `loragate
/// worker`'s decoded chunks come from the heap and are reused, not mapped, page-faulted in and unmapped again for
/// every chunk (with 1 MiB chunks that churn was about a third of a fleet coordinator's CPU time during a push).
const CHUNK_BYTES: usize = 64 * 1024;

/// How many chunks the reader reads ahead of the slowest point of the stream.
const CHUNKS_AHEAD: usize = 16;

/// What a worker needs to load one adapter version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Delivery {
    /// The directory as the workers see it (what is sent where no push is possible).
    path: String,
    /// For a pushed version, its files in the coordinator's store.
    pushed: Option<PushedFiles>,
}

/// A pushed version's files in the coordinator's adapter store (never changed once there), with their identity.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PushedFiles {
    dir: PathBuf,
    sha256: Sha256,
    bytes: u64,
}

impl Delivery {
    /// The delivery of `source`, whose directory the workers see as `path`.
    pub(crate) fn of(source: &AdapterSource, path: String) -> Self {
        // A pushed source's digest is known since it was received: this reads no file.
        let pushed = source.is_pushed().then(|| source.digest().ok()).flatten().map(|(sha256, bytes)| PushedFiles {
            dir: source.dir().to_owned(),
            sha256,
            bytes,
        });
        Self { path, pushed }
    }

    /// A version read from `path` by the workers (no push).
    #[cfg(test)]
    pub(crate) fn path_only(path: impl Into<String>) -> Self {
        Self { path: path.into(), pushed: None }
    }

    /// The directory as the workers see it.
    pub(crate) fn path(&self) -> &str {
        &self.path
    }

    /// The pushed files, for a pushed version.
    pub(crate) fn pushed(&self) -> Option<&PushedFiles> {
        self.pushed.as_ref()
    }

    /// Whether a copy a worker holds, loaded from `reported` (the source it reports), is this version's: loaded from
    /// its path, or pushed with its SHA-256 (a `loragate worker` reports `push:SHA256`). A copy an agent wrote is
    /// not recognised and is delivered again.
    pub(crate) fn is_held_as(&self, reported: Option<&str>) -> bool {
        let Some(reported) = reported else { return false };
        reported == self.path
            || self.pushed.as_ref().is_some_and(|pushed| reported == format!("push:{}", pushed.sha256))
    }
}

impl PushedFiles {
    /// The SHA-256 of `adapter_model.safetensors`.
    pub(crate) fn sha256(&self) -> Sha256 {
        self.sha256
    }

    /// The size of `adapter_model.safetensors`.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The text of `adapter_config.json`.
    pub(crate) async fn config_json(&self) -> Result<String, WorkerError> {
        tokio::fs::read_to_string(self.dir.join(CONFIG_FILE))
            .await
            .map_err(|err| WorkerError::Unavailable(format!("reading the pushed {CONFIG_FILE}: {err}")))
    }

    /// The bytes of `adapter_model.safetensors`, in chunks of [`CHUNK_BYTES`], read by one blocking task of their
    /// own a few chunks ahead of the stream (not one blocking call per chunk). A read failing midway ends the stream
    /// early (the receiver then refuses the truncated file by the size and SHA-256 it was told); so does dropping
    /// the stream, which stops the reader.
    pub(crate) async fn weights(&self) -> Result<BoxStream<'static, Vec<u8>>, WorkerError> {
        let path = self.dir.join(WEIGHTS_FILE);
        let file = tokio::task::spawn_blocking(move || std::fs::File::open(path))
            .await
            .map_err(|err| WorkerError::Unavailable(err.to_string()))?
            .map_err(|err| WorkerError::Unavailable(format!("reading the pushed {WEIGHTS_FILE}: {err}")))?;
        let (chunks, received) = tokio::sync::mpsc::channel(CHUNKS_AHEAD);
        tokio::task::spawn_blocking(move || read_chunks(file, &chunks));
        Ok(tokio_stream::wrappers::ReceiverStream::new(received).boxed())
    }

    /// Checks what a receiver answered having stored the push: the SHA-256 (and size, if it says) it computed must be
    /// the pushed ones, else the delivery failed (no silent partial delivery).
    pub(crate) fn check_receipt(&self, sha256: &str, bytes: Option<u64>) -> Result<(), WorkerError> {
        if !sha256.eq_ignore_ascii_case(&self.sha256.to_string()) {
            return Err(WorkerError::Malformed(format!(
                "it answered SHA-256 {sha256:?} for pushed weights whose SHA-256 is {}; not installed",
                self.sha256
            )));
        }
        if let Some(bytes) = bytes.filter(|&bytes| bytes != self.bytes) {
            return Err(WorkerError::Malformed(format!(
                "it answered {bytes} bytes for pushed weights of {} bytes; not installed",
                self.bytes
            )));
        }
        Ok(())
    }
}

/// Reads `file` in chunks of [`CHUNK_BYTES`] into `chunks` until its end, a read error (logged; the stream ends
/// early) or the stream's end being dropped. Blocking.
fn read_chunks(mut file: std::fs::File, chunks: &tokio::sync::mpsc::Sender<Vec<u8>>) {
    use std::io::Read;
    loop {
        // Read into the chunk's spare capacity: nothing zeroed first.
        let mut chunk = Vec::with_capacity(CHUNK_BYTES);
        let len = match (&mut file).take(CHUNK_BYTES as u64).read_to_end(&mut chunk) {
            Ok(0) => return,
            Ok(len) => len,
            Err(err) if err.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(err) => {
                tracing::warn!(%err, "reading pushed weights failed midway; the push ends truncated");
                return;
            }
        };
        debug_assert_eq!(chunk.len(), len);
        if chunks.blocking_send(chunk).is_err() {
            return; // the delivery ended
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pushed() -> Delivery {
        let sha256 = Sha256([7; 32]);
        Delivery::of(&AdapterSource::pushed("/store/blobs/x", sha256, 42), "/store/blobs/x".into())
    }

    #[test]
    fn a_receipt_with_another_digest_or_size_fails_the_delivery() {
        let delivery = pushed();
        let files = delivery.pushed().expect("pushed");
        let sha = files.sha256().to_string();
        files.check_receipt(&sha, Some(42)).expect("the pushed digest and size");
        files.check_receipt(&sha.to_uppercase(), None).expect("hex in either case, size unsaid");
        let other = Sha256([8; 32]).to_string();
        assert!(matches!(files.check_receipt(&other, Some(42)), Err(WorkerError::Malformed(_))));
        assert!(matches!(files.check_receipt("", None), Err(WorkerError::Malformed(_))), "no digest is a failure");
        assert!(matches!(files.check_receipt(&sha, Some(41)), Err(WorkerError::Malformed(_))));
    }

    #[tokio::test]
    async fn the_weights_stream_in_chunks_under_the_mmap_threshold_and_end_with_the_file() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let weights: Vec<u8> = (0..CHUNK_BYTES * 5 / 2 + 7).map(|index| (index * 31 % 251) as u8).collect();
        std::fs::write(dir.path().join(WEIGHTS_FILE), &weights).expect("written");
        let source = AdapterSource::pushed(dir.path(), Sha256([7; 32]), weights.len() as u64);
        let delivery = Delivery::of(&source, dir.path().to_string_lossy().into_owned());
        let files = delivery.pushed().expect("pushed");
        let chunks: Vec<Vec<u8>> = files.weights().await.expect("opened").collect().await;
        assert_eq!(chunks.len(), 3);
        assert!(chunks.iter().all(|chunk| chunk.len() <= CHUNK_BYTES && CHUNK_BYTES < 128 * 1024));
        assert_eq!(chunks.concat(), weights);
    }

    #[tokio::test]
    async fn a_reader_whose_stream_was_dropped_stops() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join(WEIGHTS_FILE);
        std::fs::write(&path, vec![1u8; CHUNK_BYTES * (CHUNKS_AHEAD + 4)]).expect("written");
        let file = std::fs::File::open(&path).expect("opened");
        let (chunks, mut received) = tokio::sync::mpsc::channel(CHUNKS_AHEAD);
        let reader = tokio::task::spawn_blocking(move || read_chunks(file, &chunks));
        assert_eq!(received.recv().await.map(|chunk| chunk.len()), Some(CHUNK_BYTES));
        drop(received);
        // More chunks remain than the channel holds: only the dropped end stops the reader.
        tokio::time::timeout(std::time::Duration::from_secs(30), reader)
            .await
            .expect("the reader stopped")
            .expect("the reader did not panic");
    }

    #[test]
    fn held_copies_are_recognised_by_path_or_pushed_digest() {
        let delivery = pushed();
        let sha = Sha256([7; 32]);
        assert!(delivery.is_held_as(Some("/store/blobs/x")));
        assert!(delivery.is_held_as(Some(&format!("push:{sha}"))));
        assert!(!delivery.is_held_as(Some(&format!("push:{}", Sha256([8; 32])))));
        assert!(!delivery.is_held_as(Some("/agent/meow@1")) && !delivery.is_held_as(None));
        let by_path = Delivery::path_only("/adapters/meow");
        assert!(by_path.pushed().is_none() && by_path.is_held_as(Some("/adapters/meow")));
        assert!(!by_path.is_held_as(Some(&format!("push:{sha}"))));
    }
}
