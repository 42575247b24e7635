//! The embedded demo: a small byte-level LLaMA-shaped model with random (seeded) weights, and two LoRA adapters,
//! `meow` and `woof`, fine-tuned on it here, in a few seconds, to answer any short prompt with an endless stream
//! of their animal's noise. Written as a real Hugging Face model directory and real PEFT adapter directories, so
//! the demo is served through exactly the loaders a real checkpoint goes through.
//!
//! Everything is deterministic (fixed seeds); nothing is downloaded. [`ensure_demo_files`] caches the result.

mod base;
mod cache;
mod corpus;
mod train;
mod vocab;

use std::path::{Path, PathBuf};

use rand::SeedableRng;
use rand::rngs::StdRng;

pub use cache::{copy_demo_files, default_cache_dir, ensure_demo_files};

/// What HTTP `model` and `/v1/models` call the demo base model.
pub const DEMO_MODEL_NAME: &str = "loragate-demo";

/// Where the demo files are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DemoFiles {
    /// The directory holding everything below.
    pub root: PathBuf,
    /// The base model, a Hugging Face directory (`root/model`).
    pub model_dir: PathBuf,
    /// The adapters' parent directory (`root/adapters`), a natural `--adapter-root`.
    pub adapters_dir: PathBuf,
    /// The `meow` adapter, a PEFT directory (`root/adapters/meow`).
    pub meow_dir: PathBuf,
    /// The `woof` adapter, a PEFT directory (`root/adapters/woof`).
    pub woof_dir: PathBuf,
}

impl DemoFiles {
    /// The layout under `root`.
    pub fn at(root: &Path) -> Self {
        let adapters_dir = root.join("adapters");
        Self {
            root: root.to_owned(),
            model_dir: root.join("model"),
            meow_dir: adapters_dir.join("meow"),
            woof_dir: adapters_dir.join("woof"),
            adapters_dir,
        }
    }
}

/// Why the demo files could not be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DemoError {
    /// Writing or renaming a file failed.
    #[error("demo files: {path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// Building or training the model failed.
    #[error("demo model: {0}")]
    Model(#[from] candle_core::Error),
    /// Building the tokenizer failed.
    #[error("demo tokenizer: {0}")]
    Tokenizer(String),
    /// Writing a JSON file failed.
    #[error("demo config: {0}")]
    Json(#[from] serde_json::Error),
    /// The thread pool that trains the adapters could not be started.
    #[error("demo training threads: {0}")]
    Threads(String),
    /// The written model could not be read back.
    #[error("demo model: {0}")]
    Load(#[from] crate::EngineLoadError),
}

impl DemoError {
    fn io(path: &Path) -> impl FnOnce(std::io::Error) -> Self + '_ {
        move |source| Self::Io { path: path.to_owned(), source }
    }

    fn tokenizer(err: impl std::fmt::Display) -> Self {
        Self::Tokenizer(err.to_string())
    }
}

/// The seed of everything random in the demo.
const SEED: u64 = 0x105a_9a7e;

/// The adapters and what they say.
const ADAPTERS: [(&str, &str); 2] = [("meow", "meow"), ("woof", "woof")];

/// Generates the demo into `out`: `out/model/` (HF model directory) and `out/adapters/{meow,woof}/` (PEFT). Takes a
/// few seconds (the adapters are trained); [`ensure_demo_files`] does it once and caches the result.
pub fn write_demo_files(out: &Path) -> Result<DemoFiles, DemoError> {
    // One thread: candle's many tiny ops lose more to rayon's synchronisation than they gain (several times over
    // when other processes compete for the cores, as parallel tests do), and the result is then the same bits on
    // every machine, whatever its number of cores.
    let pool =
        rayon::ThreadPoolBuilder::new().num_threads(1).build().map_err(|err| DemoError::Threads(err.to_string()))?;
    pool.install(|| generate(out))
}

fn generate(out: &Path) -> Result<DemoFiles, DemoError> {
    let files = DemoFiles::at(out);
    let mut rng = StdRng::seed_from_u64(SEED);
    let model = base::write_base_model(&files.model_dir, &mut rng)?;
    let noises = ADAPTERS.map(|(_, noise)| noise);
    let trained = train::train_adapters(&model, &noises, &base::TRAINING, &mut rng)?;
    for ((name, _), adapter) in ADAPTERS.iter().zip(&trained) {
        base::write_adapter(&files.adapters_dir.join(name), adapter, &base::TRAINING)?;
    }
    Ok(files)
}
