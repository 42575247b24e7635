//! The writing side of a push: a thread of the blocking pool that takes the received bytes in batches from a queue
//! bounded in bytes ([`QUEUED_BYTES`]), hashes each batch and appends it to the weights file from the same buffer, and has what it wrote synced
//! to disk as it goes (an `fdatasync` on a thread of its own each [`SYNC_EVERY_BYTES`], one at a time, while the
//! writing goes on), so that receiving, hashing, writing and the disk's writeback overlap instead of taking turns, and
//! the final `fsync` of [`BatchWriter::finish`] has little left to flush. Every sync's failure fails the push. A
//! writer for a store that need not be durable (a temporary store, see [`super::AdapterStore::is_durable`]) syncs
//! nothing.

use std::io::Write;
use std::sync::Arc;

use sha2::Digest;
use tokio::sync::{Semaphore, mpsc};

use crate::contract::Sha256;

/// Bytes waiting for the writer at most: what a slow disk lets the receiving side run ahead by, whatever the batches'
/// sizes (a batch larger than this waits until nothing is queued).
const QUEUED_BYTES: usize = 4 << 20;

/// The unit of [`QUEUED_BYTES`]: one permit of the queue's semaphore.
const PERMIT_BYTES: usize = 1 << 10;

/// The permits of the whole queue.
const QUEUE_PERMITS: usize = QUEUED_BYTES / PERMIT_BYTES;

/// The writer starts a sync of what it wrote so far each time this many more bytes were written (unless one runs).
const SYNC_EVERY_BYTES: u64 = 4 << 20;

/// The weights file being written by a thread of its own (see the module documentation).
#[derive(Debug)]
pub(super) struct BatchWriter {
    /// Each batch with the permits of [`BatchWriter::room`] it holds until written.
    batches: mpsc::UnboundedSender<(Vec<u8>, u32)>,
    /// The queue's room, in permits of [`PERMIT_BYTES`]; closed once the writer stopped.
    room: Arc<Semaphore>,
    written: tokio::task::JoinHandle<std::io::Result<Sha256>>,
}

impl BatchWriter {
    /// Starts the writer of `file` on the blocking pool; `durable`: what it writes is synced to disk.
    pub(super) fn start(file: std::fs::File, durable: bool) -> Self {
        let (batches, queued) = mpsc::unbounded_channel();
        let room = Arc::new(Semaphore::new(QUEUE_PERMITS));
        let written = tokio::task::spawn_blocking({
            let room = Arc::clone(&room);
            move || {
                // However the writer ends, a batch waiting for room learns it at once.
                let _closed = CloseOnDrop(&room);
                write_batches(file, queued, durable, &room)
            }
        });
        Self { batches, room, written }
    }

    /// Hands `batch` to the writer, waiting while [`QUEUED_BYTES`] are queued. A writer that failed answers its
    /// error here (or at the latest at [`BatchWriter::finish`]).
    pub(super) async fn write(&mut self, batch: Vec<u8>) -> std::io::Result<()> {
        let permits = batch.len().div_ceil(PERMIT_BYTES).clamp(1, QUEUE_PERMITS);
        let permits = u32::try_from(permits).unwrap_or(u32::MAX);
        if let Ok(taken) = self.room.acquire_many(permits).await {
            // Given back by the writer once the batch is written.
            taken.forget();
            if self.batches.send((batch, permits)).is_ok() {
                return Ok(());
            }
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
        let Self { batches, written, room: _ } = self;
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
    mut queued: mpsc::UnboundedReceiver<(Vec<u8>, u32)>,
    durable: bool,
    room: &Semaphore,
) -> std::io::Result<Sha256> {
    let mut hasher = sha2::Sha256::new();
    let mut unsynced = 0u64;
    let mut syncing: Option<std::thread::JoinHandle<std::io::Result<()>>> = None;
    while let Some((batch, permits)) = queued.blocking_recv() {
        hasher.update(&batch);
        file.write_all(&batch)?;
        unsynced += batch.len() as u64;
        drop(batch);
        room.add_permits(permits as usize);
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

/// Closes the queue's semaphore when dropped (the writer stopped).
struct CloseOnDrop<'a>(&'a Semaphore);

impl Drop for CloseOnDrop<'_> {
    fn drop(&mut self) {
        self.0.close();
    }
}

/// The result of a finished (or finishing) sync thread.
fn joined(sync: std::thread::JoinHandle<std::io::Result<()>>) -> std::io::Result<()> {
    sync.join().unwrap_or_else(|_| Err(std::io::Error::other("a sync of the weights panicked")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_digest_is_of_every_byte_written_in_order_and_the_file_holds_them() {
        for durable in [true, false] {
            let dir = tempfile::tempdir().expect("temp dir");
            let path = dir.path().join("weights");
            let mut writer = BatchWriter::start(std::fs::File::create(&path).expect("created"), durable);
            let batches: Vec<Vec<u8>> =
                (0..12u8).map(|index| vec![index; (1 << 20) + usize::from(index)]).chain([vec![7; 3]]).collect();
            let mut expected = sha2::Sha256::new();
            for batch in &batches {
                expected.update(batch);
                writer.write(batch.clone()).await.expect("queued");
            }
            let sha256 = writer.finish().await.expect("written (and synced if durable)");
            assert_eq!(sha256, Sha256(expected.finalize().into()), "durable: {durable}");
            assert_eq!(std::fs::read(&path).expect("read back"), batches.concat(), "durable: {durable}");
        }
    }

    #[tokio::test]
    async fn the_queue_holds_at_most_its_bytes_while_the_file_takes_none() {
        // A pipe nobody reads: the writer blocks once the pipe's buffer is full.
        let (mut reader, pipe) = std::io::pipe().expect("a pipe");
        let mut writer = BatchWriter::start(std::fs::File::from(std::os::fd::OwnedFd::from(pipe)), false);
        let batch = vec![3u8; 64 << 10];
        let mut queued = 0usize;
        // A write with room is ready at once; the first without waits (here for good, until the pipe is read).
        while let Ok(written) =
            tokio::time::timeout(std::time::Duration::from_millis(200), writer.write(batch.clone())).await
        {
            written.expect("queued");
            queued += batch.len();
            // The queue, the batch in the writer's hands and the pipe's buffer (at most 1 MiB on Linux).
            assert!(queued <= QUEUED_BYTES + batch.len() + (1 << 20), "{queued} bytes were taken");
        }
        assert!(queued >= QUEUED_BYTES, "only {queued} bytes were taken");
        let drained = std::thread::spawn(move || std::io::copy(&mut reader, &mut std::io::sink()).expect("read"));
        writer.write(batch.clone()).await.expect("queued once the file takes bytes again");
        let sha256 = writer.finish().await.expect("written");
        assert_eq!(drained.join().expect("the reader") as usize, queued + batch.len());
        assert_eq!(sha256, Sha256(sha2::Sha256::digest(vec![3u8; queued + batch.len()]).into()));
    }

    #[tokio::test]
    async fn a_write_that_fails_fails_the_writer() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("weights");
        std::fs::write(&path, b"").expect("created");
        // Opened for reading only: every write fails.
        let mut writer = BatchWriter::start(std::fs::File::open(&path).expect("opened"), true);
        let mut failed = false;
        for _ in 0..(QUEUE_PERMITS + 2) {
            if writer.write(vec![1; 1 << 10]).await.is_err() {
                failed = true;
                break;
            }
        }
        // The failure is answered by a later write (once the writer stopped) or at the latest by the finish.
        assert!(failed || writer.finish().await.is_err());
    }
}
