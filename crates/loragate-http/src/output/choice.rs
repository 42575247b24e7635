//! Choices: the core's per-sequence events of one request turned into choice deltas (text, token ids, logprobs with
//! their alternatives, finish reason and what matched, version segments, and on each choice's first delta the
//! prompt's logprobs).
//!
//! Per token: its logprob entry is recorded at the current text offset, its text goes through the
//! [`IncrementalDecoder`] and then, once the choice has `min_tokens` tokens, the [`StopWatcher`]. When a stop string
//! appears the choice ends with `stop`: its text ends before the stop string (or just after it, with
//! `include_stop_str`), its token ids end with the token that completed it, and later tokens of that choice are
//! dropped.

use std::sync::Arc;

use loragate_core::{AdapterVersion, FinishReason, SampleEvent, Segment, SegmentsBuilder, TopLogprobs};
use loragate_text::{IncrementalDecoder, StopWatcher, TextCodec, Watched};

/// How every choice of a request turns tokens into text, and what it records.
#[derive(Clone, Debug, Default)]
pub(crate) struct TextOptions {
    /// Strings that end a choice (none empty).
    pub(crate) stops: Arc<[String]>,
    /// Keep a matched stop string at the end of the text (vLLM's `include_stop_str_in_output`, SGLang's
    /// `no_stop_trim`).
    pub(crate) include_stop_str: bool,
    /// Stop strings are not watched before a choice has this many tokens (vLLM's `min_tokens`).
    pub(crate) min_tokens: u32,
    /// Record each token's logprob (and alternatives, if the engine sends them).
    pub(crate) with_logprobs: bool,
}

/// The logprobs of a request's prompt, as the engine reported them.
#[derive(Debug, PartialEq)]
pub(crate) struct PromptLogprobs {
    /// The prompt.
    pub(crate) token_ids: Arc<[u32]>,
    /// One per prompt token, the first NaN.
    pub(crate) logprobs: Vec<f32>,
    /// With alternatives asked for: one per prompt token (the first empty).
    pub(crate) top: Option<Vec<TopLogprobs>>,
}

/// One generated token's logprob entry.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct TokenLogprob {
    /// The token.
    pub(crate) token: u32,
    /// Its raw logprob.
    pub(crate) logprob: f32,
    /// Its rank and the most likely tokens, if asked for.
    pub(crate) top: Option<TopLogprobs>,
    /// Where its text starts in the choice's text, in characters.
    pub(crate) text_offset: usize,
}

/// What ended a choice with `stop`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Matched {
    /// The engine sampled an end-of-sequence or stop token (the choice's last token).
    Token(u32),
    /// The front found a stop string in the text.
    Text(String),
}

/// How a choice ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Finish {
    /// Why.
    pub(crate) reason: FinishReason,
    /// With `stop`: what matched.
    pub(crate) matched: Option<Matched>,
}

/// What one choice produced since its previous delta.
#[derive(Debug, PartialEq)]
pub(crate) struct ChoiceDelta {
    /// The choice's index in the response: prompt index × n + sample index.
    pub(crate) index: u32,
    /// Which prompt of the HTTP request the choice belongs to.
    pub(crate) prompt_index: usize,
    /// New text.
    pub(crate) text: String,
    /// New tokens.
    pub(crate) token_ids: Vec<u32>,
    /// The new tokens' logprobs, if asked for (one per token).
    pub(crate) logprobs: Vec<TokenLogprob>,
    /// On the choice's first delta, if prompt logprobs were asked for.
    pub(crate) prompt: Option<Arc<PromptLogprobs>>,
    /// Set on the choice's last delta.
    pub(crate) finish: Option<Finish>,
    /// On the choice's last delta: which adapter version produced which of its tokens.
    pub(crate) segments: Option<Vec<Segment>>,
    /// The adapter version that produced this delta's tokens (one event of the core, so one version: a delta never
    /// mixes versions); on a delta without tokens, the version of the choice's latest token (`None` before any).
    pub(crate) version: Option<AdapterVersion>,
}

