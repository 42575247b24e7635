//! What the coordinator must know about the served model.

/// What the coordinator must know about the served model to validate requests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelInfo {
    /// Token ids must be below this.
    pub vocab_size: u32,
    /// Prompt plus generated tokens may not exceed this.
    pub context_length: u32,
    /// The model's end-of-sequence tokens (generation stops after one unless `ignore_eos`).
    pub eos_token_ids: Vec<u32>,
}
