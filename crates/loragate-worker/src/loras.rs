//! What vLLM's `ListLoras` shows of the adapters the coordinator serves (each name's one-based, never reused
//! `lora_id` and the path `LoadLora` was given), and the front's two rules on loads: a name is loaded once
//! (`ALREADY_EXISTS`, never a reload in place), and at most `--max-loras` adapters are loaded or loading at once.
//!
//! A load or unload first takes its name in the table through an RAII reservation, so two concurrent calls under
//! one name never both reach the coordinator, and a cap is never overrun by loads racing past it. A reservation
//! dropped before it is committed (the load failed, its caller went away) gives the name back as it was.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::error::WorkerError;

/// A LoRA adapter as `ListLoras` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LoraRecord {
    /// vLLM's one-based, never reused id.
    pub(crate) lora_id: i64,
    /// The name requests use.
    pub(crate) lora_name: String,
    /// The path as the caller of `LoadLora` gave it.
    pub(crate) source_path: String,
}

/// The worker's LoRA names. Cheap to clone; clones share the table.
#[derive(Clone)]
pub(crate) struct LoraTable {
    shared: Arc<Shared>,
}

struct Shared {
    max_loras: Option<usize>,
    entries: Mutex<Entries>,
}

#[derive(Default)]
struct Entries {
    by_name: BTreeMap<String, Slot>,
    last_lora_id: i64,
}

enum Slot {
    /// A load is in progress.
    Loading,
    /// Loaded (an unload may be in progress: the name stays taken until it is done).
    Loaded { record: LoraRecord, unloading: bool },
}

impl LoraTable {
    /// An empty table; `max_loras` caps the adapters loaded or loading at once (`None`: no cap).
    pub(crate) fn new(max_loras: Option<usize>) -> Self {
        Self { shared: Arc::new(Shared { max_loras, entries: Mutex::default() }) }
    }

    fn entries(&self) -> MutexGuard<'_, Entries> {
        // Nothing panics while holding the lock; a poisoned table is still consistent.
        self.shared.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes `lora_name` for a load: refused if the name is loaded or loading, or if `--max-loras` adapters are.
    pub(crate) fn reserve_load(&self, lora_name: &str) -> Result<LoadReservation, WorkerError> {
        let mut entries = self.entries();
        if entries.by_name.contains_key(lora_name) {
            return Err(WorkerError::LoraAlreadyLoaded(lora_name.to_owned()));
        }
        if let Some(max_loras) = self.shared.max_loras
            && entries.by_name.len() >= max_loras
        {
            return Err(WorkerError::TooManyLoras { max_loras });
        }
        entries.by_name.insert(lora_name.to_owned(), Slot::Loading);
        Ok(LoadReservation { table: self.clone(), lora_name: Some(lora_name.to_owned()) })
    }

    /// Takes a loaded `lora_name` for an unload: refused if it is not loaded, or already being unloaded.
    pub(crate) fn reserve_unload(&self, lora_name: &str) -> Result<UnloadReservation, WorkerError> {
        let mut entries = self.entries();
        match entries.by_name.get_mut(lora_name) {
            Some(Slot::Loaded { record, unloading }) if !*unloading => {
                *unloading = true;
                Ok(UnloadReservation { table: self.clone(), record: Some(record.clone()) })
            }
            _ => Err(WorkerError::LoraNotLoaded(lora_name.to_owned())),
        }
    }

    /// The loaded adapters, sorted by name.
    pub(crate) fn loaded(&self) -> Vec<LoraRecord> {
        let entries = self.entries();
        entries
            .by_name
            .values()
            .filter_map(|slot| match slot {
                Slot::Loaded { record, .. } => Some(record.clone()),
                Slot::Loading => None,
            })
            .collect()
    }
}

/// A name taken for a load. [`LoadReservation::commit`] records it as loaded; dropping it frees the name.
pub(crate) struct LoadReservation {
    table: LoraTable,
    lora_name: Option<String>,
}

impl LoadReservation {
    /// The load succeeded: the name is loaded from `source_path`, under a fresh `lora_id`.
    pub(crate) fn commit(mut self, source_path: String) -> LoraRecord {
        let lora_name = self.lora_name.take().expect("a reservation is committed once");
        let mut entries = self.table.entries();
        entries.last_lora_id += 1;
        let record = LoraRecord { lora_id: entries.last_lora_id, lora_name: lora_name.clone(), source_path };
        entries.by_name.insert(lora_name, Slot::Loaded { record: record.clone(), unloading: false });
        record
    }
}

impl Drop for LoadReservation {
    fn drop(&mut self) {
        if let Some(lora_name) = self.lora_name.take() {
            self.table.entries().by_name.remove(&lora_name);
        }
    }
}

/// A loaded name taken for an unload. [`UnloadReservation::commit`] frees the name; dropping it leaves it loaded.
pub(crate) struct UnloadReservation {
    table: LoraTable,
    record: Option<LoraRecord>,
}

impl UnloadReservation {
    /// The unload succeeded: the name is free (and counts no more against `--max-loras`).
    pub(crate) fn commit(mut self) -> LoraRecord {
        let record = self.record.take().expect("a reservation is committed once");
        self.table.entries().by_name.remove(&record.lora_name);
        record
    }
}

impl Drop for UnloadReservation {
    fn drop(&mut self) {
        if let Some(record) = self.record.take() {
            let mut entries = self.table.entries();
            if let Some(Slot::Loaded { unloading, .. }) = entries.by_name.get_mut(&record.lora_name) {
                *unloading = false;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_is_loaded_once_and_failed_loads_leave_nothing() {
        let table = LoraTable::new(None);
        let first = table.reserve_load("meow@1").expect("free");
        assert!(matches!(table.reserve_load("meow@1"), Err(WorkerError::LoraAlreadyLoaded(_))), "loading");
        let record = first.commit("/a/meow".into());
        assert_eq!((record.lora_id, record.source_path.as_str()), (1, "/a/meow"));
        assert!(matches!(table.reserve_load("meow@1"), Err(WorkerError::LoraAlreadyLoaded(_))), "loaded");
        drop(table.reserve_load("woof@1").expect("free"));
        assert_eq!(table.loaded(), vec![record], "a dropped load leaves nothing");
        assert_eq!(table.reserve_load("woof@1").expect("free again").commit("/a/woof".into()).lora_id, 2);
    }

    #[test]
    fn the_cap_counts_loading_and_loaded_names_and_an_unload_frees_a_place() {
        let table = LoraTable::new(Some(2));
        let loading = table.reserve_load("a").expect("1 of 2");
        table.reserve_load("b").expect("2 of 2").commit("/b".into());
        assert!(matches!(table.reserve_load("c"), Err(WorkerError::TooManyLoras { max_loras: 2 })));
        drop(loading);
        table.reserve_load("c").expect("a failed load freed its place").commit("/c".into());

        let unloading = table.reserve_unload("b").expect("loaded");
        assert!(matches!(table.reserve_unload("b"), Err(WorkerError::LoraNotLoaded(_))), "one unload at a time");
        assert!(matches!(table.reserve_load("d"), Err(WorkerError::TooManyLoras { .. })), "b is not gone yet");
        drop(unloading);
        assert_eq!(table.loaded().len(), 2, "a failed unload leaves the adapter loaded");
        assert_eq!(table.reserve_unload("b").expect("loaded").commit().lora_name, "b");
        table.reserve_load("d").expect("the unload freed a place");
        assert!(matches!(table.reserve_unload("zzz"), Err(WorkerError::LoraNotLoaded(_))));
    }
}
