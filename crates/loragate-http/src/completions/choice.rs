//! Choices: the core's per-sequence events turned into OpenAI choice deltas (text, token ids, logprobs, finish
//! reason, version segments). The streamed and the unary responses are both built from these deltas, so they can
//! never disagree.
//!
//! Per token: its logprob entry is recorded at the current text offset, its text goes through the
//! [`IncrementalDecoder`] and then the [`StopWatcher`]. When a stop string appears the choice ends with `stop`: its
//! text ends before the stop string, its token ids end with the token that completed it, and later tokens of that
//! choice are dropped.

use std::collections::BTreeMap;
use std::sync::Arc;

use loragate_core::{AdapterVersion, FinishReason, SampleEvent, Segment, SegmentsBuilder};
use serde::Serialize;

use super::decode::IncrementalDecoder;
use super::stop::{StopWatcher, Watched};
use crate::codec::TextCodec;

/// OpenAI's legacy completion logprobs object. loragate knows only the sampled token's logprob, so each
/// `top_logprobs` entry holds just the sampled token. `text_offset` counts characters (Unicode scalar values) from
/// the start of the choice's text.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub(crate) struct Logprobs {
    tokens: Vec<String>,
    token_logprobs: Vec<f32>,
    top_logprobs: Vec<BTreeMap<String, f32>>,
    text_offset: Vec<usize>,
}

impl Logprobs {
    fn push(&mut self, token: String, logprob: f32, text_offset: usize) {
        self.top_logprobs.push(BTreeMap::from([(token.clone(), logprob)]));
        self.tokens.push(token);
        self.token_logprobs.push(logprob);
        self.text_offset.push(text_offset);
    }

    /// Appends a later delta's entries.
    pub(crate) fn extend(&mut self, later: Logprobs) {
        self.tokens.extend(later.tokens);
        self.token_logprobs.extend(later.token_logprobs);
        self.top_logprobs.extend(later.top_logprobs);
        self.text_offset.extend(later.text_offset);
    }
}

/// What one choice produced since its previous delta.
#[derive(Debug, PartialEq)]
pub(crate) struct ChoiceDelta {
    /// The choice's index.
    pub(crate) index: u32,
    /// New text.
    pub(crate) text: String,
    /// New tokens.
    pub(crate) token_ids: Vec<u32>,
    /// The new tokens' logprobs, if asked for.
    pub(crate) logprobs: Option<Logprobs>,
    /// Set on the choice's last delta.
    pub(crate) finish_reason: Option<FinishReason>,
    /// On the choice's last delta: which adapter version produced which of its tokens.
    pub(crate) segments: Option<Vec<Segment>>,
}

/// One choice in progress.
#[derive(Debug)]
struct Choice {
    index: u32,
    decoder: IncrementalDecoder,
    stop: StopWatcher,
    decoded_chars: usize,
    segments: SegmentsBuilder,
    finished: bool,
}

impl Choice {
    fn delta(&self, with_logprobs: bool) -> ChoiceDelta {
        ChoiceDelta {
            index: self.index,
            text: String::new(),
            token_ids: Vec::new(),
            logprobs: with_logprobs.then(Logprobs::default),
            finish_reason: None,
            segments: None,
        }
    }

    fn finish(&mut self, delta: &mut ChoiceDelta, reason: FinishReason) {
        self.finished = true;
        delta.finish_reason = Some(reason);
        delta.segments = Some(std::mem::take(&mut self.segments).finish());
    }
}

/// The choices of one request.
pub(crate) struct Choices {
    codec: Arc<dyn TextCodec>,
    with_logprobs: bool,
    choices: Vec<Choice>,
}

impl Choices {
    /// `count` choices watching for `stops`.
    pub(crate) fn new(codec: Arc<dyn TextCodec>, count: u32, stops: Arc<[String]>, with_logprobs: bool) -> Self {
        let choices = (0..count)
            .map(|index| Choice {
                index,
                decoder: IncrementalDecoder::default(),
                stop: StopWatcher::new(stops.clone()),
                decoded_chars: 0,
                segments: SegmentsBuilder::default(),
                finished: false,
            })
            .collect();
        Self { codec, with_logprobs, choices }
    }

