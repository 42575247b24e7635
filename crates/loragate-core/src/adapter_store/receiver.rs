//! Receiving one push: the weights counted, bounded and checked as they arrive, hashed and written to a temporary
//! directory by a writer of their own ([`writer`]) while the next bytes are received, then renamed into the store in
//! one step. Dropping a [`Receiver`] before [`Receiver::finish`] removes its temporary directory.

use std::path::{Path, PathBuf};

use sha2::Digest;

use self::writer::BatchWriter;
use super::growing::WriteProgress;
use super::safetensors::{self, AdapterLayout};
use super::{AdapterStore, BlobLease, LayoutCheck, Preparation, PushHeader};
use crate::adapter_source::{AdapterSource, CONFIG_FILE, PreparedLoad, WEIGHTS_FILE};
use crate::contract::{CoreError, Field, Sha256, StateError};

mod writer;

/// Received bytes are gathered up to this size before they go to the writer: one hand-over and one blocking write per
/// this many bytes rather than one per network chunk (HTTP bodies arrive in chunks of a few KiB).
const WRITE_BATCH_BYTES: usize = 1 << 20;

/// A push being received (see the module documentation).
pub struct Receiver {
    store: AdapterStore,
    temp: TempDir,
    /// Hashes and writes the weights file.
    writer: BatchWriter,
    /// Received bytes not handed to the writer yet (fewer than [`WRITE_BATCH_BYTES`] between calls).
    unwritten: Vec<u8>,
    received: u64,
    header: HeaderState,
    declared: PushHeader,
    check: LayoutCheck,
    /// How much of the weights file is written, for a reader of it (see [`super::GrowingFile`]).
    progress: WriteProgress,
    /// The engine's reading of the weights as they arrive, begun once the header is checked, if it reads them so.
    preparation: Option<Preparation>,
    /// What that reading prepares, once begun.
    prepared: Option<PreparedLoad>,
}

impl std::fmt::Debug for Receiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Receiver").field("temp", &self.temp.0).field("received", &self.received).finish()
    }
}

/// How far the safetensors header is.
enum HeaderState {
    /// Not complete yet: its bytes so far (the 8-byte length first).
    Pending(Vec<u8>),
    /// Parsed and checked: the whole file must be this long.
    Checked { file_len: u64 },
}

/// Pushed weights, in the store: what to install, holding the directory against collection until it is installed.
#[derive(Debug)]
pub struct StoredAdapter {
    /// The version's directory in the store, with the weights' digest and size.
    pub source: AdapterSource,
    /// The weights' SHA-256.
    pub sha256: Sha256,
    /// The weights' size in bytes.
    pub bytes: u64,
    /// Keeps the directory from being collected; drop it once the version is installed (or refused).
    pub lease: BlobLease,
    /// Discards what the engine prepared of these weights while they were received (which `source` carries to the
    /// install) when dropped: drop it once the version is installed (or refused).
    pub prepared: PreparedGuard,
}

/// Discards a push's [`PreparedLoad`] when dropped (if the install did not take it), so that the weights it holds are
/// not kept alive by the clones of the version's source that records keep.
#[derive(Debug, Default)]
pub struct PreparedGuard(Option<PreparedLoad>);

impl Drop for PreparedGuard {
    fn drop(&mut self) {
        if let Some(prepared) = &self.0 {
            prepared.discard();
        }
    }
}

/// A temporary directory removed when dropped (unless it was renamed away).
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        if self.0.exists() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

fn store_failed(what: &str, err: std::io::Error) -> CoreError {
    CoreError::State(StateError::Failed(format!("adapter store: {what}: {err}")))
}

impl Receiver {
    pub(super) async fn start(
        store: AdapterStore,
        declared: PushHeader,
        check: LayoutCheck,
    ) -> Result<Self, CoreError> {
        let unique = format!("push-{:016x}", rand::random::<u64>());
        let temp = TempDir(store.dir().join("tmp").join(unique));
        tokio::fs::create_dir(&temp.0).await.map_err(|err| store_failed("creating a temporary directory", err))?;
        let path = temp.0.join(WEIGHTS_FILE);
        let file = std::fs::File::create(&path).map_err(|err| store_failed("creating a temporary file", err))?;
        let progress = WriteProgress::new(path);
        let writer = BatchWriter::start(file, store.is_durable(), progress.report());
        let unwritten = writer.empty_batch(WRITE_BATCH_BYTES);
        Ok(Self {
            store,
            temp,
            writer,
            unwritten,
            received: 0,
            header: HeaderState::Pending(Vec::with_capacity(8)),
            declared,
            check,
            progress,
            preparation: None,
            prepared: None,
        })
    }

