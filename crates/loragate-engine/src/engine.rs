//! [`CandleEngine`]: the [`Engine`] the coordinator drives. It keeps the installed adapters and hands requests to
//! the step thread; the model itself lives on that thread.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use loragate_core::{
    AdapterKey, AdapterLayout, AdapterName, AdapterSource, AdapterVersion, Engine, EngineError, EngineStream,
    GrowingFile, ModelInfo, Parking, PreparedLoad, SampleRequest,
};
use parking_lot::RwLock;
use tokio_util::sync::CancellationToken;

use crate::config::EngineConfig;
use crate::detached::{DetachedError, run_detached, spawn_detached, wait_detached};
use crate::error::EngineLoadError;
use crate::gguf::{GgufFile, ModelFormat};
use crate::lora::{AdapterLimits, AdapterReader, AdapterWeights, check_peft_layout};
use crate::model::{BLOCK_SIZE, BlockPool, Llama, ModelConfig, kv_cache_error};
use crate::scheduler::{StepThread, Submission, outbox};
use crate::tokenizer::Tokenizer;

mod metrics;
mod stats;
#[cfg(test)]
mod tests;

pub use stats::{EngineFacts, KvCacheStats};

/// The candle inference engine: a LLaMA-family model with per-request LoRA adapters, sampled by a batched step
/// scheduler on its own thread. Dropping it stops the thread (after its current step); requests still running
/// then end with [`EngineError::Stopped`].
pub struct CandleEngine {
    info: ModelInfo,
    model_config: Arc<ModelConfig>,
    device: candle_core::Device,
    dtype: candle_core::DType,
    adapters: RwLock<HashMap<AdapterName, InstalledVersions>>,
    adapter_limits: AdapterLimits,
    adapter_load_timeout: Duration,
    tokenizer: Option<Tokenizer>,
    /// The KV cache's blocks (the step thread holds the keys and values): for the metrics and resets.
    kv_pool: BlockPool,
    facts: EngineFacts,
    metrics: metrics::KvCacheMetrics,
    step_thread: StepThread,
}

/// The weights served under an adapter name, by version: the newest serves unpinned requests, older ones serve exact
/// pins until the coordinator releases them. Running sequences hold their own `Arc` to the weights they started with,
/// so removing an entry never touches them.
type InstalledVersions = BTreeMap<AdapterVersion, Arc<AdapterWeights>>;

impl CandleEngine {
    /// Loads the model at `path` and starts the step thread: a Hugging Face directory (`config.json`,
    /// `model.safetensors` or sharded safetensors with their index, optionally `generation_config.json` and
    /// `tokenizer.json`) or a GGUF file (see [`ModelFormat::of`]). Blocking (it reads the weights): from async code,
    /// call it in `spawn_blocking`.
    pub fn load(path: &Path, config: EngineConfig) -> Result<Self, EngineLoadError> {
        let device = config.device.open()?;
        let dtype = config.dtype.for_device(&device)?;
        let max_context = config.max_context_length.map(|max| max as usize);
        let (model, tokenizer) = match ModelFormat::of(path) {
            ModelFormat::HuggingFace => {
                (Llama::load(path, &device, dtype, max_context)?, Tokenizer::from_model_dir(path)?)
            }
            ModelFormat::Gguf => {
                let file = GgufFile::open(path)?;
                let weights = config.quantized_weights_on_device()?;
                (Llama::load_gguf(&file, &device, dtype, max_context, weights)?, Some(file.tokenizer()?.into()))
            }
        };
        Self::start(model, tokenizer, &config)
    }

    pub(crate) fn start(
        model: Llama,
        tokenizer: Option<Tokenizer>,
        config: &EngineConfig,
    ) -> Result<Self, EngineLoadError> {
        let model_config = Arc::new(model.config().clone());
        let (device, dtype) = (model.device().clone(), model.dtype());
        let limits = config.step_limits(model.device(), model.multiplies_quantized_only())?;
        let bytes_per_position = model.kv_bytes_per_position();
        let blocks = config.kv_cache_blocks(bytes_per_position, model.context_length())?;
        let cache = model
            .kv_cache(blocks, config.enable_prefix_caching)
            .map_err(|err| EngineLoadError::Settings(format!("cannot allocate the KV cache: {err}")))?;
        let kv_pool = cache.pool().clone();
        let facts = EngineFacts {
            kv_cache_blocks: kv_pool.usage().total,
            kv_cache_bytes: (blocks * BLOCK_SIZE * bytes_per_position) as u64,
            block_size: BLOCK_SIZE,
            prefix_caching: config.enable_prefix_caching,
            weights: model.weights_summary(),
        };
        // A sequence must fit in the cache alone: the served context is capped at what it holds.
        let cached_positions = facts.kv_cache_blocks * BLOCK_SIZE;
        if cached_positions < model.context_length() {
            tracing::warn!(
                context_length = model.context_length(),
                kv_cache_positions = cached_positions,
                "the KV cache holds fewer positions than the context: the served context is capped at what it \
                 holds (raise --kv-cache-memory-bytes, or lower --max-context-length)"
            );
        }
        let info = ModelInfo {
            vocab_size: model_config.vocab_size as u32,
            context_length: model.context_length().min(cached_positions) as u32,
            eos_token_ids: model_config.eos_token_ids.clone(),
        };
        let step_thread = StepThread::spawn(model, cache, limits).map_err(EngineLoadError::Thread)?;
        Ok(Self {
            info,
            model_config,
            device,
            dtype,
            adapters: RwLock::default(),
            adapter_limits: AdapterLimits { max_rank: config.max_lora_rank, max_bytes: config.max_adapter_bytes },
            adapter_load_timeout: config.adapter_load_timeout,
            tokenizer,
            kv_pool,
            metrics: metrics::KvCacheMetrics::new(&facts),
            facts,
            step_thread,
        })
    }

