//! The adapter actor: the single writer of one adapter's gate and version, and the owner of its incarnation's
//! in-flight registry (admissions register themselves in it under its lock: see `admission`). Every handler is
//! short and non-blocking: waits happen on the gate's `watch` outside the actor, weight loads run on a spawned task
//! that reports back with a message, and per-request failures travel on reply ports (an `Err` from `handle` would
//! kill the actor).

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;

use ractor::{Actor, ActorProcessingErr, ActorRef, MessagingErr, RpcReplyPort};

use super::admission::admit_parked;
use super::cell::AdapterCell;
use super::registry::{OwnedRegistry, PendingHandBacks, SharedRegistry};
use super::versions::Servable;
use crate::adapter_source::AdapterSource;
use crate::contract::{
    AbortReport, AdapterKey, AdapterName, AdapterStatus, AdapterVersion, CoreError, KvPolicy, PauseId, PauseMode,
    PauseOwner, PauseRequest, RequestId, ResumeReport, Retirement, StalenessPolicy, StateError, StopCause, VersionInfo,
};
use crate::engine::Engine;
use crate::state::{PauseRecord, RecordedSource, Recording, StateChange, nothing_to_record};

/// The commands an adapter actor serves. Only [`super::AdapterHandle`] and the manager build them. (Admission is no
/// command: the admitting task registers itself in the registry the actor owns, under its lock; see `admission`.)
pub(crate) enum AdapterMsg {
    /// Adds (or renews) a pause, which closes the gate, then acts on the admitted requests as its mode says:
    /// cancels them (abort), cancels them to be kept (keep), or only watches them (wait).
    Pause { request: PauseRequest, reply: RpcReplyPort<PauseTicket> },
    /// Releases pauses, reopening the gate when none is left; answers with the recording of the released pauses' end.
    Release { target: ReleaseTarget, reply: RpcReplyPort<(ResumeReport, Recording)> },
    /// Puts back pauses recorded earlier (see [`AdapterCell::adopt`]), closing the gate without acting on admitted
    /// requests.
    Adopt { pauses: Vec<PauseRecord> },
    /// Applies a pause another replica made (adopted as recorded, not recorded again), then acts on the admitted
    /// requests as its mode says (a keep-mode one recomputes); answers with what to wait on.
    AdoptRemote { record: PauseRecord, reply: RpcReplyPort<PendingHandBacks> },
    /// Serves a version another replica installed (or one recorded before a restart) that this replica's engine has
    /// loaded.
    InstallRemote { servable: Servable, reply: RpcReplyPort<()> },
    /// Marks the adapter as having no servable weights, for `reason` (another replica's version could not be fetched
    /// in time): its samples are refused until an install gives it weights.
    WeightsMissing { reason: String, reply: RpcReplyPort<()> },
    /// Tells the engine to release versions no longer servable and no longer pinned.
    ReleaseVersions { versions: Vec<AdapterVersion> },
    /// Sets (or clears) the staleness bound; answers with its record (none if `record` is false: another replica set
    /// it and recorded that).
    SetStaleness { policy: Option<StalenessPolicy>, record: bool, reply: RpcReplyPort<Recording> },
    /// A lease timer fired for the lease of `pause_id` that expires at `expires_at`.
    LeaseEnded { pause_id: PauseId, expires_at: tokio::time::Instant },
    /// Cancels admitted requests without pausing: those with these ids, or every one for `None`.
    AbortRequests { ids: Option<Arc<HashSet<RequestId>>>, reply: RpcReplyPort<PendingHandBacks> },
    /// Queues a weight load; answers with the new version once installed.
    Load { source: AdapterSource, reply: RpcReplyPort<Result<VersionInfo, CoreError>> },
    /// A load task finished.
    LoadFinished { outcome: Result<Servable, LoadFailure>, reply: RpcReplyPort<Result<VersionInfo, CoreError>> },
    /// Marks the adapter retired and cancels every admitted request (before the actor is drained); an unloaded
    /// adapter's record goes if `record` (not when another replica unloaded it and recorded that). The reply is
    /// always `Ok` from the actor; the manager answers on the same port with an error for an unknown adapter.
    Retire { why: Retirement, record: bool, reply: RpcReplyPort<Result<Retired, CoreError>> },
    /// A snapshot of the adapter's state.
    Status { reply: RpcReplyPort<AdapterStatus> },
    /// Makes the handler fail, so tests can watch the supervisor restart the actor.
    #[cfg(test)]
    FailForTest,
}

