//! The fleet's membership: which workers exist, their states, the adapters each holds, the epoch, and the adapter
//! set the fleet wants on every worker. One actor owns all of it behind the typed [`Membership`] handle and
//! publishes a [`Roster`] snapshot over a `watch` after every change, which request paths read without asking the
//! actor (routing a sequence costs no message).
//!
//! Lifecycle of a worker: added JOINING → its health check answers → caught up (loads the fleet's `NAME@V` set,
//! unloads stale `NAME@V` copies) → READY. A failed health check, a failed stream or a failed catch-up makes it
//! UNHEALTHY: its session token is cancelled, so its running sequences end at once with their tokens; a later
//! healthy check brings it back through JOINING, after its back-off and probation when it failed repeatedly
//! ([`probation`]). `RemoveWorker` with drain makes it DRAINING until it has no sequence in flight. The epoch grows
//! on every membership change.
//!
//! Addresses are resolved before they reach the actor (never inside a handler): one process listed under two
//! spellings, or two names of one socket address, is one worker.

mod actor;
mod catch_up;
mod probation;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use loragate_core::{Key, WorkerState};
use ractor::rpc::CallResult;
use ractor::{Actor, ActorRef, RpcReplyPort};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use self::actor::{MembershipActor, MembershipArgs, MembershipMsg};
pub(crate) use self::probation::FailurePolicy;
use self::probation::FailureRecord;
use crate::address::{WorkerAddress, WorkerIdentity};
use crate::delivery::Delivery;
use crate::error::FleetError;
use crate::link::{InFlight, WorkerLink};
use crate::metrics::FleetMetrics;

/// Timing and bounds of the membership's background work.
#[derive(Clone, Debug)]
pub(crate) struct MembershipSettings {
    /// How often every worker's health is checked, and when failures back its probes off.
    pub(crate) failures: FailurePolicy,
    /// The most workers the fleet holds.
    pub(crate) max_workers: usize,
    /// How long one health check may take.
    pub(crate) health_timeout: Duration,
    /// How long one adapter load or unload on one worker may take.
    pub(crate) adapter_timeout: Duration,
    /// The coordinator's context length: a worker serving less cannot join.
    pub(crate) context_length: u32,
    /// The key presented to the workers.
    pub(crate) worker_key: Option<Key>,
}

/// A snapshot of the membership.
#[derive(Clone, Default)]
pub(crate) struct Roster {
    /// Grows on every membership change.
    pub(crate) epoch: u64,
    /// Every worker, in the order they joined.
    pub(crate) workers: Vec<WorkerView>,
}

/// One worker in a [`Roster`].
#[derive(Clone)]
pub(crate) struct WorkerView {
    pub(crate) link: Arc<WorkerLink>,
    /// Tells this membership of the address from earlier and later ones.
    pub(crate) incarnation: u64,
    pub(crate) state: WorkerState,
    /// Engine-side adapter names (`NAME@V`) the worker holds.
    pub(crate) adapters: BTreeSet<String>,
    pub(crate) last_error: String,
    /// Its failures, and when it is probed next.
    pub(crate) failures: FailureRecord,
    /// Cancelled when the worker is declared lost or removed: its running sequences end at once.
    pub(crate) session: CancellationToken,
}

/// Where one sequence runs: a READY worker holding its adapter version. Holding it counts the sequence in the
/// worker's in-flight count.
pub(crate) struct Route {
    pub(crate) link: Arc<WorkerLink>,
    pub(crate) incarnation: u64,
    pub(crate) session: CancellationToken,
    _in_flight: InFlight,
}

/// A READY worker an adapter version is staged on.
#[derive(Clone)]
pub(crate) struct StageTarget {
    pub(crate) link: Arc<WorkerLink>,
    pub(crate) incarnation: u64,
}

/// The typed handle on the membership. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Membership {
    actor: ActorRef<MembershipMsg>,
    roster: watch::Receiver<Arc<Roster>>,
    rotation: Arc<AtomicUsize>,
}

impl Membership {
    /// Starts the membership with `workers` JOINING and their health checks running. Fails if two of them are one
    /// worker, or if there are more than the limit.
    pub(crate) async fn start(
        workers: Vec<WorkerAddress>,
        settings: MembershipSettings,
        metrics: FleetMetrics,
    ) -> Result<Self, FleetError> {
        if workers.len() > settings.max_workers {
            return Err(FleetError::TooManyWorkers { max: settings.max_workers });
        }
        let workers = futures::future::join_all(workers.into_iter().map(WorkerIdentity::resolve)).await;
        for (index, worker) in workers.iter().enumerate() {
            if let Some(earlier) = workers[..index].iter().find(|earlier| earlier.same_worker(worker)) {
                return Err(FleetError::WorkerExists { address: worker.address.clone(), as_: earlier.address.clone() });
            }
        }
        let (publish, roster) = watch::channel(Arc::new(Roster::default()));
        let args = MembershipArgs { workers, settings, metrics, roster: publish };
        let (actor, _join) = Actor::spawn(None, MembershipActor, args).await?;
        Ok(Self { actor, roster, rotation: Arc::default() })
    }

    /// Stops the membership: every worker's session ends (their running sequences are handed back).
    pub(crate) fn stop(&self) {
        self.actor.stop(Some("fleet stopped".into()));
    }

    /// The latest snapshot.
    pub(crate) fn roster(&self) -> Arc<Roster> {
        self.roster.borrow().clone()
    }

