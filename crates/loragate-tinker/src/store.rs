//! The futures store: one actor owns every future of this process (pending or finished), the index of transport-level
//! resubmissions and the finished sessions. Callers hold the typed [`FutureStore`] handle; a sample's task holds a
//! [`PendingFuture`] guard that settles its future exactly once, and settles it as failed if the task ends without an
//! outcome (a panic), so a future is never left pending by accident.
//!
//! Long-polls never wait inside the actor: `watch` hands out the future's `watch` channel and `retrieve_future` waits
//! on it with its own hold time.
//!
//! Every future is recorded in the coordinator's state store ([`record`]), so that it survives a restart: `submit`
//! answers only once the pending future's record is durable (a sample is never accepted unrecorded), and its
//! outcome replaces the record in the same change that settles it (off the sample's path: the actor queues it and
//! pollers get the outcome at once); a result dropped from the table is removed from the store. At start,
//! [`FutureStore::start`] puts back what was recorded (see `restore.rs`).
//!
//! Retention ([`RetentionLimits`]): at most `max_pending` pending futures (past it `asample` gets 429 and the SDK
//! resubmits after a back-off); a result is kept until it was delivered plus `delivered_grace` (a lost response is
//! retrieved again), or `result_lifetime` if it is never retrieved, and at most `max_results` results are kept (oldest
//! dropped first).

mod actor;
pub(crate) mod record;
mod table;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
#[cfg(test)]
use loragate_core::Principal;
use loragate_core::state::StateStore;
use loragate_core::{AdapterKey, CoreError};
use ractor::rpc::CallResult;
use ractor::{Actor, ActorRef, RpcReplyPort, SpawnErr};
use tokio::sync::watch;

use self::actor::{StoreActor, StoreArgs, StoreMsg};
pub(crate) use self::record::{Creator, Produced, SampleRecord};
pub(crate) use self::table::{Restored, Submitted};
use crate::error::TinkerError;
use crate::ids::FutureId;

/// How long futures and results are kept, and how many.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetentionLimits {
    /// Most futures pending at once (`asample` past it: 429).
    pub max_pending: usize,
    /// Most finished results kept (past it the oldest are dropped).
    pub max_results: usize,
    /// How long a result that is never retrieved is kept.
    pub result_lifetime: Duration,
    /// How long a delivered result is kept (a response lost in transit is retrieved again).
    pub delivered_grace: Duration,
    /// How long a finished session is remembered (its heartbeats get 410).
    pub session_lifetime: Duration,
}

impl Default for RetentionLimits {
    fn default() -> Self {
        Self {
            max_pending: 4096,
            max_results: 8192,
            result_lifetime: Duration::from_secs(30 * 60),
            delivered_grace: Duration::from_secs(60),
            session_lifetime: Duration::from_secs(60 * 60),
        }
    }
}

/// What a future is now.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum FutureState {
    /// The sample is running or waiting for its adapter.
    Pending,
    /// The encoded `SampleResponse`.
    Finished(Bytes),
    /// The sample failed; the SDK raises `RequestFailedError` with the message.
    Failed(Failure),
}

impl FutureState {
    /// Whether this is an answer the SDK stops polling on.
    pub(crate) fn is_final(&self) -> bool {
        !matches!(self, Self::Pending)
    }
}

/// How a pending future ends.
#[derive(Debug)]
pub(crate) enum Settled {
    /// The encoded `SampleResponse`.
    Finished(Bytes),
    /// A failure.
    Failed(Failure),
}

/// A failed sample, as `retrieve_future` reports it: `{"error", "category"}`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Failure {
    /// What happened, for the user.
    pub(crate) message: String,
    /// Whose fault it is.
    pub(crate) category: FailureCategory,
}

impl Failure {
    /// A failure on the server's side.
    pub(crate) fn server(message: impl Into<String>) -> Self {
        Self { message: message.into(), category: FailureCategory::Server }
    }

    /// A failure caused by the user's actions (e.g. unloading the adapter).
    pub(crate) fn user(message: impl Into<String>) -> Self {
        Self { message: message.into(), category: FailureCategory::User }
    }
}

/// The SDK's `RequestErrorCategory`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FailureCategory {
    /// The user's doing.
    User,
    /// The server's doing.
    Server,
}

impl FailureCategory {
    /// The wire value.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::User => "user",
            Self::Server => "server",
        }
    }
}

/// What identifies a transport-level resubmission of one `asample`: the SDK resends the same pair.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub(crate) struct DedupKey {
    /// The sampling session.
    pub(crate) sampling_session_id: String,
    /// The SDK's per-client sequence number.
    pub(crate) seq_id: i64,
}

/// What a future samples, and who asked for it: only that caller may read it.
#[derive(Clone, Debug)]
pub(crate) struct FutureSubject {
    /// The adapter, or the base model.
    pub(crate) target: AdapterKey,
    /// The caller whose `asample` created it.
    pub(crate) creator: Creator,
}

#[cfg(test)]
impl From<AdapterKey> for FutureSubject {
    /// A future anyone may read (authentication off).
    fn from(target: AdapterKey) -> Self {
        Self { target, creator: Creator::Caller(Principal::Anyone) }
    }
}

/// A future's state channel and its subject (to report a paused adapter while it waits, and to check its reader).
#[derive(Debug)]
pub(crate) struct FutureWatch {
    /// Its state; closed if the future is dropped.
    pub(crate) state: watch::Receiver<FutureState>,
    /// What it samples and who created it.
    pub(crate) subject: FutureSubject,
}

/// What [`FutureStore::submit`] answers.
pub(crate) enum Submission {
    /// A new future: run the sample and settle it through the guard.
    New(PendingFuture),
    /// A resubmission of an earlier future: answer its id again.
    Existing(FutureId),
}

