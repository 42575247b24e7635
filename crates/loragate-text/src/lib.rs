//! The text kit loragate's fronts share, below them all: how generated tokens become text and where stop strings end
//! a sequence. The HTTP front (OpenAI, vLLM and SGLang APIs) renders text with it; the Tinker front, which answers
//! tokens, watches its stop strings with it; neither depends on the other.
//!
//! - [`TextCodec`]: text ↔ the served model's token ids. The fronts consume it; the binary implements it over the
//!   engine's tokenizer.
//! - [`IncrementalDecoder`] (and [`decode_with_offsets`]): a sequence's tokens become text one token at a time, a
//!   character split across tokens released once complete.
//! - [`StopWatcher`]: stop strings watched in text as it grows, across piece boundaries, holding back what could be
//!   the start of one; [`TokenStopWatcher`] the same over tokens, saying which token completed a stop string.
//! - [`check_stop_strings`]: the one check every front's stop strings pass ([`MAX_STOP_STRINGS`] of at most
//!   [`MAX_STOP_STRING_BYTES`] bytes, none empty), which bounds what watching them costs.
//!
//! With the `testing` feature, `testing::ByteCodec` is a byte-level codec for tests.
//!
//! ```
//! use loragate_text::{StopWatcher, Watched};
//!
//! let mut watcher = StopWatcher::new(vec!["\n\n".to_owned()].into());
//! // The newline could start the stop string: it is held back until the next piece shows.
//! assert_eq!(watcher.feed("meow\n"), Watched::Continue("meow".to_owned()));
//! assert_eq!(watcher.feed("\nwoof"), Watched::Stopped { before: String::new(), stop: "\n\n".to_owned() });
//! ```

mod codec;
mod decode;
mod stop;
mod stop_strings;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
mod token_stop_watcher;

pub use codec::TextCodec;
pub use decode::{IncrementalDecoder, decode_with_offsets};
pub use stop::{StopWatcher, Watched};
pub use stop_strings::{MAX_STOP_STRING_BYTES, MAX_STOP_STRINGS, check_stop_strings};
pub use token_stop_watcher::TokenStopWatcher;
