//! The `Engine` trait: what the coordinator needs from whatever runs the model. It lives here, in the crate that
//! consumes it, so the coordinator and the fronts are tested without candle (with scripted engines in test code),
//! and so an in-process candle engine and a remote engine worker reached over gRPC fit the same seam.

use std::any::Any;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

use async_trait::async_trait;
use futures::stream::BoxStream;
use tokio_util::sync::CancellationToken;

use crate::adapter_source::{AdapterSource, PreparedLoad};
use crate::adapter_store::{AdapterLayout, GrowingFile};
use crate::contract::{AdapterName, AdapterVersion, EngineError, FinishReason, ModelInfo, TopLogprobs};
use crate::sampling::SampleRequest;

/// One step of a request's output, in the order the engine produced it.
#[derive(Clone, Debug, PartialEq)]
pub enum EngineEvent {
    /// With `include_prompt_logprobs`, once, before any token: one entry per prompt token, the first NaN.
    PromptLogprobs(Vec<f32>),
    /// With `prompt_top_logprobs`, once, right after [`EngineEvent::PromptLogprobs`]: one entry per prompt token,
    /// the first with rank 0 and no alternatives.
    PromptTopLogprobs(Vec<TopLogprobs>),
    /// Once, before any token: how many of the prompt's tokens had their keys and values taken from the engine's
    /// prefix cache rather than computed (OpenAI's `usage.prompt_tokens_details.cached_tokens`). An engine without
    /// a prefix cache never sends it: none were.
    PromptCached {
        /// The prompt tokens found in the cache.
        tokens: u32,
    },
    /// Tokens newly produced for one sequence, all by the same adapter version.
    Tokens {
        /// The sequence's index within the request (`0..num_samples`).
        sequence: u32,
        /// The adapter version whose weights produced these tokens.
        version: AdapterVersion,
        /// The new tokens.
        token_ids: Vec<u32>,
        /// The logprob of each new token.
        logprobs: Vec<f32>,
        /// With `top_logprobs` asked for: each new token's rank and the most likely tokens at its position (one
        /// entry per token). Empty otherwise.
        top_logprobs: Vec<TopLogprobs>,
    },
    /// A keep-mode pause with [`crate::KvPolicy::Reuse`] stopped the sequence and the engine parked it: its keys and
    /// values, to hand back with the continuation ([`Parking::resume_from`]). Sent right before the sequence's
    /// `Finished { Abort }`, only by an engine that [can park](Engine::can_park).
    Parked {
        /// The sequence's index within the request.
        sequence: u32,
        /// The parked keys and values.
        kv: ParkedKv,
    },
    /// The sequence resumed from the parked keys and values it was started with, with no prefill: sent once, before
    /// its first tokens. Without it, a continuation was prefilled (its keys and values are all its own version's).
    Resumed {
        /// The sequence's index within the request.
        sequence: u32,
    },
    /// A sequence ended; it produces nothing more.
    Finished {
        /// The sequence's index within the request.
        sequence: u32,
        /// Why it ended.
        reason: FinishReason,
    },
}

/// The keys and values an engine parked for one kept sequence: opaque to the core, which keeps it with the kept
/// sequence and hands it back with its continuation. Whoever holds the last handle owns the memory: dropping it frees
/// the keys and values, so no engine-side table can leak them (an unloaded adapter, a cancelled or abandoned request
/// simply drops its handle).
#[derive(Clone)]
pub struct ParkedKv(Arc<dyn Any + Send + Sync>);

impl ParkedKv {
    /// Wraps what an engine parked.
    pub fn new<T: Any + Send + Sync>(parked: T) -> Self {
        Self(Arc::new(parked))
    }

    /// What the engine parked, if it is a `T`.
    pub fn downcast_ref<T: Any>(&self) -> Option<&T> {
        self.0.downcast_ref()
    }

    /// A watch that tells when every handle is gone and the keys and values were freed.
    pub fn watch(&self) -> ParkedKvWatch {
        ParkedKvWatch(Arc::downgrade(&self.0))
    }
}

impl fmt::Debug for ParkedKv {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ParkedKv(..)")
    }
}

