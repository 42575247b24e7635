//! An adapter's durable cell: what outlives any one incarnation of its actor. The manager creates it once per
//! loaded name and hands it to every incarnation; handles keep it to find the current incarnation and to wait on
//! the gate without asking the actor.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use parking_lot::Mutex;

use ractor::ActorRef;
use tokio::sync::watch;
use tokio_util::task::AbortOnDropHandle;

use super::actor::{AdapterMsg, Incarnation};
use super::pauses::{PauseBook, Paused};
use super::registry::SharedRegistry;
use super::staleness::StalenessBound;
use super::versions::{PinRefused, RetainedVersions, Servable};
use crate::contract::{
    AbortReport, AdapterKey, AdapterStatus, AdapterVersion, CoreError, GateState, PauseId, PauseMode, PauseOwner,
    PauseRequest, ResumeReport, Retirement, StalenessPolicy, StalenessStatus,
};
use crate::limits::{AdapterLoad, Occupancy, ServerLoad, Slot};
use crate::metrics::{AdapterLabels, CoreMetrics};
use crate::state::{PauseRecord, Recording, StateChange, StateStore, VersionRecord, nothing_to_record};

/// Set in `last_reserved_version` by [`AdapterCell::seal_versions`]: no version is handed out after it.
const SEALED: u64 = 1 << 63;

/// The durable state of one adapter. Gate writes (`pause`, `adopt`, `release`, `expire_lease`, `install_version`,
/// `retire`) are made by the adapter's actor only (and by the manager before the actor exists). Each change of a
/// recorded pause is queued in the state store in the same call that makes it (see [`crate::state`]).
pub(crate) struct AdapterCell {
    key: AdapterKey,
    gate: watch::Sender<GateState>,
    /// The current incarnation of the actor (`None` once the adapter is removed).
    actor: watch::Sender<Option<Incarnation>>,
    /// The last version handed to a load (installed or not), so versions are never reused, across restarts too; with
    /// [`SEALED`] set once the adapter is unloaded.
    last_reserved_version: AtomicU64,
    /// Set by an unload once every request admitted before it was handed back: from then on no request of this
    /// adapter can reach the engine, so its weights may be removed (see [`AdapterCell::release_weights`]).
    weights_released: AtomicBool,
    /// Its requests in flight and held, counted against the limits.
    load: Arc<AdapterLoad>,
    pub(crate) waiting: AtomicU32,
    /// Admitted requests that have produced a token in their current attempt (the rest are queued in the engine or
    /// prefilling).
    pub(crate) running: AtomicU32,
    /// Requests stopped by a keep-mode pause, waiting in the core to continue.
    pub(crate) kept: AtomicU32,
    /// The live pauses; the gate is closed while there is any.
    pauses: Mutex<PauseBook>,
    /// When the gate last closed (for the pause-duration metric).
    paused_at: Mutex<Option<Instant>>,
    /// Set while the adapter has no weights in the engine: its recorded weights could not be loaded at start. The
    /// flag is what admission reads; the reason is for the error and the listing.
    weights_missing: AtomicBool,
    weights_error: Mutex<Option<Arc<str>>>,
    /// The servable versions (current and retained for pins) and the pins on them.
    versions: Mutex<RetainedVersions>,
    /// The staleness bound, if one is set.
    staleness: Mutex<Option<StalenessBound>>,
    /// How many times a staleness policy was set or cleared (each setting's generation).
    staleness_settings: AtomicU64,
    /// Requests held at the staleness bound (also counted as held).
    pub(crate) staleness_held: AtomicU32,
    /// The newest version published on the gate and the instant it was (what benchmarks time held requests from).
    #[cfg(any(test, feature = "testing"))]
    installed_at: Mutex<Option<(AdapterVersion, Instant)>>,
    /// When the last pass over parked requests started and ended (what benchmarks break the hold down with).
    #[cfg(any(test, feature = "testing"))]
    last_pass: Mutex<Option<(Instant, Instant)>>,
    state: Arc<dyn StateStore>,
    pub(crate) metrics: Arc<CoreMetrics>,
    pub(crate) labels: AdapterLabels,
}

