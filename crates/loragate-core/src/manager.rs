//! The adapter manager: supervisor of every adapter actor and the single writer of the name → handle map that
//! request paths read. It publishes an adapter once its first load succeeded, retires it on unload, and restarts a
//! failed actor on the same durable cell, so the restart keeps the adapter's pause and version. Callers hold a
//! [`ManagerHandle`].

mod commands;
mod handle;

use std::collections::HashMap;
use std::sync::Arc;

use dashmap::DashMap;
use ractor::{Actor, ActorCell, ActorId, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use tokio::sync::oneshot;

use crate::adapter::{
    AdapterActor, AdapterArgs, AdapterCell, AdapterHandle, AdapterMsg, Incarnation, OwnedRegistry, Retired,
};
use crate::adapter_source::AdapterSource;
use crate::contract::{AdapterKey, AdapterName, AdapterVersion, CoreError, PauseRequest, StateError, VersionInfo};
use crate::engine::Engine;
use crate::limits::ServerLoad;
use crate::metrics::CoreMetrics;
use crate::state::{Recording, StateStore};

pub(crate) use self::handle::{ManagerHandle, RestoredAdapter};

/// The published adapters, read lock-free by request paths. Written only by the manager.
pub(crate) type AdapterMap = Arc<DashMap<AdapterKey, AdapterHandle>>;

/// The commands the manager serves. Only its [`ManagerHandle`] builds them.
pub(crate) enum ManagerMsg {
    /// Loads weights under `name`, creating the adapter (unpublished until the load succeeds) if it is new.
    Load { name: AdapterName, source: AdapterSource, reply: RpcReplyPort<Result<VersionInfo, CoreError>> },
    /// An adapter actor finished one load. The manager updates its bookkeeping (publishing a new adapter on its
    /// first success) before answering the load's caller, so a caller told "loaded" finds the adapter.
    /// The caller's answer is the load's result unless its record failed (`recorded`).
    LoadSettled {
        key: AdapterKey,
        result: Result<VersionInfo, CoreError>,
        recorded: Result<(), StateError>,
        reply: RpcReplyPort<Result<VersionInfo, CoreError>>,
    },
    /// Creates and publishes `name` as recorded before a restart, or as another replica installed it: at `version`
    /// (its weights already loaded in the engine, or, with `weights_error`, not), with its recorded pauses put back
    /// before it is published. An adapter that exists already only moves to `version` if that is newer.
    Restore { adapter: RestoredAdapter, reply: RpcReplyPort<Result<(), CoreError>> },
    /// Unpublishes `name`, seals its versions, marks it removed and cancels its admitted requests; the actor stops
    /// once it has answered.
    /// The unload's record is queued unless another replica unloaded it (`record` false).
    Unload { name: AdapterName, record: bool, reply: RpcReplyPort<Result<Unloading, CoreError>> },
    /// Sets (or clears, for `None`) the global pause that every adapter created from now on starts with, and
    /// answers with every adapter that exists now (published or still loading, and the base model), for the caller
    /// to pause or release, and the global pause's record. Done in the manager so no adapter escapes between the two.
    SetGlobalPause { pause: Option<PauseRequest>, reply: RpcReplyPort<(Vec<AdapterHandle>, Recording)> },
    /// Whether a global pause is set.
    IsGloballyPaused { reply: RpcReplyPort<bool> },
}

/// An adapter being unloaded: the answer to [`ManagerMsg::Unload`].
pub(crate) struct Unloading {
    /// The last version the adapter's loads were given: every weights version it can have in the engine is at most
    /// this, and a reload of the name starts above it.
    pub(crate) last_version: AdapterVersion,
    /// The actor's answer to its retirement: what to wait on for the hand-backs and the record's removal.
    pub(crate) retired: oneshot::Receiver<Result<Retired, CoreError>>,
    /// The unloaded adapter's cell, to say when its weights may go ([`AdapterCell::release_weights`]).
    pub(crate) cell: Arc<AdapterCell>,
}

/// The manager's behaviour.
pub(crate) struct AdapterManager;

/// What the manager starts from.
pub(crate) struct ManagerArgs {
    pub(crate) engine: Arc<dyn Engine>,
    pub(crate) published: AdapterMap,
    pub(crate) metrics: Arc<CoreMetrics>,
    pub(crate) server_load: Arc<ServerLoad>,
    pub(crate) state: Arc<dyn StateStore>,
    /// How many versions of each adapter stay servable (`--retain-versions`).
    pub(crate) retain_versions: usize,
    /// The most LoRA adapters loaded or loading at once (`--max-loras`; `None`: no cap).
    pub(crate) max_loras: Option<usize>,
}

/// One adapter under supervision.
struct Supervised {
    cell: Arc<AdapterCell>,
    actor: ActorRef<AdapterMsg>,
    published: bool,
    loads_outstanding: u32,
}

/// The manager's state.
pub(crate) struct ManagerState {
    engine: Arc<dyn Engine>,
    published: AdapterMap,
    metrics: Arc<CoreMetrics>,
    server_load: Arc<ServerLoad>,
    state: Arc<dyn StateStore>,
    retain_versions: usize,
    max_loras: Option<usize>,
    supervised: HashMap<AdapterKey, Supervised>,
    keys_by_actor: HashMap<ActorId, AdapterKey>,
    /// The global pause, which every new adapter starts with while it is set.
    global_pause: Option<PauseRequest>,
}

impl AdapterManager {
    /// Spawns the manager (and the base model's actor) and hands back its typed handle.
    pub(crate) async fn start(args: ManagerArgs) -> Result<ManagerHandle, ractor::SpawnErr> {
        let (actor, _join) = Actor::spawn(None, AdapterManager, args).await?;
        Ok(ManagerHandle::new(actor))
    }
}

impl Actor for AdapterManager {
    type Msg = ManagerMsg;
    type State = ManagerState;
    type Arguments = ManagerArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<ManagerMsg>,
        args: ManagerArgs,
    ) -> Result<ManagerState, ActorProcessingErr> {
        let mut state = ManagerState {
            engine: args.engine,
            published: args.published,
            metrics: args.metrics,
            server_load: args.server_load,
            state: args.state,
            retain_versions: args.retain_versions,
            max_loras: args.max_loras,
            supervised: HashMap::new(),
            keys_by_actor: HashMap::new(),
            global_pause: None,
        };
        // The base model goes through the same gate and registry as any adapter.
        state.spawn(&myself, AdapterKey::Base, AdapterVersion::BASE).await?;
        state.publish(&AdapterKey::Base);
        Ok(state)
    }

    async fn handle(
        &self,
        myself: ActorRef<ManagerMsg>,
        message: ManagerMsg,
        state: &mut ManagerState,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            ManagerMsg::Load { name, source, reply } => state.load(&myself, name, source, reply).await,
            ManagerMsg::LoadSettled { key, result, recorded, reply } => {
                state.load_settled(key, result, recorded, reply);
            }
            ManagerMsg::Restore { adapter, reply } => state.restore(&myself, adapter, reply).await,
            ManagerMsg::SetGlobalPause { pause, reply } => state.set_global_pause(pause, reply),
            ManagerMsg::IsGloballyPaused { reply } => {
                let _ = reply.send(state.global_pause.is_some());
            }
            ManagerMsg::Unload { name, record, reply } => state.unload(name, record, reply),
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<ManagerMsg>,
        event: SupervisionEvent,
        state: &mut ManagerState,
    ) -> Result<(), ActorProcessingErr> {
        let (cell, why) = match event {
            SupervisionEvent::ActorFailed(cell, err) => (cell, err.to_string()),
            SupervisionEvent::ActorTerminated(cell, _, reason) => (cell, reason.unwrap_or_else(|| "stopped".into())),
            _ => return Ok(()),
        };
        // Actors the manager stopped on purpose (unload, discard) are no longer in the map.
        let Some(key) = state.keys_by_actor.remove(&cell.get_id()) else {
            return Ok(());
        };
        state.restart(&myself, &key, &cell, &why).await;
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<ManagerMsg>,
        state: &mut ManagerState,
    ) -> Result<(), ActorProcessingErr> {
        let keys: Vec<AdapterKey> = state.supervised.keys().cloned().collect();
        for key in keys {
            if let Some(adapter) = state.supervised.get(&key) {
                adapter.actor.stop(Some("coordinator stopped".into()));
            }
            state.discard(&key);
        }
        Ok(())
    }
}