    /// Waits (up to `timeout`) until some worker is READY and none is JOINING; answers the snapshot then (or at
    /// the timeout). Unreachable workers keep being probed meanwhile, so a worker that comes up late is waited for.
    pub(crate) async fn settled(&self, timeout: Duration) -> Arc<Roster> {
        let mut roster = self.roster.clone();
        let settled = roster.wait_for(|roster| {
            roster.workers.iter().any(|worker| worker.state == WorkerState::Ready)
                && roster.workers.iter().all(|worker| worker.state != WorkerState::Joining)
        });
        match tokio::time::timeout(timeout, settled).await {
            Ok(Ok(roster)) => roster.clone(),
            _ => self.roster(),
        }
    }

    /// Picks a READY worker holding `engine_name` (any READY worker for the base model, `""`), the one with the
    /// fewest sequences in flight (ties rotate), skipping the incarnations in `tried`.
    pub(crate) fn route(&self, engine_name: &str, tried: &[u64]) -> Option<Route> {
        let roster = self.roster.borrow();
        let count = roster.workers.len();
        if count == 0 {
            return None;
        }
        let start = self.rotation.fetch_add(1, Ordering::Relaxed) % count;
        let chosen = (0..count)
            .map(|offset| &roster.workers[(start + offset) % count])
            .filter(|worker| worker.state == WorkerState::Ready && !tried.contains(&worker.incarnation))
            .filter(|worker| engine_name.is_empty() || worker.adapters.contains(engine_name))
            .min_by_key(|worker| worker.link.in_flight())?;
        Some(Route {
            link: chosen.link.clone(),
            incarnation: chosen.incarnation,
            session: chosen.session.clone(),
            _in_flight: chosen.link.enter(),
        })
    }

    /// Adds the worker at `address` (JOINING), unless it is in the fleet already (under any spelling) or the fleet
    /// is full.
    pub(crate) async fn add(&self, address: WorkerAddress) -> Result<(), FleetError> {
        let identity = WorkerIdentity::resolve(address).await;
        self.call(|reply| MembershipMsg::Add { identity, reply }).await?
    }

    /// Removes the worker at `address` (under any spelling); with `drain`, answers once its sequences finished.
    pub(crate) async fn remove(&self, address: WorkerAddress, drain: bool) -> Result<(), FleetError> {
        let identity = WorkerIdentity::resolve(address).await;
        self.call(|reply| MembershipMsg::Remove { identity, drain, reply }).await?
    }

    /// The READY workers, for staging an adapter version.
    pub(crate) async fn stage_targets(&self) -> Result<Vec<StageTarget>, FleetError> {
        self.call(|reply| MembershipMsg::StageTargets { reply }).await
    }

    /// Records that `target` loaded (`loaded`) or unloaded `engine_name`.
    pub(crate) fn adapter_changed(&self, target: &StageTarget, engine_name: &str, loaded: bool) {
        let _ = self.actor.cast(MembershipMsg::AdapterChanged {
            address: target.link.address().clone(),
            incarnation: target.incarnation,
            engine_name: engine_name.to_owned(),
            loaded,
        });
    }

    /// Adds `engine_name` (delivered as `delivery` says) to the set every worker must hold: joining workers load it,
    /// READY ones that lack it (they joined during the staging) get it topped up.
    pub(crate) async fn install(&self, engine_name: String, delivery: Delivery) -> Result<(), FleetError> {
        self.call(|reply| MembershipMsg::Install { engine_name, delivery, reply }).await
    }

    /// Removes `engine_name` from the set and unloads it from every worker holding it; answers when done.
    pub(crate) async fn retire(&self, engine_name: String) -> Result<(), FleetError> {
        self.call(|reply| MembershipMsg::Retire { engine_name, reply: Some(reply) }).await
    }

    /// [`Membership::retire`] without waiting (callable from `Drop`).
    pub(crate) fn retire_later(&self, engine_name: String) {
        let _ = self.actor.cast(MembershipMsg::Retire { engine_name, reply: None });
    }

    /// A stream on this worker failed: check its health now rather than at the next round.
    pub(crate) fn report_failure(&self, route: &Route) {
        let _ = self
            .actor
            .cast(MembershipMsg::CheckNow { address: route.link.address().clone(), incarnation: route.incarnation });
    }

    /// The worker broke its bounds (a stream past its budget, silence past a timeout, a protocol error): it counts
    /// one failure toward its probation and is out of traffic until a health check brings it back.
    pub(crate) fn report_misbehaviour(&self, route: &Route, why: String) {
        let (address, incarnation) = (route.link.address().clone(), route.incarnation);
        let _ = self.actor.cast(MembershipMsg::Misbehaved { address, incarnation, why });
    }

    /// The worker lacks an adapter the fleet thought it held: bring it back through JOINING.
    pub(crate) fn report_out_of_sync(&self, route: &Route) {
        let _ = self
            .actor
            .cast(MembershipMsg::Resync { address: route.link.address().clone(), incarnation: route.incarnation });
    }

    async fn call<T, B>(&self, build: B) -> Result<T, FleetError>
    where
        T: Send + 'static,
        B: FnOnce(RpcReplyPort<T>) -> MembershipMsg,
    {
        match self.actor.call(build, None).await {
            Ok(CallResult::Success(answer)) => Ok(answer),
            _ => Err(FleetError::Stopped),
        }
    }
}
