//! One future's sample, on its own task: submitted through the coordinator, collected into a `SampleResponse`, and
//! settled into the store.
//!
//! A paused adapter is not an error, and this front has no hold or continuation logic of its own: the core holds a
//! request that arrives at a paused adapter's gate, and continues one that a pause stopped (keep mode always; abort
//! mode because the request asks for it, `SampleRequest::continue_through_abort_pauses`) as `prompt + its tokens` on
//! the weights current at resume, in one stream. Each of those waits is bounded by the front's pause-wait cap
//! (`GateDeadline::new(None, max_pause_wait)`), and the future stays pending meanwhile. What ends a future with an
//! error is what cannot be fixed by waiting: the adapter was unloaded (category `user`), it stayed paused past the
//! cap, an operator aborted the request by id, or the engine failed (`server`). When the server is stopping the
//! future is left pending: its record stays pending, and the next start on the same state continues the sample.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use loragate_core::{AdapterKey, CoreError, EngineError, FinishReason, GateDeadline, SampleEvent, SampleStream};
use loragate_http::{TextCodec, TokenStopWatcher};

use crate::proto::{Ending, FinishedSequence, encode_sample_response};
use crate::sample_request::SamplePlan;
use crate::state::TinkerState;
use crate::store::{Failure, PendingFuture, Settled};

/// How a sample ended, for its future.
enum Outcome {
    /// Settle the future.
    Settled(Settled),
    /// The server is stopping: leave the future pending for the SDK to resubmit after the restart.
    ServerStopping,
}

/// Runs the sample of `future` and settles it.
pub(crate) async fn run_sample(state: TinkerState, plan: SamplePlan, future: PendingFuture) {
    match sample(&state, plan).await {
        Outcome::Settled(settled) => {
            if let Settled::Failed(failure) = &settled {
                tracing::warn!(request_id = %future.id(), category = failure.category.as_str(),
                    error = %failure.message, "Tinker sample failed");
            }
            future.settle(settled);
        }
        Outcome::ServerStopping => future.leave_for_restart(),
    }
}

async fn sample(state: &TinkerState, plan: SamplePlan) -> Outcome {
    let coordinator = state.coordinator();
    let target = plan.request.adapter().clone();
    let deadline = GateDeadline::new(None, state.config().max_pause_wait);
    let sequences = plan.request.num_samples() as usize;
    let wants_prompt_logprobs = plan.request.include_prompt_logprobs();
    let stream = match coordinator.sample(plan.request, deadline).await {
        Ok(stream) => stream,
        Err(err) => return failed(state, &target, err),
    };
    let mut collector = Collector::new(state.codec(), sequences, &plan.stop_strings, wants_prompt_logprobs);
    if let Err(err) = collector.drain(stream).await {
        return failed(state, &target, err);
    }
    if collector.aborted() {
        return aborted(state, &target);
    }
    let (sequences, prompt_logprobs) = collector.finish();
    Outcome::Settled(Settled::Finished(encode_sample_response(sequences, prompt_logprobs, plan.prompt_logprobs_last_n)))
}

/// The future of a request the core refused or failed after it was accepted.
fn failed(state: &TinkerState, target: &AdapterKey, err: CoreError) -> Outcome {
    let failure = match err {
        CoreError::ShuttingDown | CoreError::Engine(EngineError::Stopped) => return Outcome::ServerStopping,
        _ if state.coordinator().is_shutting_down() => return Outcome::ServerStopping,
        CoreError::UnknownAdapter(_) | CoreError::Engine(EngineError::AdapterNotLoaded(_)) => unloaded(target),
        CoreError::GateHoldExpired { .. } => stayed_paused(state, target),
        CoreError::InvalidArgument { .. } => Failure::user(err.to_string()),
        other => Failure::server(other.to_string()),
    };
    Outcome::Settled(Settled::Failed(failure))
}

/// The future of a request the core ended aborted. Pauses never do that (the core continues the request); what is
/// left is an unload, the server stopping, a continuation that waited past the pause-wait cap, or an operator's abort
/// of this request id.
fn aborted(state: &TinkerState, target: &AdapterKey) -> Outcome {
    let coordinator = state.coordinator();
    if coordinator.is_shutting_down() {
        return Outcome::ServerStopping;
    }
    let failure = match coordinator.adapter(target) {
        Err(_) => unloaded(target),
        Ok(adapter) if adapter.gate().paused => stayed_paused(state, target),
        Ok(_) => {
            Failure::server("this sample was aborted on the server (its request id was aborted); it is not retried")
        }
    };
    Outcome::Settled(Settled::Failed(failure))
}

fn stayed_paused(state: &TinkerState, target: &AdapterKey) -> Failure {
    Failure::server(format!(
        "{target} stayed paused for {} (this server's --tinker-max-pause-wait)",
        human(state.config().max_pause_wait)
    ))
}

fn unloaded(target: &AdapterKey) -> Failure {
    Failure::user(format!("{target} was unloaded while this sample was pending"))
}

/// A duration in the unit a person would say it in.
fn human(duration: Duration) -> String {
    let seconds = duration.as_secs();
    match seconds {
        0 => format!("{} ms", duration.as_millis()),
        s if s % 3600 == 0 => format!("{} h", s / 3600),
        s if s % 60 == 0 => format!("{} min", s / 60),
        s => format!("{s} s"),
    }
}

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
struct Collector {
    sequences: Vec<SequenceProgress>,
    prompt_logprobs: Option<Vec<f32>>,
}

impl Collector {
    fn new(codec: &Arc<dyn TextCodec>, count: usize, stops: &Arc<[String]>, wants_prompt_logprobs: bool) -> Self {
        let sequences = (0..count)
            .map(|_| SequenceProgress {
                output: FinishedSequence::default(),
                stop: (!stops.is_empty()).then(|| TokenStopWatcher::new(codec.clone(), stops.clone())),
                aborted: false,
            })
            .collect();
        Self { sequences, prompt_logprobs: wants_prompt_logprobs.then(Vec::new) }
    }

    /// Takes events until every sequence is done (then the stream is dropped: nothing more is wanted from it).
    async fn drain(&mut self, mut stream: SampleStream) -> Result<(), CoreError> {
        while !self.sequences.iter().all(SequenceProgress::done) {
            let Some(event) = stream.next().await else { break };
            self.on_event(event?);
        }
        Ok(())
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

    fn aborted(&self) -> bool {
        self.sequences.iter().any(|progress| progress.aborted)
    }

    fn finish(self) -> (Vec<FinishedSequence>, Option<Vec<f32>>) {
        (self.sequences.into_iter().map(|progress| progress.output).collect(), self.prompt_logprobs)
    }
}

#[cfg(test)]
mod tests {
    use loragate_core::AdapterVersion;

    use super::*;
    use crate::test_support::ByteCodec;

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
    fn durations_are_said_in_their_unit() {
        assert_eq!(human(Duration::from_secs(1800)), "30 min");
        assert_eq!(human(Duration::from_secs(7200)), "2 h");
        assert_eq!(human(Duration::from_secs(90)), "90 s");
        assert_eq!(human(Duration::from_millis(250)), "250 ms");
    }
}