impl AdapterCell {
    /// A cell for `key` whose first load will be `last_version.next()`, keeping `retain_versions` versions servable.
    /// The gate starts open.
    pub(crate) fn new(
        key: AdapterKey,
        last_version: AdapterVersion,
        retain_versions: usize,
        metrics: Arc<CoreMetrics>,
        server_load: &Arc<ServerLoad>,
        state: Arc<dyn StateStore>,
    ) -> Self {
        let gate =
            GateState { paused: false, version: last_version, retired: None, abort_pauses: 0, admission_epoch: 0 };
        Self {
            versions: Mutex::new(RetainedVersions::new(retain_versions)),
            staleness: Mutex::new(None),
            staleness_settings: AtomicU64::new(0),
            staleness_held: AtomicU32::new(0),
            #[cfg(any(test, feature = "testing"))]
            installed_at: Mutex::new(None),
            #[cfg(any(test, feature = "testing"))]
            last_pass: Mutex::new(None),
            labels: AdapterLabels::of(&key),
            metrics,
            paused_at: Mutex::new(None),
            weights_missing: AtomicBool::new(false),
            weights_error: Mutex::new(None),
            state,
            key,
            gate: watch::Sender::new(gate),
            actor: watch::Sender::new(None),
            last_reserved_version: AtomicU64::new(last_version.0),
            weights_released: AtomicBool::new(false),
            load: AdapterLoad::new(server_load),
            waiting: AtomicU32::new(0),
            running: AtomicU32::new(0),
            kept: AtomicU32::new(0),
            pauses: Mutex::new(PauseBook::default()),
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
        self.counting_overloads(self.load.occupy(occupancy, &self.key))
    }

    /// Counts a held request of this adapter (its `held` slot) as in flight instead, or refuses it naming the limit
    /// that is reached (see [`Slot::recount`]).
    pub(crate) fn admit_held(&self, held: Slot) -> Result<Slot, CoreError> {
        self.counting_overloads(held.recount(Occupancy::InFlight, &self.key))
    }

    /// `slot`, with a refusal over a limit counted in the metrics.
    fn counting_overloads(&self, slot: Result<Slot, CoreError>) -> Result<Slot, CoreError> {
        if let Err(CoreError::Overloaded { limit, .. }) = &slot {
            self.metrics.record_overload(*limit);
        }
        slot
    }

    /// Counts one of its requests as in flight or held without checking the caps (a request the server already
    /// accepted, coming back from a keep-mode pause).
    pub(crate) fn occupy_uncapped(&self, occupancy: Occupancy) -> Slot {
        self.load.count(occupancy)
    }

    /// Adds `request`'s pause (or renews its owner's) and closes the gate; queues its record if it is recorded.
    pub(crate) fn pause(&self, request: &PauseRequest) -> (Paused, Recording<AbortReport>) {
        let paused = self.pauses.lock().pause(request, || self.state.new_pause_id(), |id, at| self.lease_timer(id, at));
        let wall_expiry = request.lease.map(|lease| SystemTime::now() + lease);
        let recording = self.record_pause(&request.owner, &paused.pause_id, request.mode, wall_expiry);
        self.close_gate(request.mode);
        (paused, recording)
    }

    /// Puts back a recorded pause (at start, or made by another coordinator) under its own id, closing the gate,
    /// without acting on admitted requests. A pause whose lease ran out meanwhile ends instead (and its record goes).
    pub(crate) fn adopt(&self, record: &PauseRecord) -> Recording {
        let lease_left = match record.lease_expires_at.map(|at| at.duration_since(SystemTime::now())) {
            None => None,
            Some(Ok(left)) if left > Duration::ZERO => Some(left),
            Some(_) => {
                tracing::warn!(
                    adapter = %self.key, pause_id = %record.pause_id, owner = %record.owner,
                    "a recorded pause's lease ran out while the server was down; released it"
                );
                self.metrics.record_lease_expiry(&self.labels);
                return self
                    .record_ended(vec![(PauseOwner::Named(record.owner.as_str().into()), record.pause_id.clone())]);
            }
        };
        let owner = PauseOwner::Named(record.owner.as_str().into());
        self.pauses
            .lock()
            .adopt(owner, record.pause_id.clone(), record.mode, lease_left, |id, at| self.lease_timer(id, at));
        self.close_gate(record.mode);
        nothing_to_record()
    }

    /// A lease's timer: it reports to whichever incarnation of the actor is current when it fires.
    fn lease_timer(&self, pause_id: PauseId, expires_at: tokio::time::Instant) -> AbortOnDropHandle<()> {
        let mut incarnations = self.subscribe_actor();
        AbortOnDropHandle::new(tokio::spawn(async move {
            tokio::time::sleep_until(expires_at).await;
            // If the actor is between incarnations, tell the next one; stop once the adapter is removed.
            loop {
                let Some(actor) = incarnations.borrow_and_update().as_ref().map(|current| current.actor.clone()) else {
                    return;
                };
                let ended = AdapterMsg::LeaseEnded { pause_id: pause_id.clone(), expires_at };
                if actor.cast(ended).is_ok() || incarnations.changed().await.is_err() {
                    return;
                }
            }
        }))
    }

    fn close_gate(&self, mode: PauseMode) {
        if mode == PauseMode::Abort {
            // Before the gate closes, so that a kept request never sees this pause close the gate without it.
            self.gate.send_modify(|gate| gate.abort_pauses += 1);
        }
        self.sync_gate();
    }

    /// Queues the record of a pause made or renewed, if its owner's pauses are recorded (named owners: a swap's
    /// pause dies with its call, and the global pause is recorded once, by the manager).
    fn record_pause(
        &self,
        owner: &PauseOwner,
        pause_id: &PauseId,
        mode: PauseMode,
        lease_expires_at: Option<SystemTime>,
    ) -> Recording<AbortReport> {
        let (AdapterKey::Lora(adapter), PauseOwner::Named(owner)) = (&self.key, owner) else {
            return Box::pin(std::future::ready(Ok(AbortReport::default())));
        };
        let record = PauseRecord {
            adapter: adapter.clone(),
            pause_id: pause_id.clone(),
            owner: owner.to_string(),
            mode,
            lease_expires_at,
        };
        self.state.record_pause(record)
    }

    /// Queues the end of the recorded ones among `ended`.
    fn record_ended(&self, ended: Vec<(PauseOwner, PauseId)>) -> Recording {
        let AdapterKey::Lora(adapter) = &self.key else { return nothing_to_record() };
        let changes: Vec<StateChange> = ended
            .into_iter()
            .filter(|(owner, _)| matches!(owner, PauseOwner::Named(_)))
            .map(|(_, pause_id)| StateChange::PauseEnded { adapter: adapter.clone(), pause_id })
            .collect();
        if changes.is_empty() { nothing_to_record() } else { self.state.record(changes) }
    }

    /// Releases the pause `id` (every pause for `None`), reopening the gate if it was the last.
    pub(crate) fn release(&self, id: Option<&PauseId>) -> (ResumeReport, Recording) {
        let was_paused = self.gate_state().paused;
        let ended = self.pauses.lock().release(id);
        let recording = self.record_ended(ended);
        (ResumeReport { was_paused, still_paused: self.sync_gate() }, recording)
    }

    /// Releases the pause `id` without recording its end (another replica ended it, and recorded that), reopening
    /// the gate if it was the last.
    pub(crate) fn release_unrecorded(&self, id: &PauseId) -> ResumeReport {
        let was_paused = self.gate_state().paused;
        drop(self.pauses.lock().release(Some(id)));
        ResumeReport { was_paused, still_paused: self.sync_gate() }
    }

    /// Releases the pause `owner` holds, reopening the gate if it was the last.
    pub(crate) fn release_owner(&self, owner: &PauseOwner) -> (ResumeReport, Recording) {
        let was_paused = self.gate_state().paused;
        let ended = {
            let mut pauses = self.pauses.lock();
            match pauses.of_owner(owner) {
                Some(pause_id) => pauses.release(Some(&pause_id)),
                None => Vec::new(),
            }
        };
        let recording = self.record_ended(ended);
        (ResumeReport { was_paused, still_paused: self.sync_gate() }, recording)
    }

    /// Ends the pause `id` if the lease that expires at `expires_at` is still its lease and has run out; returns the
    /// owner whose pause ended. Its record's end is queued (nobody waits for it).
    pub(crate) fn expire_lease(&self, id: &PauseId, expires_at: tokio::time::Instant) -> Option<PauseOwner> {
        let owner = self.pauses.lock().expire(id, expires_at)?;
        drop(self.record_ended(vec![(owner.clone(), id.clone())]));
        self.metrics.record_lease_expiry(&self.labels);
        self.sync_gate();
        Some(owner)
    }

    /// Makes the gate say what the pause book says, recording pauses and reopenings; returns whether it is closed.
    fn sync_gate(&self) -> bool {
        let paused = self.pauses.lock().is_paused();
        let changed = self.gate.send_if_modified(|gate| std::mem::replace(&mut gate.paused, paused) != paused);
        if changed && paused {
            *self.paused_at.lock() = Some(Instant::now());
            self.metrics.record_pause(&self.labels);
        } else if changed && let Some(paused_at) = self.paused_at.lock().take() {
            self.metrics.record_reopen(&self.labels, paused_at.elapsed());
        }
        paused
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

    /// Takes `version` (issued by the state store) for a load of this adapter; `false` once the versions are sealed
    /// (the adapter is unloaded: the load must not start).
    pub(crate) fn reserve_version(&self, version: AdapterVersion) -> bool {
        self.last_reserved_version
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |last| {
                (last & SEALED == 0).then_some(last.max(version.0))
            })
            .is_ok()
    }

    /// Gives back a version whose load failed, if no later one was handed out (and the versions are not sealed), so
    /// failures leave no gaps.
    pub(crate) fn give_back_version(&self, version: AdapterVersion) {
        let _ =
            self.last_reserved_version.compare_exchange(version.0, version.0 - 1, Ordering::AcqRel, Ordering::Acquire);
    }

    /// Stops handing out versions (the adapter is being unloaded) and returns the last one handed out: every version
    /// this adapter's loads can ever install is at most that, and a reload of the name starts above it.
    pub(crate) fn seal_versions(&self) -> AdapterVersion {
        AdapterVersion(self.last_reserved_version.fetch_or(SEALED, Ordering::AcqRel) & !SEALED)
    }

    /// Says that no request of this (unloaded) adapter will reach the engine any more: its unload saw every admitted
    /// request handed back and is about to remove the weights of every version it sealed. A load that installs after
    /// this removes its own weights ([`AdapterCell::weights_released`]); one that installs before finds the flag
    /// unset and leaves them to the unload's removal, which follows the flag. Either way they go, and never while an
    /// admitted request may still ask the engine for them.
    pub(crate) fn release_weights(&self) {
        self.weights_released.store(true, Ordering::SeqCst);
    }

    /// Whether [`AdapterCell::release_weights`] was called.
    pub(crate) fn weights_released(&self) -> bool {
        self.weights_released.load(Ordering::SeqCst)
    }

    /// Marks the adapter as having no weights in the engine, for `reason` (its recorded weights could not be loaded
    /// at start); a successful load clears it.
    pub(crate) fn set_weights_missing(&self, reason: &str) {
        *self.weights_error.lock() = Some(reason.into());
        self.weights_missing.store(true, Ordering::Release);
    }

    /// Why the adapter has no weights in the engine, if it has none.
    pub(crate) fn weights_error(&self) -> Option<Arc<str>> {
        if !self.weights_missing.load(Ordering::Acquire) {
            return None;
        }
        self.weights_error.lock().clone()
    }

    /// The state store this adapter records its changes in.
    pub(crate) fn state(&self) -> &Arc<dyn StateStore> {
        &self.state
    }

    /// Makes `servable`'s version current unless a later one already is (it is then kept servable only if the count
    /// of retained versions allows); the adapter has weights again. Returns the versions the engine may release now.
    pub(crate) fn install(&self, servable: Servable) -> Vec<AdapterVersion> {
        if self.weights_missing.swap(false, Ordering::AcqRel) {
            *self.weights_error.lock() = None;
        }
        let version = servable.info.version;
        let release = self.versions.lock().install(servable);
        self.gate.send_if_modified(|gate| {
            let newer = version > gate.version;
            if newer {
                gate.version = version;
                // Just before the new version is published (the watch notifies once this returns).
                #[cfg(any(test, feature = "testing"))]
                {
                    *self.installed_at.lock() = Some((version, Instant::now()));
                }
            }
            newer
        });
        self.metrics.forget_old_versions(&self.labels, version);
        release
    }

    /// When `version` was published on the gate, if it is the newest version installed.
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn installed_at(&self, version: AdapterVersion) -> Option<Instant> {
        self.installed_at.lock().filter(|(installed, _)| *installed == version).map(|(_, at)| at)
    }

    /// Records a pass over parked requests that started at `started` and ends now.
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn record_pass(&self, started: Instant) {
        *self.last_pass.lock() = Some((started, Instant::now()));
    }

    /// When the last pass over parked requests started and ended.
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn last_pass(&self) -> Option<(Instant, Instant)> {
        *self.last_pass.lock()
    }

    /// The records of the servable versions other than `current`, oldest first (what an install records as retained).
    pub(crate) fn retained_records(&self, current: AdapterVersion) -> Vec<VersionRecord> {
        let versions = self.versions.lock();
        let servable = versions.servable().iter().filter(|held| held.info.version != current);
        servable.map(|held| VersionRecord { version: held.info.version, source: held.source.clone() }).collect()
    }

    /// Pins `version` for one request (see [`VersionPin`]).
    pub(crate) fn pin(self: &Arc<Self>, version: AdapterVersion) -> Result<VersionPin, PinRefused> {
        self.versions.lock().pin(version)?;
        Ok(VersionPin { cell: self.clone(), version })
    }

    /// The servable versions, oldest first.
    pub(crate) fn servable_versions(&self) -> Vec<Servable> {
        self.versions.lock().servable().to_vec()
    }

    /// Has the actor tell the engine to release `versions` (no longer servable, no longer pinned).
    fn release_from_engine(&self, versions: Vec<AdapterVersion>) {
        if let Some(actor) = self.current_actor() {
            // An actor that is gone was unloaded: the unload removes every version's weights.
            let _ = actor.cast(AdapterMsg::ReleaseVersions { versions });
        }
    }

    /// Sets (or, with `None`, clears) the staleness bound at the current version; queues its record.
    pub(crate) fn set_staleness(&self, policy: Option<StalenessPolicy>) -> Recording {
        let generation = self.staleness_settings.fetch_add(1, Ordering::AcqRel) + 1;
        *self.staleness.lock() =
            policy.map(|policy| StalenessBound::new(policy, self.gate_state().version, generation));
        self.gate.send_modify(|gate| gate.admission_epoch += 1);
        match &self.key {
            AdapterKey::Lora(name) => self.state.record(vec![StateChange::Staleness { name: name.clone(), policy }]),
            AdapterKey::Base => nothing_to_record(),
        }
    }

    /// Sets the staleness bound recorded before a restart (or by another replica) at the current version, without
    /// recording it again.
    pub(crate) fn restore_staleness(&self, policy: Option<StalenessPolicy>) {
        let generation = self.staleness_settings.fetch_add(1, Ordering::AcqRel) + 1;
        *self.staleness.lock() =
            policy.map(|policy| StalenessBound::new(policy, self.gate_state().version, generation));
        self.gate.send_modify(|gate| gate.admission_epoch += 1);
    }

    /// Counts `sequences` more as started under the staleness bound: `Ok` with a ticket to give them back if they
    /// end aborted (`None` without a bound, or for no new sequences), `Err` with the capacity if they do not fit now.
    /// `current` is the adapter's version the caller read from the gate.
    pub(crate) fn start_sequences(
        self: &Arc<Self>,
        sequences: u32,
        current: AdapterVersion,
    ) -> Result<Option<StalenessTicket>, u64> {
        let mut staleness = self.staleness.lock();
        let Some(bound) = staleness.as_mut().filter(|_| sequences > 0) else { return Ok(None) };
        if !bound.try_start(sequences, current) {
            return Err(bound.capacity(current));
        }
        Ok(Some(StalenessTicket { cell: self.clone(), generation: bound.generation() }))
    }

    /// The staleness bound's state, if one is set.
    fn staleness_status(&self) -> Option<StalenessStatus> {
        let staleness = *self.staleness.lock();
        staleness.map(|bound| StalenessStatus {
            policy: bound.policy(),
            started: bound.started(),
            capacity: bound.capacity(self.gate_state().version),
            held: self.staleness_held.load(Ordering::Acquire),
        })
    }

    /// The current incarnation of the adapter's actor; `None` once the adapter is removed.
    pub(crate) fn current_actor(&self) -> Option<ActorRef<AdapterMsg>> {
        self.actor.borrow().as_ref().map(|current| current.actor.clone())
    }

    /// The current incarnation's registry; `None` once the adapter is removed. (Taken out of the watch, so that
    /// nobody locks a registry while reading the watch.)
    pub(crate) fn current_registry(&self) -> Option<SharedRegistry> {
        self.actor.borrow().as_ref().map(|current| current.registry.clone())
    }

    pub(crate) fn subscribe_actor(&self) -> watch::Receiver<Option<Incarnation>> {
        self.actor.subscribe()
    }

    /// Points the cell at a new incarnation (or at none, on removal).
    pub(crate) fn set_actor(&self, incarnation: Option<Incarnation>) {
        self.actor.send_replace(incarnation);
    }

    /// A snapshot, given the registry's size (known only to the actor).
    pub(crate) fn status(&self, in_flight: usize) -> AdapterStatus {
        let gate = self.gate_state();
        AdapterStatus {
            key: self.key.clone(),
            version: gate.version,
            paused: gate.paused,
            in_flight: u32::try_from(in_flight).unwrap_or(u32::MAX),
            running: self.running.load(Ordering::Acquire),
            held: self.load.held(),
            waiting: self.waiting.load(Ordering::Acquire),
            kept: self.kept.load(Ordering::Acquire),
            pauses: self.pauses.lock().snapshot(),
            weights_error: self.weights_error().map(|reason| reason.to_string()),
            versions: self.servable_versions().into_iter().map(|servable| servable.info).collect(),
            staleness: self.staleness_status(),
        }
    }
}

/// A request's hold on the exact version it pinned (`NAME@V`): the version stays loaded in the engine until the pin
/// goes, even if newer ones replaced it meanwhile. Held by the request's driver until the request ends, across
/// keep-mode pauses.
pub(crate) struct VersionPin {
    cell: Arc<AdapterCell>,
    version: AdapterVersion,
}

impl Drop for VersionPin {
    fn drop(&mut self) {
        let released = self.cell.versions.lock().unpin(self.version);
        if let Some(version) = released {
            self.cell.release_from_engine(vec![version]);
        }
    }
}

/// The places a request took under its adapter's staleness bound: what it gives back for sequences that end aborted
/// (their continuations, resubmitted, take places again).
pub(crate) struct StalenessTicket {
    cell: Arc<AdapterCell>,
    generation: u64,
}

impl StalenessTicket {
    /// Gives back the places of `sequences` that ended aborted, if the policy that counted them is still in force.
    pub(crate) fn give_back(&self, sequences: u32) {
        let mut staleness = self.cell.staleness.lock();
        if let Some(bound) = staleness.as_mut().filter(|bound| bound.generation() == self.generation) {
            bound.give_back(sequences);
            drop(staleness);
            self.cell.gate.send_modify(|gate| gate.admission_epoch += 1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealed_versions_are_never_handed_out_and_a_release_does_not_unseal() {
        let load = ServerLoad::new(crate::limits::Limits::default());
        let state = Arc::new(crate::state::MemoryStore::new());
        let cell = AdapterCell::new(AdapterKey::Base, AdapterVersion(4), 1, Arc::default(), &load, state);
        assert!(cell.reserve_version(AdapterVersion(5)));
        assert!(cell.reserve_version(AdapterVersion(6)));
        cell.give_back_version(AdapterVersion(5));
        assert_eq!(cell.seal_versions(), AdapterVersion(6), "a release of an older version leaves the count");
        assert!(!cell.reserve_version(AdapterVersion(7)));
        cell.give_back_version(AdapterVersion(6));
        assert!(!cell.reserve_version(AdapterVersion(8)), "still sealed after a release");
        assert_eq!(cell.seal_versions(), AdapterVersion(6), "sealing again changes nothing");
    }
}
