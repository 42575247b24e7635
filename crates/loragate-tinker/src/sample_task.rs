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
//!
//! As it runs, the sample records what it has produced in its future's pending record ([`progress`]), and a sample
//! continued after a restart starts from there ([`SamplePlan::resumed`]): one core request per sequence still to
//! sample, merged back into the sequences' order.

mod collector;
mod progress;

use std::time::Duration;

use futures::StreamExt;
use loragate_core::{AdapterKey, CoreError, EngineError, ErrorClass, GateDeadline, SampleEvent};

use self::collector::Collector;
use self::progress::Progress;
use crate::proto::encode_sample_response;
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
    let outcome = sample(&state, plan, &future).await;
    match outcome {
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

async fn sample(state: &TinkerState, plan: SamplePlan, future: &PendingFuture) -> Outcome {
    let coordinator = state.coordinator();
    let target = plan.request.adapter().clone();
    let sequences = plan.request.num_samples() as usize;
    let wants_prompt_logprobs = plan.request.include_prompt_logprobs();
    let mut collector = Collector::new(state.codec(), sequences, &plan.stop_strings, wants_prompt_logprobs);
    // Each request with the index of its first sequence in the answer.
    let requests = match plan.resumed {
        None => vec![(0, plan.request)],
        Some(resumed) => {
            collector.resume(resumed.sequences, resumed.prompt_logprobs);
            resumed.requests
        }
    };
    let mut streams = Vec::with_capacity(requests.len());
    for (first_sequence, request) in requests {
        let deadline = GateDeadline::new(None, state.config().max_pause_wait);
        match coordinator.sample(request, deadline).await {
            Ok(stream) => streams.push(stream.map(move |event| event.map(|event| renumbered(event, first_sequence)))),
            Err(err) => return failed(state, &target, err),
        }
    }
    let mut progress = Progress::new(future, collector.token_count());
    if let Err(err) = collector.drain(futures::stream::select_all(streams), &mut progress).await {
        return failed(state, &target, err);
    }
    if collector.aborted() {
        return aborted(state, &target);
    }
    let (sequences, prompt_logprobs) = collector.finish();
    Outcome::Settled(Settled::Finished(encode_sample_response(sequences, prompt_logprobs, plan.prompt_logprobs_last_n)))
}

/// `event` of a request whose first sequence is sequence `first_sequence` of the answer.
fn renumbered(mut event: SampleEvent, first_sequence: u32) -> SampleEvent {
    if let SampleEvent::Tokens { sequence, .. } | SampleEvent::Finished { sequence, .. } = &mut event {
        *sequence += first_sequence;
    }
    event
}

/// The future of a request the core refused or failed after it was accepted. Tinker's own cases first (the server
/// stopping leaves the future for the restart, a gate hold past the cap says so); otherwise the error's class says
/// whose doing it is: a request that names nothing (its adapter was unloaded) or that is invalid is the user's, the
/// rest the server's.
fn failed(state: &TinkerState, target: &AdapterKey, err: CoreError) -> Outcome {
    let failure = match err {
        CoreError::ShuttingDown | CoreError::Engine(EngineError::Stopped) => return Outcome::ServerStopping,
        _ if state.coordinator().is_shutting_down() => return Outcome::ServerStopping,
        CoreError::GateHoldExpired { .. } => stayed_paused(state, target),
        other => match other.class() {
            ErrorClass::NotFound => unloaded(target),
            ErrorClass::Invalid => Failure::user(other.to_string()),
            _ => Failure::server(other.to_string()),
        },
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

#[cfg(test)]
mod tests {
    use loragate_core::{AdapterVersion, FinishReason};

    use super::*;

    #[test]
    fn a_continued_sequences_events_take_its_place_in_the_answer() {
        let finished = SampleEvent::Finished { sequence: 0, reason: FinishReason::Length, segments: Vec::new() };
        assert!(matches!(renumbered(finished, 2), SampleEvent::Finished { sequence: 2, .. }));
        let tokens = SampleEvent::Tokens {
            sequence: 0,
            version: AdapterVersion(1),
            kv_version: AdapterVersion(1),
            token_ids: vec![1],
            logprobs: vec![0.0],
            top_logprobs: Vec::new(),
        };
        assert!(matches!(renumbered(tokens, 1), SampleEvent::Tokens { sequence: 1, .. }));
        let prompt = SampleEvent::PromptLogprobs(vec![f32::NAN]);
        assert!(matches!(renumbered(prompt, 3), SampleEvent::PromptLogprobs(_)));
    }

    #[test]
    fn durations_are_said_in_their_unit() {
        assert_eq!(human(Duration::from_secs(1800)), "30 min");
        assert_eq!(human(Duration::from_secs(7200)), "2 h");
        assert_eq!(human(Duration::from_secs(90)), "90 s");
        assert_eq!(human(Duration::from_millis(250)), "250 ms");
    }
}
