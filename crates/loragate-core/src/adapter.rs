//! One adapter: its actor (gate, registry, version) and the typed [`AdapterHandle`] callers use, so nobody outside
//! this module builds an actor message.
//!
//! Data flow: `admit` registers the request in the registry the actor owns, under its lock, with no round trip
//! through the actor (see `admission` for why a racing pause never misses it); if the gate is closed the caller
//! waits on the gate's `watch` (counted as *held*) until it opens or the deadline passes, then tries again; if the
//! version it wants has not arrived it is parked in the registry and admitted by the install's pass (see `parked`).
//! `pause` asks the actor to add a pause (closing the gate) and to cancel, keep or watch every registered request as
//! its mode says, then waits outside the actor until each was handed back (or, in wait mode, finished).

mod actor;
mod admission;
mod cell;
mod gate;
mod parked;
mod pauses;
mod registry;
mod staleness;
mod versions;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use ractor::RpcReplyPort;
use ractor::rpc::CallResult;
use tokio::time::Instant;

use self::actor::PauseTicket;
pub(crate) use self::actor::{
    AdapterActor, AdapterArgs, AdapterMsg, Incarnation, ReleaseTarget, Retired, Supervisor, servable,
};
use self::admission::AdmitReply;
pub(crate) use self::admission::Admitted;
pub(crate) use self::cell::{AdapterCell, StalenessTicket, VersionPin};
pub(crate) use self::gate::Counted;
use self::gate::{GateWait, wait_until_open, wait_until_ready};
use self::parked::{ParkedOutcome, ParkedWait};
pub use self::registry::Admission;
use self::registry::SharedRegistry;
pub(crate) use self::registry::{OwnedRegistry, PendingHandBacks};
pub(crate) use self::versions::Servable;
use crate::contract::{
    AbortReport, AdapterKey, AdapterName, AdapterStatus, AdapterVersion, CoreError, GateState, KvPolicy, PauseId,
    PauseMode, PauseOwner, PauseReport, PauseRequest, RequestId, ResumeReport, Retirement, StalenessPolicy,
    VersionWanted,
};
use crate::limits::Occupancy;
use crate::state::PauseRecord;

/// How long a call waits for a crashed actor's next incarnation before giving up.
const RESTART_WAIT: Duration = Duration::from_secs(5);

/// Who waits at a closed gate in an admission.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Waiter {
    /// A fresh sampling request, counted as held.
    Held,
    /// A request a pause kept, counted as kept by its driver; with `Some(n)` it gives up once the adapter has had
    /// more than `n` abort-mode pauses.
    Kept { abort_pauses_seen: Option<u64> },
}

/// A typed handle on one adapter. Cheap to clone; stays valid across restarts of the adapter's actor.
#[derive(Clone)]
pub struct AdapterHandle {
    cell: Arc<AdapterCell>,
}

impl std::fmt::Debug for AdapterHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdapterHandle").field("key", self.key()).field("gate", &self.gate()).finish()
    }
}

impl AdapterHandle {
    pub(crate) fn new(cell: Arc<AdapterCell>) -> Self {
        Self { cell }
    }

    /// Which adapter this is.
    pub fn key(&self) -> &AdapterKey {
        self.cell.key()
    }

    /// The gate's state now.
    pub fn gate(&self) -> GateState {
        self.cell.gate_state()
    }

    /// Registers a request of `sequences` sequences that wants `wanted` versions, with the pin on its exact version
    /// and its places under the staleness bound. The caller is held (and counted as
    /// held) while the gate is closed, while the version it wants has not arrived, and while the staleness bound has
    /// no room for its sequences — until that changes, the adapter is removed, or `hold_until` passes
    /// ([`CoreError::GateHoldExpired`], [`CoreError::VersionNotReached`], [`CoreError::StalenessHoldExpired`]). A
    /// pinned version no longer served is refused at once ([`CoreError::VersionRetired`]).
    ///
    /// An admitted request counts against the in-flight limits until its [`Admission`] ends; a request over a
    /// limit is refused at once with [`CoreError::Overloaded`].
    pub(crate) async fn admit_request(
        &self,
        request_id: RequestId,
        wanted: VersionWanted,
        sequences: u32,
        hold_until: Instant,
    ) -> Result<Admitted, CoreError> {
        self.admit_as(Waiter::Held, request_id, wanted, sequences, hold_until).await
    }

