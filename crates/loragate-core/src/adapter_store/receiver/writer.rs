//! The writing side of a push: a thread of the blocking pool that takes the received bytes in batches from a bounded
//! channel, hashes each batch and appends it to the weights file from the same buffer, and has what it wrote synced
//! to disk as it goes (an `fdatasync` on a thread of its own each [`SYNC_EVERY_BYTES`], one at a time, while the
//! writing goes on), so that receiving, hashing, writing and the disk's writeback overlap instead of taking turns, and
//! the final `fsync` of [`BatchWriter::finish`] has little left to flush. Every sync's failure fails the push. A
//! writer for a store that need not be durable (a temporary store, see [`super::AdapterStore::is_durable`]) syncs
//! nothing.

use std::io::Write;
use std::sync::Arc;

use parking_lot::Mutex;
use sha2::Digest;
use tokio::sync::mpsc;

use crate::adapter_store::growing::ProgressReport;
use crate::contract::Sha256;

/// Batches waiting for the writer at most: what a slow disk lets the receiving side run ahead by (with the batch size
/// of the receiver, a few MiB held at most).
const QUEUED_BATCHES: usize = 4;

/// The writer starts a sync of what it wrote so far each time this many more bytes were written (unless one runs).
const SYNC_EVERY_BYTES: u64 = 4 << 20;

/// Written batches kept for the receiver to fill again, at most.
const SPARE_BATCHES: usize = QUEUED_BATCHES + 1;

/// The weights file being written by a thread of its own (see the module documentation).
#[derive(Debug)]
pub(super) struct BatchWriter {
    batches: mpsc::Sender<Vec<u8>>,
    written: tokio::task::JoinHandle<std::io::Result<Sha256>>,
    spare: SpareBatches,
}

/// Batches the writer is done with, for the receiver to fill again: a batch of a MiB is over glibc's mmap threshold
/// (pinned at 128 KiB by `loragate`), so a new one is mapped, page-faulted in page by page and zeroed by the kernel
/// each time (the kernel's page zeroing alone was 12 % of the CPU samples of the real-model push benchmark, single
/// server and fleet; 3 % with the batches reused, and the benchmark's CPU 14 % less). Reused, a push maps a few
/// batches, not one per MiB; they are unmapped with the push.
#[derive(Clone, Debug, Default)]
struct SpareBatches(Arc<Mutex<Vec<Vec<u8>>>>);

impl SpareBatches {
    /// An empty batch with room for `capacity` bytes: a spare one if there is one.
    fn take(&self, capacity: usize) -> Vec<u8> {
        let Some(mut batch) = self.0.lock().pop() else { return Vec::with_capacity(capacity) };
        batch.clear();
        batch.reserve(capacity);
        batch
    }

    /// Keeps `batch` for reuse, unless [`SPARE_BATCHES`] are kept already.
    fn give_back(&self, batch: Vec<u8>) {
        let mut spare = self.0.lock();
        if spare.len() < SPARE_BATCHES {
            spare.push(batch);
        }
    }
}

impl BatchWriter {
    /// Starts the writer of `file` on the blocking pool; `durable`: what it writes is synced to disk; `report`: where
    /// it says how much it wrote (and that it failed).
    pub(super) fn start(file: std::fs::File, durable: bool, report: ProgressReport) -> Self {
        let (batches, queued) = mpsc::channel(QUEUED_BATCHES);
        let spare = SpareBatches::default();
        let written = tokio::task::spawn_blocking({
            let spare = spare.clone();
            move || {
                let written = write_batches(file, queued, durable, &report, &spare);
                if written.is_err() {
                    report.fail();
                }
                written
            }
        });
        Self { batches, written, spare }
    }

    /// An empty batch with room for `capacity` bytes, to fill and hand over: one the writer is done with if there is
    /// one (see [`SpareBatches`]).
    pub(super) fn empty_batch(&self, capacity: usize) -> Vec<u8> {
        self.spare.take(capacity)
    }

    /// Hands `batch` to the writer, waiting while [`QUEUED_BATCHES`] are queued. A writer that failed answers its
    /// error here (or at the latest at [`BatchWriter::finish`]).
    pub(super) async fn write(&mut self, batch: Vec<u8>) -> std::io::Result<()> {
        if self.batches.send(batch).await.is_ok() {
            return Ok(());
        }
        // The writer stopped early: only a failure stops it.
        match (&mut self.written).await {
            Ok(Err(err)) => Err(err),
            Ok(Ok(_)) => Err(std::io::Error::other("the weights' writer stopped early")),
            Err(err) => Err(std::io::Error::other(format!("the weights' writer failed: {err}"))),
        }
    }

    /// Waits for every batch to be hashed and written and (if durable) the file (data and size) synced to disk; the
    /// SHA-256 of every byte written.
    pub(super) async fn finish(self) -> std::io::Result<Sha256> {
        let Self { batches, written, .. } = self;
        drop(batches);
        match written.await {
            Ok(written) => written,
            Err(err) => Err(std::io::Error::other(format!("the weights' writer failed: {err}"))),
        }
    }
}