    /// Takes one event, like [`Choices::on_event`]. When the request has stop strings, the decoding and matching
    /// run on the blocking pool, off the async runtime, so that no request's matching can stall the runtime's
    /// workers; without stop strings there is little to do and it runs inline.
    pub(crate) async fn on_event_off_runtime(mut self, event: SampleEvent) -> (Self, Option<ChoiceDelta>) {
        if !self.choices.iter().any(|choice| choice.stop.is_watching()) {
            let delta = self.on_event(event);
            return (self, delta);
        }
        let work = tokio::task::spawn_blocking(move || {
            let delta = self.on_event(event);
            (self, delta)
        });
        match work.await {
            Ok(done) => done,
            // As if it had run inline: a panic in the matching panics the request's task.
            Err(err) => match err.try_into_panic() {
                Ok(panic) => std::panic::resume_unwind(panic),
                Err(err) => panic!("the blocking pool dropped stop-string matching: {err}"),
            },
        }
    }

    /// Whether every choice has ended (the request's stream may be dropped: nothing more is wanted from it).
    pub(crate) fn all_finished(&self) -> bool {
        self.choices.iter().all(|choice| choice.finished)
    }

    /// Takes one event of the request; returns the delta it makes, if any (events of choices that already ended at
    /// a stop string, and prompt logprobs, make none).
    pub(crate) fn on_event(&mut self, event: SampleEvent) -> Option<ChoiceDelta> {
        match event {
            SampleEvent::PromptLogprobs(_) => None,
            SampleEvent::Tokens { sequence, version, token_ids, logprobs } => {
                self.on_tokens(sequence, version, &token_ids, &logprobs)
            }
            SampleEvent::Finished { sequence, reason, .. } => self.on_finished(sequence, reason),
        }
    }

    fn on_tokens(
        &mut self,
        sequence: u32,
        version: AdapterVersion,
        token_ids: &[u32],
        logprobs: &[f32],
    ) -> Option<ChoiceDelta> {
        let codec = &*self.codec;
        let choice = self.choices.get_mut(sequence as usize).filter(|choice| !choice.finished)?;
        let mut delta = choice.delta(self.with_logprobs);
        for (&token, &logprob) in token_ids.iter().zip(logprobs) {
            if let Some(entries) = &mut delta.logprobs {
                entries.push(codec.decode(&[token]), logprob, choice.decoded_chars);
            }
            delta.token_ids.push(token);
            choice.segments.push(version, 1);
            let text = choice.decoder.push(codec, token);
            choice.decoded_chars += text.chars().count();
            match choice.stop.feed(&text) {
                Watched::Continue(released) => delta.text.push_str(&released),
                Watched::Stopped(released) => {
                    delta.text.push_str(&released);
                    choice.finish(&mut delta, FinishReason::Stop);
                    break;
                }
            }
        }
        Some(delta)
    }

