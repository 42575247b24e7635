//! The worker's state actor: the single writer of the LoRA table, the running-request registry and the pause.
//! Every handler is short: engine loads and unloads run on tasks (one at a time) that report back, waits happen on
//! `watch`es outside, and per-request failures travel on reply ports.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

use loragate_core::{AdapterName, AdapterSource, AdapterVersion, Engine, EngineError};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{LoraRecord, Registration};
use crate::error::WorkerError;

/// The commands the actor serves. Only [`super::WorkerHandle`] and [`Registration`] build them.
pub(crate) enum WorkerMsg {
    /// Registers a request unless generation is paused or its adapter is unknown.
    Admit { request_id: String, lora_name: Option<String>, reply: RpcReplyPort<AdmitReply> },
    /// A registration was dropped.
    Deregister { ticket: u64 },
    /// Cancels the running requests with these ids; answers how many were running.
    Abort { request_ids: Vec<String>, reply: RpcReplyPort<usize> },
    /// Pauses generation (cancelling every running request first if `abort_running`).
    Pause { abort_running: bool, reply: RpcReplyPort<()> },
    /// Resumes generation; answers whether it was paused.
    Resume { reply: RpcReplyPort<bool> },
    /// Queues a LoRA load.
    Load {
        name: AdapterName,
        source: AdapterSource,
        source_path: String,
        reply: RpcReplyPort<Result<LoraRecord, WorkerError>>,
    },
    /// Queues a LoRA unload.
    Unload { lora_name: String, reply: RpcReplyPort<Result<LoraRecord, WorkerError>> },
    /// A load or unload task finished.
    UpdateFinished { outcome: UpdateOutcome, reply: RpcReplyPort<Result<LoraRecord, WorkerError>> },
    /// The loaded adapters, sorted by name.
    List { reply: RpcReplyPort<Vec<LoraRecord>> },
}

/// The answer to [`WorkerMsg::Admit`].
pub(crate) enum AdmitReply {
    /// Registered.
    Admitted(Registration),
    /// Generation is paused: wait for it to resume and ask again.
    Paused,
    /// Refused (unknown adapter, duplicate request id).
    Refused(WorkerError),
}

/// What a finished load or unload task did.
pub(crate) enum UpdateOutcome {
    /// A load: install `record` if the engine succeeded.
    Loaded { record: LoraRecord, result: Result<(), EngineError> },
    /// An unload (the record already left the table).
    Unloaded { record: LoraRecord, result: Result<(), EngineError> },
}

/// The actor's behaviour (its state is [`WorkerActorState`]).
pub(crate) struct WorkerActor;

/// What the actor starts from.
pub(crate) struct WorkerArgs {
    pub(crate) engine: Arc<dyn Engine>,
    pub(crate) paused: watch::Sender<bool>,
    pub(crate) running: watch::Sender<usize>,
}

/// One queued LoRA update.
enum Update {
    Load { name: AdapterName, source: AdapterSource, source_path: String },
    Unload { lora_name: String },
}

struct Running {
    request_id: String,
    cancel: CancellationToken,
}

/// The actor's state.
pub(crate) struct WorkerActorState {
    engine: Arc<dyn Engine>,
    loras: BTreeMap<String, LoraRecord>,
    next_lora_id: i64,
    updating: bool,
    queued: VecDeque<(Update, RpcReplyPort<Result<LoraRecord, WorkerError>>)>,
    next_ticket: u64,
    running: HashMap<u64, Running>,
    tickets_by_id: HashMap<String, u64>,
    running_count: watch::Sender<usize>,
    paused: watch::Sender<bool>,
}