    /// Registers a request of one sequence on whatever version is current, held as
    /// [`AdapterHandle::admit_request`] says (what benchmarks of admission measure).
    pub async fn admit(&self, request_id: RequestId, hold_until: Instant) -> Result<Admission, CoreError> {
        Ok(self.admit_request(request_id, VersionWanted::Any, 1, hold_until).await?.admission)
    }

    /// [`AdapterHandle::admit`] for a request that wants version `least` or newer (`min_lora_version`): held while the
    /// adapter is older (what benchmarks of the version hold measure).
    pub async fn admit_min_version(
        &self,
        request_id: RequestId,
        least: AdapterVersion,
        hold_until: Instant,
    ) -> Result<Admission, CoreError> {
        Ok(self.admit_request(request_id, VersionWanted::AtLeast(least), 1, hold_until).await?.admission)
    }

    /// [`AdapterHandle::admit`] for a request the core kept across a pause (its driver counts it as kept meanwhile,
    /// so it is not counted as held).
    ///
    /// With `abort_pauses_seen` (the adapter's count of abort-mode pauses when the request was admitted), an
    /// abort-mode pause since then ends the wait with [`CoreError::AbortedWhileKept`]: such a pause hands back every request of
    /// the adapter, kept ones included. Requests that continue through abort pauses pass `None`.
    ///
    /// A kept request keeps its pinned version (its driver holds the pin) and is not counted again by the staleness
    /// bound: it is admitted on any version.
    pub(crate) async fn readmit_kept(
        &self,
        request_id: RequestId,
        hold_until: Instant,
        abort_pauses_seen: Option<u64>,
    ) -> Result<Admission, CoreError> {
        let waiter = Waiter::Kept { abort_pauses_seen };
        Ok(self.admit_as(waiter, request_id, VersionWanted::Any, 0, hold_until).await?.admission)
    }

    async fn admit_as(
        &self,
        waiter: Waiter,
        request_id: RequestId,
        wanted: VersionWanted,
        sequences: u32,
        hold_until: Instant,
    ) -> Result<Admitted, CoreError> {
        loop {
            // Held requests are not in flight: wait at a closed gate first (this returns at once on an open one).
            self.wait_while_paused(waiter, hold_until).await?;
            let slot = match waiter {
                Waiter::Held => self.cell.occupy(Occupancy::InFlight)?,
                // Accepted before its pause: counted in flight again, never refused.
                Waiter::Kept { .. } => self.cell.occupy_uncapped(Occupancy::InFlight),
            };
            let reply = match self.decide(&request_id, wanted, sequences).await? {
                AdmitReply::Admitted(admitted) => {
                    let admission = admitted.admission.occupying(slot);
                    return Ok(Admitted { admission, ..admitted });
                }
                AdmitReply::Parked(parked, version) => {
                    drop(slot);
                    match self.hold_parked(parked, version, hold_until).await? {
                        // Admitted by the install's pass, which counted it in flight.
                        Some(AdmitReply::Admitted(admitted)) => return Ok(admitted),
                        Some(reply) => reply,
                        None => continue, // The registry's incarnation ended: ask the next one.
                    }
                }
                reply => {
                    drop(slot);
                    reply
                }
            };
            match reply {
                AdmitReply::Paused => {} // Closed again meanwhile: wait again.
                AdmitReply::Released(retained) => {
                    let (adapter, requested) = (self.lora_name(), wanted.least().unwrap_or_default());
                    return Err(CoreError::VersionRetired { adapter, requested, retained });
                }
                AdmitReply::AtCapacity { capacity, version, epoch } => {
                    self.hold_for_capacity(capacity, version, epoch, hold_until).await?;
                }
                AdmitReply::Retired(why) => return Err(self.retired_error(why)),
                AdmitReply::Admitted(_) | AdmitReply::Parked(..) => {
                    unreachable!("answered above; a pass never parks")
                }
            }
        }
    }

