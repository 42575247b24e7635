//! The store's state, as plain synchronous code (the actor only delegates to it, so tests drive it directly with
//! their own clock): every future with its `watch` channel, the resubmission index, finished sessions, and the
//! retention rules.

use std::collections::{HashMap, VecDeque};
use std::time::SystemTime;

use tokio::sync::watch;
use tokio::time::Instant;

use super::record::SampleRecord;
use super::{DedupKey, FutureState, FutureSubject, FutureWatch, RetentionLimits, Settled};
use crate::ids::FutureId;

/// A future recorded before a restart, to put back.
#[derive(Debug)]
pub(crate) struct Restored {
    /// Its request id (an earlier process's).
    pub(crate) id: FutureId,
    /// What it samples and who created it.
    pub(crate) subject: FutureSubject,
    /// Its resubmission key.
    pub(crate) dedup: Option<DedupKey>,
    /// Pending (its sample is continued), or settled at the given time.
    pub(crate) settled: Option<(FutureState, Instant)>,
}

/// What [`FutureTable::submit`] did.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Submitted {
    /// A new future is pending under the id.
    New,
    /// The same submission arrived before (a transport-level resubmission): its future answers again.
    Existing(FutureId),
    /// Too many futures are pending; nothing was recorded.
    Full {
        /// How many are pending.
        pending: usize,
    },
}

struct Entry {
    subject: FutureSubject,
    state: watch::Sender<FutureState>,
    dedup: Option<DedupKey>,
    settled_at: Option<Instant>,
    delivered_at: Option<Instant>,
}

/// Every future of this process that is pending or whose result is retained.
pub(crate) struct FutureTable {
    limits: RetentionLimits,
    entries: HashMap<FutureId, Entry>,
    by_dedup: HashMap<DedupKey, FutureId>,
    /// Settled futures, oldest first (ids already evicted are skipped when met).
    settled: VecDeque<FutureId>,
    pending: usize,
    finished_sessions: HashMap<String, Instant>,
}

impl FutureTable {
    /// An empty table with `limits`.
    pub(crate) fn new(limits: RetentionLimits) -> Self {
        Self {
            limits,
            entries: HashMap::new(),
            by_dedup: HashMap::new(),
            settled: VecDeque::new(),
            pending: 0,
            finished_sessions: HashMap::new(),
        }
    }

    /// Records a new pending future `id` for `subject`, unless `dedup` names an earlier submission or the table is
    /// full.
    pub(crate) fn submit(
        &mut self,
        id: FutureId,
        subject: impl Into<FutureSubject>,
        dedup: Option<DedupKey>,
    ) -> Submitted {
        if let Some(existing) = dedup.as_ref().and_then(|key| self.by_dedup.get(key)) {
            return Submitted::Existing(*existing);
        }
        if self.pending >= self.limits.max_pending {
            return Submitted::Full { pending: self.pending };
        }
        if let Some(key) = &dedup {
            self.by_dedup.insert(key.clone(), id);
        }
        let (state, _) = watch::channel(FutureState::Pending);
        let subject = subject.into();
        self.entries.insert(id, Entry { subject, state, dedup, settled_at: None, delivered_at: None });
        self.pending += 1;
        Submitted::New
    }

    /// Puts back a future recorded before a restart. It counts toward the limits like any other, and is never refused
    /// (it was accepted before); results past `max_results` drop the oldest, as at settling. Answers the ids dropped.
    pub(crate) fn restore(&mut self, restored: Restored) -> Vec<FutureId> {
        let Restored { id, subject, dedup, settled } = restored;
        if let Some(key) = &dedup {
            self.by_dedup.insert(key.clone(), id);
        }
        let (state, settled_at) = match settled {
            Some((state, at)) => (state, Some(at)),
            None => (FutureState::Pending, None),
        };
        let (state, _) = watch::channel(state);
        self.entries.insert(id, Entry { subject, state, dedup, settled_at, delivered_at: None });
        if settled_at.is_some() {
            self.settled.push_back(id);
            self.evict_past_max_results()
        } else {
            self.pending += 1;
            Vec::new()
        }
    }

    /// Whether `id` is a pending future.
    pub(crate) fn is_pending(&self, id: FutureId) -> bool {
        self.entries.get(&id).is_some_and(|entry| entry.settled_at.is_none())
    }

