//! [`FailingStore`]: a state store whose health fails on demand, for the fronts' health tests.

use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;

use crate::contract::{AdapterName, AdapterVersion, PauseId};
use crate::state::{MemoryStore, RecordedState, Recording, StateChange, StateError, StateStore};

/// Records in memory, and reports its health as a store whose disk failed (and that could not be opened again)
/// while [`FailingStore::set_failing`] says so.
#[derive(Debug, Default)]
pub struct FailingStore {
    records: MemoryStore,
    failing: AtomicBool,
}

impl FailingStore {
    /// Makes its health fail (`true`) or pass.
    pub fn set_failing(&self, failing: bool) {
        self.failing.store(failing, Ordering::SeqCst);
    }
}

#[async_trait]
impl StateStore for FailingStore {
    async fn recorded(&self) -> Result<RecordedState, StateError> {
        self.records.recorded().await
    }

    fn record(&self, changes: Vec<StateChange>) -> Recording {
        self.records.record(changes)
    }

    fn issue_version(&self, name: &AdapterName) -> Recording<AdapterVersion> {
        self.records.issue_version(name)
    }

    fn new_pause_id(&self) -> PauseId {
        self.records.new_pause_id()
    }

    fn health(&self) -> Result<(), StateError> {
        match self.failing.load(Ordering::SeqCst) {
            true => Err(StateError::Unavailable("disk full".into())),
            false => Ok(()),
        }
    }
}
