//! The candle inference engine of loragate: serves a LLaMA-family model (LLaMA, Qwen2, Mistral) with LoRA adapters
//! chosen per request, whose weights can be swapped while sequences keep sampling.
//!
//! - **Model**: our own LLaMA-family decoder, loaded from a Hugging Face directory (`config.json` +
//!   safetensors) or a GGUF file (llama.cpp's format, quantized weights included), with a LoRA term on every
//!   attention and MLP projection that can differ per row of a batch.
//! - **Adapters**: PEFT directories (`adapter_config.json` + `adapter_model.safetensors`), validated against the
//!   model on a blocking thread before they replace anything.
//! - **Scheduler**: one OS thread runs every sequence, of every adapter and of the base model, one token per step
//!   in one batched forward pass; cancellation is honoured within one step.
//! - **Versions**: a sequence keeps the adapter weights (and version) it started with until it ends.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use loragate_core::{AdapterName, AdapterSource, AdapterVersion, Engine};
//! use loragate_engine::{CandleEngine, EngineConfig, default_cache_dir, ensure_demo_files};
//!
//! let files = ensure_demo_files(&default_cache_dir())?;
//! let engine = CandleEngine::load(&files.model_dir, EngineConfig::default())?;
//! let meow = AdapterName::parse("meow")?;
//! engine.load_adapter(&meow, AdapterVersion(1), &AdapterSource::trusted(&files.meow_dir)).await?;
//! # Ok(())
//! # }
//! ```
//!
//! See `docs/engine.md` for the design and `docs/real-models.md` for serving real checkpoints.

mod config;
mod demo;
mod detached;
mod engine;
mod error;
mod gguf;
mod lora;
mod model;
mod random_adapter;
mod sampler;
mod scheduler;
mod synthetic;
#[cfg(test)]
mod test_support;
mod tokenizer;

pub use config::{
    DType, Device, EngineConfig, ParseDTypeError, ParseDeviceError, ParseQuantizedWeightsError, QuantizedWeights,
};
pub use demo::{
    DEMO_MODEL_NAME, DemoError, DemoFiles, copy_demo_files, default_cache_dir, ensure_demo_files, write_demo_files,
};
pub use engine::{CandleEngine, EngineFacts, KvCacheStats, read_model_info};
pub use error::EngineLoadError;
pub use gguf::{ChatTemplateSource, ModelFormat, gguf_chat_template};
/// The CPU attention kernels on synthetic inputs, for the benchmarks only.
#[doc(hidden)]
pub use model::kernel_bench;
pub use random_adapter::{RandomAdapter, RandomAdapterError, write_random_adapter};
pub use scheduler::{StepCost, StepTarget};
pub use synthetic::ModelShape;
pub use tokenizer::{TOKENIZER_FILE, Tokenizer, TokenizerError};
