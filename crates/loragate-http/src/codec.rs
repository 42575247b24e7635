//! The text codec: how this front turns OpenAI's text prompts into token ids and generated token ids back into
//! text. The trait lives here, in the crate that consumes it; the binary wraps the engine's tokenizer in it.

/// Converts between text and the served model's token ids.
///
/// Implementations must be cheap enough to call on every generated token (the front decodes incrementally, a few
/// tokens at a time) and must not block for long: they run on the async runtime.
pub trait TextCodec: Send + Sync + 'static {
    /// The token ids of `text`, as the model expects its prompt (special tokens such as BOS included if the model
    /// wants them). An error says, in words for the caller, why `text` cannot be encoded.
    fn encode(&self, text: &str) -> Result<Vec<u32>, String>;

    /// The text of `token_ids`. Lossy: bytes that are not valid UTF-8 (including a character cut in half at the end)
    /// become U+FFFD; special tokens decode to whatever the implementation chooses (usually nothing).
    fn decode(&self, token_ids: &[u32]) -> String;
}
