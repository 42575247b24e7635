//! Admission: the decision whether one request is served now, taken by the admitting task itself inside the current
//! incarnation's registry lock, with no round trip through the actor.
//!
//! Why this cannot lose a request to a pause: every gate change that acts on admitted requests (a pause, a remote
//! pause's adoption, a retirement) is made by the actor, which changes the gate *first* and only then takes the
//! registry lock to cancel, keep or watch what is registered. An admission reads the gate *under* that lock. So
//! either the admission's critical section comes first (the request is registered, and the actor's pass over the
//! registry reaches it) or the actor's does (the admission sees the closed gate or the retirement, and the request
//! is held or refused). A request is never registered behind the pass unseen, nor admitted through a closed gate.

use std::sync::Arc;

use parking_lot::Mutex;

use super::cell::{AdapterCell, StalenessTicket, VersionPin};
use super::registry::{Admission, InFlightRegistry};
use super::versions::PinRefused;
use crate::contract::{AdapterVersion, RequestId, Retirement, VersionWanted};

/// The answer to an admission.
pub(crate) enum AdmitReply {
    /// Registered.
    Admitted(Admitted),
    /// The gate is closed; wait on it and try again.
    Paused,
    /// The version the request wants has not arrived: wait until the adapter is at this version and try again.
    NotYet(AdapterVersion),
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

/// Decides on a request of `sequences` sequences (0: a continuation, not counted again) that wants `wanted`, in
/// `registry`, under its lock: registers it if the gate is open, a version it wants is servable and the staleness
/// bound has room for it. `None` if the registry's incarnation ended (its actor died): ask the next one.
pub(crate) fn admit(
    registry: &Mutex<InFlightRegistry>,
    cell: &Arc<AdapterCell>,
    request_id: &RequestId,
    wanted: VersionWanted,
    sequences: u32,
) -> Option<AdmitReply> {
    let mut registry = registry.lock();
    if registry.is_ended() {
        return None;
    }
    // Read under the lock: see the module's doc.
    let gate = cell.gate_state();
    if let Some(why) = gate.retired {
        return Some(AdmitReply::Retired(why));
    }
    if gate.paused {
        return Some(AdmitReply::Paused);
    }
    let (version, pin) = match wanted {
        VersionWanted::Any => (gate.version, None),
        VersionWanted::AtLeast(least) if gate.version < least => return Some(AdmitReply::NotYet(least)),
        VersionWanted::AtLeast(_) => (gate.version, None),
        VersionWanted::Exactly(exact) => match cell.pin(exact) {
            Ok(pin) => (exact, Some(pin)),
            Err(PinRefused::NotYet) => return Some(AdmitReply::NotYet(exact)),
            Err(PinRefused::Released(servable)) => return Some(AdmitReply::Released(servable)),
        },
    };
    // Counted at the version and epoch read above, so that whatever widens the bound after this read (a new version,
    // a new policy, places given back, each of which moves the gate after changing the bound) is seen by the wait.
    let staleness = match cell.start_sequences(sequences, gate.version) {
        Ok(ticket) => ticket,
        Err(capacity) => {
            return Some(AdmitReply::AtCapacity { capacity, version: gate.version, epoch: gate.admission_epoch });
        }
    };
    let admission = registry.admit(request_id.clone(), version);
    Some(AdmitReply::Admitted(Admitted { admission, pin, staleness }))
}
