//! When a running sample records what it has produced, so that a restart continues from there instead of from its
//! prompt: once [`RECORD_EVERY_TOKENS`] new tokens came since the last record, or [`RECORD_EVERY`] after it if some
//! did (also when nothing more comes, as at a paused adapter). A record is a write of the future's pending record through the state store's
//! ordinary queue (group-committed with whatever else is queued; with etcd, one put): the sample never waits for it.
//! Nothing is recorded once every sequence is done (the result's record follows at once).
//!
//! What a kill leaves: the tokens up to the last committed record are kept; those produced after it are produced
//! again by the continuation (a greedy sample produces the same ones).

use std::time::Duration;

use tokio::time::Instant;

use super::collector::Collector;
use crate::store::PendingFuture;

/// The most new tokens (all sequences together) between two records of a sample's progress.
pub(crate) const RECORD_EVERY_TOKENS: usize = 128;
/// The longest time between two records of a sample's progress while it produces tokens.
pub(crate) const RECORD_EVERY: Duration = Duration::from_millis(500);

/// A sample's progress records: how many tokens the last one held, and when it was written.
pub(super) struct Progress<'a> {
    future: &'a PendingFuture,
    recorded_tokens: usize,
    recorded_at: Instant,
}

impl<'a> Progress<'a> {
    /// Progress of `future`'s sample, whose record holds `recorded_tokens` tokens now.
    pub(super) fn new(future: &'a PendingFuture, recorded_tokens: usize) -> Self {
        Self { future, recorded_tokens, recorded_at: Instant::now() }
    }

    /// Records `collector`'s progress if it is due.
    pub(super) fn after_event(&mut self, collector: &Collector) {
        let new = collector.token_count().saturating_sub(self.recorded_tokens);
        if new >= RECORD_EVERY_TOKENS || self.due_at(collector).is_some_and(|due| due <= Instant::now()) {
            self.record(collector);
        }
    }

    /// When `collector`'s progress is due at the latest, if it holds tokens not recorded yet.
    pub(super) fn due_at(&self, collector: &Collector) -> Option<Instant> {
        (collector.token_count() > self.recorded_tokens).then_some(self.recorded_at + RECORD_EVERY)
    }

    /// Records `collector`'s progress now.
    pub(super) fn record(&mut self, collector: &Collector) {
        self.future.record_progress(collector.produced());
        self.recorded_tokens = collector.token_count();
        self.recorded_at = Instant::now();
    }
}
