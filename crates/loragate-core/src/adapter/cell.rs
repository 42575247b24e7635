//! An adapter's durable cell: what outlives any one incarnation of its actor. The manager creates it once per
//! loaded name and hands it to every incarnation; handles keep it to find the current incarnation and to wait on
//! the gate without asking the actor.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Instant;

use parking_lot::Mutex;

use ractor::ActorRef;
use tokio::sync::watch;

use super::actor::AdapterMsg;
use super::gate::{GateState, Retirement};
use super::status::AdapterStatus;
use crate::error::CoreError;
use crate::ids::{AdapterKey, AdapterVersion};
use crate::limits::{AdapterLoad, Occupancy, ServerLoad, Slot};
use crate::metrics::{AdapterLabels, CoreMetrics};

/// The durable state of one adapter. Gate writes (`close_gate`, `open_gate`, `install_version`, `retire`) are
/// made by the adapter's actor only.
pub(crate) struct AdapterCell {
    key: AdapterKey,
    gate: watch::Sender<GateState>,
    actor: watch::Sender<Option<ActorRef<AdapterMsg>>>,
    /// The last version handed to a load (installed or not), so versions are never reused, across restarts too.
    last_reserved_version: AtomicU64,
    /// Its requests in flight and held, counted against the limits.
    load: Arc<AdapterLoad>,
    pub(crate) waiting: AtomicU32,
    /// When the gate last closed (for the pause-duration metric).
    paused_at: Mutex<Option<Instant>>,
    pub(crate) metrics: Arc<CoreMetrics>,
    pub(crate) labels: AdapterLabels,
}

impl AdapterCell {
    /// A cell for `key` whose first load will be `last_version.next()`. The gate starts open.
    pub(crate) fn new(
        key: AdapterKey,
        last_version: AdapterVersion,
        metrics: Arc<CoreMetrics>,
        server_load: &Arc<ServerLoad>,
    ) -> Self {
        let gate = GateState { paused: false, version: last_version, retired: None };
        Self {
            labels: AdapterLabels::of(&key),
            metrics,
            paused_at: Mutex::new(None),
            key,
            gate: watch::Sender::new(gate),
            actor: watch::Sender::new(None),
            last_reserved_version: AtomicU64::new(last_version.0),
            load: AdapterLoad::new(server_load),
            waiting: AtomicU32::new(0),
        }
    }

    pub(crate) fn key(&self) -> &AdapterKey {
        &self.key
    }

    pub(crate) fn gate_state(&self) -> GateState {
        *self.gate.borrow()
    }

    pub(crate) fn subscribe_gate(&self) -> watch::Receiver<GateState> {
        self.gate.subscribe()
    }

    /// Counts one of its requests as in flight or held, or refuses it naming the limit that is reached.
    pub(crate) fn occupy(&self, occupancy: Occupancy) -> Result<Slot, CoreError> {
        let slot = self.load.occupy(occupancy, &self.key);
        if let Err(CoreError::Overloaded { limit, .. }) = &slot {
            self.metrics.record_overload(*limit);
        }
        slot
    }

    /// Closes the gate (idempotent).
    pub(crate) fn close_gate(&self) {
        if self.gate.send_if_modified(|gate| !std::mem::replace(&mut gate.paused, true)) {
            *self.paused_at.lock() = Some(Instant::now());
            self.metrics.record_pause(&self.labels);
        }
    }

    /// Opens the gate, releasing every waiter at once; returns whether it was closed.
    pub(crate) fn open_gate(&self) -> bool {
        let mut was_paused = false;
        self.gate.send_if_modified(|gate| {
            was_paused = std::mem::replace(&mut gate.paused, false);
            was_paused
        });
        if let Some(paused_at) = self.paused_at.lock().take().filter(|_| was_paused) {
            self.metrics.record_reopen(&self.labels, paused_at.elapsed());
        }
        was_paused
    }

    /// Marks the adapter as no longer serving, releasing every waiter with the reason (the first reason stays).
    pub(crate) fn retire(&self, why: Retirement) {
        self.gate.send_if_modified(|gate| {
            let first = gate.retired.is_none();
            if first {
                gate.retired = Some(why);
            }
            first
        });
    }

    /// Hands out the next version number for a load.
    pub(crate) fn reserve_version(&self) -> AdapterVersion {
        AdapterVersion(self.last_reserved_version.fetch_add(1, Ordering::AcqRel) + 1)
    }

    /// Gives back a version whose load failed, if no later one was handed out, so failures leave no gaps.
    pub(crate) fn release_version(&self, version: AdapterVersion) {
        let _ =
            self.last_reserved_version.compare_exchange(version.0, version.0 - 1, Ordering::AcqRel, Ordering::Acquire);
    }

    /// The highest version reserved so far (for numbering a later reload of the same name).
    pub(crate) fn last_reserved_version(&self) -> AdapterVersion {
        AdapterVersion(self.last_reserved_version.load(Ordering::Acquire))
    }

    /// Makes `version` current unless a later one already is.
    pub(crate) fn install_version(&self, version: AdapterVersion) {
        self.gate.send_if_modified(|gate| {
            let newer = version > gate.version;
            if newer {
                gate.version = version;
            }
            newer
        });
        self.metrics.forget_old_versions(&self.labels, version);
    }

    /// The current incarnation of the adapter's actor; `None` once the adapter is removed.
    pub(crate) fn current_actor(&self) -> Option<ActorRef<AdapterMsg>> {
        self.actor.borrow().clone()
    }

    pub(crate) fn subscribe_actor(&self) -> watch::Receiver<Option<ActorRef<AdapterMsg>>> {
        self.actor.subscribe()
    }

    /// Points the cell at a new incarnation (or at none, on removal).
    pub(crate) fn set_actor(&self, actor: Option<ActorRef<AdapterMsg>>) {
        self.actor.send_replace(actor);
    }

    /// A snapshot, given the registry's size (known only to the actor).
    pub(crate) fn status(&self, in_flight: usize) -> AdapterStatus {
        let gate = self.gate_state();
        AdapterStatus {
            key: self.key.clone(),
            version: gate.version,
            paused: gate.paused,
            in_flight: u32::try_from(in_flight).unwrap_or(u32::MAX),
            held: self.load.held(),
            waiting: self.waiting.load(Ordering::Acquire),
        }
    }
}
