//! The line logged when the model is loaded: what an operator checks first (which model runs, how, with what context
//! and chat template).

use std::path::Path;

use loragate_core::ModelInfo;
use loragate_engine::{EngineConfig, EngineFacts, ModelFormat};
use loragate_http::ChatTemplate;

/// Logs the loaded model's facts; `engine` is the in-process engine's configuration and what it started with (`None`
/// for a fleet, whose workers choose their device, dtype and cache): how its weights are held (a GGUF file's Q4_1
/// matrices kept quantized say so, not `f32`), its activations' dtype, and its KV cache's blocks and bytes.
pub(crate) fn log_model_facts(
    path: &Path,
    served_model_name: &str,
    info: &ModelInfo,
    engine: Option<(&EngineConfig, &EngineFacts)>,
    chat_template: &Result<Option<ChatTemplate>, String>,
) {
    let format = match ModelFormat::of(path) {
        ModelFormat::HuggingFace => "hugging-face",
        ModelFormat::Gguf => "gguf",
    };
    let chat_template = match chat_template {
        Ok(Some(_)) => "found",
        Ok(None) => "none (/v1/chat/completions answers 400)",
        Err(_) => "unusable (/v1/chat/completions answers 400)",
    };
    let workers = || "the workers'".to_owned();
    let (backend, device, weights, activations, kv_cache_blocks, kv_cache_bytes, prefix_caching) = match engine {
        Some((config, facts)) => (
            "in-process",
            config.device.to_string(),
            facts.weights.clone(),
            config.dtype.to_string(),
            facts.kv_cache_blocks.to_string(),
            facts.kv_cache_bytes.to_string(),
            facts.prefix_caching.to_string(),
        ),
        None => ("fleet", workers(), workers(), workers(), workers(), workers(), workers()),
    };
    tracing::info!(
        model = %path.display(),
        served_model_name,
        format,
        engine = backend,
        device,
        weights,
        activations,
        kv_cache_blocks,
        kv_cache_bytes,
        kv_cache_block_size = EngineConfig::KV_BLOCK_SIZE,
        prefix_caching,
        context_length = info.context_length,
        vocab_size = info.vocab_size,
        chat_template,
        "model loaded"
    );
}