/// Which pauses [`AdapterMsg::Release`] releases.
#[derive(Clone)]
pub(crate) enum ReleaseTarget {
    /// Every pause (a resume without a pause id).
    All,
    /// One pause.
    Pause(PauseId),
    /// The pause of one owner (a global resume releases the global pause only).
    Owner(PauseOwner),
    /// One pause another replica ended (and recorded the end of).
    Remote(PauseId),
}

/// The answer to [`AdapterMsg::Pause`].
pub(crate) struct PauseTicket {
    /// The pause now holding the gate.
    pub(crate) pause_id: PauseId,
    /// Whether the call created it (rather than renewing its owner's pause).
    pub(crate) created: bool,
    /// The admitted requests the pause acted on, to wait for.
    pub(crate) pending: PendingHandBacks,
    /// The pause's record, queued in the state store; resolves with what other replicas handed back (a shared
    /// store).
    pub(crate) recorded: Recording<AbortReport>,
}

/// The answer to [`AdapterMsg::Retire`].
pub(crate) struct Retired {
    /// The admitted requests cancelled, to wait for.
    pub(crate) pending: PendingHandBacks,
    /// The removal of an unloaded adapter's record, queued in the state store.
    pub(crate) recorded: Recording,
}

/// A load that installed nothing.
pub(crate) struct LoadFailure {
    /// The version the state store issued it, if it got that far (given back now).
    issued: Option<AdapterVersion>,
    /// Why.
    error: CoreError,
}

/// What an adapter actor tells the manager that supervises it. Defined here, where it is used (the manager's handle
/// implements it), so that the adapter's floor does not import the manager's.
pub(crate) trait Supervisor: Send + Sync + 'static {
    /// One load of `key` finished: the supervisor updates its bookkeeping, then answers the load's caller on
    /// `reply` (with `result`, unless its record failed). If the supervisor is gone, the caller is answered at once.
    fn load_settled(
        &self,
        key: AdapterKey,
        result: Result<VersionInfo, CoreError>,
        recorded: Result<(), StateError>,
        reply: RpcReplyPort<Result<VersionInfo, CoreError>>,
    );
}

/// The actor's behaviour (stateless; its state is [`AdapterState`]).
pub(crate) struct AdapterActor;

/// What an adapter actor starts from. The same cell is handed to every incarnation of the actor; the registry is
/// this incarnation's own (the manager publishes its shared side with the actor's address, see [`Incarnation`]).
pub(crate) struct AdapterArgs {
    pub(crate) cell: Arc<AdapterCell>,
    pub(crate) engine: Arc<dyn Engine>,
    pub(crate) manager: Arc<dyn Supervisor>,
    pub(crate) registry: OwnedRegistry,
}

/// One incarnation of an adapter's actor as its handles reach it: its address, and its in-flight registry, in which
/// admissions register themselves.
#[derive(Clone)]
pub(crate) struct Incarnation {
    pub(crate) actor: ActorRef<AdapterMsg>,
    pub(crate) registry: SharedRegistry,
}

/// One incarnation's state. The durable part (gate, version) lives in the cell; the registry dies with the
/// incarnation, and aborts what it held when it does (see [`OwnedRegistry`]'s `Drop`).
pub(crate) struct AdapterState {
    cell: Arc<AdapterCell>,
    engine: Arc<dyn Engine>,
    manager: Arc<dyn Supervisor>,
    registry: OwnedRegistry,
    loads: LoadQueue,
}

/// Weight loads of this adapter run one at a time, in arrival order.
#[derive(Default)]
struct LoadQueue {
    running: bool,
    queued: VecDeque<(AdapterSource, RpcReplyPort<Result<VersionInfo, CoreError>>)>,
}

