//! Errors of starting an engine. Errors of serving (adapter files, stopped engine) are
//! [`loragate_core::EngineError`]s.

use std::path::{Path, PathBuf};

/// Why [`crate::CandleEngine::load`] failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineLoadError {
    /// A file of the model directory could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// `config.json` or `generation_config.json` is malformed or describes an unsupported model.
    #[error("bad model config: {0}")]
    Config(String),
    /// The safetensors weights are malformed, missing a tensor, or have the wrong shapes.
    #[error("bad model weights: {0}")]
    Weights(String),
    /// `tokenizer.json` could not be loaded.
    #[error("bad tokenizer: {0}")]
    Tokenizer(String),
    /// The requested device cannot be used (CUDA asked of a build without the `cuda` feature, or no such GPU).
    #[error("device unavailable: {0}")]
    Device(String),
    /// The requested dtype is not supported on the requested device.
    #[error("unsupported dtype: {0}")]
    DType(String),
    /// The engine's settings contradict each other.
    #[error("invalid engine settings: {0}")]
    Settings(String),
    /// The engine's step thread could not be started.
    #[error("cannot start the engine thread: {0}")]
    Thread(#[source] std::io::Error),
}

impl EngineLoadError {
    pub(crate) fn io(path: &Path, source: std::io::Error) -> Self {
        Self::Io { path: path.to_owned(), source }
    }

    pub(crate) fn config(reason: impl Into<String>) -> Self {
        Self::Config(reason.into())
    }

    pub(crate) fn weights(reason: impl Into<String>) -> Self {
        Self::Weights(reason.into())
    }
}
