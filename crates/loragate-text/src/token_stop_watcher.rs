//! Stop strings for fronts that return tokens rather than text (the Tinker front): the same incremental decoding
//! ([`IncrementalDecoder`]) and stop-string matching ([`StopWatcher`]) as every HTTP sampling endpoint, reporting which
//! token completed a stop string.

use std::sync::Arc;

use crate::codec::TextCodec;
use crate::decode::IncrementalDecoder;
use crate::stop::{StopWatcher, Watched};

/// Watches one sequence's tokens for stop strings in its decoded text, across token (and continuation) boundaries.
pub struct TokenStopWatcher {
    codec: Arc<dyn TextCodec>,
    decoder: IncrementalDecoder,
    stop: StopWatcher,
}

impl TokenStopWatcher {
    /// A watcher for `stops` (none of them empty) over text decoded with `codec`.
    pub fn new(codec: Arc<dyn TextCodec>, stops: Arc<[String]>) -> Self {
        Self { codec, decoder: IncrementalDecoder::default(), stop: StopWatcher::new(stops) }
    }

    /// Takes the sequence's next token; `true` when the text up to and including it contains a stop string (the
    /// sequence ends with this token).
    pub fn push(&mut self, token: u32) -> bool {
        let text = self.decoder.push(&*self.codec, token);
        matches!(self.stop.feed(&text), Watched::Stopped { .. })
    }

    /// The sequence ended: `true` when the text held back for an incomplete character completes a stop string.
    pub fn finish(&mut self) -> bool {
        let rest = self.decoder.finish(&*self.codec);
        matches!(self.stop.feed(&rest), Watched::Stopped { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::ByteCodec;

    fn watcher(stops: &[&str]) -> TokenStopWatcher {
        TokenStopWatcher::new(Arc::new(ByteCodec), stops.iter().map(|stop| (*stop).to_owned()).collect())
    }

    /// The index of the token after which `tokens` stop, if they do.
    fn stops_after(stops: &[&str], text: &str) -> Option<usize> {
        let mut watcher = watcher(stops);
        text.bytes().position(|byte| watcher.push(u32::from(byte)))
    }

    #[test]
    fn the_token_that_completes_a_stop_string_ends_the_sequence() {
        assert_eq!(stops_after(&["woof"], "meow woof meow"), Some(8));
        assert_eq!(stops_after(&["woof", "ow"], "meow woof"), Some(3), "the earliest stop string wins");
        assert_eq!(stops_after(&["wolf"], "a woof"), None);
        assert_eq!(stops_after(&["€"], "a€"), Some(3), "a character split across tokens completes on its last byte");
    }

    #[test]
    fn held_back_text_is_checked_when_the_sequence_ends() {
        let mut watcher = watcher(&["\u{FFFD}"]);
        assert!(!watcher.push(u32::from(b'a')) && !watcher.push(0xE2), "an incomplete character is held back");
        assert!(watcher.finish(), "flushed lossily at the end, it completes the stop string");
    }
}