impl Actor for WorkerActor {
    type Msg = WorkerMsg;
    type State = WorkerActorState;
    type Arguments = WorkerArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<WorkerMsg>,
        args: WorkerArgs,
    ) -> Result<WorkerActorState, ActorProcessingErr> {
        Ok(WorkerActorState {
            engine: args.engine,
            loras: BTreeMap::new(),
            next_lora_id: 1,
            updating: false,
            queued: VecDeque::new(),
            next_ticket: 0,
            running: HashMap::new(),
            tickets_by_id: HashMap::new(),
            running_count: args.running,
            paused: args.paused,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<WorkerMsg>,
        message: WorkerMsg,
        state: &mut WorkerActorState,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            WorkerMsg::Admit { request_id, lora_name, reply } => {
                let answer = state.admit(&myself, request_id, lora_name);
                // A caller that left drops the registration here, which deregisters it again.
                let _ = reply.send(answer);
            }
            WorkerMsg::Deregister { ticket } => state.deregister(ticket),
            WorkerMsg::Abort { request_ids, reply } => {
                let mut found = 0;
                for request_id in &request_ids {
                    if let Some(running) = state.tickets_by_id.get(request_id).and_then(|t| state.running.get(t)) {
                        running.cancel.cancel();
                        found += 1;
                    }
                }
                let _ = reply.send(found);
            }
            WorkerMsg::Pause { abort_running, reply } => {
                state.paused.send_replace(true);
                if abort_running {
                    for running in state.running.values() {
                        running.cancel.cancel();
                    }
                }
                let _ = reply.send(());
            }
            WorkerMsg::Resume { reply } => {
                let _ = reply.send(state.paused.send_replace(false));
            }
            WorkerMsg::Load { name, source, source_path, reply } => {
                state.queued.push_back((Update::Load { name, source, source_path }, reply));
                state.start_next_update(&myself);
            }
            WorkerMsg::Unload { lora_name, reply } => {
                state.queued.push_back((Update::Unload { lora_name }, reply));
                state.start_next_update(&myself);
            }
            WorkerMsg::UpdateFinished { outcome, reply } => {
                state.updating = false;
                let answer = match outcome {
                    UpdateOutcome::Loaded { record, result } => result.map(|()| {
                        tracing::info!(lora = %record.lora_name, id = record.lora_id, "LoRA adapter loaded");
                        state.loras.insert(record.lora_name.clone(), record.clone());
                        record
                    }),
                    UpdateOutcome::Unloaded { record, result } => result.map(|()| {
                        tracing::info!(lora = %record.lora_name, id = record.lora_id, "LoRA adapter unloaded");
                        record
                    }),
                };
                let _ = reply.send(answer.map_err(WorkerError::from));
                state.start_next_update(&myself);
            }
            WorkerMsg::List { reply } => {
                let _ = reply.send(state.loras.values().cloned().collect());
            }
        }
        Ok(())
    }
}

impl WorkerActorState {
    fn admit(&mut self, myself: &ActorRef<WorkerMsg>, request_id: String, lora_name: Option<String>) -> AdmitReply {
        if let Some(lora_name) = lora_name
            && !self.loras.contains_key(&lora_name)
        {
            return AdmitReply::Refused(WorkerError::LoraNotLoaded(lora_name));
        }
        if self.tickets_by_id.contains_key(&request_id) {
            return AdmitReply::Refused(WorkerError::RequestIdInUse(request_id));
        }
        if *self.paused.borrow() {
            return AdmitReply::Paused;
        }
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        let cancel = CancellationToken::new();
        self.tickets_by_id.insert(request_id.clone(), ticket);
        self.running.insert(ticket, Running { request_id, cancel: cancel.clone() });
        self.running_count.send_replace(self.running.len());
        AdmitReply::Admitted(Registration { ticket, cancel, actor: myself.clone() })
    }

    fn deregister(&mut self, ticket: u64) {
        if let Some(running) = self.running.remove(&ticket) {
            self.tickets_by_id.remove(&running.request_id);
            self.running_count.send_replace(self.running.len());
        }
    }

    /// Starts the oldest queued update unless one runs. The engine work runs on a task that reports back.
    fn start_next_update(&mut self, myself: &ActorRef<WorkerMsg>) {
        while !self.updating {
            let Some((update, reply)) = self.queued.pop_front() else {
                return;
            };
            let engine = self.engine.clone();
            let actor = myself.clone();
            match update {
                Update::Load { name, source, source_path } => {
                    if self.loras.contains_key(name.as_str()) {
                        let _ = reply.send(Err(WorkerError::LoraAlreadyLoaded(name.to_string())));
                        continue;
                    }
                    let lora_id = self.next_lora_id;
                    self.next_lora_id += 1;
                    self.updating = true;
                    let record = LoraRecord { lora_id, lora_name: name.to_string(), source_path };
                    let version = AdapterVersion(lora_id.unsigned_abs());
                    tokio::spawn(async move {
                        let result = engine.load_adapter(&name, version, &source).await;
                        report(&actor, UpdateOutcome::Loaded { record, result }, reply);
                    });
                }
                Update::Unload { lora_name } => {
                    let Some(record) = self.loras.remove(&lora_name) else {
                        let _ = reply.send(Err(WorkerError::LoraNotLoaded(lora_name)));
                        continue;
                    };
                    let name = match AdapterName::parse(&lora_name) {
                        Ok(name) => name,
                        Err(err) => {
                            let _ = reply.send(Err(WorkerError::from_core(err)));
                            continue;
                        }
                    };
                    self.updating = true;
                    let version = AdapterVersion(record.lora_id.unsigned_abs());
                    tokio::spawn(async move {
                        let result = engine.unload_adapter(&name, version).await;
                        report(&actor, UpdateOutcome::Unloaded { record, result }, reply);
                    });
                }
            }
        }
    }
}

/// Sends a finished update back to the actor; if it is gone, answers the caller directly.
fn report(actor: &ActorRef<WorkerMsg>, outcome: UpdateOutcome, reply: RpcReplyPort<Result<LoraRecord, WorkerError>>) {
    if let Err(ractor::MessagingErr::SendErr(WorkerMsg::UpdateFinished { reply, .. })) =
        actor.cast(WorkerMsg::UpdateFinished { outcome, reply })
    {
        let _ = reply.send(Err(WorkerError::ShuttingDown));
    }
}