    /// Holds the caller (counted as held), parked for `version` (see `parked`), until an install's pass answers it,
    /// or `hold_until` passes. `None` if the registry's incarnation ended meanwhile.
    async fn hold_parked(
        &self,
        parked: ParkedWait,
        version: AdapterVersion,
        hold_until: Instant,
    ) -> Result<Option<AdmitReply>, CoreError> {
        // Counted as held by its parked entry (see `parked`).
        let started = Instant::now();
        let outcome = parked.wait(hold_until).await;
        // Held until the pass that answered decided (its one clock reading), or until now.
        let held_for = match &outcome {
            ParkedOutcome::Answered(answered) => answered.at.saturating_duration_since(started),
            ParkedOutcome::TimedOut | ParkedOutcome::Ended => started.elapsed(),
        };
        let timed_out = matches!(outcome, ParkedOutcome::TimedOut);
        self.cell.metrics.record_gate_hold(&self.cell.labels, held_for, timed_out);
        match outcome {
            ParkedOutcome::Answered(answered) => answered.answer.map(Some),
            ParkedOutcome::Ended => Ok(None),
            ParkedOutcome::TimedOut => {
                let current = self.cell.gate_state().version;
                Err(CoreError::VersionNotReached { adapter: self.key().clone(), current, requested: version, held_for })
            }
        }
    }

    /// Holds the caller (counted as held, and as held at the staleness bound) until the bound may admit more than
    /// when it was found full at `version` and admission epoch `epoch` (a new version, a new policy, places given
    /// back), the adapter is removed, or `hold_until` passes.
    async fn hold_for_capacity(
        &self,
        capacity: u64,
        version: AdapterVersion,
        epoch: u64,
        hold_until: Instant,
    ) -> Result<(), CoreError> {
        let started = Instant::now();
        let _held = self.cell.occupy(Occupancy::Held)?;
        let _at_bound = Counted::new(&self.cell.staleness_held);
        let loosened = |gate: &GateState| gate.admission_epoch != epoch || gate.version != version;
        let outcome = wait_until_ready(self.cell.subscribe_gate(), hold_until, loosened).await;
        let held_for = started.elapsed();
        self.cell.metrics.record_gate_hold(&self.cell.labels, held_for, outcome == GateWait::TimedOut);
        match outcome {
            GateWait::TimedOut => {
                Err(CoreError::StalenessHoldExpired { adapter: self.key().clone(), capacity, held_for })
            }
            GateWait::Retired(why) => Err(self.retired_error(why)),
            GateWait::Open | GateWait::AbortPaused => Ok(()),
        }
    }

    /// The adapter's name (the base model has none: its key's wire form, empty, would not parse).
    fn lora_name(&self) -> AdapterName {
        match self.key() {
            AdapterKey::Lora(name) => name.clone(),
            AdapterKey::Base => AdapterName::parse("base").unwrap_or_else(|_| unreachable!("a valid name")),
        }
    }

    /// Holds the caller (counted as held) while the gate is closed: returns once it is open, or fails when the
    /// adapter is retired or `hold_until` passes. Returns at once on an open gate. A caller over a held limit is
    /// refused at once with [`CoreError::Overloaded`].
    pub async fn hold_while_paused(&self, hold_until: Instant) -> Result<(), CoreError> {
        self.wait_while_paused(Waiter::Held, hold_until).await
    }

    async fn wait_while_paused(&self, waiter: Waiter, hold_until: Instant) -> Result<(), CoreError> {
        let abort_pauses_seen = match waiter {
            Waiter::Held => None,
            Waiter::Kept { abort_pauses_seen } => abort_pauses_seen,
        };
        if let Some(reason) = self.cell.weights_error() {
            // Nothing to wait for: no reopening gives it weights, only a load does.
            return Err(CoreError::WeightsMissing { adapter: self.key().clone(), reason: reason.to_string() });
        }
        let gate = self.cell.gate_state();
        if !gate.paused && abort_pauses_seen.is_none_or(|seen| gate.abort_pauses <= seen) {
            return Ok(());
        }
        let started = Instant::now();
        let _held = match waiter {
            Waiter::Held => Some(self.cell.occupy(Occupancy::Held)?),
            Waiter::Kept { .. } => None,
        };
        let outcome = wait_until_open(self.cell.subscribe_gate(), Some(hold_until), abort_pauses_seen).await;
        let held_for = started.elapsed();
        if waiter == Waiter::Held {
            self.cell.metrics.record_gate_hold(&self.cell.labels, held_for, outcome == GateWait::TimedOut);
        }
        match outcome {
            GateWait::Open => Ok(()),
            GateWait::TimedOut => Err(CoreError::GateHoldExpired { adapter: self.key().clone(), held_for }),
            GateWait::Retired(why) => Err(self.retired_error(why)),
            GateWait::AbortPaused => Err(CoreError::AbortedWhileKept(self.key().clone())),
        }
    }

