//! A pushed weights file while it is being written, for an engine that reads its tensors as they arrive
//! ([`crate::Engine::prepare_pushed_adapter`]) instead of after the push: the install at the end of a push then finds
//! its weights read already, and receiving and reading overlap.
//!
//! The receiver's writer reports each batch it wrote ([`WriteProgress::wrote`]); a reader waits for the bytes it
//! needs ([`GrowingFile::wait_written`]). A push that fails, or whose receiver is dropped, fails every wait at once.
//! The bytes a wait reports are the ones the push hashes: nothing read through a [`GrowingFile`] is served unless the
//! push's SHA-256 check passes (its preparation goes with the stored version, see [`crate::PreparedLoad`]).

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

/// How much of the file is written, and whether the push failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Written {
    Bytes(u64),
    Failed,
}

#[derive(Debug)]
struct Progress {
    written: Mutex<Written>,
    changed: Condvar,
}

/// The weights file of a push being received: where it is, how long it will be, and how much of it is written.
#[derive(Clone, Debug)]
pub struct GrowingFile {
    path: PathBuf,
    len: u64,
    progress: Arc<Progress>,
}

impl GrowingFile {
    /// The temporary file the weights are written to (it is renamed into the store once complete; a reader opens it
    /// once and keeps reading its handle).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The whole file's size, as its checked safetensors header says.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the file is empty (never, for a checked header; for completeness).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Blocks until the file's first `end` bytes are written (at once if they are). Fails once the push failed or
    /// was abandoned, and for `end` past the file's size. Blocking: call it off the async runtime.
    pub fn wait_written(&self, end: u64) -> io::Result<()> {
        if end > self.len {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("byte {end} is past the pushed file's {} bytes", self.len),
            ));
        }
        let mut written = self.progress.written.lock();
        loop {
            match *written {
                Written::Bytes(bytes) if bytes >= end => return Ok(()),
                Written::Bytes(_) => self.progress.changed.wait(&mut written),
                Written::Failed => return Err(io::Error::other("the push was abandoned before these bytes arrived")),
            }
        }
    }
}

/// The receiving side of a [`GrowingFile`]: creates it once the file's size is known ([`WriteProgress::file`]) and
/// hands the writer its [`ProgressReport`]. Dropped before the whole file was reported written (the push failed, or
/// its receiver was dropped), it fails every wait.
#[derive(Debug)]
pub(super) struct WriteProgress {
    path: PathBuf,
    progress: Arc<Progress>,
    /// The file's size, once its header was checked.
    len: Option<u64>,
}

/// What the writer reports through (see [`WriteProgress`]).
#[derive(Clone, Debug)]
pub(super) struct ProgressReport(Arc<Progress>);

impl WriteProgress {
    /// The progress of writing the file at `path`, nothing written yet.
    pub(super) fn new(path: PathBuf) -> Self {
        let progress = Arc::new(Progress { written: Mutex::new(Written::Bytes(0)), changed: Condvar::new() });
        Self { path, progress, len: None }
    }

    /// Where the writer reports what it wrote.
    pub(super) fn report(&self) -> ProgressReport {
        ProgressReport(Arc::clone(&self.progress))
    }

    /// The file, `len` bytes long once complete, for its readers.
    pub(super) fn file(&mut self, len: u64) -> GrowingFile {
        self.len = Some(len);
        GrowingFile { path: self.path.clone(), len, progress: Arc::clone(&self.progress) }
    }
}

impl ProgressReport {
    /// Reports that the file's first `total` bytes are written.
    pub(super) fn wrote(&self, total: u64) {
        let mut written = self.0.written.lock();
        if let Written::Bytes(bytes) = *written
            && total > bytes
        {
            *written = Written::Bytes(total);
            self.0.changed.notify_all();
        }
    }

    /// Fails every wait, now and later.
    pub(super) fn fail(&self) {
        *self.0.written.lock() = Written::Failed;
        self.0.changed.notify_all();
    }
}

impl Drop for WriteProgress {
    fn drop(&mut self) {
        let complete = self.len.is_some_and(|len| *self.progress.written.lock() == Written::Bytes(len));
        if !complete {
            ProgressReport(Arc::clone(&self.progress)).fail();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_returns_once_its_bytes_are_written_and_fails_once_the_push_is_dropped() {
        let mut progress = WriteProgress::new(PathBuf::from("/nowhere"));
        let report = progress.report();
        let file = progress.file(100);
        assert!(file.wait_written(0).is_ok());
        assert!(file.wait_written(101).is_err(), "past the end");
        let waiter = std::thread::spawn({
            let file = file.clone();
            move || file.wait_written(60)
        });
        report.wrote(40);
        report.wrote(70);
        assert!(waiter.join().expect("joined").is_ok());
        let stuck = std::thread::spawn({
            let file = file.clone();
            move || file.wait_written(100)
        });
        drop(progress);
        assert!(stuck.join().expect("joined").is_err(), "a dropped push fails the wait");
        assert!(file.wait_written(10).is_err(), "and every later one");
    }

    #[test]
    fn a_complete_file_stays_readable_after_its_push_is_gone() {
        let mut progress = WriteProgress::new(PathBuf::from("/nowhere"));
        let file = progress.file(10);
        progress.report().wrote(10);
        drop(progress);
        assert!(file.wait_written(10).is_ok());
    }

    #[test]
    fn a_failure_is_not_undone_by_a_later_write() {
        let mut progress = WriteProgress::new(PathBuf::from("/nowhere"));
        let file = progress.file(10);
        let report = progress.report();
        report.fail();
        report.wrote(10);
        assert!(file.wait_written(1).is_err());
    }
}
