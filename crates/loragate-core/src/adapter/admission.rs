//! Admission: the decision whether one request is served now, taken by the admitting task itself inside the current
//! incarnation's registry lock, with no round trip through the actor.
//!
//! Why this cannot lose a request to a pause: every gate change that acts on admitted requests (a pause, a remote
//! pause's adoption, a retirement) is made by the actor, which changes the gate *first* and only then takes the
//! registry lock to cancel, keep or watch what is registered. An admission reads the gate *under* that lock. So
//! either the admission's critical section comes first (the request is registered, and the actor's pass over the
//! registry reaches it) or the actor's does (the admission sees the closed gate or the retirement, and the request
//! is held or refused). A request is never registered behind the pass unseen, nor admitted through a closed gate.
//!
//! A request whose version has not arrived is parked in the registry in the same critical section (see `parked`),
//! and admitted by [`admit_parked`], the pass that follows each install: one lock hold for every parked request,
//! deciding each exactly as [`admit`] does, on the gate read under that lock — so the argument above holds for it too.

use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::oneshot;

use super::cell::{AdapterCell, StalenessTicket, VersionPin};
use super::parked::{Answer, Parked, ParkedWait};
use super::registry::{Admission, InFlightRegistry, Registration, SharedRegistry};
use super::versions::PinRefused;
use crate::contract::{AdapterVersion, CoreError, GateState, RequestId, Retirement, VersionWanted};
use crate::limits::Occupancy;

/// The answer to an admission.
pub(crate) enum AdmitReply {
    /// Registered.
    Admitted(Admitted),
    /// The gate is closed; wait on it and try again.
    Paused,
    /// The version the request wants has not arrived: it is parked until an install admits it (or answers what
    /// stands in its way then); it waits for this version.
    Parked(ParkedWait, AdapterVersion),
    /// The version the request pinned is no longer served; these are.
    Released(Vec<AdapterVersion>),
    /// The staleness bound has no room: wait for a new version (or for places given back) and try again. Says the
    /// capacity, and the gate's version and admission epoch it was found full at.
    AtCapacity { capacity: u64, version: AdapterVersion, epoch: u64 },
    /// The adapter stopped serving.
    Retired(Retirement),
}

/// A registered request, with what it holds beyond its registration: the pin on the exact version it asked for,
/// and its places under the staleness bound. Whoever drives the request keeps both until it ends.
pub(crate) struct Admitted {
    /// The registration.
    pub(crate) admission: Admission,
    /// The pin on its exact version (`NAME@V`), if it asked for one.
    pub(crate) pin: Option<VersionPin>,
    /// Its places under the staleness bound, if one counted it.
    pub(crate) staleness: Option<StalenessTicket>,
}

/// One decision, under the registry's lock on the gate read under it.
enum Decision {
    /// Answered.
    Reply(AdmitReply),
    /// The version the request wants has not arrived (its registration is given back, for when it does).
    NotYet(AdapterVersion, Registration),
}

/// Decides on a request of `sequences` sequences (0: a continuation, not counted again) that wants `wanted`, in
/// `registry`, under its lock: registers it if the gate is open, a version it wants is servable and the staleness
/// bound has room for it; parks it, counted as held, if that version has not arrived (refused with
/// [`CoreError::Overloaded`] over a held limit). `None` if the registry's incarnation ended (its actor died): ask the
/// next one.
pub(crate) fn admit(
    registry: &SharedRegistry,
    cell: &Arc<AdapterCell>,
    request_id: &RequestId,
    wanted: VersionWanted,
    sequences: u32,
) -> Option<Result<AdmitReply, CoreError>> {
    // Allocated before the lock is taken (and kept by a parked request for the pass that admits it).
    let registration = Registration::default();
    let mut locked = registry.lock();
    if locked.is_ended() {
        return None;
    }
    // Read under the lock: see the module's doc.
    let gate = cell.gate_state();
    match decide(&mut locked, &gate, cell, request_id, wanted, sequences, registration) {
        Decision::Reply(reply) => Some(Ok(reply)),
        Decision::NotYet(least, registration) => {
            let held = match cell.occupy(Occupancy::Held) {
                Ok(held) => held,
                Err(err) => return Some(Err(err)),
            };
            let (answer, answered) = oneshot::channel();
            let request_id = request_id.clone();
            let parked = Parked { request_id, wanted, least, sequences, registration, held, answer };
            let ticket = locked.park(parked);
            Some(Ok(AdmitReply::Parked(ParkedWait::new(registry.clone(), ticket, sequences, answered), least)))
        }
    }
}