impl ManagerState {
    /// Starts an actor for `key` on a fresh cell, supervised by the manager, unpublished.
    async fn spawn(
        &mut self,
        manager: &ActorRef<ManagerMsg>,
        key: AdapterKey,
        last_version: AdapterVersion,
    ) -> Result<(), ActorProcessingErr> {
        let cell = Arc::new(AdapterCell::new(
            key.clone(),
            last_version,
            self.retain_versions,
            self.metrics.clone(),
            &self.server_load,
            self.state.clone(),
        ));
        if let Some(global) = &self.global_pause {
            // No request can have reached the new adapter yet: the pause only closes its gate.
            // The global pause is recorded once, by the manager: nothing to record here.
            drop(cell.pause(global));
        }
        let actor = self.start_incarnation(manager, &cell).await?;
        self.supervised.insert(key, Supervised { cell, actor, published: false, loads_outstanding: 0 });
        Ok(())
    }

    /// Starts one incarnation of the actor on `cell` and points the cell at it.
    async fn start_incarnation(
        &mut self,
        manager: &ActorRef<ManagerMsg>,
        cell: &Arc<AdapterCell>,
    ) -> Result<ActorRef<AdapterMsg>, ActorProcessingErr> {
        let supervisor = Arc::new(ManagerHandle::new(manager.clone()));
        let registry = OwnedRegistry::default();
        let shared = registry.share();
        let args = AdapterArgs { cell: cell.clone(), engine: self.engine.clone(), manager: supervisor, registry };
        let (actor, _join) = Actor::spawn_linked(None, AdapterActor, args, manager.get_cell()).await?;
        self.keys_by_actor.insert(actor.get_id(), cell.key().clone());
        cell.set_actor(Some(Incarnation { actor: actor.clone(), registry: shared }));
        Ok(actor)
    }

