//! Test support (the `testing` feature, for other crates' tests and benchmarks): a byte-level codec, like the demo
//! model's vocabulary: token ids 0–255 are the bytes of UTF-8 text, ids from 256 up are special tokens that decode to
//! nothing. With special tokens added, a prompt starts with [`BOS`].

use crate::codec::TextCodec;

/// The special token a prompt starts with when special tokens are added.
pub const BOS: u32 = 256;

/// Text ↔ UTF-8 bytes.
pub struct ByteCodec;

impl TextCodec for ByteCodec {
    fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, String> {
        let bos = add_special_tokens.then_some(BOS);
        Ok(bos.into_iter().chain(text.bytes().map(u32::from)).collect())
    }

    fn decode(&self, token_ids: &[u32]) -> String {
        let bytes: Vec<u8> = token_ids.iter().filter_map(|&id| u8::try_from(id).ok()).collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    fn token_str(&self, token_id: u32) -> Option<String> {
        match token_id {
            0..=255 => Some(format!("<0x{token_id:02X}>")),
            BOS => Some("<s>".to_owned()),
            _ => None,
        }
    }
}
