//! loragate's embedded state store: the [`StateStore`] of one server, in one [redb] file (`DIR/state.redb`), so that
//! a restart puts back every loaded adapter at its version, the highest version ever issued for each name, the
//! live pauses with their owners and wall-clock leases, and the fronts' own records (the Tinker front's futures; opaque
//! documents here).
//!
//! One writer thread owns every write. [`StateStore::record`] and [`StateStore::issue_version`] queue their work on
//! its channel (never blocking the actor that calls them) and the thread commits what is queued in one durable
//! transaction (group commit), in queue order, then answers each caller. A transaction is atomic: a process killed at
//! any instant leaves the file as of its last commit, which the next open accepts (redb repairs an interrupted
//! commit on open). Reads ([`StateStore::recorded`], once at start) are queued the same way.
//!
//! The store heals: after a failed transaction (a full disk) the database is closed and opened again on the next
//! call (and every second while idle), so control calls work again once the disk does, without a restart; until
//! then [`EmbeddedStore::problem`] says why it cannot record (the server's health reports it).
//!
//! The file is locked while open: a second server on the same directory is refused with an error naming it. An
//! existing file that is empty or truncated is refused with a message naming it and what to do: never taken as a
//! fresh store (which would issue recorded versions again).
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

mod file_check;
mod tables;
mod writer;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, mpsc};

use async_trait::async_trait;
use loragate_core::state::{RecordedState, Recording, StateChange, StateError, StateStore};
use loragate_core::{AdapterName, AdapterVersion, PauseId};
use redb::Database;
use tokio::sync::oneshot;

use crate::writer::{Health, Op, Opener, Writer};

/// The file in the state directory.
pub const STATE_FILE: &str = "state.redb";

/// The embedded store: one redb file, one writer thread. Dropping it waits for the thread to commit what is queued;
/// the file is closed (and free for the next open) once the drop returns.
pub struct EmbeddedStore {
    dir: PathBuf,
    writes: mpsc::Sender<Op>,
    writer: Option<std::thread::JoinHandle<()>>,
    health: Arc<Health>,
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

impl EmbeddedStore {
    /// Opens (creating it and its directory if needed) the store in `dir`. Fails if another process, or another
    /// store in this one, has it open, or if the file is not a state file this version reads, or is empty or
    /// truncated (naming it, and what to do).
    pub fn open(dir: impl AsRef<Path>) -> Result<Self, StateError> {
        Self::open_with(dir.as_ref(), Box::new(|path| Database::create(path)))
    }

    /// [`EmbeddedStore::open`] with `open` opening the database file.
    fn open_with(dir: &Path, open: Opener) -> Result<Self, StateError> {
        let dir = dir.to_owned();
        let at =
            |what: &str, err: &dyn std::fmt::Display| StateError::Failed(format!("{what} {}: {err}", dir.display()));
        create_private_dir(&dir).map_err(|err| at("cannot create the state directory", &err))?;
        let path = dir.join(STATE_FILE);
        file_check::check(&path)?;
        let db = open(&path).map_err(|err| match err {
            redb::DatabaseError::DatabaseAlreadyOpen => StateError::Failed(format!(
                "the state directory {} is in use by another loragate server (give each server its own --state-dir)",
                dir.display()
            )),
            other => at("cannot open the state in", &other),
        })?;
        let txn = db.begin_write().map_err(|err| at("cannot write the state in", &err))?;
        tables::prepare(&txn).map_err(|err| at("cannot use the state in", &err))?;
        txn.commit().map_err(|err| at("cannot write the state in", &err))?;
        let last_pause_number = {
            let txn = db.begin_read().map_err(|err| at("cannot read the state in", &err))?;
            tables::read_all(&txn).map_err(|err| at("cannot read the state in", &err))?.1
        };
        let (writes, queue) = mpsc::channel();
        let health = Arc::new(Health::default());
        let writer = Writer { path, open, db: Some(db), health: health.clone() };
        let writer = std::thread::Builder::new()
            .name("loragate-state".into())
            .spawn(move || writer.run(&queue))
            .map_err(|err| at("cannot start the state writer for", &err))?;
        Ok(Self { dir, writes, writer: Some(writer), health, last_pause_number: AtomicU64::new(last_pause_number) })
    }

    /// The state directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Why the store cannot record now (its last transaction failed and it could not be opened again yet), if it
    /// cannot.
    pub fn problem(&self) -> Option<String> {
        self.health.problem()
    }

    fn queue<T: Send + 'static>(&self, op: Op, answer: oneshot::Receiver<Result<T, StateError>>) -> Recording<T> {
        if self.writes.send(op).is_err() {
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
        let (answer, answered) = oneshot::channel();
        self.queue(Op::Read(answer), answered).await
    }

    fn record(&self, changes: Vec<StateChange>) -> Recording {
        let (answer, answered) = oneshot::channel();
        self.queue(Op::Record(changes, answer), answered)
    }

    fn issue_version(&self, name: &AdapterName) -> Recording<AdapterVersion> {
        let (answer, answered) = oneshot::channel();
        self.queue(Op::Issue(name.clone(), answer), answered)
    }

    fn health(&self) -> Result<(), StateError> {
        match self.problem() {
            Some(problem) => Err(StateError::Unavailable(format!("the state store cannot record: {problem}"))),
            None => Ok(()),
        }
    }

    fn new_pause_id(&self) -> PauseId {
        PauseId::numbered(self.last_pause_number.fetch_add(1, Ordering::Relaxed) + 1)
    }
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
