//! The in-flight registry: every admitted request of one adapter, with the token that aborts it and the signal
//! that says it was handed back. Requests are registered through an [`Admission`] guard, so completion, abort,
//! client disconnect and panic all deregister them the same way: by dropping the guard.
//!
//! Each incarnation of the adapter's actor owns one registry ([`OwnedRegistry`]) behind a short lock it shares with
//! the adapter's handles: admissions register themselves under that lock (see `admission`), everything else that
//! reads or cancels the registry (pauses, aborts, retirement, status) is the actor's. When the incarnation ends, its
//! registry ends with it: what it held is aborted, and it admits nothing more.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures::stream::{FuturesUnordered, StreamExt};
use parking_lot::{Mutex, MutexGuard};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::parked::{Parked, ParkedRequests};
use crate::contract::{AbortReport, AdapterVersion, Ending, RequestId, StopCause};
use crate::engine::ParkSignal;
use crate::limits::Slot;

/// Where a request's ending is settled once, by its [`Admission`], and read by the registry and by aborts; with the
/// token that aborts it (one allocation and one reference count shared by the registry's entry and the admission,
/// rather than a token handle of each).
#[derive(Default)]
struct HandBack {
    /// The token an abort cancels.
    cancel: CancellationToken,
    ending: OnceLock<Ending>,
    cause: OnceLock<StopCause>,
    /// Set with a keep cause whose pause reuses keys and values: the engine parks the request's sequences.
    park: ParkSignal,
    settled: Notify,
}

impl HandBack {
    /// Records why the request is being cancelled (the first cause stays).
    fn stop(&self, cause: StopCause) {
        let _ = self.cause.set(cause);
    }

    /// Records a keep-mode cancellation that parks the request's sequences in the engine: the park signal is set
    /// only if this is the first cause, and before the caller cancels the token.
    fn stop_parking(&self) {
        if self.cause.set(StopCause::Kept).is_ok() {
            self.park.request();
        }
    }

    /// Records how the request ended; only the first call counts.
    fn settle(&self, ending: Ending) {
        if self.ending.set(ending).is_ok() {
            self.settled.notify_waiters();
        }
    }

    fn is_settled(&self) -> bool {
        self.ending.get().is_some()
    }

    /// Waits until the request was handed back.
    async fn wait(&self) -> Ending {
        loop {
            let settled = self.settled.notified();
            if let Some(ending) = self.ending.get() {
                return *ending;
            }
            settled.await;
        }
    }
}

/// The registry forgets handed-back requests lazily, when it grows past this many entries (and before every count
/// or abort), so ending a request costs its actor no message.
const MIN_PRUNE_AT: usize = 64;

struct Entry {
    request_id: RequestId,
    hand_back: Arc<HandBack>,
}

/// What registering a request allocates (its cancellation token and its hand-back), made before the registry's lock
/// is taken: by an admission before it locks, and by a request parked for a version when it parks, so that the
/// install's pass over the parked requests allocates nothing of theirs.
#[derive(Default)]
pub(crate) struct Registration {
    hand_back: Arc<HandBack>,
}

/// The admitted requests of one adapter, for one incarnation of its actor.
pub(crate) struct InFlightRegistry {
    next_ticket: u64,
    entries: HashMap<u64, Entry>,
    prune_at: usize,
    /// Requests waiting for a version not yet installed (see `parked`): admitted by the pass after an install.
    parked: ParkedRequests,
    /// Set when the incarnation ended: nothing more is admitted here.
    ended: bool,
}

impl Default for InFlightRegistry {
    fn default() -> Self {
        Self {
            next_ticket: 0,
            entries: HashMap::new(),
            prune_at: MIN_PRUNE_AT,
            parked: ParkedRequests::default(),
            ended: false,
        }
    }
}

/// One incarnation's registry, shared by the actor (through its [`OwnedRegistry`]) and the adapter's handles.
pub(crate) type SharedRegistry = Arc<RegistryLock>;

/// The registry's lock, on cache lines of its own: apart from the reference count of the `Arc` that shares it, which
/// every parked request's waiter moves when it wakes, while the install's pass writes the registry under the lock.
#[derive(Default)]
#[repr(align(128))]
pub(crate) struct RegistryLock(Mutex<InFlightRegistry>);

impl std::ops::Deref for RegistryLock {
    type Target = Mutex<InFlightRegistry>;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

/// The actor's hold on its incarnation's registry: dropping it (the actor stops or dies) ends the registry, aborting
/// every request it held, so none runs on unseen, and admitting nothing more.
#[derive(Default)]
pub(crate) struct OwnedRegistry {
    shared: SharedRegistry,
}

impl OwnedRegistry {
    /// The registry as the adapter's handles reach it.
    pub(crate) fn share(&self) -> SharedRegistry {
        self.shared.clone()
    }