    /// Adds `request`'s pause (renewing its owner's if it has one), which closes the gate first, then acts on every
    /// admitted request as the mode says and waits outside the actor:
    /// - abort: each is handed back with `FINISH_REASON_ABORT` (or kept, if it asked the core to continue it);
    /// - keep: each is stopped in the engine and kept by the core;
    /// - wait: each runs to its end; if some still run at `drain_until`, a pause this call created is withdrawn and
    ///   the call fails with [`CoreError::DrainTimedOut`] (also withdrawn if the caller goes away meanwhile).
    ///
    /// Abort and keep return when every request was handed back or kept, or when `ack_timeout` passes (the
    /// stragglers are reported).
    pub async fn pause(
        &self,
        request: PauseRequest,
        ack_timeout: Duration,
        drain_until: Instant,
    ) -> Result<PauseReport, CoreError> {
        let started = Instant::now();
        let (mode, kv_policy) = (request.mode, request.kv_policy);
        let PauseTicket { pause_id, created, pending, recorded } =
            self.call(|reply| AdapterMsg::Pause { request: request.clone(), reply }).await?;
        let remote = match recorded.await {
            Ok(remote) => remote,
            Err(err) => {
                // Not durable (or not applied on every replica): a pause this call made is withdrawn rather than left
                // holding without a record.
                if created {
                    PauseRelease::new(self.clone(), pause_id).release().await?;
                }
                return Err(err.into());
            }
        };
        let mut report = match mode {
            PauseMode::Abort | PauseMode::Keep => {
                let report = pending.wait(ack_timeout).await;
                report.warn_if_unacknowledged(self.key(), "pause");
                let labels = &self.cell.labels;
                self.cell.metrics.record_abort(labels, report.aborted.len(), report.kept.len(), started.elapsed());
                report
            }
            PauseMode::Wait => {
                let withdraw_unless_drained = created.then(|| PauseRelease::new(self.clone(), pause_id.clone()));
                let report = pending.wait(drain_until.saturating_duration_since(Instant::now())).await;
                if !report.unacknowledged.is_empty() {
                    if let Some(withdraw) = withdraw_unless_drained {
                        withdraw.release().await?;
                    }
                    return Err(CoreError::DrainTimedOut {
                        adapter: self.key().clone(),
                        still_running: report.unacknowledged.len(),
                        waited: started.elapsed(),
                    });
                }
                if let Some(drained) = withdraw_unless_drained {
                    drained.keep_paused();
                }
                report
            }
        };
        // Other replicas' hand-backs (a shared state store) count in the answer.
        report.absorb(remote);
        let AbortReport { aborted, kept, unacknowledged } = report;
        Ok(PauseReport { pause_id, mode, aborted, kept, unacknowledged, kv_policy })
    }

    /// Applies a pause another replica made (see [`crate::state::RemoteChange::Paused`]): closes the gate under the
    /// pause's own id and acts on the admitted requests as its mode says; returns what to wait on.
    pub(crate) async fn adopt_remote(&self, record: PauseRecord) -> Result<PendingHandBacks, CoreError> {
        self.call(|reply| AdapterMsg::AdoptRemote { record: record.clone(), reply }).await
    }

    /// Serves a version another replica installed (or one recorded before a restart), which this replica's engine
    /// has loaded.
    pub(crate) async fn install_remote(&self, servable: Servable) -> Result<(), CoreError> {
        self.call(|reply| AdapterMsg::InstallRemote { servable: servable.clone(), reply }).await
    }

    /// Holds new requests at the gate, exactly as a pause does, while the files of a version another replica pushed
    /// are fetched: a pause under an owner of its own (never recorded, never shared) that lets admitted requests run
    /// on at the version they were admitted at. Dropping the returned guard releases it.
    pub(crate) async fn hold_for_fetch(&self) -> Result<PauseRelease, CoreError> {
        let request = PauseRequest {
            mode: PauseMode::Wait,
            owner: PauseOwner::new_fetch(),
            lease: None,
            kv_policy: KvPolicy::Recompute,
        };
        let ticket = self.call(|reply| AdapterMsg::Pause { request: request.clone(), reply }).await?;
        let release = PauseRelease::new(self.clone(), ticket.pause_id);
        // Nothing waits for the admitted requests, and a pause of this owner records nothing.
        drop((ticket.pending, ticket.recorded));
        Ok(release)
    }