    /// Has `preparation` begin reading the weights as they arrive once their header is checked (see
    /// [`Preparation`]).
    pub fn prepared_by(mut self, preparation: Preparation) -> Self {
        self.preparation = Some(preparation);
        self
    }

    /// How many bytes of the weights file were received so far.
    pub fn received(&self) -> u64 {
        self.received
    }

    /// Takes the next bytes of `adapter_model.safetensors`. Refuses, at once: bytes past the limit, past the size
    /// the header or the push declared, and a header that is not a safetensors header of LoRA factors fitting the
    /// model. After an error the receiver must be dropped (nothing of it is kept).
    ///
    /// The bytes are copied into the writer's batches, which it hands back to be filled again: a chunk is never kept
    /// as it came. (A gRPC message's 1 MiB chunk, kept, was a fresh mapping per MiB, page-faulted in and unmapped
    /// again, which cost more than the copy.)
    pub async fn write(&mut self, chunk: &[u8]) -> Result<(), CoreError> {
        if chunk.is_empty() {
            return Ok(());
        }
        let received = self.received + chunk.len() as u64;
        let limit = self.store.max_bytes();
        if received > limit {
            return Err(CoreError::AdapterTooLarge { size: received, limit });
        }
        let expected = match &self.header {
            HeaderState::Checked { file_len } => Some(*file_len),
            HeaderState::Pending(_) => self.declared.total_bytes(),
        };
        if let Some(expected) = expected.filter(|&expected| received > expected) {
            return Err(CoreError::invalid(
                Field::Weights,
                format!("more than the {expected} bytes the file declares were sent"),
            ));
        }
        if let HeaderState::Pending(_) = self.header {
            self.take_header_bytes(chunk)?;
        }
        self.received = received;
        let mut rest = chunk;
        while !rest.is_empty() {
            let take = (WRITE_BATCH_BYTES - self.unwritten.len()).min(rest.len());
            let (now, later) = rest.split_at(take);
            self.unwritten.extend_from_slice(now);
            rest = later;
            if self.unwritten.len() == WRITE_BATCH_BYTES {
                let batch = std::mem::replace(&mut self.unwritten, self.writer.empty_batch(WRITE_BATCH_BYTES));
                self.hand_over(batch).await?;
            }
        }
        Ok(())
    }

    /// Hands `batch` to the writer (waiting while it is behind).
    async fn hand_over(&mut self, batch: Vec<u8>) -> Result<(), CoreError> {
        self.writer.write(batch).await.map_err(|err| store_failed("writing the weights", err))
    }

    /// Feeds the header check with the bytes of `chunk` that belong to the header; checks it once complete.
    fn take_header_bytes(&mut self, chunk: &[u8]) -> Result<(), CoreError> {
        let HeaderState::Pending(pending) = &mut self.header else { return Ok(()) };
        let limit = self.store.max_bytes();
        let mut chunk = chunk;
        if pending.len() < 8 {
            let take = (8 - pending.len()).min(chunk.len());
            pending.extend_from_slice(&chunk[..take]);
            chunk = &chunk[take..];
            if pending.len() < 8 {
                return Ok(());
            }
        }
        let mut first = [0u8; 8];
        first.copy_from_slice(&pending[..8]);
        let header_len = safetensors::header_len(first, limit)?;
        let wanted = usize::try_from(8 + header_len).unwrap_or(usize::MAX);
        let take = (wanted - pending.len()).min(chunk.len());
        pending.extend_from_slice(&chunk[..take]);
        if pending.len() < wanted {
            return Ok(());
        }
        let checked = safetensors::check_header(&pending[8..])?;
        if checked.file_len > limit {
            return Err(CoreError::AdapterTooLarge { size: checked.file_len, limit });
        }
        if let Some(declared) = self.declared.total_bytes().filter(|&declared| declared != checked.file_len) {
            return Err(CoreError::invalid(
                Field::TotalBytes,
                format!("is {declared}, but the safetensors header describes a {}-byte file", checked.file_len),
            ));
        }
        let layout = AdapterLayout { config: self.declared.config.clone(), tensors: checked.tensors };
        (self.check)(&layout)?;
        if let Some(prepare) = &self.preparation {
            self.prepared = prepare(&layout, self.progress.file(checked.file_len));
        }
        self.header = HeaderState::Checked { file_len: checked.file_len };
        Ok(())
    }