impl PartialEq for ParkedKv {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// Tells whether parked keys and values were freed (see [`ParkedKv::watch`]).
#[derive(Clone, Debug)]
pub struct ParkedKvWatch(Weak<dyn Any + Send + Sync>);

impl ParkedKvWatch {
    /// Whether every handle is gone.
    pub fn is_freed(&self) -> bool {
        self.0.strong_count() == 0
    }
}

/// Set, before a request's cancellation token fires, when the cancellation is a keep-mode pause with
/// [`crate::KvPolicy::Reuse`]: the engine then parks the request's decoding sequences rather than dropping their keys
/// and values. Shared by the request's admission and the engine.
#[derive(Clone, Debug, Default)]
pub struct ParkSignal(Arc<AtomicBool>);

impl ParkSignal {
    /// Asks the engine to park when the cancellation comes (call before cancelling).
    pub fn request(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    /// Whether parking was asked for.
    pub fn is_requested(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// How [`Engine::generate_parking`] may park and resume a request.
#[derive(Clone, Debug, Default)]
pub struct Parking {
    /// Set before the cancellation that should park the request's decoding sequences.
    pub park_on_cancel: ParkSignal,
    /// The keys and values a continuation (one sequence, whose prompt is the parked sequence's tokens) resumes
    /// from. An engine that cannot use them prefills the prompt instead and sends no [`EngineEvent::Resumed`].
    pub resume_from: Option<ParkedKv>,
}

/// The events of one request. It ends after every sequence's [`EngineEvent::Finished`].
pub type EngineStream = BoxStream<'static, Result<EngineEvent, EngineError>>;

/// Runs the model: samples requests and holds adapter weights.
///
/// Contract for implementors:
/// - `generate` starts work and returns at once; the work runs off the async runtime (its own thread or process).
/// - When `cancel` fires, every unfinished sequence ends within one engine step with [`FinishReason::Abort`], after
///   the tokens it had produced (nothing produced is lost). A request whose token is cancelled before it starts ends
///   the same way with no tokens.
/// - Dropping the stream means the caller is gone; the engine stops that request's sequences.
/// - The stream's buffer is bounded and the engine never waits for a slow reader: it may coalesce a sequence's
///   unread tokens into one [`EngineEvent::Tokens`] (same order, same versions).
/// - A sequence whose output becomes non-finite ends with [`EngineError::NonFiniteOutput`]; nothing is sampled from
///   NaN or infinite logits.
/// - A sequence keeps the adapter weights it started with until it ends, even if the adapter is reloaded or unloaded
///   meanwhile, and stamps each token with their version.
/// - Weights belong to a (name, version) pair, and an engine may hold several versions of a name. A request runs on
///   its pinned version ([`SampleRequest::pinned_version`], an exact pin `NAME@V`) or, unpinned, on the newest
///   version of its adapter the engine holds. `load_adapter` adds its version (a load that finishes after a newer
///   version of the name was installed leaves the newer one serving unpinned requests); older versions stay
///   servable to pins until [`Engine::release_version`] removes them one by one. `unload_adapter(name, version)`
///   removes every version of the name up to `version`. So an unload, or the clean-up of a load that finished after
///   its adapter was unloaded, never removes weights that a later load of the same name installed.
/// - `load_adapter` validates everything before installing: on error the previously installed weights of that name
///   stay in service. It returns within a bounded time: a load that cannot finish (a hung file system) fails and
///   installs nothing, ever.
#[async_trait]
pub trait Engine: Send + Sync + 'static {
    /// The served model's limits.
    fn model_info(&self) -> &ModelInfo;

    /// Whether the engine can park kept sequences with their keys and values and resume them without a prefill
    /// ([`crate::KvPolicy::Reuse`]). One that cannot (the default) has every keep-mode pause apply RECOMPUTE.
    fn can_park(&self) -> bool {
        false
    }

    /// Checks a pushed adapter's layout (its configuration and its tensors' names, dtypes and shapes, from the
    /// safetensors header) against the model, before its tensors are received: the same checks a load of the files
    /// makes before reading any tensor. The default accepts every layout (the load checks it then).
    fn check_adapter_layout(&self, layout: &AdapterLayout) -> Result<(), EngineError> {
        let _ = layout;
        Ok(())
    }

    /// Begins reading a pushed adapter's weights while they are still being received (`file` grows as they arrive;
    /// [`GrowingFile::wait_written`] waits for the bytes a read needs), once `layout` passed
    /// [`Engine::check_adapter_layout`]. What it returns travels with the stored version's [`AdapterSource`] to
    /// [`Engine::load_adapter`], which may take it ([`AdapterSource::take_prepared`]) instead of reading the files:
    /// receiving and reading then overlap. It is only ever used if the push's size and SHA-256 checks pass; a push that
    /// fails fails the reading's waits. A preparation must give what a load of the stored files would give (or be set
    /// aside by the load). The default prepares nothing.
    fn prepare_pushed_adapter(&self, layout: &AdapterLayout, file: GrowingFile) -> Option<PreparedLoad> {
        let _ = (layout, file);
        None
    }

    /// Starts sampling `request`; cancelling `cancel` aborts it.
    async fn generate(&self, request: SampleRequest, cancel: CancellationToken) -> Result<EngineStream, EngineError>;

    /// Starts sampling `request` as [`Engine::generate`] does, with `parking`: when `cancel` fires with the park
    /// signal set, each decoding sequence is sent back parked ([`EngineEvent::Parked`]) before its `Finished
    /// { Abort }`; a continuation with parked keys and values resumes from them ([`EngineEvent::Resumed`]). An
    /// engine that cannot park (the default) ignores `parking`: every continuation is prefilled.
    async fn generate_parking(
        &self,
        request: SampleRequest,
        cancel: CancellationToken,
        parking: Parking,
    ) -> Result<EngineStream, EngineError> {
        drop(parking);
        self.generate(request, cancel).await
    }

    /// Validates and installs the adapter at `source` under `name`, as `version`, for sequences started from now on
    /// (unless a newer version of `name` is installed already).
    async fn load_adapter(
        &self,
        name: &AdapterName,
        version: AdapterVersion,
        source: &AdapterSource,
    ) -> Result<(), EngineError>;

    /// Removes `name`'s weights for sequences started from now on if their version is `version` or older; newer
    /// weights of `name` stay. Unknown names are fine.
    async fn unload_adapter(&self, name: &AdapterName, version: AdapterVersion) -> Result<(), EngineError>;

    /// Removes exactly `version` of `name`, which the coordinator no longer serves (`--retain-versions`): sequences
    /// started from now on can no longer pin it; those running on it keep its weights until they end. The newest
    /// version of `name` the engine holds is never removed this way. Unknown names and versions are fine.
    async fn release_version(&self, name: &AdapterName, version: AdapterVersion) -> Result<(), EngineError>;
    /// Drops every cached prompt prefix no running sequence uses (vLLM's `/reset_prefix_cache`): later requests
    /// compute those prefixes again. Returns how many cache blocks were dropped. Must not block. An engine without a
    /// prefix cache (the default) has nothing to drop.
    fn reset_prefix_cache(&self) -> usize {
        0
    }
}
