//! The in-flight registry: every admitted request of one adapter, with the token that aborts it and the signal
//! that says it was handed back. Requests are registered through an [`Admission`] guard, so completion, abort,
//! client disconnect and panic all deregister them the same way: by dropping the guard.

use std::collections::HashMap;
use std::time::Duration;

use futures::FutureExt;
use futures::future::Shared;
use futures::stream::{FuturesUnordered, StreamExt};
use ractor::ActorRef;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use super::actor::AdapterMsg;
use crate::ids::{AdapterVersion, RequestId};

/// How an admitted request ended, as seen by whoever waits for it to be handed back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ending {
    /// Handed back finished (stop or length).
    Completed,
    /// Handed back with `FINISH_REASON_ABORT` and its partial output.
    Aborted,
    /// Handed back as an error.
    Failed,
    /// The caller went away (or a task panicked) before anything was handed back.
    Abandoned,
}

/// The registry's key for one admission. Callers' request ids may collide; tickets never do.
pub(crate) type Ticket = u64;

/// Resolves once the request was handed back.
type HandedBack = Shared<oneshot::Receiver<Ending>>;

struct Entry {
    request_id: RequestId,
    cancel: CancellationToken,
    handed_back: HandedBack,
}

/// The admitted requests of one adapter. Owned by the adapter's actor.
#[derive(Default)]
pub(crate) struct InFlightRegistry {
    next_ticket: Ticket,
    entries: HashMap<Ticket, Entry>,
}

impl InFlightRegistry {
    /// Registers a request and returns the guard that deregisters it.
    pub(crate) fn admit(
        &mut self,
        request_id: RequestId,
        version: AdapterVersion,
        actor: ActorRef<AdapterMsg>,
    ) -> Admission {
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        let cancel = CancellationToken::new();
        let (hand_back, handed_back) = oneshot::channel();
        self.entries.insert(
            ticket,
            Entry { request_id: request_id.clone(), cancel: cancel.clone(), handed_back: handed_back.shared() },
        );
        Admission { ticket, request_id, version, cancel, hand_back: Some(hand_back), actor }
    }

    /// Forgets a request whose guard was dropped.
    pub(crate) fn release(&mut self, ticket: Ticket) {
        self.entries.remove(&ticket);
    }

    /// Cancels every registered request and returns what to wait on for each to be handed back. Entries stay until
    /// their guards drop, so a second abort meanwhile waits for the same requests.
    pub(crate) fn cancel_all(&self) -> PendingHandBacks {
        let pending = self
            .entries
            .values()
            .map(|entry| {
                entry.cancel.cancel();
                (entry.request_id.clone(), entry.handed_back.clone())
            })
            .collect();
        PendingHandBacks { pending }
    }

    /// How many requests are admitted (queued or running).
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}

impl Drop for InFlightRegistry {
    /// The registry dies with its actor (unload, shutdown, or a crash before a restart). Nobody could abort these
    /// requests later, so they are aborted now: each is handed back with its partial output, none runs on unseen.
    fn drop(&mut self) {
        for entry in self.entries.values() {
            entry.cancel.cancel();
        }
    }
}

/// Requests cancelled by an abort, not yet known to be handed back.
#[derive(Default)]
pub(crate) struct PendingHandBacks {
    pending: Vec<(RequestId, HandedBack)>,
}

/// What an abort did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AbortReport {
    /// Requests handed back with `FINISH_REASON_ABORT`.
    pub aborted: Vec<RequestId>,
    /// Requests cancelled but not handed back within the acknowledgement timeout. They will still end as aborted.
    pub unacknowledged: Vec<RequestId>,
}

impl PendingHandBacks {
    /// Waits until every request was handed back, or `ack_timeout` passes. Requests that finished normally before
    /// the abort reached them, or whose caller left, are in neither list.
    pub(crate) async fn wait(self, ack_timeout: Duration) -> AbortReport {
        let mut report = AbortReport::default();
        let mut outstanding: Vec<Option<RequestId>> = Vec::with_capacity(self.pending.len());
        let mut waiting = FuturesUnordered::new();
        for (index, (request_id, handed_back)) in self.pending.into_iter().enumerate() {
            outstanding.push(Some(request_id));
            waiting.push(async move { (index, handed_back.await) });
        }
        let deadline = tokio::time::Instant::now() + ack_timeout;
        loop {
            match tokio::time::timeout_at(deadline, waiting.next()).await {
                Ok(Some((index, ending))) => {
                    let request_id = outstanding[index].take();
                    if ending == Ok(Ending::Aborted) {
                        report.aborted.extend(request_id);
                    }
                }
                Ok(None) => break,
                Err(_elapsed) => {
                    report.unacknowledged = outstanding.into_iter().flatten().collect();
                    break;
                }
            }
        }
        report
    }
}

/// An admitted request. While it exists the request is in its adapter's registry and an abort can reach it through
/// [`Admission::cancel_token`]. Dropping it deregisters the request and cancels its token (a client that goes away
/// stops its work); [`Admission::hand_back`] first says how it ended.
#[derive(Debug)]
pub struct Admission {
    ticket: Ticket,
    request_id: RequestId,
    version: AdapterVersion,
    cancel: CancellationToken,
    hand_back: Option<oneshot::Sender<Ending>>,
    actor: ActorRef<AdapterMsg>,
}

impl Admission {
    /// The request's id.
    pub fn request_id(&self) -> &RequestId {
        &self.request_id
    }

    /// The adapter's version when the request was admitted.
    pub fn version_at_admission(&self) -> AdapterVersion {
        self.version
    }

    /// The token an abort cancels; hand it to the engine.
    pub fn cancel_token(&self) -> &CancellationToken {
        &self.cancel
    }

    /// Says how the request ended and deregisters it. An abort waiting for this request returns once every request
    /// it cancelled was handed back.
    pub fn hand_back(mut self, ending: Ending) {
        if let Some(hand_back) = self.hand_back.take() {
            // The receiver lives in the registry entry; if the actor is gone nobody is waiting.
            let _ = hand_back.send(ending);
        }
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        if let Some(hand_back) = self.hand_back.take() {
            let _ = hand_back.send(Ending::Abandoned);
        }
        self.cancel.cancel();
        // A dead actor took its registry with it: there is nothing left to release.
        let _ = self.actor.cast(AdapterMsg::Release { ticket: self.ticket });
    }
}