    /// Ends the push: checks that the whole file arrived and that its SHA-256 is the declared one, then moves the
    /// version into the store (`blobs/<sha256>-<config>/`) in one rename.
    pub async fn finish(mut self) -> Result<StoredAdapter, CoreError> {
        let file_len = match self.header {
            HeaderState::Checked { file_len } => file_len,
            HeaderState::Pending(_) if self.received == 0 => {
                return Err(CoreError::invalid(Field::Weights, "no bytes were sent"));
            }
            HeaderState::Pending(_) => {
                return Err(CoreError::invalid(
                    Field::Weights,
                    format!("truncated: the body ended after {} bytes, inside the safetensors header", self.received),
                ));
            }
        };
        if self.received != file_len {
            return Err(CoreError::invalid(
                Field::Weights,
                format!("truncated: {} of the {file_len} bytes its header describes were sent", self.received),
            ));
        }
        let rest = std::mem::take(&mut self.unwritten);
        if !rest.is_empty() {
            self.hand_over(rest).await?;
        }
        let sha256 = self.writer.finish().await.map_err(|err| store_failed("writing the weights", err))?;
        if let Some(declared) = self.declared.sha256().filter(|&declared| declared != sha256) {
            return Err(CoreError::invalid(
                Field::Sha256,
                format!("is {declared}, but the bytes sent have SHA-256 {sha256}; nothing was installed"),
            ));
        }
        let config_digest = sha2::Sha256::digest(&self.declared.config_bytes);
        let config_hex: String = config_digest[..8].iter().map(|byte| format!("{byte:02x}")).collect();
        let target = self.store.blobs_dir().join(format!("{sha256}-{config_hex}"));
        let lease = self.store.lease(target.clone());
        let temp = std::mem::replace(&mut self.temp.0, PathBuf::new());
        let config = std::mem::take(&mut self.declared.config_bytes);
        let durable = self.store.is_durable();
        let moved = tokio::task::spawn_blocking({
            let target = target.clone();
            move || move_into_place(&temp, &config, &target, durable)
        })
        .await;
        match moved {
            Ok(Ok(())) => {}
            Ok(Err(err)) => return Err(store_failed("moving the version into place", err)),
            Err(_) => return Err(CoreError::ShuttingDown),
        }
        let bytes = self.received;
        let mut source = AdapterSource::pushed(&target, sha256, bytes);
        let prepared = self.prepared.take();
        if let Some(prepared) = &prepared {
            source = source.with_prepared(prepared.clone());
        }
        Ok(StoredAdapter { source, sha256, bytes, lease, prepared: PreparedGuard(prepared) })
    }
}

/// Writes the config beside the weights in `temp`, then renames `temp` to `target` (or, when `target` holds the same
/// content already, removes `temp`); `durable`: the config is synced to disk before the rename and the rename after
/// it. Blocking.
fn move_into_place(temp: &Path, config: &[u8], target: &Path, durable: bool) -> std::io::Result<()> {
    let _removed_unless_moved = TempDir(temp.to_owned());
    let config_path = temp.join(CONFIG_FILE);
    std::fs::write(&config_path, config)?;
    if durable {
        std::fs::File::open(&config_path)?.sync_all()?;
    }
    // The rename is atomic: a directory under `blobs/` is complete or absent.
    let in_place = |dir: &Path| dir.join(WEIGHTS_FILE).is_file() && dir.join(CONFIG_FILE).is_file();
    if in_place(target) {
        // The same weights and configuration were pushed before: the same content is in place already.
        return Ok(());
    }
    if let Err(err) = std::fs::rename(temp, target) {
        // A push of the same content may have moved its copy into place meanwhile.
        return if in_place(target) { Ok(()) } else { Err(err) };
    }
    if let Some(parent) = target.parent().filter(|_| durable) {
        std::fs::File::open(parent)?.sync_all()?;
    }
    Ok(())
}
