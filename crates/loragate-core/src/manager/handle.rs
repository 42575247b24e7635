//! The typed handle on the adapter manager: the coordinator and the adapter actors call these methods, and nobody
//! outside `manager` builds a [`ManagerMsg`] or reads a `CallResult`.

use std::time::Duration;

use ractor::rpc::CallResult;
use ractor::{ActorRef, MessagingErr, RpcReplyPort};

use super::{ManagerMsg, Unloading};
use crate::adapter::{AdapterHandle, Servable, Supervisor};
use crate::adapter_source::AdapterSource;
use crate::contract::{
    AdapterKey, AdapterName, AdapterVersion, CoreError, PauseRequest, StalenessPolicy, StateError, VersionInfo,
};
use crate::state::{PauseRecord, Recording};

/// An adapter as recorded before a restart, or as another replica installed it, to publish at its version.
pub(crate) struct RestoredAdapter {
    /// Its name.
    pub(crate) name: AdapterName,
    /// The version to publish it at (its weights already loaded in the engine, unless `weights_error`).
    pub(crate) version: AdapterVersion,
    /// The versions loaded into the engine, oldest first: the current one (unless `weights_error`) and the older
    /// ones recorded as retained.
    pub(crate) servable: Vec<Servable>,
    /// Why its weights could not be loaded, if they could not.
    pub(crate) weights_error: Option<String>,
    /// Its recorded pauses, put back before it is published.
    pub(crate) pauses: Vec<PauseRecord>,
    /// Its recorded staleness bound, set again at the restored version.
    pub(crate) staleness: Option<StalenessPolicy>,
}

/// A typed handle on the adapter manager. Cheap to clone.
#[derive(Clone)]
pub(crate) struct ManagerHandle {
    actor: ActorRef<ManagerMsg>,
}

impl ManagerHandle {
    pub(super) fn new(actor: ActorRef<ManagerMsg>) -> Self {
        Self { actor }
    }

    /// Loads weights under `name`, creating the adapter if it is new (published once the load succeeded).
    pub(crate) async fn load(&self, name: AdapterName, source: AdapterSource) -> Result<VersionInfo, CoreError> {
        let key = AdapterKey::Lora(name.clone());
        match self.actor.call(|reply| ManagerMsg::Load { name, source, reply }, None).await {
            Ok(CallResult::Success(result)) => result,
            _ => Err(CoreError::AdapterUnavailable(key)),
        }
    }

    /// Publishes `adapter` at its version (see [`RestoredAdapter`]); an adapter that exists already only moves to
    /// that version if it is newer.
    pub(crate) async fn restore(&self, adapter: RestoredAdapter) -> Result<(), CoreError> {
        let key = AdapterKey::Lora(adapter.name.clone());
        match self.actor.call(|reply| ManagerMsg::Restore { adapter, reply }, None).await {
            Ok(CallResult::Success(result)) => result,
            _ => Err(CoreError::AdapterUnavailable(key)),
        }
    }

    /// Unpublishes `name` and retires it (see [`ManagerMsg::Unload`]); the unload is recorded unless `record` is
    /// false (another replica unloaded it).
    pub(crate) async fn unload(&self, name: AdapterName, record: bool) -> Result<Unloading, CoreError> {
        let key = AdapterKey::Lora(name.clone());
        match self.actor.call(|reply| ManagerMsg::Unload { name, record, reply }, None).await {
            Ok(CallResult::Success(result)) => result,
            _ => Err(CoreError::AdapterUnavailable(key)),
        }
    }

    /// Sets (or, with `None`, clears) the global pause, and answers with every adapter that exists now, for the
    /// caller to pause or release, and the global pause's record.
    pub(crate) async fn set_global_pause(
        &self,
        pause: Option<PauseRequest>,
    ) -> Result<(Vec<AdapterHandle>, Recording), CoreError> {
        match self.actor.call(|reply| ManagerMsg::SetGlobalPause { pause, reply }, None).await {
            Ok(CallResult::Success(answer)) => Ok(answer),
            _ => Err(CoreError::ShuttingDown),
        }
    }

    /// Whether the global pause is set.
    pub(crate) async fn is_globally_paused(&self) -> Result<bool, CoreError> {
        match self.actor.call(|reply| ManagerMsg::IsGloballyPaused { reply }, None).await {
            Ok(CallResult::Success(paused)) => Ok(paused),
            _ => Err(CoreError::ShuttingDown),
        }
    }

    /// Stops the manager (and with it every adapter actor) without waiting.
    pub(crate) fn stop(&self, reason: &str) {
        self.actor.stop(Some(reason.into()));
    }

    /// Stops the manager and waits, at most `timeout`, until it has stopped.
    pub(crate) async fn stop_and_wait(&self, reason: &str, timeout: Duration) {
        let _ = self.actor.stop_and_wait(Some(reason.into()), Some(timeout)).await;
    }
}

impl Supervisor for ManagerHandle {
    fn load_settled(
        &self,
        key: AdapterKey,
        result: Result<VersionInfo, CoreError>,
        recorded: Result<(), StateError>,
        reply: RpcReplyPort<Result<VersionInfo, CoreError>>,
    ) {
        let settled = ManagerMsg::LoadSettled { key, result, recorded, reply };
        if let Err(MessagingErr::SendErr(ManagerMsg::LoadSettled { result, recorded, reply, .. })) =
            self.actor.cast(settled)
        {
            let _ = reply.send(result.and_then(|version| recorded.map(|()| version).map_err(CoreError::from)));
        }
    }
}
