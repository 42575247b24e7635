//! Stop strings, watched in a choice's decoded text as it grows. Text that could be the start of a stop string is
//! held back until the next piece shows whether it is one, so a stop string split across tokens or chunks is
//! still found and never sent to a streaming client.
//!
//! The request side caps how many stop strings a request gives and how long they are
//! ([`check_stop_strings`](crate::check_stop_strings)), and held-back text is always shorter than the longest one, so
//! watching one piece of text costs at most a few microseconds' worth of comparisons. The HTTP front matches off the
//! async runtime anyway, so that no request's stop strings can stall others.

use std::sync::Arc;

/// What the watcher says about a piece of text.
#[derive(Debug, PartialEq, Eq)]
pub enum Watched {
    /// No stop string yet; this much text is safe to release (the rest is held back).
    Continue(String),
    /// A stop string appeared.
    Stopped {
        /// The text before it, to release as the choice's last.
        before: String,
        /// The stop string that appeared.
        stop: String,
    },
}

/// Watches one choice's text for the request's stop strings.
#[derive(Debug)]
pub struct StopWatcher {
    stops: Arc<[String]>,
    /// The longest stop string's length: held-back text is always shorter.
    longest: usize,
    held: String,
}

impl StopWatcher {
    /// A watcher for `stops` (none empty: the request side checks them).
    pub fn new(stops: Arc<[String]>) -> Self {
        let longest = stops.iter().map(String::len).max().unwrap_or(0);
        Self { stops, longest, held: String::new() }
    }

    /// Whether there is anything to watch for.
    pub fn is_watching(&self) -> bool {
        !self.stops.is_empty()
    }

    /// Takes the next piece of text.
    pub fn feed(&mut self, text: &str) -> Watched {
        if self.stops.is_empty() {
            return Watched::Continue(text.to_owned());
        }
        self.held.push_str(text);
        let earliest =
            self.stops.iter().filter_map(|stop| Some((self.held.find(stop.as_str())?, stop))).min_by_key(|(at, _)| *at);
        if let Some((at, stop)) = earliest {
            let stop = stop.clone();
            let mut before = std::mem::take(&mut self.held);
            before.truncate(at);
            return Watched::Stopped { before, stop };
        }
        // Hold back the longest tail that some stop string starts with (only tails shorter than the longest stop
        // string can be one).
        let shortest_start = self.held.len().saturating_sub(self.longest.saturating_sub(1));
        let keep_from = self
            .held
            .char_indices()
            .map(|(index, _)| index)
            .filter(|&index| index >= shortest_start)
            .find(|&index| self.stops.iter().any(|stop| stop.starts_with(&self.held[index..])))
            .unwrap_or(self.held.len());
        let kept = self.held.split_off(keep_from);
        Watched::Continue(std::mem::replace(&mut self.held, kept))
    }

    /// Releases the held-back text (the choice ended without a stop string).
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn watcher(stops: &[&str]) -> StopWatcher {
        StopWatcher::new(stops.iter().map(|stop| (*stop).to_owned()).collect())
    }

    /// Feeds `pieces`; returns the released text and whether a stop string ended it.
    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let mut watcher = watcher(stops);
        let mut released = String::new();
        for piece in pieces {
            match watcher.feed(piece) {
                Watched::Continue(text) => released.push_str(&text),
                Watched::Stopped { before, .. } => return (released + &before, true),
            }
        }
        (released + &watcher.flush(), false)
    }

    #[test]
    fn without_stop_strings_text_passes_at_once() {
        let mut watcher = watcher(&[]);
        assert_eq!(watcher.feed("meow"), Watched::Continue("meow".into()));
    }

    #[test]
    fn a_stop_string_inside_one_piece_truncates_before_it() {
        assert_eq!(run(&["woof"], &["meow woof meow"]), ("meow ".into(), true));
    }

    #[test]
    fn a_stop_string_split_across_pieces_is_found_and_never_released() {
        let mut watcher = watcher(&["\n\n"]);
        assert_eq!(watcher.feed("meow\n"), Watched::Continue("meow".into()), "the possible start is held back");
        assert_eq!(watcher.feed("\nmore"), Watched::Stopped { before: String::new(), stop: "\n\n".into() });
        assert_eq!(run(&["woof"], &["me", "ow w", "o", "of!"]), ("meow ".into(), true));
    }

    #[test]
    fn a_false_start_is_released_once_it_cannot_match() {
        let mut watcher = watcher(&["wolf"]);
        assert_eq!(watcher.feed("a wo"), Watched::Continue("a ".into()));
        assert_eq!(watcher.feed("of"), Watched::Continue("woof".into()));
        assert_eq!(run(&["wolf"], &["a wo"]), ("a wo".into(), false), "held text is flushed at the end");
    }

    #[test]
    fn the_earliest_of_several_stop_strings_wins() {
        assert_eq!(run(&["meow", "ow"], &["a cow says meow"]), ("a c".into(), true));
        let mut watcher = watcher(&["meow", "ow"]);
        assert_eq!(watcher.feed("a cow"), Watched::Stopped { before: "a c".into(), stop: "ow".into() });
        assert_eq!(run(&["xyz", "b"], &["a", "bc"]), ("a".into(), true));
    }

    #[test]
    fn held_back_text_stays_shorter_than_the_longest_stop_string() {
        let mut watcher = watcher(&["aaaab", "xy"]);
        for _ in 0..1000 {
            assert!(matches!(watcher.feed("a"), Watched::Continue(_)));
            assert!(watcher.held.len() < 5, "{}", watcher.held.len());
        }
        assert_eq!(watcher.feed("b"), Watched::Stopped { before: String::new(), stop: "aaaab".to_owned() });
    }

    #[test]
    fn multibyte_text_is_cut_at_character_boundaries() {
        assert_eq!(run(&["€!"], &["1€", "2€", "!3"]), ("1€2".into(), true));
        let mut watcher = watcher(&["€!"]);
        assert_eq!(watcher.feed("é€"), Watched::Continue("é".into()));
    }
}