    /// Drops a pending future whose record could not be written (its `asample` failed).
    pub(crate) fn withdraw(&mut self, id: FutureId) {
        if self.entries.get(&id).is_some_and(|entry| entry.settled_at.is_none()) {
            self.pending -= 1;
            self.remove(id);
        }
    }

    /// The record of a settled future, settled at `settled_at` (wall clock); `None` if it is unknown or pending.
    pub(crate) fn settled_record(&self, id: FutureId, settled_at: SystemTime) -> Option<SampleRecord> {
        let entry = self.entries.get(&id)?;
        let subject = &entry.subject;
        SampleRecord::settled(&subject.target, &subject.creator, entry.dedup.clone(), &entry.state.borrow(), settled_at)
    }

    /// Records the outcome of a pending future (a second outcome is ignored: the first is final). Answers the ids of
    /// the results dropped to stay within `max_results`.
    pub(crate) fn settle(&mut self, id: FutureId, outcome: Settled, now: Instant) -> Vec<FutureId> {
        let Some(entry) = self.entries.get_mut(&id).filter(|entry| entry.settled_at.is_none()) else {
            return Vec::new();
        };
        entry.settled_at = Some(now);
        entry.state.send_replace(match outcome {
            Settled::Finished(bytes) => FutureState::Finished(bytes),
            Settled::Failed(failure) => FutureState::Failed(failure),
        });
        self.pending -= 1;
        self.settled.push_back(id);
        self.evict_past_max_results()
    }

    /// Drops the oldest results past `max_results`; answers their ids.
    fn evict_past_max_results(&mut self) -> Vec<FutureId> {
        let mut evicted = Vec::new();
        while self.retained() > self.limits.max_results {
            let Some(oldest) = self.settled.pop_front() else { break };
            if let Some(entry) = self.entries.get(&oldest)
                && entry.delivered_at.is_none()
            {
                tracing::warn!(request_id = %oldest, limit = self.limits.max_results,
                    "dropped a Tinker result that was never retrieved: too many results are retained");
            }
            if self.entries.contains_key(&oldest) {
                evicted.push(oldest);
            }
            self.remove(oldest);
        }
        evicted
    }

    /// The future's state channel, if it is known.
    pub(crate) fn watch(&self, id: FutureId) -> Option<FutureWatch> {
        self.entries
            .get(&id)
            .map(|entry| FutureWatch { state: entry.state.subscribe(), subject: entry.subject.clone() })
    }

    /// The future's final answer went out; it is kept for the grace period (a lost response is retrieved again).
    pub(crate) fn delivered(&mut self, id: FutureId, now: Instant) {
        if let Some(entry) = self.entries.get_mut(&id).filter(|entry| entry.settled_at.is_some()) {
            entry.delivered_at.get_or_insert(now);
        }
    }

    /// Marks `session_id` finished (its heartbeats get 410 from now on).
    pub(crate) fn finish_session(&mut self, session_id: String, now: Instant) {
        self.finished_sessions.insert(session_id, now);
    }

    /// Whether `session_id` was finished.
    pub(crate) fn session_finished(&self, session_id: &str) -> bool {
        self.finished_sessions.contains_key(session_id)
    }

    /// Drops what outlived its retention: delivered results after the grace period, undelivered ones after the result
    /// lifetime, finished sessions after theirs. Answers the ids of the results dropped.
    pub(crate) fn sweep(&mut self, now: Instant) -> Vec<FutureId> {
        let limits = self.limits;
        let expired: Vec<FutureId> = self
            .entries
            .iter()
            .filter(|(_, entry)| match (entry.settled_at, entry.delivered_at) {
                (_, Some(delivered)) => now >= delivered + limits.delivered_grace,
                (Some(settled), None) => now >= settled + limits.result_lifetime,
                (None, None) => false,
            })
            .map(|(id, _)| *id)
            .collect();
        for id in &expired {
            if self.entries.get(id).is_some_and(|entry| entry.delivered_at.is_none()) {
                tracing::info!(request_id = %id, "dropped a Tinker result that was never retrieved");
            }
            self.remove(*id);
        }
        self.settled.retain(|id| self.entries.contains_key(id));
        self.finished_sessions.retain(|_, finished| now < *finished + limits.session_lifetime);
        expired
    }