/// The writer's loop (blocking): hash and append each batch, start a sync every [`SYNC_EVERY_BYTES`]; once the
/// channel is closed, wait for the sync running and sync the whole file (no sync at all unless `durable`). A dropped
/// receiver closes the channel too: what is queued is written to a file whose directory is being removed, and
/// nothing is answered.
fn write_batches(
    mut file: std::fs::File,
    mut queued: mpsc::Receiver<Vec<u8>>,
    durable: bool,
    report: &ProgressReport,
    spare: &SpareBatches,
) -> std::io::Result<Sha256> {
    let mut hasher = sha2::Sha256::new();
    let mut total = 0u64;
    let mut unsynced = 0u64;
    let mut syncing: Option<std::thread::JoinHandle<std::io::Result<()>>> = None;
    while let Some(batch) = queued.blocking_recv() {
        hasher.update(&batch);
        file.write_all(&batch)?;
        let len = batch.len() as u64;
        // Given back before it is reported written: whoever sees it written finds it spare.
        spare.give_back(batch);
        total += len;
        report.wrote(total);
        unsynced += len;
        if durable && unsynced >= SYNC_EVERY_BYTES && syncing.as_ref().is_none_or(std::thread::JoinHandle::is_finished)
        {
            if let Some(done) = syncing.take() {
                joined(done)?;
            }
            // The same open file: a failure is reported to this sync only, so its result is collected.
            let synced = file.try_clone()?;
            syncing = Some(std::thread::spawn(move || synced.sync_data()));
            unsynced = 0;
        }
    }
    if let Some(running) = syncing.take() {
        joined(running)?;
    }
    if durable {
        file.sync_all()?;
    }
    Ok(Sha256(hasher.finalize().into()))
}

/// The result of a finished (or finishing) sync thread.
fn joined(sync: std::thread::JoinHandle<std::io::Result<()>>) -> std::io::Result<()> {
    sync.join().unwrap_or_else(|_| Err(std::io::Error::other("a sync of the weights panicked")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adapter_store::growing::WriteProgress;

    #[tokio::test]
    async fn the_digest_is_of_every_byte_written_in_order_and_the_file_holds_them() {
        for durable in [true, false] {
            let dir = tempfile::tempdir().expect("temp dir");
            let path = dir.path().join("weights");
            let batches: Vec<Vec<u8>> =
                (0..12u8).map(|index| vec![index; (1 << 20) + usize::from(index)]).chain([vec![7; 3]]).collect();
            let len = batches.iter().map(Vec::len).sum::<usize>() as u64;
            let mut progress = WriteProgress::new(path.clone());
            let growing = progress.file(len);
            let file = std::fs::File::create(&path).expect("created");
            let mut writer = BatchWriter::start(file, durable, progress.report());
            let mut expected = sha2::Sha256::new();
            for batch in &batches {
                expected.update(batch);
                writer.write(batch.clone()).await.expect("queued");
            }
            let sha256 = writer.finish().await.expect("written (and synced if durable)");
            assert_eq!(sha256, Sha256(expected.finalize().into()), "durable: {durable}");
            assert_eq!(std::fs::read(&path).expect("read back"), batches.concat(), "durable: {durable}");
            assert!(growing.wait_written(len).is_ok(), "every byte was reported written");
        }
    }

    #[tokio::test]
    async fn a_written_batch_is_filled_again_rather_than_a_new_one_mapped() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("weights");
        let mut progress = WriteProgress::new(path.clone());
        let growing = progress.file(3 << 20);
        let mut writer = BatchWriter::start(std::fs::File::create(&path).expect("created"), false, progress.report());
        let mut batch = writer.empty_batch(1 << 20);
        batch.resize(1 << 20, 7);
        let first = batch.as_ptr();
        writer.write(batch).await.expect("queued");
        tokio::task::spawn_blocking(move || growing.wait_written(1 << 20)).await.expect("joined").expect("written");
        let again = writer.empty_batch(1 << 20);
        assert_eq!(again.as_ptr(), first, "the written batch's buffer is reused");
        assert!(again.is_empty() && again.capacity() >= 1 << 20);
        let other = writer.empty_batch(1 << 20);
        assert_ne!(other.as_ptr(), first, "and handed out once");
    }

    #[tokio::test]
    async fn a_write_that_fails_fails_the_writer() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("weights");
        std::fs::write(&path, b"").expect("created");
        // Opened for reading only: every write fails.
        let mut progress = WriteProgress::new(path.clone());
        let growing = progress.file(1 << 10);
        let mut writer = BatchWriter::start(std::fs::File::open(&path).expect("opened"), true, progress.report());
        let mut failed = false;
        for _ in 0..(QUEUED_BATCHES + 2) {
            if writer.write(vec![1; 1 << 10]).await.is_err() {
                failed = true;
                break;
            }
        }
        // The failure is answered by a later write (once the writer stopped) or at the latest by the finish.
        assert!(failed || writer.finish().await.is_err());
        assert!(growing.wait_written(1).is_err(), "a reader of the file is told it failed");
    }
}
