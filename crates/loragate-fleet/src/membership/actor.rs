//! The membership actor: the single writer of the workers, their states and adapters, the epoch and the fleet's
//! adapter set. Handlers are short: health checks, catch-ups, top-ups, unloads and drain waits run on tasks that
//! report back with messages, tagged with the worker's incarnation so that reports about an earlier membership of
//! the same address are ignored.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use futures::future::join_all;
use loragate_core::WorkerState;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::catch_up::catch_up;
use super::probation::{FailureRecord, Verdict};
use super::{MembershipSettings, Roster, StageTarget, WorkerView};
use crate::address::{WorkerAddress, WorkerIdentity};
use crate::delivery::Delivery;
use crate::error::FleetError;
use crate::link::WorkerLink;
use crate::metrics::FleetMetrics;

/// The commands the actor serves. Only [`super::Membership`] and the actor's own tasks build them.
pub(crate) enum MembershipMsg {
    Add {
        identity: WorkerIdentity,
        reply: RpcReplyPort<Result<(), FleetError>>,
    },
    Remove {
        identity: WorkerIdentity,
        drain: bool,
        reply: RpcReplyPort<Result<(), FleetError>>,
    },
    /// A draining worker has no sequence in flight any more.
    Drained {
        address: WorkerAddress,
        incarnation: u64,
    },
    /// A health-check round.
    Tick,
    CheckNow {
        address: WorkerAddress,
        incarnation: u64,
    },
    Checked {
        address: WorkerAddress,
        incarnation: u64,
        outcome: Result<(), String>,
    },
    Resync {
        address: WorkerAddress,
        incarnation: u64,
    },
    Misbehaved {
        address: WorkerAddress,
        incarnation: u64,
        why: String,
    },
    CaughtUp {
        address: WorkerAddress,
        incarnation: u64,
        generation: u64,
        outcome: Result<BTreeSet<String>, String>,
    },
    AdapterChanged {
        address: WorkerAddress,
        incarnation: u64,
        engine_name: String,
        loaded: bool,
    },
    StageTargets {
        reply: RpcReplyPort<Vec<StageTarget>>,
    },
    Install {
        engine_name: String,
        delivery: Delivery,
        reply: RpcReplyPort<()>,
    },
    Retire {
        engine_name: String,
        reply: Option<RpcReplyPort<()>>,
    },
}

/// The actor's behaviour.
pub(crate) struct MembershipActor;

/// What the actor starts from.
pub(crate) struct MembershipArgs {
    pub(crate) workers: Vec<WorkerIdentity>,
    pub(crate) settings: MembershipSettings,
    pub(crate) metrics: FleetMetrics,
    pub(crate) roster: watch::Sender<Arc<Roster>>,
}

struct Member {
    identity: WorkerIdentity,
    link: Arc<WorkerLink>,
    incarnation: u64,
    state: WorkerState,
    adapters: BTreeSet<String>,
    last_error: String,
    failures: FailureRecord,
    session: CancellationToken,
    checking: bool,
    catching_up: bool,
    drain_waiters: Vec<RpcReplyPort<Result<(), FleetError>>>,
}

/// The actor's state.
pub(crate) struct MembershipState {
    settings: MembershipSettings,
    metrics: FleetMetrics,
    members: Vec<Member>,
    epoch: u64,
    next_incarnation: u64,
    /// The adapter set every worker must hold: engine-side name → source path as the workers see it.
    desired: BTreeMap<String, Delivery>,
    /// Grows whenever `desired` changes, so a catch-up that started before knows it must run again.
    generation: u64,
    roster: watch::Sender<Arc<Roster>>,
    ticker: Option<JoinHandle<()>>,
}