    /// The registry, locked (briefly: the actor's own passes over it).
    pub(crate) fn lock(&self) -> MutexGuard<'_, InFlightRegistry> {
        self.shared.lock()
    }
}

impl Drop for OwnedRegistry {
    fn drop(&mut self) {
        self.shared.lock().end();
    }
}

impl InFlightRegistry {
    /// Registers a request with what `registration` allocated and returns the guard that ends its registration.
    pub(crate) fn admit(
        &mut self,
        request_id: RequestId,
        version: AdapterVersion,
        registration: Registration,
    ) -> Admission {
        if self.entries.len() >= self.prune_at {
            self.forget_handed_back();
            self.prune_at = (2 * self.entries.len()).max(MIN_PRUNE_AT);
        }
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        let Registration { hand_back } = registration;
        let entry = Entry { request_id: request_id.clone(), hand_back: hand_back.clone() };
        self.entries.insert(ticket, entry);
        Admission { request_id, version, hand_back, _in_flight: None }
    }

    /// Cancels every request not yet handed back, for `cause`, and returns what to wait on for each. Entries stay
    /// until handed back, so a second abort meanwhile waits for the same requests.
    pub(crate) fn cancel_all(&mut self, cause: StopCause) -> PendingHandBacks {
        self.cancel_where(cause, |_| true)
    }

    /// Cancels every request not yet handed back to be kept with its keys and values parked in the engine
    /// ([`crate::KvPolicy::Reuse`]); returns what to wait on for each.
    pub(crate) fn park_all(&mut self) -> PendingHandBacks {
        self.forget_handed_back();
        let pending = self
            .entries
            .values()
            .map(|entry| {
                entry.hand_back.stop_parking();
                entry.hand_back.cancel.cancel();
                (entry.request_id.clone(), entry.hand_back.clone())
            })
            .collect();
        PendingHandBacks { pending }
    }

    /// Cancels, for `cause`, the requests whose id is in `ids`; returns what to wait on for each.
    ///
    /// One id (SGLang's `/abort_request` names one `rid` per call, and a fleet sends one such call per sequence) is
    /// compared with each entry's id rather than looked up: looking it up hashes every entry's id, which made a
    /// burst of such calls quadratic in hashing.
    pub(crate) fn cancel_matching(&mut self, ids: &HashSet<RequestId>, cause: StopCause) -> PendingHandBacks {
        match ids.iter().next() {
            Some(only) if ids.len() == 1 => self.cancel_where(cause, |entry| entry.request_id == *only),
            _ => self.cancel_where(cause, |entry| ids.contains(&entry.request_id)),
        }
    }

    /// What to wait on for every request not yet handed back, cancelling nothing (a pause that lets them finish).
    pub(crate) fn pending_all(&mut self) -> PendingHandBacks {
        self.forget_handed_back();
        let pending = self.entries.values().map(|entry| (entry.request_id.clone(), entry.hand_back.clone())).collect();
        PendingHandBacks { pending }
    }

    fn cancel_where(&mut self, cause: StopCause, selected: impl Fn(&Entry) -> bool) -> PendingHandBacks {
        self.forget_handed_back();
        let pending = self
            .entries
            .values()
            .filter(|entry| selected(entry))
            .map(|entry| {
                entry.hand_back.stop(cause);
                entry.hand_back.cancel.cancel();
                (entry.request_id.clone(), entry.hand_back.clone())
            })
            .collect();
        PendingHandBacks { pending }
    }

    /// How many requests are admitted and not yet handed back (queued or running).
    pub(crate) fn len(&mut self) -> usize {
        self.forget_handed_back();
        self.entries.len()
    }

    /// Makes room for `additional` registrations at once (the install's pass over the parked requests): forgets the
    /// handed-back requests and grows the map once, so that no registration of the pass prunes or rehashes it.
    pub(crate) fn make_room(&mut self, additional: usize) {
        self.forget_handed_back();
        self.entries.reserve(additional);
        self.prune_at = self.prune_at.max(self.entries.len() + additional);
    }

    fn forget_handed_back(&mut self) {
        self.entries.retain(|_, entry| !entry.hand_back.is_settled());
    }

    /// Parks a request that waits for a version (see `parked`); returns its ticket.
    pub(crate) fn park(&mut self, parked: Parked) -> u64 {
        self.parked.park(parked)
    }

    /// Removes the parked entry `ticket`; `false` if it is not parked (a pass answered it, or the registry ended).
    pub(crate) fn withdraw_parked(&mut self, ticket: u64) -> bool {
        self.parked.withdraw(ticket)
    }