impl Actor for AdapterActor {
    type Msg = AdapterMsg;
    type State = AdapterState;
    type Arguments = AdapterArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<AdapterMsg>,
        args: AdapterArgs,
    ) -> Result<AdapterState, ActorProcessingErr> {
        let AdapterArgs { cell, engine, manager, registry } = args;
        Ok(AdapterState { cell, engine, manager, registry, loads: LoadQueue::default() })
    }

    async fn handle(
        &self,
        _myself: ActorRef<AdapterMsg>,
        message: AdapterMsg,
        state: &mut AdapterState,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            AdapterMsg::Pause { request, reply } => {
                // The gate closes before the pass over the registry (see `admission`).
                let (paused, recorded) = state.cell.pause(&request);
                let pending = state.act_on_admitted(request.mode, request.kv_policy);
                let ticket = PauseTicket { pause_id: paused.pause_id, created: paused.created, pending, recorded };
                let _ = reply.send(ticket);
            }
            AdapterMsg::Adopt { pauses } => {
                for pause in &pauses {
                    // An expired pause's end is queued; nobody waits for it.
                    drop(state.cell.adopt(pause));
                }
            }
            AdapterMsg::AdoptRemote { record, reply } => {
                drop(state.cell.adopt(&record));
                let _ = reply.send(state.act_on_admitted(record.mode, KvPolicy::Recompute));
            }
            AdapterMsg::InstallRemote { servable, reply } => {
                // A sealed (unloaded) adapter takes no version; an older one than it serves is kept servable only if
                // the count of retained versions allows.
                if state.cell.reserve_version(servable.info.version) {
                    let release = state.cell.install(servable);
                    state.admit_parked();
                    state.release_from_engine(release);
                }
                let _ = reply.send(());
            }
            AdapterMsg::WeightsMissing { reason, reply } => {
                state.cell.set_weights_missing(&reason);
                let _ = reply.send(());
            }
            AdapterMsg::ReleaseVersions { versions } => state.release_from_engine(versions),
            AdapterMsg::SetStaleness { policy, record: true, reply } => {
                let _ = reply.send(state.cell.set_staleness(policy));
            }
            AdapterMsg::SetStaleness { policy, record: false, reply } => {
                state.cell.restore_staleness(policy);
                let _ = reply.send(nothing_to_record());
            }
            AdapterMsg::Release { target, reply } => {
                let report = match target {
                    ReleaseTarget::All => state.cell.release(None),
                    ReleaseTarget::Pause(pause_id) => state.cell.release(Some(&pause_id)),
                    ReleaseTarget::Owner(owner) => state.cell.release_owner(&owner),
                    ReleaseTarget::Remote(pause_id) => (state.cell.release_unrecorded(&pause_id), nothing_to_record()),
                };
                let _ = reply.send(report);
            }
            AdapterMsg::LeaseEnded { pause_id, expires_at } => {
                if let Some(owner) = state.cell.expire_lease(&pause_id, expires_at) {
                    tracing::warn!(
                        adapter = %state.cell.key(), %pause_id, %owner,
                        "a pause's lease ran out before anyone resumed it; released it"
                    );
                }
            }
            AdapterMsg::AbortRequests { ids, reply } => {
                let pending = match ids {
                    Some(ids) => state.registry.lock().cancel_matching(&ids, StopCause::Targeted),
                    None => state.registry.lock().cancel_all(StopCause::Targeted),
                };
                let _ = reply.send(pending);
            }
            AdapterMsg::Load { source, reply } => {
                state.loads.queued.push_back((source, reply));
                state.start_next_load();
            }
            AdapterMsg::LoadFinished { outcome, reply } => state.finish_load(outcome, reply),
            AdapterMsg::Retire { why, record, reply } => {
                // Retired before the pass over the registry (see `admission`).
                state.cell.retire(why);
                let recorded = match (why, state.cell.key()) {
                    // Recorded here, after any install this actor recorded: an unloaded adapter never comes back.
                    (Retirement::Unloaded, AdapterKey::Lora(name)) if record => {
                        state.cell.state().record(vec![StateChange::Unloaded { name: name.clone() }])
                    }
                    _ => nothing_to_record(),
                };
                let pending = state.registry.lock().cancel_all(StopCause::Retired);
                // Requests parked for a version are answered with the retirement (no admission: a short pass).
                admit_parked(&state.registry.share(), &state.cell);
                let _ = reply.send(Ok(Retired { pending, recorded }));
            }
            AdapterMsg::Status { reply } => {
                let in_flight = state.registry.lock().len();
                let _ = reply.send(state.cell.status(in_flight));
            }
            #[cfg(test)]
            AdapterMsg::FailForTest => return Err("failure injected by a test".into()),
        }
        Ok(())
    }
}

