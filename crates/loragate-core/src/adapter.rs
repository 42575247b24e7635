//! One adapter: its actor (gate, registry, version) and the typed [`AdapterHandle`] callers use, so nobody outside
//! this module builds an actor message.
//!
//! Data flow: `admit` asks the actor to register the request; if the gate is closed the caller waits on the gate's
//! `watch` (counted as *held*) until it opens or the deadline passes, then asks again. `abort` asks the actor to
//! close the gate and cancel every registered request, then waits outside the actor until each was handed back.

mod actor;
mod cell;
mod gate;
mod registry;
mod status;

use std::sync::Arc;
use std::time::Duration;

use ractor::RpcReplyPort;
use ractor::rpc::CallResult;
use tokio::time::Instant;

use self::actor::AdmitReply;
pub(crate) use self::actor::{AdapterActor, AdapterArgs, AdapterMsg};
pub(crate) use self::cell::AdapterCell;
use self::gate::{Counted, GateWait, wait_until_open};
pub use self::gate::{GateState, Retirement};
pub(crate) use self::registry::PendingHandBacks;
pub use self::registry::{AbortReport, Admission, Ending};
pub use self::status::AdapterStatus;
use crate::error::{CoreError, Field};
use crate::ids::{AdapterKey, RequestId};
use crate::limits::Occupancy;

/// The longest `WaitLoraUnpaused` timeout honoured; longer ones are shortened to it.
pub const MAX_WAIT_TIMEOUT: Duration = Duration::from_secs(24 * 60 * 60);

/// How long a call waits for a crashed actor's next incarnation before giving up.
const RESTART_WAIT: Duration = Duration::from_secs(5);

/// Parses a `timeout_s`: finite and non-negative; values over [`MAX_WAIT_TIMEOUT`] are shortened to it.
pub fn parse_timeout_s(raw: f64) -> Result<Duration, CoreError> {
    if !raw.is_finite() || raw < 0.0 {
        return Err(CoreError::invalid(Field::TimeoutS, format!("must be finite and >= 0, got {raw}")));
    }
    Ok(Duration::from_secs_f64(raw.min(MAX_WAIT_TIMEOUT.as_secs_f64())))
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

    /// Registers a request. While the gate is closed the caller is held (and counted as held) until it opens, the
    /// adapter is removed, or `hold_until` passes ([`CoreError::GateHoldExpired`]).
    ///
    /// An admitted request counts against the in-flight limits until its [`Admission`] ends; a request over a
    /// limit is refused at once with [`CoreError::Overloaded`].
    pub async fn admit(&self, request_id: RequestId, hold_until: Instant) -> Result<Admission, CoreError> {
        loop {
            // Held requests are not in flight: wait at a closed gate first (this returns at once on an open one).
            self.hold_while_paused(hold_until).await?;
            let slot = self.cell.occupy(Occupancy::InFlight)?;
            match self.call(|reply| AdapterMsg::Admit { request_id: request_id.clone(), reply }).await? {
                AdmitReply::Admitted(admission) => return Ok(admission.occupying(slot)),
                AdmitReply::Paused => {} // Closed again meanwhile: hold again.
                AdmitReply::Retired(why) => return Err(self.retired_error(why)),
            }
        }
    }

    /// Holds the caller (counted as held) while the gate is closed: returns once it is open, or fails when the
    /// adapter is retired or `hold_until` passes. Returns at once on an open gate. A caller over a held limit is
    /// refused at once with [`CoreError::Overloaded`].
    pub async fn hold_while_paused(&self, hold_until: Instant) -> Result<(), CoreError> {
        if !self.cell.gate_state().paused {
            return Ok(());
        }
        let started = Instant::now();
        let _held = self.cell.occupy(Occupancy::Held)?;
        let outcome = wait_until_open(self.cell.subscribe_gate(), Some(hold_until)).await;
        let held_for = started.elapsed();
        self.cell.metrics.record_gate_hold(&self.cell.labels, held_for, outcome == GateWait::TimedOut);
        match outcome {
            GateWait::Open => Ok(()),
            GateWait::TimedOut => Err(CoreError::GateHoldExpired { adapter: self.key().clone(), held_for }),
            GateWait::Retired(why) => Err(self.retired_error(why)),
        }
    }

    /// Closes the gate first, then cancels every admitted request; returns once each was handed back, or when
    /// `ack_timeout` passes (the stragglers are reported).
    pub async fn abort(&self, ack_timeout: Duration) -> Result<AbortReport, CoreError> {
        let started = Instant::now();
        let pending = self.call(|reply| AdapterMsg::Abort { reply }).await?;
        let report = pending.wait(ack_timeout).await;
        self.cell.metrics.record_abort(&self.cell.labels, report.aborted.len(), started.elapsed());
        Ok(report)
    }

    /// Opens the gate, releasing every held submission and waiter at once. Returns whether it was closed.
    pub async fn resume(&self) -> Result<bool, CoreError> {
        self.call(|reply| AdapterMsg::Resume { reply }).await
    }

    /// Long-poll: `Ok(false)` as soon as the gate is open (at once if it is), `Ok(true)` if it is still closed after
    /// `timeout`. The caller is counted as waiting until this returns or is dropped.
    pub async fn wait_unpaused(&self, timeout: Duration) -> Result<bool, CoreError> {
        let _waiting = Counted::new(&self.cell.waiting);
        match wait_until_open(self.cell.subscribe_gate(), Some(Instant::now() + timeout)).await {
            GateWait::Open => Ok(false),
            GateWait::TimedOut => Ok(true),
            GateWait::Retired(why) => Err(self.retired_error(why)),
        }
    }

    /// A consistent snapshot of the adapter's state.
    pub async fn status(&self) -> Result<AdapterStatus, CoreError> {
        self.call(|reply| AdapterMsg::Status { reply }).await
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
            let Some(actor) = incarnations.borrow_and_update().clone() else {
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
        self.call(|reply| AdapterMsg::Retire { why, reply }).await?
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