    /// The parked requests, for a pass over them.
    pub(crate) fn parked(&mut self) -> &mut ParkedRequests {
        &mut self.parked
    }

    /// Whether any request is parked for a version.
    pub(crate) fn has_parked(&self) -> bool {
        !self.parked.is_empty()
    }

    /// How many requests are parked for a version.
    #[cfg(test)]
    pub(crate) fn parked_len(&self) -> usize {
        self.parked.len()
    }

    /// Whether the registry's incarnation ended (see [`InFlightRegistry::end`]).
    pub(crate) fn is_ended(&self) -> bool {
        self.ended
    }

    /// Ends the registry with its actor's incarnation (unload, shutdown, or a crash before a restart). Nobody could
    /// abort these requests later, so they are aborted now: each is handed back with its partial output, none runs
    /// on unseen. Nothing is admitted here afterwards: admissions go to the next incarnation, parked requests too.
    fn end(&mut self) {
        self.ended = true;
        // Their waiters see the answer's sender go, and ask the next incarnation.
        drop(self.parked.take_all());
        for (_, entry) in self.entries.drain() {
            entry.hand_back.stop(StopCause::Retired);
            entry.hand_back.cancel.cancel();
        }
    }
}

/// Requests cancelled by an abort, not yet known to be handed back.
#[derive(Default)]
pub(crate) struct PendingHandBacks {
    pending: Vec<(RequestId, Arc<HandBack>)>,
}