    fn on_finished(&mut self, sequence: u32, reason: FinishReason) -> Option<ChoiceDelta> {
        let codec = &*self.codec;
        let choice = self.choices.get_mut(sequence as usize).filter(|choice| !choice.finished)?;
        let mut delta = choice.delta(self.with_logprobs);
        let rest = choice.decoder.finish(codec);
        let reason = match choice.stop.feed(&rest) {
            Watched::Continue(released) => {
                delta.text = released + &choice.stop.flush();
                reason
            }
            Watched::Stopped(released) => {
                delta.text = released;
                FinishReason::Stop
            }
        };
        choice.finish(&mut delta, reason);
        Some(delta)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_codec::ByteCodec;

    fn choices(count: u32, stops: &[&str], with_logprobs: bool) -> Choices {
        let stops = stops.iter().map(|stop| (*stop).to_owned()).collect();
        Choices::new(Arc::new(ByteCodec), count, stops, with_logprobs)
    }

    fn tokens(sequence: u32, text: &str) -> SampleEvent {
        let token_ids: Vec<u32> = text.bytes().map(u32::from).collect();
        let logprobs = (0..token_ids.len()).map(|i| -0.5 * i as f32).collect();
        SampleEvent::Tokens { sequence, version: AdapterVersion(3), token_ids, logprobs }
    }

    fn finished(sequence: u32, reason: FinishReason) -> SampleEvent {
        SampleEvent::Finished { sequence, reason, segments: Vec::new() }
    }

    #[test]
    fn tokens_become_text_and_the_end_carries_reason_and_segments() {
        let mut choices = choices(1, &[], false);
        let delta = choices.on_event(tokens(0, "meow")).expect("delta");
        assert_eq!((delta.text.as_str(), delta.token_ids.len(), delta.logprobs), ("meow", 4, None));
        let last = choices.on_event(finished(0, FinishReason::Length)).expect("last delta");
        assert_eq!(last.finish_reason, Some(FinishReason::Length));
        assert_eq!(last.segments, Some(vec![Segment { version: AdapterVersion(3), start: 0, end: 4 }]));
        assert!(choices.all_finished());
    }

    /// A byte codec that records which threads decode.
    #[derive(Default)]
    struct ThreadRecordingCodec(std::sync::Mutex<Vec<std::thread::ThreadId>>);

    impl TextCodec for ThreadRecordingCodec {
        fn encode(&self, text: &str) -> Result<Vec<u32>, String> {
            ByteCodec.encode(text)
        }

        fn decode(&self, token_ids: &[u32]) -> String {
            self.0.lock().expect("lock").push(std::thread::current().id());
            ByteCodec.decode(token_ids)
        }
    }

    #[tokio::test]
    async fn with_stop_strings_decoding_and_matching_run_off_the_runtimes_threads() {
        let runtime_thread = std::thread::current().id();
        for (stops, off_runtime, text) in [(vec!["woof".to_owned()], true, "meow "), (vec![], false, "meow woof")] {
            let codec = Arc::new(ThreadRecordingCodec::default());
            let choices = Choices::new(codec.clone(), 1, stops.into(), false);
            let (choices, delta) = choices.on_event_off_runtime(tokens(0, "meow woof")).await;
            assert_eq!(delta.expect("delta").text, text);
            assert_eq!(choices.all_finished(), off_runtime, "only the stop string ends the choice");
            let threads = codec.0.lock().expect("lock").clone();
            assert!(!threads.is_empty());
            assert_eq!(threads.iter().all(|thread| *thread != runtime_thread), off_runtime, "{threads:?}");
        }
    }

    #[test]
    fn a_stop_string_across_chunks_ends_the_choice_and_drops_its_later_tokens() {
        let mut choices = choices(2, &["woof"], false);
        let first = choices.on_event(tokens(0, "meow wo")).expect("delta");
        assert_eq!(first.text, "meow ", "the possible start of the stop string is held back");
        let second = choices.on_event(tokens(0, "of meow")).expect("delta");
        assert_eq!(second.text, "");
        assert_eq!(second.token_ids, b"of".map(u32::from), "tokens end with the one that completed the stop");
        assert_eq!(second.finish_reason, Some(FinishReason::Stop));
        assert_eq!(second.segments, Some(vec![Segment { version: AdapterVersion(3), start: 0, end: 9 }]));
        assert_eq!(choices.on_event(tokens(0, "more")), None, "later tokens of a stopped choice are dropped");
        assert_eq!(choices.on_event(finished(0, FinishReason::Abort)), None);
        assert!(!choices.all_finished(), "choice 1 is still running");
        choices.on_event(finished(1, FinishReason::Length)).expect("choice 1 ends");
        assert!(choices.all_finished());
    }

    #[test]
    fn held_back_text_is_released_or_stopped_when_the_engine_ends_the_choice() {
        let mut choices = choices(1, &["wolf"], false);
        assert_eq!(choices.on_event(tokens(0, "a wo")).expect("delta").text, "a ");
        let last = choices.on_event(finished(0, FinishReason::Abort)).expect("last");
        assert_eq!((last.text.as_str(), last.finish_reason), ("wo", Some(FinishReason::Abort)));
    }

    #[test]
    fn logprobs_hold_each_sampled_token_with_its_text_offset() {
        let mut choices = choices(1, &[], true);
        let mut all = choices.on_event(tokens(0, "hé")).expect("delta").logprobs.expect("asked for");
        all.extend(choices.on_event(tokens(0, "y")).expect("delta").logprobs.expect("asked for"));
        assert_eq!(all.tokens, ["h", "\u{FFFD}", "\u{FFFD}", "y"], "a byte of a split character decodes lossily");
        assert_eq!(all.token_logprobs, [0.0, -0.5, -1.0, 0.0]);
        assert_eq!(all.text_offset, [0, 1, 1, 2], "offsets count characters of the choice's text");
        assert_eq!(all.top_logprobs[1], BTreeMap::from([("\u{FFFD}".to_owned(), -0.5)]));
        let json = serde_json::to_value(&all).expect("json");
        assert_eq!(json["top_logprobs"][0], serde_json::json!({"h": 0.0}));
    }
}
