//! The HTTP front's text codec over the engine's tokenizer.

use loragate_engine::Tokenizer;
use loragate_text::TextCodec;

/// Encodes text prompts and decodes generated tokens with the served model's `tokenizer.json`. A model without one
/// still serves token-id prompts; text prompts then get a clear error naming the missing file.
pub(crate) struct TokenizerCodec {
    tokenizer: Option<Tokenizer>,
}

impl TokenizerCodec {
    /// A codec over the model's tokenizer, if it has one.
    pub(crate) fn new(tokenizer: Option<Tokenizer>) -> Self {
        Self { tokenizer }
    }
}

impl TextCodec for TokenizerCodec {
    fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, String> {
        let Some(tokenizer) = &self.tokenizer else {
            return Err("this model has no tokenizer.json, so prompts must be token ids".to_owned());
        };
        tokenizer.encode_with(text, add_special_tokens).map_err(|err| err.to_string())
    }

    fn token_str(&self, token_id: u32) -> Option<String> {
        self.tokenizer.as_ref()?.id_to_token(token_id)
    }

    fn decode(&self, token_ids: &[u32]) -> String {
        let Some(tokenizer) = &self.tokenizer else { return String::new() };
        tokenizer.decode(token_ids).unwrap_or_else(|err| {
            tracing::warn!(%err, "generated tokens could not be decoded; returning no text for them");
            String::new()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_tokenizer_text_prompts_are_refused_by_name_and_tokens_decode_to_nothing() {
        let codec = TokenizerCodec::new(None);
        let refused = codec.encode("hello", true).expect_err("no tokenizer");
        assert!(refused.contains("tokenizer.json"), "{refused}");
        assert_eq!(codec.decode(&[1, 2, 3]), "");
        assert_eq!(codec.token_str(1), None);
    }
}