impl Actor for MembershipActor {
    type Msg = MembershipMsg;
    type State = MembershipState;
    type Arguments = MembershipArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<MembershipMsg>,
        args: MembershipArgs,
    ) -> Result<MembershipState, ActorProcessingErr> {
        let mut state = MembershipState {
            settings: args.settings,
            metrics: args.metrics,
            members: Vec::new(),
            epoch: 0,
            next_incarnation: 0,
            desired: BTreeMap::new(),
            generation: 0,
            roster: args.roster,
            ticker: None,
        };
        for identity in args.workers {
            state.add(&myself, identity)?;
        }
        state.ticker = Some(myself.send_interval(state.settings.failures.interval, || MembershipMsg::Tick));
        state.publish();
        Ok(state)
    }

    async fn handle(
        &self,
        myself: ActorRef<MembershipMsg>,
        message: MembershipMsg,
        state: &mut MembershipState,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            MembershipMsg::Add { identity, reply } => {
                let added = state.add(&myself, identity);
                // Published before the answer: a caller that lists the workers next sees this one.
                state.publish();
                let _ = reply.send(added);
            }
            MembershipMsg::Remove { identity, drain, reply } => state.remove(&myself, &identity, drain, reply),
            MembershipMsg::Drained { address, incarnation } => state.drained(&address, incarnation),
            MembershipMsg::Tick => {
                state.check_due(&myself);
                return Ok(());
            }
            MembershipMsg::CheckNow { address, incarnation } => {
                if let Some(index) = state.find(&address, incarnation) {
                    state.check(&myself, index);
                }
                return Ok(());
            }
            MembershipMsg::Checked { address, incarnation, outcome } => {
                let Some(index) = state.find(&address, incarnation) else { return Ok(()) };
                state.members[index].checking = false;
                match outcome {
                    Ok(()) => state.healthy(&myself, index),
                    Err(why) => {
                        state.members[index].link.counters().record_health_check_failure();
                        state.failed(index, why);
                    }
                }
            }
            MembershipMsg::Misbehaved { address, incarnation, why } => {
                if let Some(index) = state.find(&address, incarnation) {
                    state.failed(index, why);
                }
            }
            MembershipMsg::Resync { address, incarnation } => {
                if let Some(index) = state.find(&address, incarnation)
                    && state.members[index].state == WorkerState::Ready
                {
                    tracing::warn!(worker = %address, "worker lacks an adapter it should hold; catching it up again");
                    state.set_state(index, WorkerState::Joining);
                    state.catch_up(&myself, index);
                }
            }
            MembershipMsg::CaughtUp { address, incarnation, generation, outcome } => {
                let Some(index) = state.find(&address, incarnation) else { return Ok(()) };
                state.caught_up(&myself, index, generation, outcome);
            }
            MembershipMsg::AdapterChanged { address, incarnation, engine_name, loaded } => {
                let Some(index) = state.find(&address, incarnation) else { return Ok(()) };
                let adapters = &mut state.members[index].adapters;
                if loaded {
                    adapters.insert(engine_name);
                } else {
                    adapters.remove(&engine_name);
                }
            }
            MembershipMsg::StageTargets { reply } => {
                let targets = state
                    .members
                    .iter()
                    .filter(|member| member.state == WorkerState::Ready)
                    .map(|member| StageTarget { link: member.link.clone(), incarnation: member.incarnation })
                    .collect();
                let _ = reply.send(targets);
                return Ok(());
            }
            MembershipMsg::Install { engine_name, delivery, reply } => {
                state.desired.insert(engine_name.clone(), delivery.clone());
                state.generation += 1;
                state.top_up(&myself, &engine_name, &delivery);
                let _ = reply.send(());
            }
            MembershipMsg::Retire { engine_name, reply } => state.retire(&myself, engine_name, reply),
        }
        state.publish();
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<MembershipMsg>,
        state: &mut MembershipState,
    ) -> Result<(), ActorProcessingErr> {
        if let Some(ticker) = state.ticker.take() {
            ticker.abort();
        }
        for member in state.members.drain(..) {
            member.session.cancel();
            for waiter in member.drain_waiters {
                let _ = waiter.send(Err(FleetError::Stopped));
            }
        }
        Ok(())
    }
}

impl MembershipState {
    /// Removes a draining worker whose last request ended, and answers those waiting for its removal.
    fn drained(&mut self, address: &WorkerAddress, incarnation: u64) {
        if let Some(index) = self.find(address, incarnation)
            && self.members[index].state == WorkerState::Draining
        {
            let member = self.members.remove(index);
            member.session.cancel();
            self.metrics.forget(address);
            self.epoch += 1;
            tracing::info!(worker = %address, "drained worker removed from the fleet");
            self.publish();
            for waiter in member.drain_waiters {
                let _ = waiter.send(Ok(()));
            }
        }
    }

    /// Starts the health checks that are due (a health-check round).
    fn check_due(&mut self, myself: &ActorRef<MembershipMsg>) {
        let now = Instant::now();
        for index in 0..self.members.len() {
            if self.members[index].failures.due(now) {
                self.check(myself, index);
            }
        }
    }

    fn find(&self, address: &WorkerAddress, incarnation: u64) -> Option<usize> {
        self.members.iter().position(|member| member.link.address() == address && member.incarnation == incarnation)
    }

    fn publish(&self) {
        let workers = self
            .members
            .iter()
            .map(|member| WorkerView {
                link: member.link.clone(),
                incarnation: member.incarnation,
                state: member.state,
                adapters: member.adapters.clone(),
                last_error: member.last_error.clone(),
                failures: member.failures.clone(),
                session: member.session.clone(),
            })
            .collect();
        self.roster.send_replace(Arc::new(Roster { epoch: self.epoch, workers }));
    }

