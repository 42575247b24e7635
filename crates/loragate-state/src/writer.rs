//! The writer thread, the only owner of the open database: it commits what is queued, in order, a batch per
//! durable transaction (group commit), answers reads in queue order, and heals.
//!
//! Healing: after any failed transaction (a full or failing disk; the storage library then refuses every later
//! transaction until the database is closed and opened again) the database is closed at once, so its file lock and
//! poisoned state go with it. The next operation opens it again (redb repairs an interrupted commit on open), and
//! while nothing is queued the thread tries every [`RETRY_OPEN`] on its own, so the store reports healthy again as
//! soon as the disk is back, without a restart. Until then every operation fails with the reason and
//! [`Health::problem`] says why.

use std::path::PathBuf;
use std::sync::mpsc;
use std::time::Duration;

use loragate_core::state::{RecordedState, StateChange, StateError};
use loragate_core::{AdapterName, AdapterVersion};
use redb::Database;
use tokio::sync::oneshot;

use crate::tables;

/// The most queued operations committed in one transaction.
const MAX_BATCH: usize = 256;
/// How often a closed database is tried again while nothing is queued.
const RETRY_OPEN: Duration = Duration::from_secs(1);

/// Opens the database file (the production opener is [`Database::create`]; tests inject failures through theirs).
pub(crate) type Opener = Box<dyn Fn(&std::path::Path) -> Result<Database, redb::DatabaseError> + Send>;

/// One queued operation and where its answer goes.
pub(crate) enum Op {
    Record(Vec<StateChange>, oneshot::Sender<Result<(), StateError>>),
    Issue(AdapterName, oneshot::Sender<Result<AdapterVersion, StateError>>),
    Read(oneshot::Sender<Result<RecordedState, StateError>>),
}

/// Whether the store works now, shared by the writer (which sets it) and the store (which reports it).
#[derive(Debug, Default)]
pub(crate) struct Health(std::sync::Mutex<Option<String>>);

impl Health {
    /// Why the store cannot record now, if it cannot.
    pub(crate) fn problem(&self) -> Option<String> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    fn set(&self, problem: Option<String>) {
        *self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = problem;
    }
}

/// The writer's database: open, or closed after a failure until it can be opened again.
pub(crate) struct Writer {
    pub(crate) path: PathBuf,
    pub(crate) open: Opener,
    pub(crate) db: Option<Database>,
    pub(crate) health: std::sync::Arc<Health>,
}

impl Writer {
    /// Serves the queue until every sender is gone.
    pub(crate) fn run(mut self, queue: &mpsc::Receiver<Op>) {
        let mut held: Option<Op> = None;
        loop {
            let first = match held.take() {
                Some(op) => op,
                None if self.db.is_some() => match queue.recv() {
                    Ok(op) => op,
                    Err(_) => return,
                },
                None => match queue.recv_timeout(RETRY_OPEN) {
                    Ok(op) => op,
                    Err(mpsc::RecvTimeoutError::Timeout) => {
                        let _ = self.with_database(|_| Ok(()));
                        continue;
                    }
                    Err(mpsc::RecvTimeoutError::Disconnected) => return,
                },
            };
            if let Op::Read(answer) = first {
                let _ = answer.send(self.with_database(read));
                continue;
            }
            let mut batch = vec![first];
            while batch.len() < MAX_BATCH {
                match queue.try_recv() {
                    Ok(Op::Read(answer)) => {
                        held = Some(Op::Read(answer));
                        break;
                    }
                    Ok(op) => batch.push(op),
                    Err(_) => break,
                }
            }
            let outcome = self.with_database(|db| commit(db, &batch));
            answer(batch, outcome);
        }
    }

    /// Runs `work` on the database, opening it first if it is closed; a failure closes it (to be opened again by
    /// the next call) and is reported by [`Health`] until a call succeeds.
    fn with_database<T>(&mut self, work: impl FnOnce(&Database) -> Result<T, StateError>) -> Result<T, StateError> {
        let db = match self.db.take() {
            Some(db) => db,
            None => match self.reopen() {
                Ok(db) => db,
                Err(err) => {
                    self.health.set(Some(err.to_string()));
                    return Err(err);
                }
            },
        };
        match work(&db) {
            Ok(done) => {
                self.db = Some(db);
                if self.health.problem().is_some() {
                    tracing::info!(file = %self.path.display(), "the state store records again");
                }
                self.health.set(None);
                Ok(done)
            }
            Err(err) => {
                drop(db);
                tracing::error!(file = %self.path.display(), %err, "the state store failed; it is opened again on the next call");
                self.health.set(Some(err.to_string()));
                Err(err)
            }
        }
    }

    fn reopen(&self) -> Result<Database, StateError> {
        crate::file_check::check(&self.path)?;
        let unavailable = |err: &dyn std::fmt::Display| {
            StateError::Unavailable(format!("the state store {}: {err}", self.path.display()))
        };
        let db = (self.open)(&self.path).map_err(|err| unavailable(&err))?;
        let txn = db.begin_write().map_err(|err| unavailable(&err))?;
        tables::prepare(&txn)?;
        txn.commit().map_err(|err| unavailable(&err))?;
        tracing::warn!(file = %self.path.display(), "the state store was opened again after a failure");
        Ok(db)
    }
}

fn read(db: &Database) -> Result<RecordedState, StateError> {
    let txn = db.begin_read().map_err(|err| StateError::Failed(err.to_string()))?;
    tables::read_all(&txn).map(|(state, _)| state)
}

/// Answers each operation of `batch` with the outcome of its transaction.
fn answer(batch: Vec<Op>, outcome: Result<Vec<AdapterVersion>, StateError>) {
    match outcome {
        Ok(issued) => {
            let mut issued = issued.into_iter();
            for op in batch {
                match op {
                    Op::Record(_, answer) => {
                        let _ = answer.send(Ok(()));
                    }
                    Op::Issue(_, answer) => {
                        let version = issued.next().ok_or_else(|| StateError::Failed("no version issued".into()));
                        let _ = answer.send(version);
                    }
                    Op::Read(_) => {}
                }
            }
        }
        Err(err) => {
            tracing::error!(%err, writes = batch.len(), "could not record changes of the control-plane state");
            for op in batch {
                match op {
                    Op::Record(_, answer) => {
                        let _ = answer.send(Err(err.clone()));
                    }
                    Op::Issue(_, answer) => {
                        let _ = answer.send(Err(err.clone()));
                    }
                    Op::Read(_) => {}
                }
            }
        }
    }
}

/// One transaction for `batch`; the versions issued, in order.
fn commit(db: &Database, batch: &[Op]) -> Result<Vec<AdapterVersion>, StateError> {
    let failed = |err: &dyn std::fmt::Display| StateError::Failed(err.to_string());
    let txn = db.begin_write().map_err(|err| failed(&err))?;
    let mut issued = Vec::new();
    for op in batch {
        match op {
            Op::Record(changes, _) => {
                for change in changes {
                    tables::apply(&txn, change)?;
                }
            }
            Op::Issue(name, _) => issued.push(tables::issue(&txn, name)?),
            Op::Read(_) => {}
        }
    }
    txn.commit().map_err(|err| failed(&err))?;
    Ok(issued)
}