    /// Makes `key` visible to request paths.
    fn publish(&mut self, key: &AdapterKey) {
        if let Some(adapter) = self.supervised.get_mut(key) {
            adapter.published = true;
            self.metrics.start_series(&adapter.cell.labels);
            self.published.insert(key.clone(), AdapterHandle::new(adapter.cell.clone()));
        }
    }

    /// Forgets `key`: unpublished, unsupervised, its cell pointing at no actor (callers get "unknown adapter").
    /// Stopping the actor is the caller's business.
    fn discard(&mut self, key: &AdapterKey) {
        self.published.remove(key);
        if let Some(adapter) = self.supervised.remove(key) {
            self.keys_by_actor.remove(&adapter.actor.get_id());
            adapter.cell.set_actor(None);
            if !adapter.published {
                adapter.actor.stop(Some("first load failed".into()));
            }
        }
    }

    /// Replaces a dead incarnation. The cell keeps the gate and version, so a paused adapter stays paused.
    async fn restart(&mut self, manager: &ActorRef<ManagerMsg>, key: &AdapterKey, dead: &ActorCell, why: &str) {
        let Some(cell) = self.supervised.get(key).map(|adapter| adapter.cell.clone()) else {
            return;
        };
        tracing::error!(adapter = %key, actor = %dead.get_id(), why, "adapter actor died; restarting it");
        match self.start_incarnation(manager, &cell).await {
            Ok(actor) => {
                if let Some(adapter) = self.supervised.get_mut(key) {
                    adapter.actor = actor;
                    // Loads queued in the dead incarnation were answered with errors when their ports dropped.
                    adapter.loads_outstanding = 0;
                }
            }
            Err(err) => {
                tracing::error!(adapter = %key, %err, "could not restart the adapter's actor; unloading it");
                self.discard(key);
            }
        }
    }
}