/// One choice in progress.
#[derive(Debug)]
struct Choice {
    index: u32,
    decoder: IncrementalDecoder,
    stop: StopWatcher,
    tokens: u32,
    last_token: Option<u32>,
    decoded_chars: usize,
    segments: SegmentsBuilder,
    last_version: Option<AdapterVersion>,
    started: bool,
    finished: bool,
}

/// The choices of one request (one prompt).
pub(crate) struct Choices {
    codec: Arc<dyn TextCodec>,
    options: Arc<TextOptions>,
    prompt_index: usize,
    prompt_token_ids: Arc<[u32]>,
    prompt_logprobs: Option<Vec<f32>>,
    prompt_top: Option<Vec<TopLogprobs>>,
    prompt: Option<Arc<PromptLogprobs>>,
    choices: Vec<Choice>,
}

impl Choices {
    /// The `count` choices of prompt `prompt_index` (`prompt_token_ids`), indexed from `prompt_index × count`.
    pub(crate) fn new(
        codec: Arc<dyn TextCodec>,
        options: Arc<TextOptions>,
        prompt_index: usize,
        prompt_token_ids: Arc<[u32]>,
        count: u32,
    ) -> Self {
        let first_index = u32::try_from(prompt_index).unwrap_or(u32::MAX).saturating_mul(count);
        let choices = (0..count)
            .map(|sample| Choice {
                index: first_index + sample,
                decoder: IncrementalDecoder::default(),
                stop: StopWatcher::new(options.stops.clone()),
                tokens: 0,
                last_token: None,
                decoded_chars: 0,
                segments: SegmentsBuilder::default(),
                last_version: None,
                started: false,
                finished: false,
            })
            .collect();
        Self {
            codec,
            options,
            prompt_index,
            prompt_token_ids,
            prompt_logprobs: None,
            prompt_top: None,
            prompt: None,
            choices,
        }
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
            SampleEvent::PromptLogprobs(logprobs) => {
                self.prompt_logprobs = Some(logprobs);
                None
            }
            SampleEvent::PromptTopLogprobs(top) => {
                self.prompt_top = Some(top);
                None
            }
            SampleEvent::Tokens { sequence, version, kv_version, token_ids, logprobs, top_logprobs } => {
                self.on_tokens(sequence, (version, kv_version), &token_ids, &logprobs, top_logprobs)
            }
            SampleEvent::Finished { sequence, reason, .. } => self.on_finished(sequence, reason),
        }
    }

    /// A new delta of choice `sequence`, if it is still running (the prompt's logprobs on its first).
    fn delta(&mut self, sequence: u32) -> Option<(usize, ChoiceDelta)> {
        let position = sequence as usize;
        if self.choices.get(position).is_none_or(|choice| choice.finished) {
            return None;
        }
        if self.prompt.is_none()
            && let Some(logprobs) = self.prompt_logprobs.take()
        {
            let top = self.prompt_top.take();
            let token_ids = self.prompt_token_ids.clone();
            self.prompt = Some(Arc::new(PromptLogprobs { token_ids, logprobs, top }));
        }
        let choice = &mut self.choices[position];
        let prompt = if choice.started { None } else { self.prompt.clone() };
        choice.started = true;
        let delta = ChoiceDelta {
            index: choice.index,
            prompt_index: self.prompt_index,
            text: String::new(),
            token_ids: Vec::new(),
            logprobs: Vec::new(),
            prompt,
            finish: None,
            segments: None,
            version: choice.last_version,
        };
        Some((position, delta))
    }

    fn on_tokens(
        &mut self,
        sequence: u32,
        (version, kv_version): (AdapterVersion, AdapterVersion),
        token_ids: &[u32],
        logprobs: &[f32],
        top_logprobs: Vec<TopLogprobs>,
    ) -> Option<ChoiceDelta> {
        let (position, mut delta) = self.delta(sequence)?;
        let (codec, options) = (&*self.codec, &*self.options);
        let choice = &mut self.choices[position];
        choice.last_version = Some(version);
        delta.version = Some(version);
        let mut tops = top_logprobs.into_iter();
        for (&token, &logprob) in token_ids.iter().zip(logprobs) {
            let top = tops.next();
            if options.with_logprobs {
                delta.logprobs.push(TokenLogprob { token, logprob, top, text_offset: choice.decoded_chars });
            }
            delta.token_ids.push(token);
            choice.segments.push(version, kv_version, 1);
            choice.tokens += 1;
            choice.last_token = Some(token);
            let text = choice.decoder.push(codec, token);
            choice.decoded_chars += text.chars().count();
            if choice.tokens < options.min_tokens {
                delta.text.push_str(&text);
                continue;
            }
            match choice.stop.feed(&text) {
                Watched::Continue(released) => delta.text.push_str(&released),
                Watched::Stopped { before, stop } => {
                    delta.text.push_str(&before);
                    let matched = stopped_at(&mut delta.text, stop, options);
                    choice.finish(&mut delta, FinishReason::Stop, Some(matched));
                    break;
                }
            }
        }
        Some(delta)
    }

    fn on_finished(&mut self, sequence: u32, reason: FinishReason) -> Option<ChoiceDelta> {
        let (position, mut delta) = self.delta(sequence)?;
        let (codec, options) = (&*self.codec, &*self.options);
        let choice = &mut self.choices[position];
        let rest = choice.decoder.finish(codec);
        let (reason, matched) = match choice.stop.feed(&rest) {
            Watched::Continue(released) => {
                delta.text = released + &choice.stop.flush();
                let matched = (reason == FinishReason::Stop).then_some(choice.last_token.map(Matched::Token)).flatten();
                (reason, matched)
            }
            Watched::Stopped { before, stop } => {
                delta.text = before;
                let matched = stopped_at(&mut delta.text, stop, options);
                (FinishReason::Stop, Some(matched))
            }
        };
        choice.finish(&mut delta, reason, matched);
        Some(delta)
    }
}