impl AdapterState {
    /// Tells the engine to release `versions` of this adapter, on a task (the actor never waits for the engine).
    fn release_from_engine(&self, versions: Vec<AdapterVersion>) {
        let AdapterKey::Lora(name) = self.cell.key().clone() else { return };
        if versions.is_empty() {
            return;
        }
        let engine = self.engine.clone();
        tokio::spawn(async move {
            for version in versions {
                if let Err(err) = engine.release_version(&name, version).await {
                    tracing::warn!(adapter = %name, %version, %err, "the engine could not release a replaced version");
                }
            }
        });
    }

    /// Admits the requests parked for a version, now that one was installed and published on the gate: one pass
    /// under one hold of the registry's lock, on a task spawned at once (the pass is as long as the requests parked;
    /// see `admission::admit_parked`). Nothing to do if none is parked now: any parked later read the new version.
    fn admit_parked(&self) {
        if !self.registry.lock().has_parked() {
            return;
        }
        let (registry, cell) = (self.registry.share(), self.cell.clone());
        tokio::spawn(async move { admit_parked(&registry, &cell) });
    }

    /// Acts on every admitted request as a pause in `mode` says: cancels them (abort), stops them to be kept (keep:
    /// parked with the REUSE policy), or only watches them (wait).
    fn act_on_admitted(&mut self, mode: PauseMode, kv_policy: KvPolicy) -> PendingHandBacks {
        let mut registry = self.registry.lock();
        match mode {
            PauseMode::Abort => registry.cancel_all(StopCause::Paused),
            PauseMode::Keep if kv_policy == KvPolicy::Reuse => registry.park_all(),
            PauseMode::Keep => registry.cancel_all(StopCause::Kept),
            PauseMode::Wait => registry.pending_all(),
        }
    }

    /// Starts the oldest queued load unless one is running. The load itself runs on a task (the state store issues
    /// its version, then the engine loads); it reports back to whichever incarnation of this actor is current when it
    /// finishes.
    fn start_next_load(&mut self) {
        if self.loads.running {
            return;
        }
        let Some((source, reply)) = self.loads.queued.pop_front() else {
            return;
        };
        let AdapterKey::Lora(name) = self.cell.key().clone() else {
            let _ = reply.send(Err(CoreError::UnknownAdapter(AdapterKey::Base)));
            return;
        };
        if self.cell.gate_state().retired.is_some() {
            // Unloaded: queued loads never start.
            let gone = || Err(CoreError::UnknownAdapter(self.cell.key().clone()));
            let _ = reply.send(gone());
            for (_, reply) in self.loads.queued.drain(..) {
                let _ = reply.send(gone());
            }
            return;
        }
        self.loads.running = true;
        let (cell, engine) = (self.cell.clone(), self.engine.clone());
        tokio::spawn(async move {
            let outcome = load_weights(&cell, &*engine, &name, &source).await;
            match cell.current_actor() {
                Some(actor) => {
                    let finished = AdapterMsg::LoadFinished { outcome, reply };
                    if let Err(MessagingErr::SendErr(AdapterMsg::LoadFinished { reply, .. })) = actor.cast(finished) {
                        // The actor is stopping (unloaded): the caller learns the adapter is gone.
                        let _ = reply.send(Err(CoreError::UnknownAdapter(cell.key().clone())));
                    }
                }
                None => {
                    let _ = reply.send(Err(CoreError::UnknownAdapter(cell.key().clone())));
                }
            }
        });
    }

