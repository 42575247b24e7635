//! loragate's embedded state store: the [`StateStore`] of one server, in one [redb] file (`DIR/state.redb`), so that
//! a restart puts back every loaded adapter at its version, the highest version ever issued for each name, the
//! live pauses with their owners and wall-clock leases, and the fronts' own records (the Tinker front's futures; opaque
//! documents here).
//!
//! One writer thread owns every write. [`StateStore::record`] and [`StateStore::issue_version`] queue their work on
//! its channel (never blocking the actor that calls them) and the thread commits what is queued in one durable
//! transaction (group commit), in queue order, then answers each caller. A transaction is atomic: a process killed at
//! any instant leaves the file as of its last commit, which the next open accepts (redb repairs an interrupted
//! commit on open). Reads ([`StateStore::recorded`], once at start) run beside the writer.
//!
//! The file is locked while open: a second server on the same directory is refused with an error naming it.
//!
//! ```no_run
//! # async fn demo() -> Result<(), loragate_core::StateError> {
//! use loragate_core::StateStore;
//! let store = loragate_state::EmbeddedStore::open("/var/lib/loragate/demo")?;
//! let recorded = store.recorded().await?;
//! println!("{} adapters recorded", recorded.adapters.len());
//! # Ok(())
//! # }
//! ```

mod tables;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, mpsc};

use async_trait::async_trait;
use loragate_core::state::{RecordedState, Recording, StateChange, StateError, StateStore};
use loragate_core::{AdapterName, AdapterVersion, PauseId};
use redb::Database;
use tokio::sync::oneshot;

/// The file in the state directory.
pub const STATE_FILE: &str = "state.redb";

/// The most queued operations committed in one transaction.
const MAX_BATCH: usize = 256;

/// The embedded store: one redb file, one writer thread. Dropping it waits for the thread to commit what is queued;
/// the file is closed (and free for the next open) once the drop returns.
pub struct EmbeddedStore {
    dir: PathBuf,
    db: Arc<Database>,
    writes: mpsc::Sender<Write>,
    writer: Option<std::thread::JoinHandle<()>>,
    last_pause_number: AtomicU64,
}

impl Drop for EmbeddedStore {
    fn drop(&mut self) {
        // The writer stops once its queue is empty and no sender is left.
        drop(std::mem::replace(&mut self.writes, mpsc::channel().0));
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
    }
}

impl std::fmt::Debug for EmbeddedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedStore").field("dir", &self.dir).finish_non_exhaustive()
    }
}

/// One queued write and where its answer goes.
enum Write {
    Record(Vec<StateChange>, oneshot::Sender<Result<(), StateError>>),
    Issue(AdapterName, oneshot::Sender<Result<AdapterVersion, StateError>>),
}

impl EmbeddedStore {
    /// Opens (creating it and its directory if needed) the store in `dir`. Fails if another process, or another
    /// store in this one, has it open, or if the file is not a state file this version reads.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self, StateError> {
        let dir = dir.as_ref().to_owned();
        let at =
            |what: &str, err: &dyn std::fmt::Display| StateError::Failed(format!("{what} {}: {err}", dir.display()));
        create_private_dir(&dir).map_err(|err| at("cannot create the state directory", &err))?;
        let db = Database::create(dir.join(STATE_FILE)).map_err(|err| match err {
            redb::DatabaseError::DatabaseAlreadyOpen => StateError::Failed(format!(
                "the state directory {} is in use by another loragate server (give each server its own --state-dir)",
                dir.display()
            )),
            other => at("cannot open the state in", &other),
        })?;
        let txn = db.begin_write().map_err(|err| at("cannot write the state in", &err))?;
        tables::prepare(&txn).map_err(|err| at("cannot use the state in", &err))?;
        txn.commit().map_err(|err| at("cannot write the state in", &err))?;
        let db = Arc::new(db);
        let last_pause_number = {
            let txn = db.begin_read().map_err(|err| at("cannot read the state in", &err))?;
            tables::read_all(&txn).map_err(|err| at("cannot read the state in", &err))?.1
        };
        let (writes, queue) = mpsc::channel();
        let writer_db = db.clone();
        let writer = std::thread::Builder::new()
            .name("loragate-state".into())
            .spawn(move || write_loop(&writer_db, &queue))
            .map_err(|err| at("cannot start the state writer for", &err))?;
        Ok(Self { dir, db, writes, writer: Some(writer), last_pause_number: AtomicU64::new(last_pause_number) })
    }

    /// The state directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn queue<T: Send + 'static>(&self, write: Write, answer: oneshot::Receiver<Result<T, StateError>>) -> Recording<T> {
        if self.writes.send(write).is_err() {
            return Box::pin(std::future::ready(Err(StateError::Unavailable("the state writer stopped".into()))));
        }
        Box::pin(async move {
            answer.await.unwrap_or_else(|_| Err(StateError::Unavailable("the state writer stopped".into())))
        })
    }
}