    /// The model's tokenizer: a Hugging Face directory's `tokenizer.json` if it has one, a GGUF file's always.
    pub fn tokenizer(&self) -> Option<&Tokenizer> {
        self.tokenizer.as_ref()
    }

    /// What the engine runs with: its KV cache and its weights (for the startup line).
    pub fn facts(&self) -> &EngineFacts {
        &self.facts
    }

    /// The KV cache's use now and its counters since the start (for the metrics).
    pub fn kv_cache_stats(&self) -> KvCacheStats {
        KvCacheStats::of(&self.kv_pool)
    }

    /// What an engine step costs, as fitted to the steps run so far (the cautious prior until one has run): what
    /// `--max-step-slowdown` sizes prompt chunks by.
    pub fn step_cost(&self) -> crate::StepCost {
        self.step_thread.step_cost()
    }

    /// Refuses a request one of whose sequences could not fit in the KV cache even alone.
    fn check_fits(&self, request: &SampleRequest) -> Result<(), EngineError> {
        // The last token's keys and values are never computed.
        let positions = request.prompt().len() + request.params().max_tokens() as usize - 1;
        let blocks = self.kv_pool.usage().total;
        if positions.div_ceil(BLOCK_SIZE) > blocks {
            return Err(EngineError::TooLarge(kv_cache_error(positions, blocks)));
        }
        Ok(())
    }

    /// The names and versions of the installed adapters, sorted by name.
    pub fn adapters(&self) -> Vec<(AdapterName, AdapterVersion)> {
        let adapters = self.adapters.read();
        let mut newest: Vec<_> = adapters
            .iter()
            .filter_map(|(name, versions)| Some((name.clone(), *versions.last_key_value()?.0)))
            .collect();
        newest.sort();
        newest
    }

    /// Every version of `name` the engine holds weights of, oldest first.
    pub fn versions_of(&self, name: &AdapterName) -> Vec<AdapterVersion> {
        self.adapters.read().get(name).map(|versions| versions.keys().copied().collect()).unwrap_or_default()
    }
}

/// The limits of the model at `path` as [`CandleEngine::load`] would serve them (context capped at
/// `max_context_length`), read from a directory's `config.json` and `generation_config.json` or a GGUF file's
/// metadata without loading any weights: what a coordinator in front of a fleet of workers validates requests
/// against.
pub fn read_model_info(path: &Path, max_context_length: Option<u32>) -> Result<ModelInfo, EngineLoadError> {
    let config = match ModelFormat::of(path) {
        ModelFormat::HuggingFace => ModelConfig::from_model_dir(path)?,
        ModelFormat::Gguf => GgufFile::open(path)?.model_config()?,
    };
    Ok(ModelInfo {
        vocab_size: config.vocab_size as u32,
        context_length: config.served_context(max_context_length.map(|max| max as usize)) as u32,
        eos_token_ids: config.eos_token_ids,
    })
}

/// A pushed adapter's weights being read as the push arrives ([`Engine::prepare_pushed_adapter`]): the result of
/// [`AdapterReader::read_pushed`] on its thread, which [`Engine::load_adapter`] takes instead of reading the stored files.
/// Dropped untaken (the push failed, or was installed elsewhere), the weights are dropped on that thread.
struct PreparedWeights(tokio::sync::oneshot::Receiver<Result<AdapterWeights, EngineError>>);

impl CandleEngine {
    /// What reading an adapter for this engine needs, to move onto the thread that reads it.
    fn adapter_reader(&self) -> AdapterReader {
        AdapterReader {
            model: Arc::clone(&self.model_config),
            device: self.device.clone(),
            dtype: self.dtype,
            limits: self.adapter_limits,
        }
    }

    /// Reads and validates the adapter at `source` on a detached thread: a read that hangs fails at the timeout and
    /// holds up neither other loads nor shutdown.
    async fn read_adapter(&self, source: &AdapterSource) -> Result<AdapterWeights, EngineError> {
        let (source, reader) = (source.clone(), self.adapter_reader());
        let load = move || reader.read(&source);
        match run_detached("loragate-adapter-load", self.adapter_load_timeout, load).await {
            Ok(loaded) => loaded,
            Err(DetachedError::TimedOut(limit)) => Err(EngineError::AdapterFiles(format!(
                "reading the adapter took longer than {limit:?} (--adapter-load-timeout); nothing was installed"
            ))),
            Err(err) => Err(EngineError::Internal(format!("loading the adapter failed: {err}"))),
        }
    }
}

