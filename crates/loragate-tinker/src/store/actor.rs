//! The store's actor: the single writer of the [`FutureTable`], and of the futures' records in the state store. Every
//! handler is a few map operations and at most one queued record (`StateStore::record` never blocks); waits happen on
//! the futures' `watch` channels and on the records' futures outside it, and a timer message sweeps expired results.
//! Records are queued in the order the table changes, so the store never holds a pending record over its result.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use loragate_core::state::{Recording, StateChange, StateStore};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::record::{SampleRecord, removed};
use super::table::{FutureTable, Restored, Submitted};
use super::{DedupKey, FutureSubject, FutureWatch, RetentionLimits, Settled};
use crate::ids::FutureId;

/// The commands the store serves. Only [`super::FutureStore`] and [`super::PendingFuture`] build them.
pub(crate) enum StoreMsg {
    /// Records a pending future unless it is a resubmission or the table is full; a new one comes with its record's
    /// [`Recording`].
    Submit {
        id: FutureId,
        subject: FutureSubject,
        dedup: Option<DedupKey>,
        record: Arc<SampleRecord>,
        reply: RpcReplyPort<(Submitted, Option<Recording>)>,
    },
    /// A pending future's record, rewritten with what its sample produced so far (ignored once it settled).
    Progress { id: FutureId, change: StateChange },
    /// A pending future whose record failed: it goes.
    Withdraw { id: FutureId },
    /// A pending future's outcome.
    Settle { id: FutureId, outcome: Settled },
    /// A future's state channel.
    Watch { id: FutureId, reply: RpcReplyPort<Option<FutureWatch>> },
    /// A future's final answer was sent.
    Delivered { id: FutureId },
    /// A session was finished.
    FinishSession { session_id: String },
    /// Whether a session was finished.
    SessionFinished { session_id: String, reply: RpcReplyPort<bool> },
    /// Pending futures and retained results.
    #[cfg(test)]
    Counts { reply: RpcReplyPort<(usize, usize)> },
    /// Drops expired results (sent by the actor's own timer).
    Sweep,
}

/// The actor's behaviour.
pub(crate) struct StoreActor;

/// What the actor starts from.
pub(crate) struct StoreArgs {
    pub(crate) limits: RetentionLimits,
    pub(crate) sweep_every: Duration,
    pub(crate) state: Arc<dyn StateStore>,
    pub(crate) restored: Vec<Restored>,
}

/// The actor's state: the table, where its records go, and the timer that sweeps it.
pub(crate) struct StoreState {
    table: FutureTable,
    records: Arc<dyn StateStore>,
    sweeper: JoinHandle<()>,
}

impl StoreState {
    /// Queues the removal of dropped results' records (nothing awaits it: a failure is logged).
    fn forget(&self, dropped: Vec<FutureId>) {
        if !dropped.is_empty() {
            self.queue(dropped.into_iter().map(removed).collect());
        }
    }

    /// Queues changes whose outcome nobody waits for; a failure is logged.
    fn queue(&self, changes: Vec<StateChange>) {
        let recording = self.records.record(changes);
        tokio::spawn(async move {
            if let Err(err) = recording.await {
                tracing::warn!(%err, "could not record a Tinker future's change; a restart may not see it");
            }
        });
    }
}

impl Actor for StoreActor {
    type Msg = StoreMsg;
    type State = StoreState;
    type Arguments = StoreArgs;

    async fn pre_start(&self, myself: ActorRef<StoreMsg>, args: StoreArgs) -> Result<StoreState, ActorProcessingErr> {
        let sweeper = myself.send_interval(args.sweep_every, || StoreMsg::Sweep);
        let mut table = FutureTable::new(args.limits);
        let dropped: Vec<FutureId> = args.restored.into_iter().flat_map(|restored| table.restore(restored)).collect();
        let state = StoreState { table, records: args.state, sweeper };
        state.forget(dropped);
        Ok(state)
    }

    async fn post_stop(&self, _myself: ActorRef<StoreMsg>, state: &mut StoreState) -> Result<(), ActorProcessingErr> {
        state.sweeper.abort();
        Ok(())
    }

    async fn handle(
        &self,
        _myself: ActorRef<StoreMsg>,
        message: StoreMsg,
        state: &mut StoreState,
    ) -> Result<(), ActorProcessingErr> {
        let table = &mut state.table;
        match message {
            StoreMsg::Submit { id, subject, dedup, record, reply } => {
                let submitted = table.submit(id, subject, dedup);
                let recording = (submitted == Submitted::New).then(|| state.records.record(vec![record.put(id)]));
                let _ = reply.send((submitted, recording));
            }
            StoreMsg::Progress { id, change } => {
                // A settled future's result was queued already: a late progress record must not replace it.
                if table.is_pending(id) {
                    state.queue(vec![change]);
                }
            }
            StoreMsg::Withdraw { id } => {
                table.withdraw(id);
                state.forget(vec![id]);
            }
            StoreMsg::Settle { id, outcome } => {
                let dropped = table.settle(id, outcome, Instant::now());
                // The result replaces the pending record, in the same change as the results it pushed out.
                let mut changes: Vec<StateChange> =
                    table.settled_record(id, SystemTime::now()).map(|record| record.put(id)).into_iter().collect();
                changes.extend(dropped.into_iter().map(removed));
                if !changes.is_empty() {
                    state.queue(changes);
                }
            }
            StoreMsg::Watch { id, reply } => {
                let _ = reply.send(table.watch(id));
            }
            StoreMsg::Delivered { id } => table.delivered(id, Instant::now()),
            StoreMsg::FinishSession { session_id } => table.finish_session(session_id, Instant::now()),
            StoreMsg::SessionFinished { session_id, reply } => {
                let _ = reply.send(table.session_finished(&session_id));
            }
            #[cfg(test)]
            StoreMsg::Counts { reply } => {
                let _ = reply.send((table.pending(), table.retained()));
            }
            StoreMsg::Sweep => {
                let dropped = table.sweep(Instant::now());
                state.forget(dropped);
            }
        }
        Ok(())
    }
}
