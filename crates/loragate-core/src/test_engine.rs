//! A scripted engine for the core's tests. Each request emits `hold_after` tokens at once (fewer if its budget is
//! smaller, then it ends with `Length`); if its budget is larger it then waits until it is cancelled and ends with
//! `Abort`. Tokens are stamped with the version last loaded under the request's adapter.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use async_trait::async_trait;
use futures::StreamExt;
use parking_lot::Mutex;
use tokio::sync::{Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

use crate::adapter_source::AdapterSource;
use crate::engine::{Engine, EngineError, EngineEvent, EngineStream, ModelInfo};
use crate::ids::{AdapterKey, AdapterName, AdapterVersion};
use crate::output::FinishReason;
use crate::sampling::SampleRequest;

/// Called on every `generate` with the request and its cancellation token, before anything is emitted.
pub(crate) type GenerateHook = Box<dyn Fn(&SampleRequest, &CancellationToken) + Send + Sync>;

pub(crate) struct ScriptedEngine {
    info: ModelInfo,
    hold_after: u32,
    versions: Mutex<HashMap<AdapterName, AdapterVersion>>,
    /// Loads whose path ends in "bad" fail with `AdapterIncompatible`.
    pub(crate) loads: AtomicU32,
    /// Loads wait for a permit here when set (to hold a load in progress).
    pub(crate) load_permits: Option<Arc<Semaphore>>,
    on_generate: Option<GenerateHook>,
}

impl ScriptedEngine {
    /// An engine whose requests emit `hold_after` tokens, then wait to be cancelled if their budget allows more.
    pub(crate) fn new(hold_after: u32) -> Self {
        Self {
            info: ModelInfo { vocab_size: 260, context_length: 4096, eos_token_ids: vec![257] },
            hold_after,
            versions: Mutex::new(HashMap::new()),
            loads: AtomicU32::new(0),
            load_permits: None,
            on_generate: None,
        }
    }

    pub(crate) fn with_generate_hook(mut self, hook: GenerateHook) -> Self {
        self.on_generate = Some(hook);
        self
    }

    pub(crate) fn with_load_permits(mut self, permits: Arc<Semaphore>) -> Self {
        self.load_permits = Some(permits);
        self
    }
}

#[async_trait]
impl Engine for ScriptedEngine {
    fn model_info(&self) -> &ModelInfo {
        &self.info
    }

    async fn generate(&self, request: SampleRequest, cancel: CancellationToken) -> Result<EngineStream, EngineError> {
        let version = match request.adapter() {
            AdapterKey::Base => AdapterVersion::BASE,
            AdapterKey::Lora(name) => {
                *self.versions.lock().get(name).ok_or_else(|| EngineError::AdapterNotLoaded(name.clone()))?
            }
        };
        if let Some(hook) = &self.on_generate {
            hook(&request, &cancel);
        }
        let (events, receiver) = mpsc::unbounded_channel();
        let hold_after = self.hold_after;
        tokio::spawn(async move {
            let budget = request.params().max_tokens();
            let emit = budget.min(hold_after);
            if cancel.is_cancelled() {
                for sequence in 0..request.num_samples() {
                    let _ = events.send(Ok(EngineEvent::Finished { sequence, reason: FinishReason::Abort }));
                }
                return;
            }
            for sequence in 0..request.num_samples() {
                let token_ids: Vec<u32> = (0..emit).map(|i| i % 256).collect();
                let logprobs = (0..emit).map(|i| -0.01 * i as f32).collect();
                let _ = events.send(Ok(EngineEvent::Tokens { sequence, version, token_ids, logprobs }));
            }
            let reason = if budget <= hold_after {
                FinishReason::Length
            } else {
                tokio::select! {
                    () = cancel.cancelled() => FinishReason::Abort,
                    () = events.closed() => return,
                }
            };
            for sequence in 0..request.num_samples() {
                let _ = events.send(Ok(EngineEvent::Finished { sequence, reason }));
            }
        });
        Ok(tokio_stream::wrappers::UnboundedReceiverStream::new(receiver).boxed())
    }

    async fn load_adapter(
        &self,
        name: &AdapterName,
        version: AdapterVersion,
        source: &AdapterSource,
    ) -> Result<(), EngineError> {
        if let Some(permits) = &self.load_permits {
            permits.acquire().await.map_err(|_| EngineError::Stopped)?.forget();
        }
        self.loads.fetch_add(1, Ordering::AcqRel);
        if source.dir().ends_with("bad") {
            return Err(EngineError::AdapterIncompatible(format!("{} has the wrong shapes", source.dir().display())));
        }
        self.versions.lock().insert(name.clone(), version);
        Ok(())
    }

    async fn unload_adapter(&self, name: &AdapterName) -> Result<(), EngineError> {
        self.versions.lock().remove(name);
        Ok(())
    }
}
