//! The store's actor: the single writer of the [`FutureTable`]. Every handler is a few map operations; waits happen on
//! the futures' `watch` channels outside it, and a timer message sweeps expired results.

use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::table::{FutureTable, Submitted};
use super::{DedupKey, FutureSubject, FutureWatch, RetentionLimits, Settled};
use crate::ids::FutureId;

/// The commands the store serves. Only [`super::FutureStore`] and [`super::PendingFuture`] build them.
pub(crate) enum StoreMsg {
    /// Records a pending future unless it is a resubmission or the table is full.
    Submit { id: FutureId, subject: FutureSubject, dedup: Option<DedupKey>, reply: RpcReplyPort<Submitted> },
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
}

/// The actor's state: the table, and the timer that sweeps it.
pub(crate) struct StoreState {
    table: FutureTable,
    sweeper: JoinHandle<()>,
}

impl Actor for StoreActor {
    type Msg = StoreMsg;
    type State = StoreState;
    type Arguments = StoreArgs;

    async fn pre_start(&self, myself: ActorRef<StoreMsg>, args: StoreArgs) -> Result<StoreState, ActorProcessingErr> {
        let sweeper = myself.send_interval(args.sweep_every, || StoreMsg::Sweep);
        Ok(StoreState { table: FutureTable::new(args.limits), sweeper })
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
            StoreMsg::Submit { id, subject, dedup, reply } => {
                let _ = reply.send(table.submit(id, subject, dedup));
            }
            StoreMsg::Settle { id, outcome } => table.settle(id, outcome, Instant::now()),
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
            StoreMsg::Sweep => table.sweep(Instant::now()),
        }
        Ok(())
    }
}