    /// Refuses the adapter's samples with [`CoreError::WeightsMissing`] for `reason` until an install gives it
    /// weights (another replica's version could not be fetched in time).
    pub(crate) async fn mark_weights_missing(&self, reason: String) -> Result<(), CoreError> {
        self.call(|reply| AdapterMsg::WeightsMissing { reason: reason.clone(), reply }).await
    }

    /// Sets (or, with `None`, clears) the adapter's staleness bound, at its current version (see
    /// [`crate::StalenessPolicy`]); requests held at the old bound ask again.
    pub async fn set_staleness(&self, policy: Option<StalenessPolicy>) -> Result<(), CoreError> {
        let recorded = self.call(|reply| AdapterMsg::SetStaleness { policy, record: true, reply }).await?;
        recorded.await?;
        Ok(())
    }

    /// Applies a staleness bound another replica set (and recorded).
    pub(crate) async fn follow_staleness(&self, policy: Option<StalenessPolicy>) -> Result<(), CoreError> {
        self.call(|reply| AdapterMsg::SetStaleness { policy, record: false, reply }).await.map(drop)
    }

    /// Releases the pause `pause_id`, or every pause for `None`, reopening the gate (releasing every held
    /// submission, waiter and kept request at once) when none is left.
    pub async fn resume(&self, pause_id: Option<PauseId>) -> Result<ResumeReport, CoreError> {
        let target = pause_id.map_or(ReleaseTarget::All, ReleaseTarget::Pause);
        self.release(target).await
    }

    pub(crate) async fn release(&self, target: ReleaseTarget) -> Result<ResumeReport, CoreError> {
        let (report, recorded) = self.call(|reply| AdapterMsg::Release { target: target.clone(), reply }).await?;
        recorded.await?;
        Ok(report)
    }

    /// Cancels, without pausing, the admitted requests whose id is in `ids` (every admitted request for `None`);
    /// returns once the actor cancelled them, with what to wait on for their hand-backs.
    pub(crate) async fn cancel_requests(
        &self,
        ids: Option<Arc<HashSet<RequestId>>>,
    ) -> Result<PendingHandBacks, CoreError> {
        self.call(|reply| AdapterMsg::AbortRequests { ids: ids.clone(), reply }).await
    }

    /// Long-poll: `Ok(false)` as soon as the gate is open (at once if it is), `Ok(true)` if it is still closed after
    /// `timeout`. The caller is counted as waiting until this returns or is dropped.
    pub async fn wait_unpaused(&self, timeout: Duration) -> Result<bool, CoreError> {
        let _waiting = Counted::new(&self.cell.waiting);
        match wait_until_open(self.cell.subscribe_gate(), Some(Instant::now() + timeout), None).await {
            GateWait::Open | GateWait::AbortPaused => Ok(false),
            GateWait::TimedOut => Ok(true),
            GateWait::Retired(why) => Err(self.retired_error(why)),
        }
    }

    /// The instant `version` was published on the adapter's gate (what requests held for it wait on), if it is the
    /// newest version installed: what benchmarks time a held request's admission from.
    #[cfg(any(test, feature = "testing"))]
    pub fn installed_at(&self, version: AdapterVersion) -> Option<std::time::Instant> {
        self.cell.installed_at(version)
    }

    /// When the last pass over requests parked for a version (see `parked`) started and ended: what benchmarks of the
    /// version hold break their figures down with.
    #[cfg(any(test, feature = "testing"))]
    pub fn last_pass(&self) -> Option<(std::time::Instant, std::time::Instant)> {
        self.cell.last_pass()
    }

    /// A consistent snapshot of the adapter's state.
    pub async fn status(&self) -> Result<AdapterStatus, CoreError> {
        self.call(|reply| AdapterMsg::Status { reply }).await
    }

