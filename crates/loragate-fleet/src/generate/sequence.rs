//! One sequence of a request, on one worker at a time.
//!
//! - Its tokens are forwarded as they arrive; its `FinishInfo` ends it.
//! - Cancelled: `Abort` is sent (batched); the `ABORTED` finish acknowledges it. Without one within the bound, the
//!   stream is dropped and the sequence ends `Abort` with what was received.
//! - Its worker fails (stream error, stream ending unfinished, worker declared lost): before any token it is tried
//!   on another READY worker holding the version; after, it ends at once with `Abort` and every token received, so
//!   the caller continues it elsewhere. The membership is told, so the worker is checked now.
//! - The worker refuses the request itself (invalid argument and the like): the request fails with that error.

use std::sync::Arc;

use loragate_core::{EngineError, EngineEvent, FinishReason, RequestId};
use tokio::time::Instant;
use tonic::{Code, Status};
use vllm_proto as pb;

use super::{RequestContext, wire};
use crate::membership::Route;

/// Runs sequence `index` of the request, starting on `route`.
pub(super) async fn run(context: Arc<RequestContext>, index: u32, route: Route) {
    let _gate = (index == 0).then(|| OpenPromptGate(context.clone()));
    if index > 0 {
        let mut sent = context.prompt_logprobs_sent.subscribe();
        tokio::select! {
            _ = sent.wait_for(|sent| *sent) => {}
            () = context.events.closed() => return,
        }
    }
    let mut sequence = Sequence { context, index, produced: 0, prompt_logprobs_sent: false, tried: Vec::new() };
    sequence.drive(route).await;
}

/// Opens the other sequences' wait when sequence 0 ends, whether or not it sent prompt logprobs.
struct OpenPromptGate(Arc<RequestContext>);

impl Drop for OpenPromptGate {
    fn drop(&mut self) {
        self.0.prompt_logprobs_sent.send_replace(true);
    }
}

/// How one attempt on one worker ended.
enum Outcome {
    /// The sequence ended (finished, handed back, failed with an error, or its caller left).
    Ended,
    /// The worker failed before the sequence finished.
    WorkerFailed { why: String, out_of_sync: bool },
}

impl Outcome {
    fn failed(why: impl Into<String>) -> Self {
        Self::WorkerFailed { why: why.into(), out_of_sync: false }
    }
}

struct Sequence {
    context: Arc<RequestContext>,
    index: u32,
    produced: usize,
    prompt_logprobs_sent: bool,
    tried: Vec<u64>,
}

impl Sequence {
    async fn drive(&mut self, mut route: Route) {
        loop {
            let Outcome::WorkerFailed { why, out_of_sync } = self.attempt(&route).await else { return };
            route.link.counters().record_sequence_failure();
            if out_of_sync {
                self.context.membership.report_out_of_sync(&route);
            } else {
                self.context.membership.report_failure(&route);
            }
            if self.produced == 0 && !self.context.cancel.is_cancelled() {
                self.tried.push(route.incarnation);
                if let Some(next) = self.context.membership.route(self.context.pin.engine_name(), &self.tried) {
                    tracing::debug!(worker = %route.link.address(), %why, next = %next.link.address(), "retrying a sequence on another worker");
                    route = next;
                    continue;
                }
            }
            tracing::warn!(worker = %route.link.address(), %why, tokens = self.produced, "sequence handed back as aborted: its worker failed");
            self.finish(FinishReason::Abort);
            return;
        }
    }

