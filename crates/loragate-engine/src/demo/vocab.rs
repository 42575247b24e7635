//! The demo vocabulary: byte-level, so token ids 0–255 are exactly the bytes of UTF-8 text, and the special tokens
//! follow at 256+. Saved as a real `tokenizer.json` built with the `tokenizers` crate (GPT-2's byte-to-character
//! mapping, a BPE without merges, the byte-level decoder).

use std::path::Path;

use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{AddedToken, Tokenizer};

use super::DemoError;

/// Beginning of sequence (unused by the demo's training, kept for HF-style prompts).
pub(super) const BOS: u32 = 256;
/// End of sequence: generation stops after it.
pub(super) const EOS: u32 = 257;
/// Padding.
pub(super) const PAD: u32 = 258;
/// Unknown (never produced by byte-level encoding; HF tooling expects one).
pub(super) const UNK: u32 = 259;
/// The vocabulary size: 256 bytes and 4 specials.
pub(super) const VOCAB_SIZE: usize = 260;

const SPECIALS: [(u32, &str); 4] = [(BOS, "<s>"), (EOS, "</s>"), (PAD, "<pad>"), (UNK, "<unk>")];

/// The demo tokenizer.
pub(super) fn build_tokenizer() -> Result<Tokenizer, DemoError> {
    let mapping = byte_to_char();
    let vocab: Vocab = (0..=255u8).map(|byte| (mapping[byte as usize].to_string(), u32::from(byte))).collect();
    let model = BPE::builder().vocab_and_merges(vocab, Vec::new()).build().map_err(DemoError::tokenizer)?;
    let mut tokenizer = Tokenizer::new(model);
    tokenizer.with_pre_tokenizer(Some(ByteLevel::new(false, false, false)));
    tokenizer.with_decoder(Some(ByteLevel::new(false, false, false)));
    tokenizer
        .add_special_tokens(SPECIALS.iter().map(|(_, content)| AddedToken::from(*content, true)))
        .map_err(DemoError::tokenizer)?;
    for (id, content) in SPECIALS {
        if tokenizer.token_to_id(content) != Some(id) {
            return Err(DemoError::Tokenizer(format!("{content} did not get id {id}")));
        }
    }
    Ok(tokenizer)
}

/// Writes `tokenizer.json` into `dir`.
pub(super) fn write_tokenizer(dir: &Path) -> Result<(), DemoError> {
    build_tokenizer()?.save(dir.join(crate::TOKENIZER_FILE), true).map_err(DemoError::tokenizer)
}

/// The special tokens' names, as `tokenizer_config.json`-style entries.
pub(super) fn special_token_names() -> [(u32, &'static str); 4] {
    SPECIALS
}

/// GPT-2's reversible mapping of bytes to printable characters (what the byte-level pre-tokenizer applies).
fn byte_to_char() -> [char; 256] {
    let printable = |byte: u8| matches!(byte, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut mapping = ['\0'; 256];
    let mut next_unprintable = 256u32;
    for byte in 0..=255u8 {
        mapping[byte as usize] = if printable(byte) {
            char::from(byte)
        } else {
            let substitute = char::from_u32(next_unprintable).unwrap_or(char::REPLACEMENT_CHARACTER);
            next_unprintable += 1;
            substitute
        };
    }
    mapping
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_are_their_own_ids_and_specials_follow() {
        let tokenizer = crate::Tokenizer::from(build_tokenizer().expect("tokenizer"));
        assert_eq!(tokenizer.encode("meow").expect("encode"), vec![109, 101, 111, 119]);
        let text = "Héllo, wörld!\n\t~ 🐈";
        let ids = tokenizer.encode(text).expect("encode");
        assert_eq!(ids, text.bytes().map(u32::from).collect::<Vec<_>>());
        assert_eq!(tokenizer.decode(&ids).expect("decode"), text);
        let mut with_eos = ids.clone();
        with_eos.push(EOS);
        assert_eq!(tokenizer.decode(&with_eos).expect("decode"), text, "specials are skipped");
        assert_eq!(tokenizer.encode("</s>").expect("encode"), vec![EOS]);
        assert_eq!(tokenizer.decode(&[0xF0, 0x9F]).expect("decode"), "\u{FFFD}", "a cut character is lossy");
    }
}
