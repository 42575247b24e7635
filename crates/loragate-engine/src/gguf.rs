//! GGUF files, llama.cpp's format: one file holding a model's hyper-parameters, its weights (usually quantized), its
//! tokenizer and its chat template — the form in which most users have a model on a CPU.
//!
//! A GGUF file of a LLaMA-family model is read into the same [`Llama`] as a Hugging Face directory:
//!
//! - the hyper-parameters (`{arch}.*` metadata) are described as a `config.json` and go through the same checks
//!   ([`config`]);
//! - the tensors get their Hugging Face names and layout ([`tensors`]): llama.cpp's converter permutes the rows of
//!   the query and key projections of `llama` models for its interleaved RoPE, and loading undoes that permutation
//!   exactly, so the model computes in the Hugging Face layout, RoPE included, and PEFT adapters trained on the
//!   Hugging Face model apply unchanged;
//! - the tokenizer is rebuilt from `tokenizer.ggml.*` as a `tokenizers::Tokenizer` ([`tokenizer`]);
//! - the chat template (`tokenizer.chat_template`) and the BOS/EOS token strings it may name are handed to the HTTP
//!   front ([`gguf_chat_template`]).

mod config;
mod source;
mod tensors;
#[cfg(test)]
mod tests;
mod tokenizer;

use std::collections::HashMap;
use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{Content, Value};

use crate::error::EngineLoadError;
use crate::model::ModelConfig;

pub(crate) use source::GgufSource;
pub(crate) use tensors::read_weights;

/// How a model is stored: what `--model` names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelFormat {
    /// A Hugging Face directory: `config.json`, safetensors, `tokenizer.json`, `tokenizer_config.json`.
    HuggingFace,
    /// One GGUF file (llama.cpp's format).
    Gguf,
}

impl ModelFormat {
    /// A directory is a Hugging Face model; anything else is taken for a GGUF file (a path that does not exist then
    /// fails to open with an error naming it).
    pub fn of(path: &Path) -> Self {
        if path.is_dir() { Self::HuggingFace } else { Self::Gguf }
    }
}

/// A chat template shipped inside a model file (GGUF's `tokenizer.chat_template`), with the special tokens a
/// template may name: what a Hugging Face directory keeps in `tokenizer_config.json`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChatTemplateSource {
    /// The Jinja source.
    pub template: String,
    /// The text of the BOS token (`bos_token` in the template), if the file names one.
    pub bos_token: Option<String>,
    /// The text of the EOS token (`eos_token` in the template), if the file names one.
    pub eos_token: Option<String>,
}

/// The chat template of the GGUF file at `path`, if it has one.
pub fn gguf_chat_template(path: &Path) -> Result<Option<ChatTemplateSource>, EngineLoadError> {
    GgufFile::open(path)?.chat_template()
}

/// An open GGUF file: its metadata and tensor directory (read at open), its tensors read on demand.
pub(crate) struct GgufFile {
    path: PathBuf,
    content: Content,
}

impl GgufFile {
    /// Reads the header of the GGUF file at `path` (metadata and tensor directory, not the tensors).
    pub(crate) fn open(path: &Path) -> Result<Self, EngineLoadError> {
        let file = File::open(path).map_err(|source| EngineLoadError::io(path, source))?;
        let content = Content::read(&mut BufReader::new(file)).map_err(|err| {
            EngineLoadError::weights(format!("{} is not a readable GGUF file: {err}", path.display()))
        })?;
        Ok(Self { path: path.to_owned(), content })
    }

    /// The model's hyper-parameters, checked as a Hugging Face `config.json` would be.
    pub(crate) fn model_config(&self) -> Result<ModelConfig, EngineLoadError> {
        let tied = !self.content.tensor_infos.contains_key(tensors::OUTPUT);
        config::model_config(&self.metadata(), tied)
    }

    /// The tokenizer described by `tokenizer.ggml.*` (`crate::Tokenizer` wraps it: this module does not depend on
    /// that one, which opens GGUF files).
    pub(crate) fn tokenizer(&self) -> Result<tokenizers::Tokenizer, EngineLoadError> {
        tokenizer::tokenizer(&self.metadata())
    }

