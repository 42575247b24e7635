//! Gathering a sample's events into its finished sequences (ending a sequence at the token that completes a stop
//! string), from the start or, after a restart, from what was recorded; and what it produced so far, for its record.

use std::sync::Arc;

use futures::{Stream, StreamExt};
use loragate_core::{CoreError, FinishReason, SampleEvent};
use loragate_text::{TextCodec, TokenStopWatcher};

use super::progress::Progress;
use crate::proto::{Ending, FinishedSequence};
use crate::store::Produced;
use crate::store::record::ProducedSequence;

/// One sequence being collected.
struct SequenceProgress {
    output: FinishedSequence,
    stop: Option<TokenStopWatcher>,
    aborted: bool,
}

impl SequenceProgress {
    fn done(&self) -> bool {
        self.aborted || self.output.ending.is_some()
    }
}

/// Gathers a request's events into finished sequences, ending a sequence at the token that completes a stop string.
pub(super) struct Collector {
    sequences: Vec<SequenceProgress>,
    prompt_logprobs: Option<Vec<f32>>,
}

impl Collector {
    pub(super) fn new(
        codec: &Arc<dyn TextCodec>,
        count: usize,
        stops: &Arc<[String]>,
        wants_prompt_logprobs: bool,
    ) -> Self {
        let sequences = (0..count)
            .map(|_| SequenceProgress {
                output: FinishedSequence::default(),
                stop: (!stops.is_empty()).then(|| TokenStopWatcher::new(codec.clone(), stops.clone())),
                aborted: false,
            })
            .collect();
        Self { sequences, prompt_logprobs: wants_prompt_logprobs.then(Vec::new) }
    }

    /// Starts from what an earlier process recorded: the sequences as they were (their stop-string watchers fed
    /// their tokens again), and the prompt's logprobs.
    pub(super) fn resume(&mut self, sequences: Vec<FinishedSequence>, prompt_logprobs: Option<Vec<f32>>) {
        for (progress, recorded) in self.sequences.iter_mut().zip(sequences) {
            if let Some(stop) = &mut progress.stop {
                for &token in &recorded.tokens {
                    stop.push(token);
                }
            }
            progress.output = recorded;
        }
        if let (Some(kept), Some(recorded)) = (&mut self.prompt_logprobs, prompt_logprobs) {
            *kept = recorded;
        }
    }

    /// Takes events until every sequence is done (then the stream is dropped: nothing more is wanted from it),
    /// recording its progress as `progress` says.
    pub(super) async fn drain(
        &mut self,
        mut stream: impl Stream<Item = Result<SampleEvent, CoreError>> + Unpin,
        progress: &mut Progress<'_>,
    ) -> Result<(), CoreError> {
        while !self.done() {
            let next = match progress.due_at(self) {
                // Tokens wait to be recorded: record them on time even if nothing more comes (a paused adapter).
                Some(due) => tokio::select! {
                    next = stream.next() => next,
                    () = tokio::time::sleep_until(due) => {
                        progress.record(self);
                        continue;
                    }
                },
                None => stream.next().await,
            };
            let Some(event) = next else { break };
            self.on_event(event?);
            if !self.done() {
                progress.after_event(self);
            }
        }
        Ok(())
    }

    fn done(&self) -> bool {
        self.sequences.iter().all(SequenceProgress::done)
    }

    /// How many tokens the sequences hold, all together.
    pub(super) fn token_count(&self) -> usize {
        self.sequences.iter().map(|progress| progress.output.tokens.len()).sum()
    }

    /// What the sample produced so far, as its record keeps it (prompt logprobs once they came).
    pub(super) fn produced(&self) -> Produced {
        Produced {
            sequences: self.sequences.iter().map(|progress| ProducedSequence::of(&progress.output)).collect(),
            prompt_logprob_bits: self
                .prompt_logprobs
                .as_ref()
                .filter(|logprobs| !logprobs.is_empty())
                .map(|logprobs| logprobs.iter().map(|logprob| logprob.to_bits()).collect()),
        }
    }

    fn on_event(&mut self, event: SampleEvent) {
        match event {
            SampleEvent::PromptLogprobs(logprobs) => {
                if let Some(kept) = &mut self.prompt_logprobs {
                    *kept = logprobs;
                }
            }
            // Never asked for: the front refuses top-k logprobs.
            SampleEvent::PromptTopLogprobs(_) => {}
            SampleEvent::Tokens { sequence, token_ids, logprobs, .. } => {
                let Some(progress) = self.sequences.get_mut(sequence as usize).filter(|p| !p.done()) else { return };
                for (token, logprob) in token_ids.into_iter().zip(logprobs) {
                    progress.output.tokens.push(token);
                    progress.output.logprobs.push(logprob);
                    if progress.stop.as_mut().is_some_and(|stop| stop.push(token)) {
                        progress.output.ending = Some(Ending::Stop);
                        break;
                    }
                }
            }
            SampleEvent::Finished { sequence, reason, .. } => {
                let Some(progress) = self.sequences.get_mut(sequence as usize).filter(|p| !p.done()) else { return };
                let held_back_stops = progress.stop.as_mut().is_some_and(TokenStopWatcher::finish);
                match reason {
                    FinishReason::Abort => progress.aborted = true,
                    _ if held_back_stops => progress.output.ending = Some(Ending::Stop),
                    FinishReason::Stop => progress.output.ending = Some(Ending::Stop),
                    FinishReason::Length => progress.output.ending = Some(Ending::Length),
                }
            }
        }
    }