    async fn attempt(&mut self, route: &Route) -> Outcome {
        let context = self.context.clone();
        let worker_request_id = RequestId::generate().to_string();
        let with_prompt_logprobs =
            self.index == 0 && context.request.include_prompt_logprobs() && !self.prompt_logprobs_sent;
        let message = wire::generate_request(
            &context.request,
            self.index,
            worker_request_id.clone(),
            context.pin.engine_name(),
            with_prompt_logprobs,
        );
        route.link.counters().record_sequence();
        let mut client = route.link.inference();
        let opened = tokio::select! {
            biased;
            () = context.events.closed() => return Outcome::Ended,
            () = context.cancel.cancelled() => {
                self.finish(FinishReason::Abort);
                return Outcome::Ended;
            }
            () = route.session.cancelled() => return Outcome::failed("the worker was declared lost"),
            opened = client.generate_stream(message) => opened,
        };
        let mut stream = match opened {
            Ok(response) => response.into_inner(),
            Err(status) => return self.refused_or_failed(route, status),
        };
        let mut abort_deadline: Option<Instant> = None;
        loop {
            let ack_bound = async move {
                match abort_deadline {
                    Some(deadline) => tokio::time::sleep_until(deadline).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                () = context.events.closed() => return Outcome::Ended,
                () = context.cancel.cancelled(), if abort_deadline.is_none() => {
                    route.link.abort(worker_request_id.clone());
                    abort_deadline = Some(Instant::now() + context.abort_ack_timeout);
                }
                () = ack_bound => {
                    tracing::warn!(worker = %route.link.address(), "no ABORTED within the bound; handing the sequence back with what it received");
                    self.finish(FinishReason::Abort);
                    return Outcome::Ended;
                }
                () = route.session.cancelled() => return Outcome::failed("the worker was declared lost"),
                message = stream.message() => match message {
                    Ok(Some(response)) => {
                        if let Some(outcome) = self.accept(route, response) {
                            return outcome;
                        }
                    }
                    Ok(None) => return Outcome::failed("the worker ended the stream without finishing the sequence"),
                    Err(_) if abort_deadline.is_some() => {
                        // Being aborted anyway: hand back what arrived.
                        self.finish(FinishReason::Abort);
                        return Outcome::Ended;
                    }
                    Err(status) => return self.refused_or_failed(route, status),
                },
            }
        }
    }

    /// Forwards one response; answers how the attempt ended if it did.
    fn accept(&mut self, route: &Route, response: pb::GenerateResponse) -> Option<Outcome> {
        let context = self.context.clone();
        if let Some(info) = response.prompt_info
            && self.index == 0
            && context.request.include_prompt_logprobs()
            && !self.prompt_logprobs_sent
        {
            let prompt_len = context.request.prompt().len();
            let (ranks, candidates) = (info.ranks.clone(), info.candidate_tokens.clone());
            let top = match context.request.prompt_top_logprobs() {
                Some(_) => wire::top_logprobs(ranks, candidates, prompt_len).map(Some),
                None => Some(None),
            };
            let (Some(logprobs), Some(top)) = (wire::prompt_logprobs(info, prompt_len), top) else {
                return Some(self.fail(format!(
                    "worker {} sent prompt logprobs that do not match the prompt",
                    route.link.address()
                )));
            };
            self.send(Ok(EngineEvent::PromptLogprobs(logprobs)));
            if let Some(top) = top {
                self.send(Ok(EngineEvent::PromptTopLogprobs(top)));
            }
            self.prompt_logprobs_sent = true;
            context.prompt_logprobs_sent.send_replace(true);
        }
        let output = response.outputs?;
        let count = output.token_ids.len();
        if count != output.num_tokens as usize || output.logprobs.len() != count {
            return Some(self.fail(format!(
                "worker {} sent {} tokens with {count} ids and {} logprobs",
                route.link.address(),
                output.num_tokens,
                output.logprobs.len()
            )));
        }
        let top_logprobs = if context.request.params().top_logprobs() > 0 {
            let Some(top) = wire::top_logprobs(output.ranks, output.candidate_tokens, count) else {
                return Some(self.fail(format!(
                    "worker {} sent {count} tokens without a rank and candidates for each",
                    route.link.address()
                )));
            };
            top
        } else {
            Vec::new()
        };
        if count > 0 {
            route.link.counters().record_tokens(count);
            self.produced += count;
            self.send(Ok(EngineEvent::Tokens {
                sequence: self.index,
                version: context.pin.version(),
                token_ids: output.token_ids,
                logprobs: output.logprobs,
                top_logprobs,
            }));
        }
        let finish = output.finish_info?;
        self.finish(wire::finish_reason(&finish));
        Some(Outcome::Ended)
    }

    /// A status from the worker: a refusal of the request itself fails it; anything else is the worker failing.
    fn refused_or_failed(&mut self, route: &Route, status: Status) -> Outcome {
        let why = format!("{:?}: {}", status.code(), status.message());
        match status.code() {
            // The worker lacks the adapter version the fleet thought it held.
            Code::NotFound => Outcome::WorkerFailed { why, out_of_sync: true },
            Code::InvalidArgument
            | Code::FailedPrecondition
            | Code::OutOfRange
            | Code::Unimplemented
            | Code::AlreadyExists
            | Code::PermissionDenied
            | Code::Unauthenticated => self.fail(format!("worker {} refused the request: {why}", route.link.address())),
            _ => Outcome::failed(why),
        }
    }

    fn fail(&self, why: String) -> Outcome {
        self.send(Err(EngineError::Internal(why)));
        Outcome::Ended
    }

    fn finish(&self, reason: FinishReason) {
        self.send(Ok(EngineEvent::Finished { sequence: self.index, reason }));
    }

    fn send(&self, event: Result<EngineEvent, EngineError>) {
        let _ = self.context.events.send(event);
    }
}