    /// Decides on the request in the current incarnation's registry, under its lock (see `admission`): no round
    /// trip through the actor. If that incarnation ended (its actor died), waits (bounded) for the supervisor's
    /// restart and tries the next one, as [`AdapterHandle::call`] does.
    async fn decide(
        &self,
        request_id: &RequestId,
        wanted: VersionWanted,
        sequences: u32,
    ) -> Result<AdmitReply, CoreError> {
        let decide = |registry: SharedRegistry| admission::admit(&registry, &self.cell, request_id, wanted, sequences);
        if let Some(reply) = self.cell.current_registry().and_then(decide) {
            return reply;
        }
        let mut incarnations = self.cell.subscribe_actor();
        let deadline = Instant::now() + RESTART_WAIT;
        loop {
            let Some(registry) = incarnations.borrow_and_update().as_ref().map(|current| current.registry.clone())
            else {
                return Err(CoreError::UnknownAdapter(self.key().clone()));
            };
            if let Some(reply) = decide(registry) {
                return reply;
            }
            match tokio::time::timeout_at(deadline, incarnations.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) | Err(_) => return Err(CoreError::AdapterUnavailable(self.key().clone())),
            }
        }
    }

    /// The admission decision alone, without the wait at a closed gate that comes before it (the cheap wait; this is
    /// the check that closes the race with a pause): `Some` if admitted on any version now, `None` if the gate is
    /// closed. For tests that race admissions against the actor's passes over the registry.
    #[cfg(test)]
    pub(crate) async fn admit_unheld(&self, request_id: RequestId) -> Option<Admission> {
        match self.decide(&request_id, VersionWanted::Any, 1).await {
            Ok(AdmitReply::Admitted(admitted)) => Some(admitted.admission),
            Ok(AdmitReply::Paused) => None,
            Ok(_) => panic!("only an open or a closed gate is expected here"),
            Err(err) => panic!("the adapter is there: {err}"),
        }
    }

    /// Asks the current incarnation of the actor. If it died, waits (bounded) for the supervisor's restart and asks
    /// the next one; every message is safe to repeat because a dead incarnation took its effects with it.
    async fn call<T, B>(&self, build: B) -> Result<T, CoreError>
    where
        T: Send + 'static,
        B: Fn(RpcReplyPort<T>) -> AdapterMsg,
    {
        let mut incarnations = self.cell.subscribe_actor();
        let deadline = Instant::now() + RESTART_WAIT;
        loop {
            let Some(actor) = incarnations.borrow_and_update().as_ref().map(|current| current.actor.clone()) else {
                return Err(CoreError::UnknownAdapter(self.key().clone()));
            };
            if let Ok(CallResult::Success(answer)) = actor.call(&build, None).await {
                return Ok(answer);
            }
            match tokio::time::timeout_at(deadline, incarnations.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) | Err(_) => {
                    return Err(CoreError::AdapterUnavailable(self.key().clone()));
                }
            }
        }
    }

    /// Stops the adapter serving: marks it retired (held submissions and waiters fail with the reason) and cancels
    /// its admitted requests. Returns what to wait on for their hand-backs.
    pub(crate) async fn retire(&self, why: Retirement) -> Result<PendingHandBacks, CoreError> {
        let retired = self.call(|reply| AdapterMsg::Retire { why, record: true, reply }).await??;
        retired.recorded.await?;
        Ok(retired.pending)
    }

    /// The durable cell (the sample stream records metrics through it; tests reach the actor through it).
    pub(crate) fn cell(&self) -> &Arc<AdapterCell> {
        &self.cell
    }

    fn retired_error(&self, why: Retirement) -> CoreError {
        match why {
            Retirement::Unloaded => CoreError::UnknownAdapter(self.key().clone()),
            Retirement::ShuttingDown => CoreError::ShuttingDown,
        }
    }
}

/// A pause to release unless told otherwise: dropping it (the pausing call failed or its caller went away) releases
/// the pause on a spawned task, so a pause made for an operation never outlives the operation by accident.
pub(crate) struct PauseRelease {
    adapter: AdapterHandle,
    pause_id: PauseId,
    armed: bool,
}

impl PauseRelease {
    pub(crate) fn new(adapter: AdapterHandle, pause_id: PauseId) -> Self {
        Self { adapter, pause_id, armed: true }
    }

    /// Releases the pause now.
    pub(crate) async fn release(mut self) -> Result<ResumeReport, CoreError> {
        self.armed = false;
        self.adapter.release(ReleaseTarget::Pause(self.pause_id.clone())).await
    }

    /// Leaves the pause in place.
    pub(crate) fn keep_paused(mut self) {
        self.armed = false;
    }
}

impl Drop for PauseRelease {
    fn drop(&mut self) {
        if self.armed {
            let (adapter, target) = (self.adapter.clone(), ReleaseTarget::Pause(self.pause_id.clone()));
            tokio::spawn(async move { adapter.release(target).await });
        }
    }
}