#[async_trait]
impl StateStore for EmbeddedStore {
    async fn recorded(&self) -> Result<RecordedState, StateError> {
        let db = self.db.clone();
        let read = tokio::task::spawn_blocking(move || {
            let txn = db.begin_read().map_err(|err| StateError::Failed(err.to_string()))?;
            tables::read_all(&txn).map(|(state, _)| state)
        });
        read.await.map_err(|err| StateError::Failed(format!("the state reader failed: {err}")))?
    }

    fn record(&self, changes: Vec<StateChange>) -> Recording {
        let (answer, answered) = oneshot::channel();
        self.queue(Write::Record(changes, answer), answered)
    }

    fn issue_version(&self, name: &AdapterName) -> Recording<AdapterVersion> {
        let (answer, answered) = oneshot::channel();
        self.queue(Write::Issue(name.clone(), answer), answered)
    }

    fn new_pause_id(&self) -> PauseId {
        PauseId::numbered(self.last_pause_number.fetch_add(1, Ordering::Relaxed) + 1)
    }
}

/// The writer thread: commits what is queued, in order, a batch per transaction, until every sender is gone.
fn write_loop(db: &Database, queue: &mpsc::Receiver<Write>) {
    while let Ok(first) = queue.recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match queue.try_recv() {
                Ok(write) => batch.push(write),
                Err(_) => break,
            }
        }
        match commit(db, &batch) {
            Ok(issued) => {
                let mut issued = issued.into_iter();
                for write in batch {
                    match write {
                        Write::Record(_, answer) => {
                            let _ = answer.send(Ok(()));
                        }
                        Write::Issue(_, answer) => {
                            let version = issued.next().ok_or_else(|| StateError::Failed("no version issued".into()));
                            let _ = answer.send(version);
                        }
                    }
                }
            }
            Err(err) => {
                tracing::error!(%err, writes = batch.len(), "could not record changes of the control-plane state");
                for write in batch {
                    match write {
                        Write::Record(_, answer) => {
                            let _ = answer.send(Err(err.clone()));
                        }
                        Write::Issue(_, answer) => {
                            let _ = answer.send(Err(err.clone()));
                        }
                    }
                }
            }
        }
    }
}

/// One transaction for `batch`; the versions issued, in order.
fn commit(db: &Database, batch: &[Write]) -> Result<Vec<AdapterVersion>, StateError> {
    let failed = |err: &dyn std::fmt::Display| StateError::Failed(err.to_string());
    let txn = db.begin_write().map_err(|err| failed(&err))?;
    let mut issued = Vec::new();
    for write in batch {
        match write {
            Write::Record(changes, _) => {
                for change in changes {
                    tables::apply(&txn, change)?;
                }
            }
            Write::Issue(name, _) => issued.push(tables::issue(&txn, name)?),
        }
    }
    txn.commit().map_err(|err| failed(&err))?;
    Ok(issued)
}

/// Creates `dir` (and its parents), readable by its owner only where permissions exist.
fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir)
}

#[cfg(test)]
mod tests;
