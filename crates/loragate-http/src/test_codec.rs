//! A byte-level codec for tests, like the demo model's vocabulary: token ids 0–255 are the bytes of UTF-8 text,
//! ids from 256 up are special tokens that decode to nothing.

use crate::codec::TextCodec;

/// Text ↔ UTF-8 bytes.
pub(crate) struct ByteCodec;

impl TextCodec for ByteCodec {
    fn encode(&self, text: &str) -> Result<Vec<u32>, String> {
        Ok(text.bytes().map(u32::from).collect())
    }

    fn decode(&self, token_ids: &[u32]) -> String {
        let bytes: Vec<u8> = token_ids.iter().filter_map(|&id| u8::try_from(id).ok()).collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }
}