/// The match of stop string `stop`, appended to `text` first if the request keeps matched stop strings.
fn stopped_at(text: &mut String, stop: String, options: &TextOptions) -> Matched {
    if options.include_stop_str {
        text.push_str(&stop);
    }
    Matched::Text(stop)
}

impl Choice {
    fn finish(&mut self, delta: &mut ChoiceDelta, reason: FinishReason, matched: Option<Matched>) {
        self.finished = true;
        delta.finish = Some(Finish { reason, matched });
        delta.segments = Some(std::mem::take(&mut self.segments).finish());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use loragate_text::testing::ByteCodec;

    fn choices_with(count: u32, options: TextOptions) -> Choices {
        Choices::new(Arc::new(ByteCodec), Arc::new(options), 1, vec![7, 8].into(), count)
    }

    fn choices(count: u32, stops: &[&str], with_logprobs: bool) -> Choices {
        let stops = stops.iter().map(|stop| (*stop).to_owned()).collect();
        choices_with(count, TextOptions { stops, with_logprobs, ..TextOptions::default() })
    }

    fn tokens(sequence: u32, text: &str) -> SampleEvent {
        let token_ids: Vec<u32> = text.bytes().map(u32::from).collect();
        let logprobs = (0..token_ids.len()).map(|i| -0.5 * i as f32).collect();
        SampleEvent::Tokens {
            sequence,
            version: AdapterVersion(3),
            kv_version: AdapterVersion(3),
            token_ids,
            logprobs,
            top_logprobs: Vec::new(),
        }
    }

    fn finished(sequence: u32, reason: FinishReason) -> SampleEvent {
        SampleEvent::Finished { sequence, reason, segments: Vec::new() }
    }

    #[test]
    fn each_delta_says_the_one_version_that_produced_its_tokens() {
        let mut choices = choices(1, &[], false);
        let at = |version: u64, text: &str| match tokens(0, text) {
            SampleEvent::Tokens { sequence, token_ids, logprobs, top_logprobs, .. } => SampleEvent::Tokens {
                sequence,
                version: AdapterVersion(version),
                kv_version: AdapterVersion(version),
                token_ids,
                logprobs,
                top_logprobs,
            },
            other => other,
        };
        let first = choices.on_event(at(2, "me")).expect("delta");
        let second = choices.on_event(at(3, "ow")).expect("delta");
        assert_eq!((first.version, first.token_ids.len()), (Some(AdapterVersion(2)), 2));
        assert_eq!((second.version, second.token_ids.len()), (Some(AdapterVersion(3)), 2));
        let last = choices.on_event(finished(0, FinishReason::Length)).expect("delta");
        assert!(last.token_ids.is_empty());
        assert_eq!(last.version, Some(AdapterVersion(3)), "a delta without tokens names the latest version");
        let segments = last.segments.expect("segments on the last delta");
        assert_eq!(segments.iter().map(|segment| segment.version.0).collect::<Vec<_>>(), vec![2, 3]);
    }

    /// A byte codec that records which threads decode.
    #[derive(Default)]
    struct ThreadRecordingCodec(std::sync::Mutex<Vec<std::thread::ThreadId>>);

    impl TextCodec for ThreadRecordingCodec {
        fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, String> {
            ByteCodec.encode(text, add_special_tokens)
        }

        fn decode(&self, token_ids: &[u32]) -> String {
            self.0.lock().expect("lock").push(std::thread::current().id());
            ByteCodec.decode(token_ids)
        }

        fn token_str(&self, token_id: u32) -> Option<String> {
            ByteCodec.token_str(token_id)
        }
    }

    #[tokio::test]
    async fn with_stop_strings_decoding_and_matching_run_off_the_runtimes_threads() {
        let runtime_thread = std::thread::current().id();
        for (stops, off_runtime, text) in [(vec!["woof".to_owned()], true, "meow "), (vec![], false, "meow woof")] {
            let codec = Arc::new(ThreadRecordingCodec::default());
            let options = TextOptions { stops: stops.into(), ..TextOptions::default() };
            let choices = Choices::new(codec.clone(), Arc::new(options), 0, vec![7].into(), 1);
            let (choices, delta) = choices.on_event_off_runtime(tokens(0, "meow woof")).await;
            assert_eq!(delta.expect("delta").text, text);
            assert_eq!(choices.all_finished(), off_runtime, "only the stop string ends the choice");
            let threads = codec.0.lock().expect("lock").clone();
            assert!(!threads.is_empty());
            assert_eq!(threads.iter().all(|thread| *thread != runtime_thread), off_runtime, "{threads:?}");
        }
    }

    #[test]
    fn tokens_become_text_and_the_end_carries_reason_and_segments() {
        let mut choices = choices(2, &[], false);
        let delta = choices.on_event(tokens(1, "meow")).expect("delta");
        assert_eq!((delta.index, delta.prompt_index), (3, 1), "prompt 1 of a request with n = 2 starts at index 2");
        assert_eq!((delta.text.as_str(), delta.token_ids.len(), delta.logprobs.len()), ("meow", 4, 0));
        let last = choices.on_event(finished(1, FinishReason::Length)).expect("last delta");
        assert_eq!(last.finish, Some(Finish { reason: FinishReason::Length, matched: None }));
        assert_eq!(
            last.segments,
            Some(vec![Segment { version: AdapterVersion(3), kv_version: AdapterVersion(3), start: 0, end: 4 }])
        );
        assert!(!choices.all_finished());
        let stopped = choices.on_event(finished(0, FinishReason::Stop)).expect("choice 0 ends");
        assert_eq!(stopped.finish, Some(Finish { reason: FinishReason::Stop, matched: None }), "no token to name");
        assert!(choices.all_finished());
    }

    #[test]
    fn a_stop_token_is_named_as_what_matched() {
        let mut choices = choices(1, &[], false);
        choices.on_event(tokens(0, "ab")).expect("delta");
        let last = choices.on_event(finished(0, FinishReason::Stop)).expect("last");
        assert_eq!(last.finish, Some(Finish { reason: FinishReason::Stop, matched: Some(Matched::Token(98)) }));
    }

    #[test]
    fn a_stop_string_across_chunks_ends_the_choice_and_drops_its_later_tokens() {
        let mut choices = choices(2, &["woof"], false);
        let first = choices.on_event(tokens(0, "meow wo")).expect("delta");
        assert_eq!(first.text, "meow ", "the possible start of the stop string is held back");
        let second = choices.on_event(tokens(0, "of meow")).expect("delta");
        assert_eq!(second.text, "");
        assert_eq!(second.token_ids, b"of".map(u32::from), "tokens end with the one that completed the stop");
        assert_eq!(
            second.finish,
            Some(Finish { reason: FinishReason::Stop, matched: Some(Matched::Text("woof".into())) })
        );
        assert_eq!(
            second.segments,
            Some(vec![Segment { version: AdapterVersion(3), kv_version: AdapterVersion(3), start: 0, end: 9 }])
        );
        assert_eq!(choices.on_event(tokens(0, "more")), None, "later tokens of a stopped choice are dropped");
        assert_eq!(choices.on_event(finished(0, FinishReason::Abort)), None);
        assert!(!choices.all_finished(), "choice 1 is still running");
        choices.on_event(finished(1, FinishReason::Length)).expect("choice 1 ends");
        assert!(choices.all_finished());
    }

    #[test]
    fn include_stop_str_keeps_the_stop_string_and_min_tokens_delays_watching() {
        let options = |min_tokens| TextOptions {
            stops: vec!["ow".to_owned()].into(),
            include_stop_str: true,
            min_tokens,
            with_logprobs: false,
        };
        let mut kept = choices_with(1, options(0));
        let delta = kept.on_event(tokens(0, "meow meow")).expect("delta");
        assert_eq!((delta.text.as_str(), delta.token_ids.len()), ("meow", 4));
        let mut late = choices_with(1, options(4));
        let delta = late.on_event(tokens(0, "meow meow")).expect("delta");
        assert_eq!((delta.text.as_str(), delta.token_ids.len()), ("meow meow", 9), "found within min_tokens: ignored");
        assert!(delta.finish.is_some(), "the second one counts");
    }

    #[test]
    fn held_back_text_is_released_or_stopped_when_the_engine_ends_the_choice() {
        let mut choices = choices(1, &["wolf"], false);
        assert_eq!(choices.on_event(tokens(0, "a wo")).expect("delta").text, "a ");
        let last = choices.on_event(finished(0, FinishReason::Abort)).expect("last");
        assert_eq!((last.text.as_str(), last.finish.map(|finish| finish.reason)), ("wo", Some(FinishReason::Abort)));
    }

    #[test]
    fn logprobs_hold_each_token_with_its_text_offset_and_alternatives() {
        let mut choices = choices(1, &[], true);
        let top = TopLogprobs { rank: 1, top: vec![(104, 0.0)] };
        let event = SampleEvent::Tokens {
            sequence: 0,
            version: AdapterVersion(1),
            kv_version: AdapterVersion(1),
            token_ids: "hé".bytes().map(u32::from).collect(),
            logprobs: vec![0.0, -0.5, -1.0],
            top_logprobs: vec![top.clone(), TopLogprobs::default(), TopLogprobs::default()],
        };
        let mut all = choices.on_event(event).expect("delta").logprobs;
        all.extend(choices.on_event(tokens(0, "y")).expect("delta").logprobs);
        let offsets: Vec<usize> = all.iter().map(|entry| entry.text_offset).collect();
        assert_eq!(offsets, [0, 1, 1, 2], "offsets count characters of the choice's text");
        assert_eq!(all[0], TokenLogprob { token: 104, logprob: 0.0, top: Some(top), text_offset: 0 });
        assert_eq!(all[3].top, None, "no alternatives were sent for it");
    }

    #[test]
    fn the_prompts_logprobs_ride_on_each_choices_first_delta() {
        let mut choices = choices(2, &[], false);
        assert_eq!(choices.on_event(SampleEvent::PromptLogprobs(vec![f32::NAN, -1.0])), None);
        let top = vec![TopLogprobs::default(), TopLogprobs { rank: 2, top: vec![(9, -0.5)] }];
        assert_eq!(choices.on_event(SampleEvent::PromptTopLogprobs(top.clone())), None);
        let first = choices.on_event(tokens(0, "a")).expect("delta").prompt.expect("on the first delta");
        assert_eq!((&first.token_ids[..], first.logprobs[1], first.top.as_ref()), (&[7, 8][..], -1.0, Some(&top)));
        assert!(choices.on_event(tokens(0, "b")).expect("delta").prompt.is_none(), "only on the first");
        let other =
            choices.on_event(finished(1, FinishReason::Abort)).expect("delta").prompt.expect("choice 1's first");
        assert!(Arc::ptr_eq(&first, &other));
    }
}