    /// How many futures are pending.
    #[cfg(test)]
    pub(crate) fn pending(&self) -> usize {
        self.pending
    }

    /// How many settled results are retained.
    pub(crate) fn retained(&self) -> usize {
        self.entries.len() - self.pending
    }

    /// Removes a settled future (its watchers see the channel close).
    fn remove(&mut self, id: FutureId) {
        if let Some(entry) = self.entries.remove(&id)
            && let Some(key) = entry.dedup
        {
            self.by_dedup.remove(&key);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use bytes::Bytes;

    use loragate_core::AdapterKey;

    use super::*;
    use crate::ids::{Epoch, IdMaker};
    use crate::store::{Failure, FailureCategory};

    fn limits() -> RetentionLimits {
        RetentionLimits {
            max_pending: 2,
            max_results: 3,
            result_lifetime: Duration::from_secs(1800),
            delivered_grace: Duration::from_secs(60),
            session_lifetime: Duration::from_secs(3600),
        }
    }

    fn finished(text: &'static str) -> Settled {
        Settled::Finished(Bytes::from_static(text.as_bytes()))
    }

    fn state(table: &FutureTable, id: FutureId) -> Option<FutureState> {
        table.watch(id).map(|watch| watch.state.borrow().clone())
    }

    fn key(seq_id: i64) -> Option<DedupKey> {
        Some(DedupKey { sampling_session_id: "ss-1".into(), seq_id })
    }

    #[test]
    fn a_future_is_pending_then_final_and_resubmissions_answer_the_same_future() {
        let ids = IdMaker::new(Epoch::random());
        let mut table = FutureTable::new(limits());
        let now = Instant::now();
        let first = ids.future_id();
        assert_eq!(table.submit(first, AdapterKey::Base, key(0)), Submitted::New);
        assert_eq!(state(&table, first), Some(FutureState::Pending));
        let watcher = table.watch(first).expect("known");
        assert_eq!(table.submit(ids.future_id(), AdapterKey::Base, key(0)), Submitted::Existing(first));
        assert_eq!(table.pending(), 1, "a resubmission records nothing");

        table.settle(first, finished("done"), now);
        assert_eq!(*watcher.state.borrow(), FutureState::Finished(Bytes::from_static(b"done")), "watchers see it");
        table.settle(first, Settled::Failed(Failure::server("late")), now);
        assert_eq!(state(&table, first), Some(FutureState::Finished(Bytes::from_static(b"done"))), "first is final");
        assert_eq!((table.pending(), table.retained()), (0, 1));
        assert_eq!(table.submit(ids.future_id(), AdapterKey::Base, key(0)), Submitted::Existing(first));
    }

    #[test]
    fn pending_futures_are_capped() {
        let ids = IdMaker::new(Epoch::random());
        let mut table = FutureTable::new(limits());
        let (a, b) = (ids.future_id(), ids.future_id());
        assert_eq!(table.submit(a, AdapterKey::Base, None), Submitted::New);
        assert_eq!(table.submit(b, AdapterKey::Base, None), Submitted::New);
        let refused = ids.future_id();
        assert_eq!(table.submit(refused, AdapterKey::Base, key(9)), Submitted::Full { pending: 2 });
        assert!(table.watch(refused).is_none(), "a refused submission leaves nothing behind");
        table.settle(
            a,
            Settled::Failed(Failure { message: "x".into(), category: FailureCategory::User }),
            Instant::now(),
        );
        assert_eq!(table.submit(refused, AdapterKey::Base, key(9)), Submitted::New, "room again");
    }

    #[test]
    fn results_are_kept_for_a_grace_period_after_delivery_and_a_lifetime_without() {
        let ids = IdMaker::new(Epoch::random());
        let mut table = FutureTable::new(limits());
        let start = Instant::now();
        let (delivered, never_retrieved, running) = (ids.future_id(), ids.future_id(), ids.future_id());
        table.submit(delivered, AdapterKey::Base, key(1));
        table.settle(delivered, finished("a"), start);
        table.submit(never_retrieved, AdapterKey::Base, None);
        table.settle(never_retrieved, finished("b"), start);
        table.submit(running, AdapterKey::Base, None);
        let watcher = table.watch(delivered).expect("known");

        table.delivered(delivered, start + Duration::from_secs(10));
        table.sweep(start + Duration::from_secs(69));
        assert!(table.watch(delivered).is_some(), "a lost response may be retrieved again within the grace");
        assert_eq!(table.sweep(start + Duration::from_secs(70)), [delivered], "its record goes too");
        assert!(table.watch(delivered).is_none(), "dropped after the grace");
        assert!(watcher.state.has_changed().is_err(), "its watchers see the channel close");
        assert_eq!(table.submit(ids.future_id(), AdapterKey::Base, key(1)), Submitted::New, "its dedup key too");

        table.sweep(start + Duration::from_secs(1799));
        assert!(table.watch(never_retrieved).is_some());
        table.sweep(start + Duration::from_secs(1800));
        assert!(table.watch(never_retrieved).is_none(), "dropped after the result lifetime");
        table.sweep(start + Duration::from_secs(100_000));
        assert_eq!(state(&table, running), Some(FutureState::Pending), "pending futures are never swept");
    }

    #[test]
    fn retained_results_are_capped_oldest_first() {
        let ids = IdMaker::new(Epoch::random());
        let mut table = FutureTable::new(RetentionLimits { max_pending: 10, ..limits() });
        let all: Vec<FutureId> = (0..5).map(|_| ids.future_id()).collect();
        let mut dropped = Vec::new();
        for (n, id) in all.iter().enumerate() {
            table.submit(*id, AdapterKey::Base, None);
            dropped.extend(table.settle(*id, finished("r"), Instant::now() + Duration::from_secs(n as u64)));
        }
        assert_eq!(dropped, all[..2], "the dropped ones are answered (their records go)");
        assert_eq!(table.retained(), 3);
        let kept: Vec<bool> = all.iter().map(|id| table.watch(*id).is_some()).collect();
        assert_eq!(kept, [false, false, true, true, true]);
    }

    #[test]
    fn restored_futures_count_like_others_and_a_withdrawn_one_leaves_nothing() {
        let ids = IdMaker::new(Epoch::random());
        let mut table = FutureTable::new(limits());
        let now = Instant::now();
        let pending = ids.future_id();
        let dedup = DedupKey { sampling_session_id: "ss".into(), seq_id: 1 };
        let restored =
            Restored { id: pending, subject: AdapterKey::Base.into(), dedup: Some(dedup.clone()), settled: None };
        assert_eq!(table.restore(restored), Vec::<FutureId>::new());
        assert_eq!(table.submit(ids.future_id(), AdapterKey::Base, Some(dedup)), Submitted::Existing(pending));
        let results: Vec<FutureId> = (0..4).map(|_| ids.future_id()).collect();
        let mut dropped = Vec::new();
        for (n, id) in results.iter().enumerate() {
            let answer = FutureState::Finished(Bytes::from_static(b"r"));
            let settled = Some((answer, now + Duration::from_secs(n as u64)));
            dropped.extend(table.restore(Restored { id: *id, subject: AdapterKey::Base.into(), dedup: None, settled }));
        }
        assert_eq!(dropped, [results[0]], "past max_results the oldest goes");
        assert_eq!((table.pending(), table.retained()), (1, 3));
        assert!(table.settled_record(pending, SystemTime::now()).is_none(), "a pending future has no settled record");
        assert_eq!(table.settle(pending, finished("done"), now), [results[1]]);
        assert!(table.settled_record(pending, SystemTime::now()).is_some());

        let fresh = ids.future_id();
        assert_eq!(table.submit(fresh, AdapterKey::Base, None), Submitted::New);
        table.withdraw(fresh);
        assert!(table.watch(fresh).is_none());
        assert_eq!(table.pending(), 0);
    }

    #[test]
    fn finished_sessions_are_remembered_for_their_lifetime() {
        let mut table = FutureTable::new(limits());
        let start = Instant::now();
        assert!(!table.session_finished("s"));
        table.finish_session("s".into(), start);
        table.sweep(start + Duration::from_secs(3599));
        assert!(table.session_finished("s"));
        table.sweep(start + Duration::from_secs(3600));
        assert!(!table.session_finished("s"));
    }
}
