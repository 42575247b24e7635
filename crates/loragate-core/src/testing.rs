//! Test support (the `testing` feature, for dev-dependencies and benchmarks only): [`ScriptedEngine`], an engine
//! without a model whose behaviour tests can predict exactly, and one sample of every error ([`every_core_error`]).

mod errors;
mod failing_store;
mod key_matrix;

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use async_trait::async_trait;
use futures::StreamExt;
use parking_lot::Mutex;
use tokio::sync::{Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

use crate::adapter_source::AdapterSource;
use crate::contract::{AdapterKey, AdapterName, AdapterVersion, EngineError, FinishReason, ModelInfo, TopLogprobs};
use crate::engine::{Engine, EngineEvent, EngineStream};
use crate::sampling::SampleRequest;

pub use self::errors::{every_core_error, every_engine_error, every_fleet_error, every_state_error};
pub use self::failing_store::FailingStore;
pub use self::key_matrix::{MATRIX_KEYS, matrix_keyring};

/// Called on every `generate` with the request and its cancellation token, before anything is emitted.
pub type GenerateHook = Box<dyn Fn(&SampleRequest, &CancellationToken) + Send + Sync>;

/// An engine without a model. Each request emits `hold_after` tokens per sequence at once (token `i` is `i % 256`,
/// its logprob `-0.01 * i`), stamped with the version last loaded under the request's adapter. If the budget is at
/// most `hold_after` it then ends with `Length`; otherwise it waits until cancelled and ends with `Abort`. A request
/// cancelled before it starts ends with `Abort` and no tokens. Loads from a directory named `bad` fail with
/// `AdapterIncompatible`; other loads succeed without reading anything. Versions follow the [`Engine`] contract: a
/// load adds its version (the newest serves unpinned requests, older ones serve pins until released), an unload
/// removes only its version or older.
///
/// Logprobs on request: prompt token `i ≥ 1` has logprob `-0.1 * i` (the first NaN), and ranks **2**: its
/// alternatives are `(t + 1) % 256` with its logprob + 0.5, then the prompt token `t` itself, then `(t + j) % 256`
/// with its logprob − j for j ≥ 2. A generated token `t` with logprob `l` ranks 1: its alternatives are `t` itself,
/// then `(t + j) % 256` with `l − j`.
pub struct ScriptedEngine {
    info: ModelInfo,
    hold_after: u32,
    versions: Mutex<HashMap<AdapterName, BTreeSet<AdapterVersion>>>,
    loads: AtomicU32,
    loads_started: AtomicU32,
    load_permits: Option<Arc<Semaphore>>,
    source_permits: HashMap<PathBuf, Arc<Semaphore>>,
    on_generate: Option<GenerateHook>,
    abort_permits: Option<Arc<Semaphore>>,
    linger: bool,
}

impl ScriptedEngine {
    /// An engine whose requests emit `hold_after` tokens, then wait to be cancelled if their budget allows more.
    /// Vocabulary 260, context 4,096, end-of-sequence 257.
    pub fn new(hold_after: u32) -> Self {
        Self {
            info: ModelInfo { vocab_size: 260, context_length: 4096, eos_token_ids: vec![257] },
            hold_after,
            versions: Mutex::new(HashMap::new()),
            loads: AtomicU32::new(0),
            loads_started: AtomicU32::new(0),
            load_permits: None,
            source_permits: HashMap::new(),
            on_generate: None,
            abort_permits: None,
            linger: false,
        }
    }

    /// Keeps each request's stream open after its last event until the caller drops it (engines may close their
    /// streams late; the coordinator must not wait for that).
    pub fn with_lingering_streams(mut self) -> Self {
        self.linger = true;
        self
    }

    /// Makes every request cancelled while it waits end (with `Abort`) only once it took a permit from `permits`
    /// (to hold aborted requests before their hand-back).
    pub fn with_abort_permits(mut self, permits: Arc<Semaphore>) -> Self {
        self.abort_permits = Some(permits);
        self
    }

    /// Calls `hook` on every `generate`.
    pub fn with_generate_hook(mut self, hook: GenerateHook) -> Self {
        self.on_generate = Some(hook);
        self
    }

    /// Makes every load wait for a permit from `permits` (to hold loads in progress).
    pub fn with_load_permits(mut self, permits: Arc<Semaphore>) -> Self {
        self.load_permits = Some(permits);
        self
    }

    /// Makes loads from `dir` wait for a permit from `permits` instead (to hold one load while others go on).
    pub fn with_load_permits_for(mut self, dir: impl Into<PathBuf>, permits: Arc<Semaphore>) -> Self {
        self.source_permits.insert(dir.into(), permits);
        self
    }
}

impl ScriptedEngine {
    /// How many loads reached the engine.
    pub fn loads(&self) -> u32 {
        self.loads.load(Ordering::Acquire)
    }

    /// How many loads were asked of the engine, including those still waiting for a permit.
    pub fn loads_started(&self) -> u32 {
        self.loads_started.load(Ordering::Acquire)
    }

    /// The version of `name` whose weights the engine serves new requests with, if any.
    pub fn installed(&self, name: &AdapterName) -> Option<AdapterVersion> {
        self.versions.lock().get(name).and_then(|held| held.last().copied())
    }

    /// Every version of `name` the engine holds weights of, oldest first.
    pub fn held(&self, name: &AdapterName) -> Vec<AdapterVersion> {
        self.versions.lock().get(name).map(|held| held.iter().copied().collect()).unwrap_or_default()
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
                let versions = self.versions.lock();
                let held = versions.get(name);
                let version = match request.pinned_version() {
                    Some(pinned) => held.and_then(|held| held.get(&pinned)).copied(),
                    None => held.and_then(|held| held.last()).copied(),
                };
                version.ok_or_else(|| EngineError::AdapterNotLoaded(name.clone()))?
            }
        };
        if let Some(hook) = &self.on_generate {
            hook(&request, &cancel);
        }
        let (events, receiver) = mpsc::unbounded_channel();
        let (hold_after, linger, abort_permits) = (self.hold_after, self.linger, self.abort_permits.clone());
        tokio::spawn(async move {
            let budget = request.params().max_tokens();
            let emit = budget.min(hold_after);
            if cancel.is_cancelled() {
                for sequence in 0..request.num_samples() {
                    let _ = events.send(Ok(EngineEvent::Finished { sequence, reason: FinishReason::Abort }));
                }
                return;
            }
            if request.include_prompt_logprobs() {
                let (logprobs, top) = scripted_prompt_logprobs(request.prompt(), request.prompt_top_logprobs());
                let _ = events.send(Ok(EngineEvent::PromptLogprobs(logprobs)));
                if let Some(top) = top {
                    let _ = events.send(Ok(EngineEvent::PromptTopLogprobs(top)));
                }
            }
            let alternatives = request.params().top_logprobs();
            for sequence in 0..request.num_samples() {
                let token_ids: Vec<u32> = (0..emit).map(|i| i % 256).collect();
                let logprobs: Vec<f32> = (0..emit).map(|i| -0.01 * i as f32).collect();
                let top_logprobs = if alternatives == 0 {
                    Vec::new()
                } else {
                    token_ids.iter().zip(&logprobs).map(|(&t, &l)| scripted_top(t, l, alternatives)).collect()
                };
                let _ = events.send(Ok(EngineEvent::Tokens { sequence, version, token_ids, logprobs, top_logprobs }));
            }
            let reason = if budget <= hold_after {
                FinishReason::Length
            } else {
                tokio::select! {
                    () = cancel.cancelled() => {}
                    () = events.closed() => return,
                }
                if let Some(permits) = abort_permits {
                    tokio::select! {
                        permit = permits.acquire() => permit.map(|permit| permit.forget()).unwrap_or(()),
                        () = events.closed() => return,
                    }
                }
                FinishReason::Abort
            };
            for sequence in 0..request.num_samples() {
                let _ = events.send(Ok(EngineEvent::Finished { sequence, reason }));
            }
            if linger {
                events.closed().await;
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
        self.loads_started.fetch_add(1, Ordering::AcqRel);
        let permits = self.source_permits.get(source.dir()).or(self.load_permits.as_ref());
        if let Some(permits) = permits {
            permits.acquire().await.map_err(|_| EngineError::Stopped)?.forget();
        }
        self.loads.fetch_add(1, Ordering::AcqRel);
        if source.dir().ends_with("bad") {
            return Err(EngineError::AdapterIncompatible(format!("{} has the wrong shapes", source.dir().display())));
        }
        self.versions.lock().entry(name.clone()).or_default().insert(version);
        Ok(())
    }

    async fn unload_adapter(&self, name: &AdapterName, version: AdapterVersion) -> Result<(), EngineError> {
        let mut versions = self.versions.lock();
        if let Some(held) = versions.get_mut(name) {
            held.retain(|held| *held > version);
            if held.is_empty() {
                versions.remove(name);
            }
        }
        Ok(())
    }

    async fn release_version(&self, name: &AdapterName, version: AdapterVersion) -> Result<(), EngineError> {
        if let Some(held) = self.versions.lock().get_mut(name)
            && held.last() != Some(&version)
        {
            held.remove(&version);
        }
        Ok(())
    }
}

/// The scripted alternatives of a generated token `token` with logprob `logprob` (see [`ScriptedEngine`]).
fn scripted_top(token: u32, logprob: f32, count: u32) -> TopLogprobs {
    let top = (0..count).map(|j| ((token + j) % 256, logprob - j as f32)).collect();
    TopLogprobs { rank: 1, top }
}

/// The scripted prompt logprobs and, if asked for, their alternatives (see [`ScriptedEngine`]).
fn scripted_prompt_logprobs(prompt: &[u32], alternatives: Option<u32>) -> (Vec<f32>, Option<Vec<TopLogprobs>>) {
    let logprobs: Vec<f32> = (0..prompt.len()).map(|i| if i == 0 { f32::NAN } else { -0.1 * i as f32 }).collect();
    let top = alternatives.map(|count| {
        prompt
            .iter()
            .zip(&logprobs)
            .enumerate()
            .map(|(i, (&token, &logprob))| {
                if i == 0 {
                    return TopLogprobs::default();
                }
                let top = (0..count)
                    .map(|j| match j {
                        0 => ((token + 1) % 256, logprob + 0.5),
                        1 => (token, logprob),
                        j => ((token + j) % 256, logprob - j as f32),
                    })
                    .collect();
                TopLogprobs { rank: 2, top }
            })
            .collect()
    });
    (logprobs, top)
}

/// Polls `condition` every few milliseconds until it holds; panics naming `what` after 10 s. Tests wait with this,
/// never with a bare sleep.
pub async fn eventually<F, Fut>(what: &str, condition: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    eventually_within(what, std::time::Duration::from_secs(10), condition).await;
}

/// [`eventually`] with its own limit.
pub async fn eventually_within<F, Fut>(what: &str, limit: std::time::Duration, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + limit;
    while !condition().await {
        assert!(tokio::time::Instant::now() < deadline, "timed out after {limit:?} waiting until {what}");
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
}

/// A coordinator over `engine` with `config`, and each of `adapters` loaded once (version 1) from `/a/NAME`.
pub async fn coordinator_with_adapters(
    engine: ScriptedEngine,
    config: crate::coordinator::CoordinatorConfig,
    adapters: &[&str],
) -> crate::coordinator::Coordinator {
    let coordinator =
        crate::coordinator::Coordinator::start(Arc::new(engine), config).await.expect("the coordinator starts");
    for adapter in adapters {
        let name = AdapterName::parse(adapter).expect("a valid adapter name");
        let source = AdapterSource::trusted(format!("/a/{adapter}"));
        coordinator.load_adapter(&name, source).await.expect("the adapter loads");
    }
    coordinator
}

/// Bytes that say when they are dropped: a test wraps a request body in them (`Bytes::from_owner`) and checks that
/// nothing downstream, a request held at a paused gate included, still holds the body.
pub struct DropTrackedBytes {
    bytes: Vec<u8>,
    dropped: Arc<AtomicBool>,
}

impl DropTrackedBytes {
    /// `bytes`, and the flag that turns true once they are dropped.
    pub fn new(bytes: Vec<u8>) -> (Self, Arc<AtomicBool>) {
        let dropped = Arc::new(AtomicBool::new(false));
        (Self { bytes, dropped: dropped.clone() }, dropped)
    }
}

impl AsRef<[u8]> for DropTrackedBytes {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

impl Drop for DropTrackedBytes {
    fn drop(&mut self) {
        self.dropped.store(true, Ordering::Release);
    }
}
