//! Requests parked for a version not yet installed (`min_lora_version`, or a pin `NAME@V` on a future version).
//!
//! A request whose version has not arrived leaves a small entry — its id, the version it wants, its sequences, what its
//! registration allocates, its count as held and a oneshot for the answer — in its adapter's registry, under the
//! registry's lock, in the same critical section that read the gate's version (see `admission`). Whoever installs a
//! version publishes it on the gate, then admits every parked request it satisfies in one pass under one lock hold
//! ([`super::admission::admit_parked`]) and sends each its answer: the waiting task wakes already admitted, instead of
//! a thousand tasks each waking to take the lock in turn. Either the parking comes first (the pass finds the entry) or
//! the pass does (the parking reads the new version and admits at once): no request waits on a version that already
//! came.
//!
//! The waiter holds its entry through a [`ParkedWait`]: if it gives up (its deadline passes, or its caller goes away)
//! the entry is withdrawn; an answer that raced the withdrawal is taken (at the deadline) or undone (a caller gone:
//! its registration ends, its places under the staleness bound are given back). When the registry's incarnation ends
//! the entries go with it: their waiters ask the next incarnation.

use std::collections::BTreeMap;

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::admission::AdmitReply;
use super::registry::{Registration, SharedRegistry};
use crate::contract::{AdapterVersion, CoreError, RequestId, VersionWanted};
use crate::limits::Slot;

/// What a parked request is answered with: the admission decision once its version came (admitted, or what stands in
/// its way now), or why it cannot be counted in flight.
pub(crate) type ParkedAnswer = Result<AdmitReply, CoreError>;

/// An answer as the pass sends it: with the instant the pass took its decisions, where the request's hold ended (one
/// clock reading for the whole pass: the woken waiter reads no clock of its own).
pub(crate) struct Answer {
    /// The decision.
    pub(crate) answer: ParkedAnswer,
    /// When the pass decided.
    pub(crate) at: Instant,
}

/// One request parked for its version.
pub(crate) struct Parked {
    /// The request's id.
    pub(crate) request_id: RequestId,
    /// The versions it accepts.
    pub(crate) wanted: VersionWanted,
    /// The version it waits for (the oldest current version that may serve it).
    pub(crate) least: AdapterVersion,
    /// Its new sequences, for the staleness bound.
    pub(crate) sequences: u32,
    /// What its registration allocates, made when it parked: the pass that admits it allocates nothing of its own.
    pub(crate) registration: Registration,
    /// Counts it as held while it is parked; the pass that admits it counts it in flight instead (its waiter, woken
    /// admitted, touches no counter).
    pub(crate) held: Slot,
    /// Where its answer goes.
    pub(crate) answer: oneshot::Sender<Answer>,
}

/// The parked requests of one registry, oldest first (a pass admits them in the order they came).
#[derive(Default)]
pub(crate) struct ParkedRequests {
    next_ticket: u64,
    entries: BTreeMap<u64, Parked>,
}

impl ParkedRequests {
    /// Parks `parked`; returns its ticket.
    pub(crate) fn park(&mut self, parked: Parked) -> u64 {
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        self.entries.insert(ticket, parked);
        ticket
    }

    /// Parks again an entry a pass took out.
    pub(crate) fn repark(&mut self, ticket: u64, parked: Parked) {
        self.entries.insert(ticket, parked);
    }

    /// Removes the entry `ticket`; `false` if it is not parked (a pass answered it, or the registry ended).
    pub(crate) fn withdraw(&mut self, ticket: u64) -> bool {
        self.entries.remove(&ticket).is_some()
    }

    /// Takes every entry out, oldest first (for a pass, which parks again those it does not answer).
    pub(crate) fn take_all(&mut self) -> BTreeMap<u64, Parked> {
        std::mem::take(&mut self.entries)
    }

    /// How many requests are parked.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether none is parked.
    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// How a wait for a parked request's answer ended.
pub(crate) enum ParkedOutcome {
    /// A pass answered (at the instant it says).
    Answered(Answer),
    /// The deadline passed with the request still parked (its entry is withdrawn).
    TimedOut,
    /// The registry's incarnation ended (its actor died or stopped): ask the next one.
    Ended,
}

/// A waiter's hold on its parked entry: dropped before an answer came, it withdraws the entry (see the module's doc).
pub(crate) struct ParkedWait {
    registry: SharedRegistry,
    ticket: u64,
    sequences: u32,
    answer: oneshot::Receiver<Answer>,
    /// Set once the wait settled: the entry is no longer parked and the answer, if any, was taken.
    settled: bool,
}

impl ParkedWait {
    /// The hold on the entry `ticket` of `registry`, answered on `answer`.
    pub(crate) fn new(
        registry: SharedRegistry,
        ticket: u64,
        sequences: u32,
        answer: oneshot::Receiver<Answer>,
    ) -> Self {
        Self { registry, ticket, sequences, answer, settled: false }
    }

    /// Waits for the answer until `deadline`. At the deadline the entry is withdrawn, unless a pass answered it
    /// meanwhile: that answer is taken.
    pub(crate) async fn wait(mut self, deadline: Instant) -> ParkedOutcome {
        let outcome = match tokio::time::timeout_at(deadline, &mut self.answer).await {
            Ok(Ok(answer)) => ParkedOutcome::Answered(answer),
            Ok(Err(_ended)) => ParkedOutcome::Ended,
            Err(_elapsed) => {
                if self.registry.lock().withdraw_parked(self.ticket) {
                    ParkedOutcome::TimedOut
                } else {
                    // Answered under the lock just taken, or the registry ended: what the pass sent is there now.
                    match self.answer.try_recv() {
                        Ok(answer) => ParkedOutcome::Answered(answer),
                        Err(_) => ParkedOutcome::Ended,
                    }
                }
            }
        };
        self.settled = true;
        outcome
    }
}

impl Drop for ParkedWait {
    fn drop(&mut self) {
        if self.settled || self.registry.lock().withdraw_parked(self.ticket) {
            return;
        }
        // A pass answered while the waiter was going away: nobody will run the request. Its registration ends as the
        // admission drops; its places under the staleness bound are given back first.
        if let Ok(Answer { answer: Ok(AdmitReply::Admitted(admitted)), .. }) = self.answer.try_recv()
            && let Some(staleness) = &admitted.staleness
        {
            staleness.give_back(self.sequences);
        }
    }
}