    /// Installs (and records) a finished load, or gives back a failed one's version; the manager answers the caller
    /// once the record is durable and its bookkeeping is done (a new adapter is published first).
    fn finish_load(
        &mut self,
        outcome: Result<Servable, LoadFailure>,
        reply: RpcReplyPort<Result<VersionInfo, CoreError>>,
    ) {
        self.loads.running = false;
        let name = self.cell.key().adapter_name().cloned();
        let (result, recorded) = match (outcome, name) {
            (Ok(servable), Some(name)) => {
                let (version, source) = (servable.info.version, servable.source.clone());
                let installed = servable.info.clone();
                let release = self.cell.install(servable);
                self.admit_parked();
                self.release_from_engine(release);
                let recorded = if self.cell.gate_state().retired.is_some() {
                    // Unloaded meanwhile: its record is gone and stays gone.
                    nothing_to_record()
                } else {
                    let retained = self.cell.retained_records(version);
                    self.cell.state().record(vec![StateChange::Installed { name, version, source, retained }])
                };
                (Ok(installed), recorded)
            }
            (Err(LoadFailure { issued: Some(version), error }), Some(name)) => {
                self.cell.give_back_version(version);
                (Err(error), self.cell.state().record(vec![StateChange::VersionReturned { name, version }]))
            }
            (Err(LoadFailure { error, .. }), _) => (Err(error), nothing_to_record()),
            (Ok(_), None) => (Err(CoreError::UnknownAdapter(AdapterKey::Base)), nothing_to_record()),
        };
        let (manager, key) = (self.manager.clone(), self.cell.key().clone());
        tokio::spawn(async move {
            let recorded = recorded.await;
            manager.load_settled(key, result, recorded, reply);
        });
        self.start_next_load();
    }
}

/// One load: the state store issues the version (durably, before anything is installed), then the engine loads, and
/// the weights file's digest is taken (known already for pushed weights).
async fn load_weights(
    cell: &AdapterCell,
    engine: &dyn Engine,
    name: &AdapterName,
    source: &AdapterSource,
) -> Result<Servable, LoadFailure> {
    let version =
        cell.state().issue_version(name).await.map_err(|err| LoadFailure { issued: None, error: err.into() })?;
    if !cell.reserve_version(version) {
        // Unloaded while the version was issued: the load never starts.
        let error = CoreError::UnknownAdapter(cell.key().clone());
        return Err(LoadFailure { issued: Some(version), error });
    }
    match engine.load_adapter(name, version, source).await {
        Ok(()) => {
            if cell.weights_released() {
                // Unloaded while loading, and the unload already removed the weights it could see: remove what this
                // load installed (and nothing a later load installed). Not before: a request admitted before the
                // unload may still be on its way to the engine, and the unload removes these weights itself once
                // every such request was handed back.
                let _ = engine.unload_adapter(name, version).await;
            }
            Ok(servable(version, source).await)
        }
        Err(err) => Err(LoadFailure { issued: Some(version), error: err.into() }),
    }
}

/// `version` loaded from `source`, with its weights' digest where this server can read them (a fleet's coordinator may
/// not hold the files its workers load: the digest is then unknown).
pub(crate) async fn servable(version: AdapterVersion, source: &AdapterSource) -> Servable {
    let reading = source.clone();
    let digest = tokio::task::spawn_blocking(move || reading.digest()).await.ok().and_then(Result::ok);
    let (sha256, bytes) = digest.unzip();
    let info = VersionInfo { version, sha256, bytes, origin: source.origin() };
    let recorded = RecordedSource {
        path: source.dir().to_owned(),
        confined: source.confined_to().is_some(),
        sha256,
        bytes,
        pushed: source.is_pushed(),
        holder: None,
    };
    Servable { info, source: recorded }
}
