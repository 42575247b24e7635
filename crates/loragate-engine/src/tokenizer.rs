//! Text in and out: a Hugging Face `tokenizer.json` or a GGUF file's tokenizer, for the fronts that take text
//! prompts.

use std::path::Path;

use crate::error::EngineLoadError;
use crate::gguf::{GgufFile, ModelFormat};

/// The file a model directory keeps its tokenizer in.
pub const TOKENIZER_FILE: &str = "tokenizer.json";

/// A Hugging Face tokenizer (the `tokenizers` crate, pure Rust).
#[derive(Clone, Debug)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
}

/// Text that could not be turned into tokens, or tokens into text.
#[derive(Debug, thiserror::Error)]
#[error("tokenizer: {0}")]
pub struct TokenizerError(String);

impl Tokenizer {
    /// Loads a `tokenizer.json`.
    pub fn from_file(path: &Path) -> Result<Self, EngineLoadError> {
        tokenizers::Tokenizer::from_file(path)
            .map(|inner| Self { inner })
            .map_err(|err| EngineLoadError::Tokenizer(format!("{}: {err}", path.display())))
    }

    /// Loads `dir/tokenizer.json` if the model directory has one.
    pub fn from_model_dir(dir: &Path) -> Result<Option<Self>, EngineLoadError> {
        let path = dir.join(TOKENIZER_FILE);
        if path.exists() { Self::from_file(&path).map(Some) } else { Ok(None) }
    }

    /// The tokenizer of the model at `path`: a Hugging Face directory's `tokenizer.json` if it has one, a GGUF
    /// file's always (built from its metadata).
    pub fn for_model(path: &Path) -> Result<Option<Self>, EngineLoadError> {
        match ModelFormat::of(path) {
            ModelFormat::HuggingFace => Self::from_model_dir(path),
            ModelFormat::Gguf => GgufFile::open(path)?.tokenizer().map(|inner| Some(Self { inner })),
        }
    }

    /// The tokens of `text`, with the special tokens the tokenizer's post-processor adds (a BOS for LLaMA; none for
    /// the demo model).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        self.encode_with(text, true)
    }

    /// The tokens of `text`, with the post-processor's special tokens only if `add_special_tokens` (a rendered chat
    /// template already holds its own).
    pub fn encode_with(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, TokenizerError> {
        self.inner
            .encode(text, add_special_tokens)
            .map(|encoding| encoding.get_ids().to_vec())
            .map_err(|err| TokenizerError(err.to_string()))
    }

    /// The vocabulary's own string for `id` (for a byte-level vocabulary, its GPT-2 characters), if it has one.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// The text of `ids`, skipping special tokens. Byte sequences that are not valid UTF-8 (a multi-byte character
    /// cut in the middle) come out as U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        self.inner.decode(ids, true).map_err(|err| TokenizerError(err.to_string()))
    }

    /// The tokenizer as the `tokenizers` crate knows it.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}

impl From<tokenizers::Tokenizer> for Tokenizer {
    fn from(inner: tokenizers::Tokenizer) -> Self {
        Self { inner }
    }
}