    fn add(&mut self, myself: &ActorRef<MembershipMsg>, identity: WorkerIdentity) -> Result<(), FleetError> {
        let address = identity.address.clone();
        if let Some(existing) = self.members.iter().find(|member| member.identity.same_worker(&identity)) {
            return Err(FleetError::WorkerExists { address, as_: existing.identity.address.clone() });
        }
        if self.members.len() >= self.settings.max_workers {
            return Err(FleetError::TooManyWorkers { max: self.settings.max_workers });
        }
        let link = WorkerLink::new(address.clone(), self.settings.worker_key.clone(), &self.metrics)
            .map_err(|err| FleetError::InvalidAddress { address: address.to_string(), reason: err.to_string() })?;
        self.next_incarnation += 1;
        self.members.push(Member {
            identity,
            link,
            incarnation: self.next_incarnation,
            state: WorkerState::Joining,
            adapters: BTreeSet::new(),
            last_error: String::new(),
            failures: FailureRecord::default(),
            session: CancellationToken::new(),
            checking: false,
            catching_up: false,
            drain_waiters: Vec::new(),
        });
        self.epoch += 1;
        tracing::info!(worker = %address, "worker joining the fleet");
        self.check(myself, self.members.len() - 1);
        Ok(())
    }

    fn remove(
        &mut self,
        myself: &ActorRef<MembershipMsg>,
        identity: &WorkerIdentity,
        drain: bool,
        reply: RpcReplyPort<Result<(), FleetError>>,
    ) {
        let Some(index) = self.members.iter().position(|member| member.identity.same_worker(identity)) else {
            let _ = reply.send(Err(FleetError::UnknownWorker(identity.address.to_string())));
            return;
        };
        let address = self.members[index].link.address().clone();
        if !drain {
            let member = self.members.remove(index);
            // Its running sequences end now, with the tokens they produced.
            member.session.cancel();
            self.metrics.forget(&address);
            self.epoch += 1;
            tracing::info!(worker = %address, "worker removed from the fleet");
            self.publish();
            for waiter in member.drain_waiters {
                let _ = waiter.send(Ok(()));
            }
            let _ = reply.send(Ok(()));
            return;
        }
        let member = &mut self.members[index];
        member.drain_waiters.push(reply);
        if member.state == WorkerState::Draining {
            return;
        }
        let (link, incarnation, myself) = (member.link.clone(), member.incarnation, myself.clone());
        self.set_state(index, WorkerState::Draining);
        tracing::info!(worker = %address, in_flight = link.in_flight(), "draining worker");
        tokio::spawn(async move {
            link.idle().await;
            let _ = myself.cast(MembershipMsg::Drained { address: link.address().clone(), incarnation });
        });
    }

    fn set_state(&mut self, index: usize, state: WorkerState) {
        let member = &mut self.members[index];
        if member.state != state {
            tracing::info!(worker = %member.link.address(), from = member.state.as_str(), to = state.as_str(), "worker state");
            member.state = state;
            self.epoch += 1;
        }
    }

    /// Starts a health check of member `index` unless one runs.
    fn check(&mut self, myself: &ActorRef<MembershipMsg>, index: usize) {
        let member = &mut self.members[index];
        if member.checking {
            return;
        }
        member.checking = true;
        let (link, incarnation, myself) = (member.link.clone(), member.incarnation, myself.clone());
        let timeout = self.settings.health_timeout;
        tokio::spawn(async move {
            let outcome = link.client().check_health(timeout).await.map_err(|err| format!("health check: {err}"));
            let _ = myself.cast(MembershipMsg::Checked { address: link.address().clone(), incarnation, outcome });
        });
    }

    fn healthy(&mut self, myself: &ActorRef<MembershipMsg>, index: usize) {
        let policy = self.settings.failures;
        match self.members[index].state {
            WorkerState::Joining => self.catch_up(myself, index),
            WorkerState::Unhealthy => match self.members[index].failures.idle_check_passed(&policy) {
                Verdict::Rejoin => {
                    self.members[index].session = CancellationToken::new();
                    self.set_state(index, WorkerState::Joining);
                    self.catch_up(myself, index);
                }
                Verdict::Probation => {
                    tracing::debug!(worker = %self.members[index].link.address(), "healthy again, on probation");
                }
            },
            WorkerState::Ready | WorkerState::Draining => self.members[index].failures.serving_check_passed(&policy),
        }
    }

    /// The worker failed (a health check or a catch-up): counted, and out of traffic at once.
    fn failed(&mut self, index: usize, why: String) {
        self.members[index].failures.failed(&self.settings.failures, Instant::now());
        self.lost(index, why);
    }

