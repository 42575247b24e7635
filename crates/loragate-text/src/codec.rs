//! The text codec: how the fronts turn text prompts (and rendered chat templates) into token ids, and token ids back
//! into text. The trait lives here, below the fronts that consume it (HTTP, Tinker); the binary wraps the engine's
//! tokenizer in it.

/// Converts between text and the served model's token ids.
///
/// Implementations must be cheap enough to call on every generated token (the front decodes incrementally, a few
/// tokens at a time) and must not block for long: they run on the async runtime.
pub trait TextCodec: Send + Sync + 'static {
    /// The token ids of `text`. With `add_special_tokens`, the special tokens the model's tokenizer adds around a
    /// prompt (a BOS for LLaMA) are added, as for completion prompts; chat prompts, whose template writes its own,
    /// are encoded without. An error says, in words for the caller, why `text` cannot be encoded.
    fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, String>;

    /// The text of `token_ids`. Lossy: bytes that are not valid UTF-8 (including a character cut in half at the end)
    /// become U+FFFD; special tokens decode to whatever the implementation chooses (usually nothing).
    fn decode(&self, token_ids: &[u32]) -> String;

    /// The vocabulary's own string for one token (Hugging Face's `convert_ids_to_tokens`), if it has one.
    fn token_str(&self, token_id: u32) -> Option<String>;
}
