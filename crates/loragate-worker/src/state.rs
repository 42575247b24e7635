//! The worker's mutable state (the loaded LoRA adapters, the running requests, the engine-wide pause), owned by one
//! actor behind the typed [`WorkerHandle`]: the services never build actor messages.
//!
//! Waits happen outside the actor: a request held by a pause waits on the pause `watch`, a pause waits on the
//! running-request count `watch`. Weight loads and unloads run on tasks, one at a time (vLLM serialises its LoRA
//! registry updates the same way), and report back with a message. A running request is registered through a
//! [`Registration`] guard; dropping it (stream ended, client gone) deregisters it.

mod actor;

use std::path::Path;
use std::sync::Arc;

use loragate_core::{AdapterName, AdapterRoot, AdapterSource, Engine, RequestId};
use ractor::rpc::CallResult;
use ractor::{Actor, ActorRef, RpcReplyPort, SpawnErr};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use self::actor::{AdmitReply, WorkerActor, WorkerArgs, WorkerMsg};
use crate::error::WorkerError;

/// A LoRA adapter as `ListLoras` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LoraRecord {
    /// vLLM's one-based, never reused id.
    pub(crate) lora_id: i64,
    /// The name requests use.
    pub(crate) lora_name: String,
    /// The path as the caller of `LoadLora` gave it.
    pub(crate) source_path: String,
}

/// How `PauseGeneration` treats running requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PauseMode {
    /// Abort them (they end with `ABORTED` after their tokens), then hold new ones.
    Abort,
    /// Let them finish, holding new ones.
    Wait,
}

/// The typed handle on the worker's state. Cheap to clone.
#[derive(Clone)]
pub(crate) struct WorkerHandle {
    actor: ActorRef<WorkerMsg>,
    paused: watch::Receiver<bool>,
    running: watch::Receiver<usize>,
    adapter_root: Option<AdapterRoot>,
}

impl WorkerHandle {
    /// Starts the state actor over `engine`. Loads are confined to `adapter_root`; without one they are refused.
    pub(crate) async fn start(engine: Arc<dyn Engine>, adapter_root: Option<AdapterRoot>) -> Result<Self, SpawnErr> {
        let (paused_tx, paused) = watch::channel(false);
        let (running_tx, running) = watch::channel(0);
        let args = WorkerArgs { engine, paused: paused_tx, running: running_tx };
        let (actor, _join) = Actor::spawn(None, WorkerActor, args).await?;
        Ok(Self { actor, paused, running, adapter_root })
    }

    /// Stops the actor (running requests are cancelled as their registrations go).
    pub(crate) fn stop(&self) {
        self.actor.stop(Some("worker stopped".into()));
    }

    /// Registers a request on `lora_name` (`None` for the base model). While generation is paused the caller waits
    /// (vLLM queues requests while paused); dropping the future leaves nothing behind.
    pub(crate) async fn admit(
        &self,
        request_id: &RequestId,
        lora_name: Option<&str>,
    ) -> Result<Registration, WorkerError> {
        loop {
            let reply = self
                .call(|reply| WorkerMsg::Admit {
                    request_id: request_id.as_str().to_owned(),
                    lora_name: lora_name.map(str::to_owned),
                    reply,
                })
                .await?;
            match reply {
                AdmitReply::Admitted(registration) => return Ok(registration),
                AdmitReply::Refused(err) => return Err(err),
                AdmitReply::Paused => {
                    let mut paused = self.paused.clone();
                    paused.wait_for(|paused| !paused).await.map_err(|_| WorkerError::ShuttingDown)?;
                }
            }
        }
    }

    /// Cancels the running requests with these ids (unknown ids are ignored, as vLLM does). Each ends with
    /// `ABORTED` after the tokens it produced. Returns how many were running.
    pub(crate) async fn abort(&self, request_ids: Vec<String>) -> Result<usize, WorkerError> {
        self.call(move |reply| WorkerMsg::Abort { request_ids, reply }).await
    }

    /// Pauses generation for every adapter and the base model; returns once the running requests were aborted and
    /// handed back (`Abort`) or have finished (`Wait`).
    pub(crate) async fn pause(&self, mode: PauseMode) -> Result<(), WorkerError> {
        self.call(|reply| WorkerMsg::Pause { abort_running: mode == PauseMode::Abort, reply }).await?;
        let mut running = self.running.clone();
        running.wait_for(|count| *count == 0).await.map_err(|_| WorkerError::ShuttingDown)?;
        Ok(())
    }

    /// Resumes generation; held requests start. Returns whether it was paused.
    pub(crate) async fn resume(&self) -> Result<bool, WorkerError> {
        self.call(|reply| WorkerMsg::Resume { reply }).await
    }

    /// Whether generation is paused.
    pub(crate) fn is_paused(&self) -> bool {
        *self.paused.borrow()
    }

    /// Loads the PEFT adapter at `source_path` (inside the adapter root) as `lora_name`.
    pub(crate) async fn load_lora(&self, lora_name: &str, source_path: &str) -> Result<LoraRecord, WorkerError> {
        let name = AdapterName::parse(lora_name).map_err(WorkerError::from_core)?;
        let source = self.resolve(source_path).await?;
        let source_path = source_path.to_owned();
        self.call(move |reply| WorkerMsg::Load { name, source, source_path, reply }).await?
    }

    /// Unloads `lora_name`: later requests get `NOT_FOUND`; running ones finish on their weights.
    pub(crate) async fn unload_lora(&self, lora_name: &str) -> Result<LoraRecord, WorkerError> {
        if lora_name.trim().is_empty() {
            return Err(WorkerError::invalid("lora_name", "is required"));
        }
        self.call(|reply| WorkerMsg::Unload { lora_name: lora_name.to_owned(), reply }).await?
    }

    /// The loaded adapters, sorted by name.
    pub(crate) async fn list_loras(&self) -> Result<Vec<LoraRecord>, WorkerError> {
        self.call(|reply| WorkerMsg::List { reply }).await
    }

    async fn resolve(&self, source_path: &str) -> Result<AdapterSource, WorkerError> {
        let Some(root) = &self.adapter_root else {
            return Err(WorkerError::LoraDisabled);
        };
        if Path::new(source_path).as_os_str().is_empty() {
            return Err(WorkerError::invalid("source_path", "is required"));
        }
        root.resolve(source_path).await.map_err(WorkerError::from_core)
    }

    async fn call<T, B>(&self, build: B) -> Result<T, WorkerError>
    where
        T: Send + 'static,
        B: FnOnce(RpcReplyPort<T>) -> WorkerMsg,
    {
        match self.actor.call(build, None).await {
            Ok(CallResult::Success(answer)) => Ok(answer),
            _ => Err(WorkerError::ShuttingDown),
        }
    }
}

/// A running request's place in the worker's registry: `Abort` reaches it through its token. Dropping it (the
/// response stream ended or its client left) deregisters the request and cancels the token.
#[derive(Debug)]
pub(crate) struct Registration {
    ticket: u64,
    cancel: CancellationToken,
    actor: ActorRef<WorkerMsg>,
}

impl Registration {
    /// The token `Abort` and `PauseGeneration(ABORT)` cancel; hand it to the engine.
    pub(crate) fn cancel_token(&self) -> &CancellationToken {
        &self.cancel
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.cancel.cancel();
        let _ = self.actor.cast(WorkerMsg::Deregister { ticket: self.ticket });
    }
}