/// The pass after an install: admits, under one hold of `registry`'s lock, every parked request whose version is now
/// current, oldest first, and answers each on its oneshot (with what stands in its way, if something does: a closed
/// gate, a full staleness bound, a retirement, the in-flight limit). Those whose version is still to come stay parked.
pub(crate) fn admit_parked(registry: &Mutex<InFlightRegistry>, cell: &Arc<AdapterCell>) {
    #[cfg(any(test, feature = "testing"))]
    let started = std::time::Instant::now();
    let mut locked = registry.lock();
    if locked.is_ended() || locked.parked().is_empty() {
        return;
    }
    // Read under the lock, after the install published the version: see the module's doc.
    let gate = cell.gate_state();
    let at = tokio::time::Instant::now();
    let parked = locked.parked().take_all();
    locked.make_room(parked.len());
    for (ticket, parked) in parked {
        if let Some(why) = gate.retired {
            let _ = parked.answer.send(Answer { answer: Ok(AdmitReply::Retired(why)), at });
            continue;
        }
        if parked.least > gate.version {
            locked.parked().repark(ticket, parked);
            continue;
        }
        if parked.answer.is_closed() {
            continue; // Its waiter is going away (and withdraws nothing).
        }
        let Parked { request_id, wanted, least, sequences, registration, held, answer } = parked;
        // No longer held: counted in flight for the decision, which may admit it.
        let slot = match cell.admit_held(held) {
            Ok(slot) => slot,
            Err(err) => {
                let _ = answer.send(Answer { answer: Err(err), at });
                continue;
            }
        };
        let reply = match decide(&mut locked, &gate, cell, &request_id, wanted, sequences, registration) {
            Decision::NotYet(_, registration) => {
                // Held again (it was a moment ago: not refused).
                let held = cell.occupy_uncapped(Occupancy::Held);
                drop(slot);
                let parked = Parked { request_id, wanted, least, sequences, registration, held, answer };
                locked.parked().repark(ticket, parked);
                continue;
            }
            Decision::Reply(AdmitReply::Admitted(admitted)) => {
                AdmitReply::Admitted(Admitted { admission: admitted.admission.occupying(slot), ..admitted })
            }
            Decision::Reply(reply) => reply,
        };
        // The waiter's withdrawal takes this lock: it finds the answer once the lock is released.
        let _ = answer.send(Answer { answer: Ok(reply), at });
    }
    #[cfg(any(test, feature = "testing"))]
    cell.record_pass(started);
}

/// The decision itself, on `gate` read under `registry`'s lock.
fn decide(
    registry: &mut InFlightRegistry,
    gate: &GateState,
    cell: &Arc<AdapterCell>,
    request_id: &RequestId,
    wanted: VersionWanted,
    sequences: u32,
    registration: Registration,
) -> Decision {
    if let Some(why) = gate.retired {
        return Decision::Reply(AdmitReply::Retired(why));
    }
    if gate.paused {
        return Decision::Reply(AdmitReply::Paused);
    }
    let (version, pin) = match wanted {
        VersionWanted::Any => (gate.version, None),
        VersionWanted::AtLeast(least) if gate.version < least => return Decision::NotYet(least, registration),
        VersionWanted::AtLeast(_) => (gate.version, None),
        VersionWanted::Exactly(exact) => match cell.pin(exact) {
            Ok(pin) => (exact, Some(pin)),
            Err(PinRefused::NotYet) => return Decision::NotYet(exact, registration),
            Err(PinRefused::Released(servable)) => return Decision::Reply(AdmitReply::Released(servable)),
        },
    };
    // Counted at the version and epoch read above, so that whatever widens the bound after this read (a new version,
    // a new policy, places given back, each of which moves the gate after changing the bound) is seen by the wait.
    let staleness = match cell.start_sequences(sequences, gate.version) {
        Ok(ticket) => ticket,
        Err(capacity) => {
            let (version, epoch) = (gate.version, gate.admission_epoch);
            return Decision::Reply(AdmitReply::AtCapacity { capacity, version, epoch });
        }
    };
    let admission = registry.admit(request_id.clone(), version, registration);
    Decision::Reply(AdmitReply::Admitted(Admitted { admission, pin, staleness }))
}