/// The typed handle on the store. Cheap to clone; the actor stops when the last clone is dropped.
#[derive(Clone)]
pub(crate) struct FutureStore {
    inner: Arc<StoreRef>,
}

struct StoreRef(ActorRef<StoreMsg>);

impl Drop for StoreRef {
    fn drop(&mut self) {
        self.0.stop(Some("the Tinker front was dropped".into()));
    }
}

impl FutureStore {
    /// Starts the store's actor, recording into `state`, with the futures `restored` from it (see `restore.rs`).
    pub(crate) async fn start(
        limits: RetentionLimits,
        sweep_every: Duration,
        state: Arc<dyn StateStore>,
        restored: Vec<Restored>,
    ) -> Result<Self, SpawnErr> {
        let args = StoreArgs { limits, sweep_every, state, restored };
        let (actor, _join) = Actor::spawn(None, StoreActor, args).await?;
        Ok(Self { inner: Arc::new(StoreRef(actor)) })
    }

    /// Records a pending future `id` for `subject` (its `request` is what a restart continues), or finds the earlier
    /// submission `dedup` names. Answers once the future's record is durable; 429 when full; the store's error (and
    /// no future) when it cannot be recorded.
    pub(crate) async fn submit(
        &self,
        id: FutureId,
        subject: FutureSubject,
        dedup: Option<DedupKey>,
        request: serde_json::Value,
    ) -> Result<Submission, TinkerError> {
        let record = Arc::new(SampleRecord::pending(&subject.target, &subject.creator, dedup.clone(), request));
        let build = |reply| StoreMsg::Submit {
            id,
            subject: subject.clone(),
            dedup: dedup.clone(),
            record: record.clone(),
            reply,
        };
        match self.call(build).await? {
            (Submitted::New, recording) => {
                if let Some(recording) = recording
                    && let Err(err) = recording.await
                {
                    let _ = self.inner.0.cast(StoreMsg::Withdraw { id });
                    return Err(TinkerError::Core(CoreError::State(err)));
                }
                Ok(Submission::New(self.pending_future(id, record)))
            }
            (Submitted::Existing(earlier), _) => Ok(Submission::Existing(earlier)),
            (Submitted::Full { pending }, _) => Err(TinkerError::TooManyPending { pending }),
        }
    }

    /// The guard of the pending future `id` whose pending record is `record`, for the task that runs (or, after a
    /// restart, continues) its sample.
    pub(crate) fn pending_future(&self, id: FutureId, record: Arc<SampleRecord>) -> PendingFuture {
        PendingFuture { id, store: self.inner.0.clone(), settled: false, record }
    }

    /// The future's state channel, or `None` if it is unknown (never issued, or expired).
    pub(crate) async fn watch(&self, id: FutureId) -> Result<Option<FutureWatch>, TinkerError> {
        self.call(|reply| StoreMsg::Watch { id, reply }).await
    }

    /// The future's final answer was sent.
    pub(crate) fn delivered(&self, id: FutureId) {
        let _ = self.inner.0.cast(StoreMsg::Delivered { id });
    }

    /// Marks a session finished.
    pub(crate) fn finish_session(&self, session_id: String) {
        let _ = self.inner.0.cast(StoreMsg::FinishSession { session_id });
    }

    /// Whether a session was finished.
    pub(crate) async fn session_finished(&self, session_id: String) -> Result<bool, TinkerError> {
        self.call(|reply| StoreMsg::SessionFinished { session_id: session_id.clone(), reply }).await
    }

    /// How many futures are pending and how many results are retained.
    #[cfg(test)]
    pub(crate) async fn counts(&self) -> Result<(usize, usize), TinkerError> {
        self.call(|reply| StoreMsg::Counts { reply }).await
    }

    async fn call<T: Send + 'static>(&self, build: impl Fn(RpcReplyPort<T>) -> StoreMsg) -> Result<T, TinkerError> {
        match self.inner.0.call(build, None).await {
            Ok(CallResult::Success(answer)) => Ok(answer),
            _ => Err(TinkerError::Stopping),
        }
    }
}

/// A pending future, held by the task that runs its sample. Settling consumes it; dropping it unsettled fails the
/// future (the task ended without an outcome).
pub(crate) struct PendingFuture {
    id: FutureId,
    store: ActorRef<StoreMsg>,
    settled: bool,
    /// Its pending record, which [`PendingFuture::record_progress`] rewrites with what the sample produced.
    record: Arc<SampleRecord>,
}

impl PendingFuture {
    /// The future's id.
    pub(crate) fn id(&self) -> FutureId {
        self.id
    }

    /// Records what the sample has produced so far in its pending record, so that a restart continues from there.
    /// The record is written here, on the sample's task; the store's actor only queues it (nobody waits for it, and
    /// it is dropped if the future settled meanwhile: the result's record replaces it).
    pub(crate) fn record_progress(&self, produced: Produced) {
        let change = self.record.with_produced(produced).put(self.id);
        let _ = self.store.cast(StoreMsg::Progress { id: self.id, change });
    }

    /// Records the outcome; pollers get it at once.
    pub(crate) fn settle(mut self, outcome: Settled) {
        self.settled = true;
        let _ = self.store.cast(StoreMsg::Settle { id: self.id, outcome });
    }

    /// Leaves the future pending because the server is stopping: its record stays pending, and the next start on the
    /// same state continues its sample.
    pub(crate) fn leave_for_restart(mut self) {
        self.settled = true;
    }
}

impl Drop for PendingFuture {
    fn drop(&mut self) {
        if !self.settled {
            let failure = Failure::server("the sample ended without a result (an internal error; see the server log)");
            let _ = self.store.cast(StoreMsg::Settle { id: self.id, outcome: Settled::Failed(failure) });
        }
    }
}