    /// The worker failed: it gets no traffic, and its running sequences end now with their tokens.
    fn lost(&mut self, index: usize, why: String) {
        let member = &mut self.members[index];
        if member.state != WorkerState::Unhealthy {
            tracing::warn!(worker = %member.link.address(), %why, "worker lost");
        }
        member.session.cancel();
        member.last_error = why;
        if member.state != WorkerState::Draining {
            self.set_state(index, WorkerState::Unhealthy);
        }
    }

    /// Starts bringing member `index` to the fleet's adapter set unless that runs already.
    fn catch_up(&mut self, myself: &ActorRef<MembershipMsg>, index: usize) {
        let member = &mut self.members[index];
        if member.catching_up {
            return;
        }
        member.catching_up = true;
        let (link, incarnation, myself) = (member.link.clone(), member.incarnation, myself.clone());
        let (desired, generation, settings) = (self.desired.clone(), self.generation, self.settings.clone());
        tokio::spawn(async move {
            let outcome = catch_up(&link, &desired, &settings).await;
            let address = link.address().clone();
            let _ = myself.cast(MembershipMsg::CaughtUp { address, incarnation, generation, outcome });
        });
    }

    fn caught_up(
        &mut self,
        myself: &ActorRef<MembershipMsg>,
        index: usize,
        generation: u64,
        outcome: Result<BTreeSet<String>, String>,
    ) {
        self.members[index].catching_up = false;
        if self.members[index].state != WorkerState::Joining {
            return;
        }
        match outcome {
            Ok(adapters) => {
                self.members[index].adapters = adapters;
                if generation == self.generation {
                    self.set_state(index, WorkerState::Ready);
                } else {
                    // The fleet's adapter set changed meanwhile: catch up with the new one.
                    self.catch_up(myself, index);
                }
            }
            Err(why) => self.failed(index, format!("catching up: {why}")),
        }
    }

    /// Loads `engine_name` on READY workers that lack it (they became ready while it was being staged).
    fn top_up(&mut self, myself: &ActorRef<MembershipMsg>, engine_name: &str, delivery: &Delivery) {
        let timeout = self.settings.adapter_timeout;
        for member in &self.members {
            if member.state != WorkerState::Ready || member.adapters.contains(engine_name) {
                continue;
            }
            let (link, incarnation, myself) = (member.link.clone(), member.incarnation, myself.clone());
            let (engine_name, delivery) = (engine_name.to_owned(), delivery.clone());
            tokio::spawn(async move {
                let address = link.address().clone();
                match link.replace_adapter(&engine_name, &delivery, timeout).await {
                    Ok(()) => {
                        let _ = myself.cast(MembershipMsg::AdapterChanged {
                            address,
                            incarnation,
                            engine_name,
                            loaded: true,
                        });
                    }
                    Err(err) => {
                        tracing::warn!(worker = %address, adapter = %engine_name, %err, "topping up failed; catching the worker up again");
                        let _ = myself.cast(MembershipMsg::Resync { address, incarnation });
                    }
                }
            });
        }
    }

    /// Drops `engine_name` from the fleet's set and unloads it from every reachable worker holding it (unreachable
    /// ones unload it when they catch up). Answers `reply` when done.
    fn retire(&mut self, myself: &ActorRef<MembershipMsg>, engine_name: String, reply: Option<RpcReplyPort<()>>) {
        self.desired.remove(&engine_name);
        self.generation += 1;
        let holders: Vec<(Arc<WorkerLink>, u64)> = self
            .members
            .iter()
            .filter(|member| member.state != WorkerState::Unhealthy && member.adapters.contains(&engine_name))
            .map(|member| (member.link.clone(), member.incarnation))
            .collect();
        let (timeout, myself) = (self.settings.adapter_timeout, myself.clone());
        tokio::spawn(async move {
            let unloads = holders.into_iter().map(|(link, incarnation)| {
                let engine_name = engine_name.clone();
                let myself = myself.clone();
                async move {
                    match link.unload_adapter(&engine_name, timeout).await {
                        Ok(()) => {
                            let address = link.address().clone();
                            let changed = MembershipMsg::AdapterChanged { address, incarnation, engine_name, loaded: false };
                            let _ = myself.cast(changed);
                        }
                        Err(err) => {
                            tracing::warn!(worker = %link.address(), adapter = %engine_name, %err, "unloading a retired version failed");
                        }
                    }
                }
            });
            join_all(unloads).await;
            tracing::info!(adapter = %engine_name, "retired adapter version unloaded from the fleet");
            if let Some(reply) = reply {
                let _ = reply.send(());
            }
        });
    }
}
