//! Test doubles shared by this crate's tests.

use loragate_http::TextCodec;

/// Text ↔ UTF-8 bytes, like the demo model's vocabulary (ids from 256 up decode to nothing).
pub(crate) struct ByteCodec;

impl TextCodec for ByteCodec {
    fn encode(&self, text: &str, _add_special_tokens: bool) -> Result<Vec<u32>, String> {
        Ok(text.bytes().map(u32::from).collect())
    }

    fn decode(&self, token_ids: &[u32]) -> String {
        let bytes: Vec<u8> = token_ids.iter().filter_map(|&id| u8::try_from(id).ok()).collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    fn token_str(&self, token_id: u32) -> Option<String> {
        u8::try_from(token_id).ok().map(|byte| char::from(byte).to_string())
    }
}