#[async_trait]
impl Engine for CandleEngine {
    fn model_info(&self) -> &ModelInfo {
        &self.info
    }

    fn can_park(&self) -> bool {
        true
    }

    async fn generate(&self, request: SampleRequest, cancel: CancellationToken) -> Result<EngineStream, EngineError> {
        self.generate_parking(request, cancel, Parking::default()).await
    }

    async fn generate_parking(
        &self,
        request: SampleRequest,
        cancel: CancellationToken,
        parking: Parking,
    ) -> Result<EngineStream, EngineError> {
        let (adapter, version) = match request.adapter() {
            AdapterKey::Base => (None, AdapterVersion::BASE),
            AdapterKey::Lora(name) => {
                let adapters = self.adapters.read();
                let versions = adapters.get(name);
                let chosen = match request.pinned_version() {
                    Some(pinned) => versions.and_then(|held| held.get_key_value(&pinned)),
                    None => versions.and_then(|held| held.last_key_value()),
                };
                let (version, weights) = chosen.ok_or_else(|| EngineError::AdapterNotLoaded(name.clone()))?;
                (Some(weights.clone()), *version)
            }
        };
        self.check_fits(&request)?;
        let (events, receiver) = outbox();
        let Parking { park_on_cancel: park, resume_from: resume } = parking;
        self.step_thread.submit(Submission { request, adapter, version, cancel, park, resume, events })?;
        Ok(receiver.boxed())
    }

    fn check_adapter_layout(&self, layout: &AdapterLayout) -> Result<(), EngineError> {
        check_peft_layout(layout, &self.model_config, self.dtype, self.adapter_limits)
    }

    /// Reads a pushed adapter as it arrives, on a thread of its own (see [`PreparedWeights`]).
    fn prepare_pushed_adapter(&self, layout: &AdapterLayout, file: GrowingFile) -> Option<PreparedLoad> {
        let (config, reader) = (layout.config.clone(), self.adapter_reader());
        let read = move || reader.read_pushed(config, file);
        match spawn_detached("loragate-adapter-prepare", read) {
            Ok(weights) => Some(PreparedLoad::new(Box::new(PreparedWeights(weights)))),
            Err(err) => {
                tracing::debug!(%err, "a pushed adapter is read once stored instead of as it arrives");
                None
            }
        }
    }

    async fn load_adapter(
        &self,
        name: &AdapterName,
        version: AdapterVersion,
        source: &AdapterSource,
    ) -> Result<(), EngineError> {
        let prepared = match source.take_prepared().and_then(|prepared| prepared.downcast::<PreparedWeights>().ok()) {
            Some(prepared) => wait_detached(prepared.0, self.adapter_load_timeout).await.ok().and_then(Result::ok),
            None => None,
        };
        // Without prepared weights (none, or their reading failed) the files are read: they give the same weights, or
        // the error to answer.
        let weights = match prepared {
            Some(weights) => weights,
            None => self.read_adapter(source).await?,
        };
        let replaced = self.adapters.write().entry(name.clone()).or_default().insert(version, Arc::new(weights));
        // Weights a repeated load of the same version replaced are freed here, outside the lock (or live on in the
        // `Arc`s of sequences running on them).
        drop(replaced);
        // The coordinator logs the load (once, at INFO); this says when the engine installed it.
        tracing::debug!(adapter = %name, %version, "adapter installed");
        Ok(())
    }

    /// Drops every cached prefix no sequence uses (vLLM's `/reset_prefix_cache`, SGLang's `/flush_cache`): their
    /// blocks become free, and later requests compute those prefixes again. Blocks in use keep their prefixes.
    fn reset_prefix_cache(&self) -> usize {
        self.kv_pool.reset_prefix_cache()
    }

    async fn unload_adapter(&self, name: &AdapterName, version: AdapterVersion) -> Result<(), EngineError> {
        let removed = {
            let mut adapters = self.adapters.write();
            let Some(versions) = adapters.get_mut(name) else { return Ok(()) };
            let newer = versions.split_off(&version.next());
            let removed = std::mem::replace(versions, newer);
            if versions.is_empty() {
                adapters.remove(name);
            }
            removed
        };
        if let Some((newest, _)) = removed.last_key_value() {
            tracing::debug!(adapter = %name, version = %newest, "adapter unloaded");
        }
        Ok(())
    }

    async fn release_version(&self, name: &AdapterName, version: AdapterVersion) -> Result<(), EngineError> {
        let released = {
            let mut adapters = self.adapters.write();
            let Some(versions) = adapters.get_mut(name) else { return Ok(()) };
            if versions.last_key_value().is_some_and(|(newest, _)| *newest == version) {
                return Ok(());
            }
            versions.remove(&version)
        };
        if released.is_some() {
            tracing::debug!(adapter = %name, %version, "replaced adapter version released");
        }
        Ok(())
    }
}
