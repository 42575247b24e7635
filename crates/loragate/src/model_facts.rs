//! The line logged when the model is loaded: what an operator checks first (which model runs, how, with what context
//! and chat template).

use std::path::Path;

use loragate_core::ModelInfo;
use loragate_engine::{EngineConfig, ModelFormat};
use loragate_http::ChatTemplate;

/// Logs the loaded model's facts; `engine` is the in-process engine's configuration (`None` for a fleet, whose
/// workers choose their device and dtype).
pub(crate) fn log_model_facts(
    path: &Path,
    served_model_name: &str,
    info: &ModelInfo,
    engine: Option<&EngineConfig>,
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
    let (backend, device, dtype) = match engine {
        Some(engine) => ("in-process", engine.device.to_string(), engine.dtype.to_string()),
        None => ("fleet", "the workers'".to_owned(), "the workers'".to_owned()),
    };
    tracing::info!(
        model = %path.display(),
        served_model_name,
        format,
        engine = backend,
        device,
        dtype,
        context_length = info.context_length,
        vocab_size = info.vocab_size,
        chat_template,
        "model loaded"
    );
}