impl PendingHandBacks {
    /// Waits until every request was handed back (or kept), or `ack_timeout` passes. Requests that finished normally
    /// before the abort reached them, or whose caller left, are in none of the lists.
    pub(crate) async fn wait(self, ack_timeout: Duration) -> AbortReport {
        let mut report = AbortReport::default();
        let mut outstanding: Vec<Option<RequestId>> = Vec::with_capacity(self.pending.len());
        let mut waiting = FuturesUnordered::new();
        for (index, (request_id, hand_back)) in self.pending.into_iter().enumerate() {
            outstanding.push(Some(request_id));
            waiting.push(async move { (index, hand_back.wait().await) });
        }
        let deadline = tokio::time::Instant::now() + ack_timeout;
        loop {
            match tokio::time::timeout_at(deadline, waiting.next()).await {
                Ok(Some((index, ending))) => {
                    let request_id = outstanding[index].take();
                    match ending {
                        Ending::Aborted => report.aborted.extend(request_id),
                        Ending::Kept => report.kept.extend(request_id),
                        Ending::Completed | Ending::Failed | Ending::Abandoned => {}
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
/// [`Admission::cancel_token`]. Dropping it ends the registration and cancels its token (a client that goes away
/// stops its work); [`Admission::hand_back`] first says how it ended.
#[derive(Debug)]
pub struct Admission {
    request_id: RequestId,
    version: AdapterVersion,
    hand_back: Arc<HandBack>,
    /// Counts the request against the in-flight limits for as long as it is admitted.
    _in_flight: Option<Slot>,
}

impl std::fmt::Debug for HandBack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("HandBack").field(&self.ending.get()).finish()
    }
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

    /// Makes the admission hold `slot` (its place under the in-flight limits) until it ends.
    pub(crate) fn occupying(mut self, slot: Slot) -> Self {
        self._in_flight = Some(slot);
        self
    }

    /// The token an abort cancels; hand it to the engine.
    pub fn cancel_token(&self) -> &CancellationToken {
        &self.hand_back.cancel
    }

    /// Set before the token fires when a keep-mode pause parks the request ([`crate::KvPolicy::Reuse`]); hand it
    /// to the engine with the token.
    pub fn park_signal(&self) -> &ParkSignal {
        &self.hand_back.park
    }

    /// Why the request was cancelled, if it was (set before its token fires).
    pub fn stop_cause(&self) -> Option<StopCause> {
        self.hand_back.cause.get().copied()
    }

    /// Says how the request ended and ends its registration. An abort waiting for this request returns once every
    /// request it cancelled was handed back.
    pub fn hand_back(self, ending: Ending) {
        self.hand_back.settle(ending);
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        // No-op if `hand_back` already settled it.
        self.hand_back.settle(Ending::Abandoned);
        self.hand_back.cancel.cancel();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(raw: &str) -> RequestId {
        RequestId::parse_or_generate(raw).expect("valid id")
    }

    #[test]
    fn handed_back_requests_leave_and_memory_stays_bounded() {
        let mut registry = InFlightRegistry::default();
        for i in 0..10_000 {
            let admission = registry.admit(id(&format!("r{i}")), AdapterVersion(1), Registration::default());
            admission.hand_back(Ending::Completed);
            assert!(registry.entries.len() <= 2 * MIN_PRUNE_AT, "entries pile up: {}", registry.entries.len());
        }
        assert_eq!(registry.len(), 0);
    }

    #[test]
    fn room_made_for_a_pass_forgets_the_handed_back_loses_nobody_and_memory_stays_bounded() {
        let mut registry = InFlightRegistry::default();
        for i in 0..100 {
            registry
                .admit(id(&format!("old{i}")), AdapterVersion(1), Registration::default())
                .hand_back(Ending::Completed);
        }
        registry.make_room(1000);
        assert_eq!(registry.entries.len(), 0, "the handed-back requests are forgotten first");
        assert!(registry.entries.capacity() >= 1000, "room for the whole pass at once");
        // What each request allocated before the lock is what the registry cancels.
        let live: Vec<Admission> = (0..1000)
            .map(|i| registry.admit(id(&format!("p{i}")), AdapterVersion(2), Registration::default()))
            .collect();
        assert_eq!(registry.len(), 1000, "no registration of the pass is lost");
        let pending = registry.cancel_all(StopCause::Paused);
        assert!(live.iter().all(|admission| admission.cancel_token().is_cancelled()));
        assert_eq!(pending.pending.len(), 1000);
        for admission in live {
            admission.hand_back(Ending::Aborted);
        }
        // Afterwards the registry prunes as before.
        for i in 0..10_000 {
            let admission = registry.admit(id(&format!("r{i}")), AdapterVersion(2), Registration::default());
            admission.hand_back(Ending::Completed);
            assert!(registry.entries.len() <= 1001, "entries pile up: {}", registry.entries.len());
        }
        assert_eq!(registry.len(), 0);
    }

    #[tokio::test]
    async fn an_abort_cancels_live_requests_only_and_reports_the_aborted_ones() {
        let mut registry = InFlightRegistry::default();
        registry.admit(id("done"), AdapterVersion(1), Registration::default()).hand_back(Ending::Completed);
        let live = registry.admit(id("live"), AdapterVersion(1), Registration::default());
        let gone = registry.admit(id("gone"), AdapterVersion(1), Registration::default());
        assert_eq!(registry.len(), 2);

        let pending = registry.cancel_all(StopCause::Paused);
        assert!(live.cancel_token().is_cancelled() && gone.cancel_token().is_cancelled());
        let waiter = tokio::spawn(pending.wait(Duration::from_secs(10)));
        drop(gone);
        live.hand_back(Ending::Aborted);
        let report = waiter.await.expect("abort waiter");
        assert_eq!(report.aborted, vec![id("live")], "an abandoned request is not reported as aborted");
        assert!(report.unacknowledged.is_empty());
        assert_eq!(registry.len(), 0);
    }

    #[test]
    fn an_abort_by_id_cancels_exactly_the_named_requests_whether_one_or_several() {
        let mut registry = InFlightRegistry::default();
        let admitted: Vec<Admission> = ["a", "b", "c", "b", "d"]
            .iter()
            .map(|raw| registry.admit(id(raw), AdapterVersion(1), Registration::default()))
            .collect();
        let cancelled = |admitted: &[Admission]| -> Vec<bool> {
            admitted.iter().map(|admission| admission.cancel_token().is_cancelled()).collect()
        };
        // One id (compared, not looked up): both requests that share it, nothing else.
        registry.cancel_matching(&HashSet::from([id("b")]), StopCause::Targeted);
        assert_eq!(cancelled(&admitted), [false, true, false, true, false]);
        // Several ids (looked up), one of them unknown.
        registry.cancel_matching(&HashSet::from([id("a"), id("d"), id("zz")]), StopCause::Targeted);
        assert_eq!(cancelled(&admitted), [true, true, false, true, true]);
        // An unknown id alone cancels nothing.
        registry.cancel_matching(&HashSet::from([id("zz")]), StopCause::Targeted);
        assert_eq!(cancelled(&admitted), [true, true, false, true, true]);
    }

    #[test]
    fn an_ended_registry_aborted_what_it_held_and_says_it_ended() {
        let owned = OwnedRegistry::default();
        let shared = owned.share();
        let orphan = shared.lock().admit(id("orphan"), AdapterVersion(1), Registration::default());
        assert!(!shared.lock().is_ended());
        drop(owned);
        assert!(orphan.cancel_token().is_cancelled());
        assert_eq!(orphan.stop_cause(), Some(StopCause::Retired));
        assert!(shared.lock().is_ended(), "the handles' side sees the end");
        assert_eq!(shared.lock().len(), 0);
    }
}
