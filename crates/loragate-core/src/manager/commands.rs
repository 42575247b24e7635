//! The manager's commands, one method each: what [`ManagerMsg`](super::ManagerMsg)'s variants do.

use ractor::{ActorRef, RpcReplyPort};
use tokio::sync::oneshot;

use super::{ManagerMsg, ManagerState, RestoredAdapter, Unloading};
use crate::adapter::{AdapterHandle, AdapterMsg, Retired};
use crate::adapter_source::AdapterSource;
use crate::contract::{
    AdapterKey, AdapterName, AdapterVersion, CoreError, PauseRequest, Retirement, StateError, VersionInfo,
};
use crate::state::{Recording, StateChange};

impl ManagerState {
    /// Loads weights under `name`, creating (unpublished) the adapter if it is new; the adapter's actor answers
    /// `reply` once the load settled ([`ManagerState::load_settled`]).
    pub(super) async fn load(
        &mut self,
        myself: &ActorRef<ManagerMsg>,
        name: AdapterName,
        source: AdapterSource,
        reply: RpcReplyPort<Result<VersionInfo, CoreError>>,
    ) {
        let key = AdapterKey::Lora(name.clone());
        if !self.supervised.contains_key(&key) {
            if let Some(max_loras) = self.max_loras
                && self.supervised.keys().filter(|key| matches!(key, AdapterKey::Lora(_))).count() >= max_loras
            {
                let _ = reply.send(Err(CoreError::TooManyAdapters { max_loras }));
                return;
            }
            // Its versions come from the state store, above every version issued for the name before.
            if let Err(err) = self.spawn(myself, key.clone(), AdapterVersion::BASE).await {
                tracing::error!(adapter = %name, %err, "could not start the adapter's actor");
                let _ = reply.send(Err(CoreError::AdapterUnavailable(key)));
                return;
            }
        }
        if let Some(adapter) = self.supervised.get_mut(&key) {
            adapter.loads_outstanding += 1;
            if let Err(ractor::MessagingErr::SendErr(AdapterMsg::Load { reply, .. })) =
                adapter.actor.cast(AdapterMsg::Load { source, reply })
            {
                adapter.loads_outstanding -= 1;
                let _ = reply.send(Err(CoreError::AdapterUnavailable(key)));
            }
        }
    }

    /// One load finished: publishes a new adapter on its first success (or forgets it once every load of it
    /// failed), then answers the load's caller.
    pub(super) fn load_settled(
        &mut self,
        key: AdapterKey,
        result: Result<VersionInfo, CoreError>,
        recorded: Result<(), StateError>,
        reply: RpcReplyPort<Result<VersionInfo, CoreError>>,
    ) {
        if let Some(adapter) = self.supervised.get_mut(&key) {
            adapter.loads_outstanding = adapter.loads_outstanding.saturating_sub(1);
            if result.is_ok() && !adapter.published {
                self.publish(&key);
            } else if !adapter.published && adapter.loads_outstanding == 0 {
                // Every load of a new name failed: forget it, as if it had never been asked for.
                self.discard(&key);
            }
        }
        let _ = reply.send(result.and_then(|version| recorded.map(|()| version).map_err(CoreError::from)));
    }

    /// Publishes an adapter recorded before a restart, or installed by another replica (see [`RestoredAdapter`]).
    pub(super) async fn restore(
        &mut self,
        myself: &ActorRef<ManagerMsg>,
        adapter: RestoredAdapter,
        reply: RpcReplyPort<Result<(), CoreError>>,
    ) {
        let RestoredAdapter { name, version, servable, weights_error, pauses, staleness } = adapter;
        let key = AdapterKey::Lora(name.clone());
        if let Some(adapter) = self.supervised.get(&key) {
            // Created here meanwhile (another replica's install racing this replica's first load): it serves
            // the versions if they are newer than what it has.
            for servable in servable {
                let (installed, _) = oneshot::channel();
                let _ = adapter.actor.cast(AdapterMsg::InstallRemote { servable, reply: installed.into() });
            }
            let _ = reply.send(Ok(()));
            return;
        }
        if let Err(err) = self.spawn(myself, key.clone(), version).await {
            tracing::error!(adapter = %key, %err, "could not start the adapter's actor");
            let _ = reply.send(Err(CoreError::AdapterUnavailable(key)));
            return;
        }
        if let Some(adapter) = self.supervised.get(&key) {
            let mut release = Vec::new();
            for servable in servable {
                release.extend(adapter.cell.install(servable));
            }
            self.release_from_engine(&name, release);
            if let Some(reason) = &weights_error {
                adapter.cell.set_weights_missing(reason);
            }
            adapter.cell.restore_staleness(staleness);
            // Queued before any request can reach the actor (it is not published yet).
            let _ = adapter.actor.cast(AdapterMsg::Adopt { pauses });
        }
        self.publish(&key);
        let _ = reply.send(Ok(()));
    }

    /// Tells the engine to release `versions` of `name` (restored beyond the count of retained versions), on a task.
    fn release_from_engine(&self, name: &AdapterName, versions: Vec<AdapterVersion>) {
        if versions.is_empty() {
            return;
        }
        let (engine, name) = (self.engine.clone(), name.clone());
        tokio::spawn(async move {
            for version in versions {
                let _ = engine.release_version(&name, version).await;
            }
        });
    }

    /// Sets or clears the global pause, answering with every adapter that exists now and the pause's record.
    pub(super) fn set_global_pause(
        &mut self,
        pause: Option<PauseRequest>,
        reply: RpcReplyPort<(Vec<AdapterHandle>, Recording)>,
    ) {
        let recorded = self.state.record(vec![StateChange::GlobalPause(pause.as_ref().map(|pause| pause.mode))]);
        self.global_pause = pause;
        let adapters = self.supervised.values().map(|adapter| AdapterHandle::new(adapter.cell.clone())).collect();
        let _ = reply.send((adapters, recorded));
    }

    /// Unpublishes and retires `name` (see [`ManagerMsg::Unload`](super::ManagerMsg::Unload)).
    pub(super) fn unload(
        &mut self,
        name: AdapterName,
        record: bool,
        reply: RpcReplyPort<Result<Unloading, CoreError>>,
    ) {
        let key = AdapterKey::Lora(name.clone());
        match self.supervised.get(&key) {
            Some(adapter) if adapter.published => {
                let (actor, cell) = (adapter.actor.clone(), adapter.cell.clone());
                let last_version = adapter.cell.seal_versions();
                self.discard(&key);
                // Retire, then drain: the actor answers Retire (and anything queued before it, a finished
                // load's record included, so the unload's record comes after it) and stops. If it is
                // already gone, nothing runs to wait on and the record's removal is queued here.
                let (retire_reply, retired) = oneshot::channel();
                let retire = AdapterMsg::Retire { why: Retirement::Unloaded, record, reply: retire_reply.into() };
                if let Err(ractor::MessagingErr::SendErr(AdapterMsg::Retire { reply, .. })) = actor.cast(retire) {
                    let recorded = if record {
                        self.state.record(vec![StateChange::Unloaded { name: name.clone() }])
                    } else {
                        crate::state::nothing_to_record()
                    };
                    let _ = reply.send(Ok(Retired { pending: Default::default(), recorded }));
                }
                let _ = actor.drain();
                let _ = reply.send(Ok(Unloading { last_version, retired, cell }));
            }
            _ => {
                let _ = reply.send(Err(CoreError::UnknownAdapter(key)));
            }
        }
    }
}
