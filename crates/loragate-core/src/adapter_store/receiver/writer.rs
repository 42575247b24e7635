//! The writing side of a push: a thread of the blocking pool that takes the received bytes in batches from a bounded
//! channel, hashes each batch and appends it to the weights file from the same buffer, and has what it wrote synced
//! to disk as it goes (an `fdatasync` on a thread of its own each [`SYNC_EVERY_BYTES`], one at a time, while the
//! writing goes on), so that receiving, hashing, writing and the disk's writeback overlap instead of taking turns, and
//! the final `fsync` of [`BatchWriter::finish`] has little left to flush. Every sync's failure fails the push. A
//! writer for a store that need not be durable (a temporary store, see [`super::AdapterStore::is_durable`]) syncs
//! nothing.

use std::io::Write;

use sha2::Digest;
use tokio::sync::mpsc;

use crate::adapter_store::growing::ProgressReport;
use crate::contract::Sha256;

/// Batches waiting for the writer at most: what a slow disk lets the receiving side run ahead by (with the batch size
/// of the receiver, a few MiB held at most).
const QUEUED_BATCHES: usize = 4;

/// The writer starts a sync of what it wrote so far each time this many more bytes were written (unless one runs).
const SYNC_EVERY_BYTES: u64 = 4 << 20;

/// The weights file being written by a thread of its own (see the module documentation).
#[derive(Debug)]
pub(super) struct BatchWriter {
    batches: mpsc::Sender<Vec<u8>>,
    written: tokio::task::JoinHandle<std::io::Result<Sha256>>,
}

impl BatchWriter {
    /// Starts the writer of `file` on the blocking pool; `durable`: what it writes is synced to disk; `report`: where
    /// it says how much it wrote (and that it failed).
    pub(super) fn start(file: std::fs::File, durable: bool, report: ProgressReport) -> Self {
        let (batches, queued) = mpsc::channel(QUEUED_BATCHES);
        let written = tokio::task::spawn_blocking(move || {
            let written = write_batches(file, queued, durable, &report);
            if written.is_err() {
                report.fail();
            }
            written
        });
        Self { batches, written }
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
        let Self { batches, written } = self;
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
) -> std::io::Result<Sha256> {
    let mut hasher = sha2::Sha256::new();
    let mut total = 0u64;
    let mut unsynced = 0u64;
    let mut syncing: Option<std::thread::JoinHandle<std::io::Result<()>>> = None;
    while let Some(batch) = queued.blocking_recv() {
        hasher.update(&batch);
        file.write_all(&batch)?;
        total += batch.len() as u64;
        report.wrote(total);
        unsynced += batch.len() as u64;
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
