//! Incremental detokenization: turns a choice's tokens into text one token at a time, decoding only a small window
//! (the tokens of the previous step and the new ones, as TGI and vLLM do), so that a long generation costs linear
//! work and tokenizers that treat a word's first piece specially decode the same as the whole text would. A token
//! that ends in the middle of a character (byte-level vocabularies split UTF-8) yields no text until the character
//! completes.

use crate::codec::TextCodec;

/// The most tokens held back waiting for a character to complete (a UTF-8 character is at most 4 bytes); past it
/// the text is released with its replacement characters, so garbage bytes cannot grow the window without bound.
const MAX_HELD_TOKENS: usize = 8;

/// Decodes one choice's tokens incrementally.
#[derive(Debug, Default)]
pub struct IncrementalDecoder {
    tokens: Vec<u32>,
    /// Start of the window decoded for context.
    prefix_offset: usize,
    /// End of the tokens whose text was already released.
    read_offset: usize,
}

impl IncrementalDecoder {
    /// Takes one more token; returns the text it completes (often empty while a character is incomplete).
    pub fn push(&mut self, codec: &dyn TextCodec, token: u32) -> String {
        self.tokens.push(token);
        let held = self.tokens.len() - self.read_offset;
        self.release(codec, held >= MAX_HELD_TOKENS)
    }

    /// Releases whatever text is still held (the choice ended).
    pub fn finish(&mut self, codec: &dyn TextCodec) -> String {
        if self.read_offset == self.tokens.len() {
            return String::new();
        }
        self.release(codec, true)
    }

    fn release(&mut self, codec: &dyn TextCodec, even_if_incomplete: bool) -> String {
        let prefix = codec.decode(&self.tokens[self.prefix_offset..self.read_offset]);
        let text = codec.decode(&self.tokens[self.prefix_offset..]);
        if !even_if_incomplete && text.ends_with(char::REPLACEMENT_CHARACTER) {
            return String::new();
        }
        self.prefix_offset = self.read_offset;
        self.read_offset = self.tokens.len();
        new_suffix(&prefix, &text).to_owned()
    }
}

/// The text of `tokens` decoded one by one, and where each token's text starts in it (in characters).
pub fn decode_with_offsets(codec: &dyn TextCodec, tokens: &[u32]) -> (String, Vec<usize>) {
    let mut decoder = IncrementalDecoder::default();
    let mut text = String::new();
    let mut chars = 0;
    let mut offsets = Vec::with_capacity(tokens.len());
    for &token in tokens {
        offsets.push(chars);
        let piece = decoder.push(codec, token);
        chars += piece.chars().count();
        text.push_str(&piece);
    }
    text.push_str(&decoder.finish(codec));
    (text, offsets)
}

/// What `text` adds to `prefix`. If decoding more tokens changed earlier characters (some tokenizers merge), the
/// text past the old prefix's length is taken: text already released cannot be taken back.
fn new_suffix<'a>(prefix: &str, text: &'a str) -> &'a str {
    if let Some(suffix) = text.strip_prefix(prefix) {
        return suffix;
    }
    let mut cut = prefix.len().min(text.len());
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    &text[cut..]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::ByteCodec;

    fn decode_one_by_one(tokens: &[u32]) -> Vec<String> {
        let mut decoder = IncrementalDecoder::default();
        let mut pieces: Vec<String> = tokens.iter().map(|&token| decoder.push(&ByteCodec, token)).collect();
        pieces.push(decoder.finish(&ByteCodec));
        pieces
    }

    #[test]
    fn ascii_is_released_token_by_token() {
        assert_eq!(decode_one_by_one(b"meow".map(u32::from).as_slice()), ["m", "e", "o", "w", ""]);
    }

    #[test]
    fn a_character_split_across_tokens_is_released_once_complete() {
        let tokens: Vec<u32> = "a€b".bytes().map(u32::from).collect();
        assert_eq!(decode_one_by_one(&tokens), ["a", "", "", "€", "b", ""]);
    }

    #[test]
    fn an_incomplete_character_at_the_end_is_flushed_lossily() {
        let mut tokens: Vec<u32> = "ok".bytes().map(u32::from).collect();
        tokens.extend([0xE2, 0x82]);
        assert_eq!(decode_one_by_one(&tokens).concat(), "ok\u{FFFD}");
    }

    #[test]
    fn invalid_bytes_are_not_held_forever() {
        let pieces = decode_one_by_one(&[0xFF; 20]);
        let released_before_the_end: String = pieces[..20].concat();
        assert!(!released_before_the_end.is_empty(), "{pieces:?}");
        assert_eq!(pieces.concat().chars().count(), 20);
    }

    #[test]
    fn whole_texts_come_with_each_tokens_character_offset() {
        let tokens: Vec<u32> = "a€b".bytes().map(u32::from).collect();
        assert_eq!(decode_with_offsets(&ByteCodec, &tokens), ("a€b".to_owned(), vec![0, 1, 1, 1, 2]));
    }

    #[test]
    fn a_tokenizer_that_rewrites_earlier_text_never_repeats_released_text() {
        assert_eq!(new_suffix("ab", "abc"), "c");
        assert_eq!(new_suffix("ab", "aXc"), "c");
        assert_eq!(new_suffix("ab", "€x"), "€x", "cut at a character boundary within the text");
    }
}