    pub(super) fn aborted(&self) -> bool {
        self.sequences.iter().any(|progress| progress.aborted)
    }

    pub(super) fn finish(self) -> (Vec<FinishedSequence>, Option<Vec<f32>>) {
        (self.sequences.into_iter().map(|progress| progress.output).collect(), self.prompt_logprobs)
    }
}

#[cfg(test)]
mod tests {
    use loragate_core::AdapterVersion;

    use super::*;
    use loragate_text::testing::ByteCodec;

    fn collector(count: usize, stops: &[&str]) -> Collector {
        let codec: Arc<dyn TextCodec> = Arc::new(ByteCodec);
        Collector::new(&codec, count, &stops.iter().map(|stop| (*stop).to_owned()).collect(), true)
    }

    fn tokens(sequence: u32, text: &str) -> SampleEvent {
        let token_ids: Vec<u32> = text.bytes().map(u32::from).collect();
        let logprobs = (0..token_ids.len()).map(|i| -(i as f32)).collect();
        SampleEvent::Tokens {
            sequence,
            version: AdapterVersion(1),
            kv_version: AdapterVersion(1),
            token_ids,
            logprobs,
            top_logprobs: Vec::new(),
        }
    }

    fn finished(sequence: u32, reason: FinishReason) -> SampleEvent {
        SampleEvent::Finished { sequence, reason, segments: Vec::new() }
    }

    fn text(sequence: &FinishedSequence) -> String {
        sequence.tokens.iter().map(|&t| char::from(u8::try_from(t).expect("a byte"))).collect()
    }

    #[test]
    fn sequences_end_at_the_token_completing_a_stop_string_or_as_the_engine_says() {
        let mut collector = collector(3, &["woof"]);
        collector.on_event(SampleEvent::PromptLogprobs(vec![f32::NAN, -1.0]));
        collector.on_event(tokens(0, "meow wo"));
        collector.on_event(tokens(0, "of meow"));
        collector.on_event(tokens(1, "meow"));
        collector.on_event(finished(1, FinishReason::Length));
        collector.on_event(tokens(2, "mew"));
        assert!(!collector.sequences.iter().all(SequenceProgress::done), "sequence 2 still runs");
        collector.on_event(finished(0, FinishReason::Length));
        collector.on_event(finished(2, FinishReason::Stop));
        assert!(!collector.aborted());
        let (sequences, prompt_logprobs) = collector.finish();
        assert_eq!(text(&sequences[0]), "meow woof", "ends with the token that completed the stop string");
        assert_eq!(sequences[0].logprobs.len(), 9, "one logprob per kept token");
        assert_eq!(sequences[0].ending, Some(Ending::Stop), "its later events change nothing");
        assert_eq!((text(&sequences[1]).as_str(), sequences[1].ending), ("meow", Some(Ending::Length)));
        assert_eq!((text(&sequences[2]).as_str(), sequences[2].ending), ("mew", Some(Ending::Stop)));
        assert_eq!(prompt_logprobs.map(|p| p.len()), Some(2));
    }

    #[test]
    fn an_aborted_sequence_is_reported() {
        let mut collector = collector(2, &[]);
        collector.on_event(tokens(0, "me"));
        collector.on_event(finished(0, FinishReason::Abort));
        collector.on_event(finished(1, FinishReason::Length));
        assert!(collector.sequences.iter().all(SequenceProgress::done));
        assert!(collector.aborted());
    }

    #[test]
    fn a_resumed_collector_starts_from_the_record_and_what_it_produced_round_trips() {
        let mut first = collector(2, &["woof"]);
        first.on_event(SampleEvent::PromptLogprobs(vec![f32::NAN, -1.0]));
        first.on_event(tokens(0, "meow wo"));
        first.on_event(tokens(1, "mew"));
        first.on_event(finished(1, FinishReason::Length));
        assert_eq!(first.token_count(), 10);
        let produced = first.produced();
        assert_eq!(produced.prompt_logprob_bits.as_ref().map(Vec::len), Some(2));

        let mut resumed = collector(2, &["woof"]);
        let sequences: Vec<FinishedSequence> =
            produced.sequences.iter().map(|sequence| sequence.to_sequence().expect("whole")).collect();
        resumed.resume(sequences, produced.prompt_logprobs());
        assert!(!resumed.done(), "sequence 0 goes on; sequence 1 had finished");
        // The stop string's first half was recorded: its second half, from the continuation, completes it.
        resumed.on_event(tokens(0, "of meow"));
        assert!(resumed.done());
        let (sequences, prompt_logprobs) = resumed.finish();
        assert_eq!((text(&sequences[0]).as_str(), sequences[0].ending), ("meow woof", Some(Ending::Stop)));
        assert_eq!((text(&sequences[1]).as_str(), sequences[1].ending), ("mew", Some(Ending::Length)));
        assert_eq!(sequences[0].logprobs[..7], [0.0, -1.0, -2.0, -3.0, -4.0, -5.0, -6.0], "the recorded logprobs");
        assert!(prompt_logprobs.is_some_and(|logprobs| logprobs[0].is_nan() && logprobs[1] == -1.0));
    }

    #[test]
    fn prompt_logprobs_are_recorded_only_once_they_came() {
        let mut collector = collector(1, &[]);
        collector.on_event(tokens(0, "me"));
        assert_eq!(collector.produced().prompt_logprob_bits, None, "asked for, but not come yet");
    }
}