    /// `tokenizer.chat_template` with the BOS and EOS token texts, if the file has a template.
    pub(crate) fn chat_template(&self) -> Result<Option<ChatTemplateSource>, EngineLoadError> {
        let metadata = self.metadata();
        let Some(template) = metadata.get("tokenizer.chat_template") else { return Ok(None) };
        let template = metadata.string("tokenizer.chat_template", template)?.to_owned();
        let token_text = |key: &str| -> Result<Option<String>, EngineLoadError> {
            let Some(id) = metadata.optional_u64(key)? else { return Ok(None) };
            let tokens = metadata.required("tokenizer.ggml.tokens")?;
            let tokens = metadata.array("tokenizer.ggml.tokens", tokens)?;
            match tokens.get(id as usize) {
                Some(token) => Ok(Some(metadata.string("tokenizer.ggml.tokens", token)?.to_owned())),
                None => Err(EngineLoadError::Tokenizer(format!("{key} ({id}) is outside the vocabulary"))),
            }
        };
        Ok(Some(ChatTemplateSource {
            template,
            bos_token: token_text("tokenizer.ggml.bos_token_id")?,
            eos_token: token_text("tokenizer.ggml.eos_token_id")?,
        }))
    }

    fn metadata(&self) -> Metadata<'_> {
        Metadata { values: &self.content.metadata, path: &self.path }
    }
}

/// Typed access to a GGUF file's metadata, with errors that name the key.
#[derive(Clone, Copy)]
pub(crate) struct Metadata<'a> {
    values: &'a HashMap<String, Value>,
    path: &'a Path,
}

impl<'a> Metadata<'a> {
    pub(crate) fn get(&self, key: &str) -> Option<&'a Value> {
        self.values.get(key)
    }

    pub(crate) fn required(&self, key: &str) -> Result<&'a Value, EngineLoadError> {
        self.get(key)
            .ok_or_else(|| EngineLoadError::config(format!("{}: no {key} in its metadata", self.path.display())))
    }

    fn invalid(&self, key: &str, expected: &str, value: &Value) -> EngineLoadError {
        let shown = format!("{value:?}");
        let shown: String = shown.chars().take(80).collect();
        EngineLoadError::config(format!("{}: {key} should be {expected}, not {shown}", self.path.display()))
    }

    /// Any integer type GGUF writers use, as `u64` (negative values are refused).
    pub(crate) fn u64(&self, key: &str, value: &Value) -> Result<u64, EngineLoadError> {
        let signed = |v: i64| u64::try_from(v).ok();
        let converted = match value {
            Value::U8(v) => Some(u64::from(*v)),
            Value::U16(v) => Some(u64::from(*v)),
            Value::U32(v) => Some(u64::from(*v)),
            Value::U64(v) => Some(*v),
            Value::I8(v) => signed(i64::from(*v)),
            Value::I16(v) => signed(i64::from(*v)),
            Value::I32(v) => signed(i64::from(*v)),
            Value::I64(v) => signed(*v),
            _ => None,
        };
        converted.ok_or_else(|| self.invalid(key, "a non-negative integer", value))
    }

    pub(crate) fn optional_u64(&self, key: &str) -> Result<Option<u64>, EngineLoadError> {
        self.get(key).map(|value| self.u64(key, value)).transpose()
    }

    pub(crate) fn required_u64(&self, key: &str) -> Result<u64, EngineLoadError> {
        self.u64(key, self.required(key)?)
    }

    pub(crate) fn optional_f64(&self, key: &str) -> Result<Option<f64>, EngineLoadError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::F32(v)) => Ok(Some(f64::from(*v))),
            Some(Value::F64(v)) => Ok(Some(*v)),
            Some(other) => Err(self.invalid(key, "a number", other)),
        }
    }

    pub(crate) fn optional_bool(&self, key: &str) -> Result<Option<bool>, EngineLoadError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(v)) => Ok(Some(*v)),
            Some(other) => Err(self.invalid(key, "a boolean", other)),
        }
    }

    pub(crate) fn string(&self, key: &str, value: &'a Value) -> Result<&'a str, EngineLoadError> {
        match value {
            Value::String(text) => Ok(text),
            other => Err(self.invalid(key, "a string", other)),
        }
    }

    pub(crate) fn optional_string(&self, key: &str) -> Result<Option<&'a str>, EngineLoadError> {
        self.get(key).map(|value| self.string(key, value)).transpose()
    }

    pub(crate) fn array(&self, key: &str, value: &'a Value) -> Result<&'a [Value], EngineLoadError> {
        match value {
            Value::Array(values) => Ok(values),
            other => Err(self.invalid(key, "an array", other)),
        }
    }

    /// An array of strings.
    pub(crate) fn strings(&self, key: &str) -> Result<Vec<&'a str>, EngineLoadError> {
        let values = self.array(key, self.required(key)?)?;
        values.iter().map(|value| self.string(key, value)).collect()
    }
}
