//! One sequence of a request, on one worker at a time, whatever its protocol.
//!
//! - Its tokens are forwarded as they arrive; its finish ends it (it is handed back then; its stream is read on to
//!   its end, bounded, so that the worker's connection can be reused).
//! - Cancelled: where the protocol aborts by a call, the abort is sent (batched) and the abort finish (or the
//!   stream's end) acknowledges it; without one within the bound, the stream is dropped and the sequence ends `Abort`
//!   with what was received. Where it aborts by disconnecting, the stream is dropped at once and the sequence ends
//!   `Abort` with what was received.
//! - Its worker fails (stream error, stream ending unfinished, worker declared lost): before any token it is tried
//!   on another READY worker holding the version; after, it ends at once with `Abort` and every token received, so
//!   the caller continues it elsewhere. The membership is told, so the worker is checked now.
//! - The worker refuses the request itself (invalid argument and the like): the request fails with that error.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use loragate_core::{EngineError, EngineEvent, FinishReason, RequestId};
use tokio::time::Instant;

use super::RequestContext;
use crate::membership::Route;
use crate::worker::{AbortBy, SequenceEvent, SequenceRequest, WorkerError};

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

/// Tells the worker to stop a sequence the fleet stopped reading before its finish: by a call where the protocol
/// aborts by one and the id is known (dropping the stream, which the caller does next, covers the rest).
fn stop_worker(route: &Route, abort: &AbortBy) {
    if let AbortBy::Call(id) = abort
        && let Some(id) = id.get()
    {
        route.link.abort(id.clone());
    }
}

/// How long a stream may take to end after its sequence finished (and was handed back).
const STREAM_END_BOUND: Duration = Duration::from_secs(1);

/// Reads a finished sequence's stream to its end, bounded by [`STREAM_END_BOUND`], so that its connection stays
/// whole (an HTTP/1.1 response read to its end goes back to the client's pool, where the next sequence or abort
/// call reuses it; one dropped midway is closed). What follows the finish is not an event of the sequence.
async fn read_to_end(mut events: BoxStream<'static, Result<SequenceEvent, WorkerError>>) {
    let _ = tokio::time::timeout(STREAM_END_BOUND, async { while events.next().await.is_some() {} }).await;
}

/// How one attempt on one worker ended.
enum Outcome {
    /// The sequence ended (finished, handed back, failed with an error, or its caller left).
    Ended,
    /// The sequence ended, but its worker broke its bounds doing it (it ran past the budget, or went silent once the
    /// budget was spent, or broke its protocol): the worker counts a failure.
    EndedMisbehaved(String),
    /// The worker failed before the sequence finished.
    WorkerFailed { why: String, failure: Failure },
}

/// What a failed worker is reported as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Failure {
    /// It failed (a broken stream, an error status): checked at once.
    Broken,
    /// It lacks the adapter version the fleet thought it held: caught up again.
    OutOfSync,
    /// It broke its bounds (silent past a timeout): one failure counted toward its probation at once.
    Misbehaved,
}

impl Outcome {
    fn failed(why: impl Into<String>) -> Self {
        Self::WorkerFailed { why: why.into(), failure: Failure::Broken }
    }

    fn silent(why: String) -> Self {
        Self::WorkerFailed { why, failure: Failure::Misbehaved }
    }
}

struct Sequence {
    context: Arc<RequestContext>,
    index: u32,
    produced: usize,
    prompt_logprobs_sent: bool,
    tried: Vec<u64>,
}

/// Waits for `deadline`, or forever without one.
async fn until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

impl Sequence {
    async fn drive(&mut self, mut route: Route) {
        loop {
            let (why, failure) = match self.attempt(&route).await {
                Outcome::Ended => return,
                Outcome::EndedMisbehaved(why) => {
                    tracing::warn!(worker = %route.link.address(), %why, "worker broke a sequence's bounds; counted as a failure");
                    route.link.counters().record_sequence_failure();
                    self.context.membership.report_misbehaviour(&route, why);
                    return;
                }
                Outcome::WorkerFailed { why, failure } => (why, failure),
            };
            route.link.counters().record_sequence_failure();
            match failure {
                Failure::Broken => self.context.membership.report_failure(&route),
                Failure::OutOfSync => self.context.membership.report_out_of_sync(&route),
                Failure::Misbehaved => self.context.membership.report_misbehaviour(&route, why.clone()),
            }
            if self.produced == 0 && !self.context.cancel.is_cancelled() {
                self.tried.push(route.incarnation);
                let engine_name = self.context.pin.engine_name();
                if let Some(next) = self.context.membership.route(engine_name, &self.tried) {
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

    /// The sequence's budget: it never gets more tokens than this, whatever its worker sends.
    fn budget(&self) -> usize {
        self.context.request.params().max_tokens() as usize
    }

    async fn attempt(&mut self, route: &Route) -> Outcome {
        let context = self.context.clone();
        let with_prompt_logprobs =
            self.index == 0 && context.request.include_prompt_logprobs() && !self.prompt_logprobs_sent;
        let request = SequenceRequest {
            request: &context.request,
            sequence: self.index,
            request_id: RequestId::generate().to_string(),
            engine_name: context.pin.engine_name(),
            with_prompt_logprobs,
        };
        route.link.counters().record_sequence();
        let first_byte = context.bounds.first_byte_timeout;
        let opened = tokio::select! {
            biased;
            () = context.events.closed() => return Outcome::Ended,
            () = context.cancel.cancelled() => {
                self.finish(FinishReason::Abort);
                return Outcome::Ended;
            }
            () = route.session.cancelled() => return Outcome::failed("the worker was declared lost"),
            opened = tokio::time::timeout(first_byte, route.link.client().generate(request)) => match opened {
                Ok(opened) => opened,
                Err(_) => return Outcome::silent(format!("no answer within the first-byte timeout ({first_byte:?})")),
            },
        };
        match opened {
            Ok(opened) => self.stream(route, opened.events, opened.abort, Instant::now() + first_byte).await,
            Err(err) => self.refused_or_failed(route, err),
        }
    }

    /// Reads an opened sequence's events until it ends; its first event is due by `first_event_due`, each next one
    /// within the inter-chunk timeout.
    async fn stream(
        &mut self,
        route: &Route,
        mut events: BoxStream<'static, Result<SequenceEvent, WorkerError>>,
        abort: AbortBy,
        first_event_due: Instant,
    ) -> Outcome {
        let context = self.context.clone();
        let mut abort_deadline: Option<Instant> = None;
        let mut next_event_due = first_event_due;
        loop {
            tokio::select! {
                biased;
                () = context.events.closed() => return Outcome::Ended,
                () = context.cancel.cancelled(), if abort_deadline.is_none() => {
                    match &abort {
                        AbortBy::Call(id) if id.get().is_some() => {
                            route.link.abort(id.get().cloned().unwrap_or_default());
                            abort_deadline = Some(Instant::now() + context.bounds.abort_ack_timeout);
                        }
                        // Nothing to call (yet): dropping the stream aborts it; hand back what arrived.
                        AbortBy::Call(_) | AbortBy::Disconnect => {
                            self.finish(FinishReason::Abort);
                            return Outcome::Ended;
                        }
                    }
                }
                () = until(abort_deadline) => {
                    tracing::warn!(worker = %route.link.address(), "no abort finish within the bound; handing the sequence back with what it received");
                    self.finish(FinishReason::Abort);
                    return Outcome::Ended;
                }
                () = tokio::time::sleep_until(next_event_due), if abort_deadline.is_none() => {
                    return self.went_silent(route, &abort, next_event_due == first_event_due);
                }
                () = route.session.cancelled() => return Outcome::failed("the worker was declared lost"),
                event = events.next() => match event {
                    Some(Ok(event)) => {
                        next_event_due = Instant::now() + context.bounds.inter_chunk_timeout;
                        let finished = matches!(event, SequenceEvent::Finished(_));
                        if let Some(outcome) = self.accept(route, event) {
                            if finished {
                                read_to_end(events).await;
                            } else {
                                stop_worker(route, &abort);
                            }
                            return outcome;
                        }
                    }
                    None if abort_deadline.is_some() => {
                        // The stream ended after the abort: that is its acknowledgement.
                        self.finish(FinishReason::Abort);
                        return Outcome::Ended;
                    }
                    // Ended (closed by the worker) with its budget spent: the sequence is whole.
                    None if self.produced >= self.budget() => {
                        self.finish(FinishReason::Length);
                        return Outcome::Ended;
                    }
                    None => return Outcome::failed("the worker ended the stream without finishing the sequence"),
                    Some(Err(_)) if abort_deadline.is_some() => {
                        // Being aborted anyway: hand back what arrived.
                        self.finish(FinishReason::Abort);
                        return Outcome::Ended;
                    }
                    Some(Err(err)) => return self.refused_or_failed(route, err),
                },
            }
        }
    }

    /// The worker sent nothing within its timeout: a sequence whose budget is spent ends `Length` (the worker just
    /// never said so); any other is handed back `Abort` with its tokens (or tried elsewhere if it has none). Either
    /// way the worker counts a failure.
    fn went_silent(&mut self, route: &Route, abort: &AbortBy, first: bool) -> Outcome {
        stop_worker(route, abort);
        let bounds = &self.context.bounds;
        let why = match first {
            true => format!("no first event within the first-byte timeout ({:?})", bounds.first_byte_timeout),
            false => format!("silent past the inter-chunk timeout ({:?})", bounds.inter_chunk_timeout),
        };
        if self.produced >= self.budget() {
            self.finish(FinishReason::Length);
            return Outcome::EndedMisbehaved(format!("{why} after the sequence's budget was spent"));
        }
        Outcome::silent(why)
    }

    /// Forwards one event; answers how the attempt ended if it did.
    fn accept(&mut self, route: &Route, event: SequenceEvent) -> Option<Outcome> {
        let context = self.context.clone();
        match event {
            SequenceEvent::PromptLogprobs { logprobs, top } => {
                let wanted = self.index == 0 && context.request.include_prompt_logprobs() && !self.prompt_logprobs_sent;
                if wanted {
                    if context.request.prompt_top_logprobs().is_some() && top.is_none() {
                        let why =
                            format!("worker {} sent prompt logprobs without their candidates", route.link.address());
                        return Some(self.fail(why));
                    }
                    self.send(Ok(EngineEvent::PromptLogprobs(logprobs)));
                    if let Some(top) = top.filter(|_| context.request.prompt_top_logprobs().is_some()) {
                        self.send(Ok(EngineEvent::PromptTopLogprobs(top)));
                    }
                    self.prompt_logprobs_sent = true;
                    context.prompt_logprobs_sent.send_replace(true);
                }
                None
            }
            SequenceEvent::Tokens { mut token_ids, mut logprobs, mut top } => {
                if context.request.params().top_logprobs() > 0 && top.len() != token_ids.len() {
                    let why = format!("worker {} sent tokens without their candidates", route.link.address());
                    return Some(self.fail(why));
                }
                let vocab_size = context.bounds.vocab_size;
                if let Some(bad) = token_ids.iter().find(|&&token| token >= vocab_size) {
                    let why = format!("token id {bad} is outside the vocabulary (size {vocab_size})");
                    return Some(self.protocol_error(route, why));
                }
                let room = self.budget().saturating_sub(self.produced);
                let overran = token_ids.len() > room;
                if overran {
                    token_ids.truncate(room);
                    logprobs.truncate(room);
                    top.truncate(room);
                }
                let count = token_ids.len();
                if count > 0 {
                    route.link.counters().record_tokens(count);
                    self.produced += count;
                    self.send(Ok(EngineEvent::Tokens {
                        sequence: self.index,
                        version: context.pin.version(),
                        token_ids,
                        logprobs,
                        top_logprobs: if context.request.params().top_logprobs() > 0 { top } else { Vec::new() },
                    }));
                }
                if overran {
                    self.finish(FinishReason::Length);
                    let budget = self.budget();
                    return Some(Outcome::EndedMisbehaved(format!("it streamed past the budget of {budget} tokens")));
                }
                None
            }
            SequenceEvent::Finished(reason) => {
                self.finish(reason);
                Some(Outcome::Ended)
            }
        }
    }

    /// An error from the worker: a refusal of the request itself fails it; a missing adapter means the worker is
    /// out of sync; anything else is the worker failing.
    fn refused_or_failed(&mut self, route: &Route, err: WorkerError) -> Outcome {
        match err {
            WorkerError::NotFound(_) => Outcome::WorkerFailed { why: err.to_string(), failure: Failure::OutOfSync },
            WorkerError::Unavailable(_) => Outcome::failed(err.to_string()),
            WorkerError::InvalidArgument(_)
            | WorkerError::FailedPrecondition(_)
            | WorkerError::AlreadyExists(_)
            | WorkerError::Refused(_) => {
                self.fail(format!("worker {} refused the request: {err}", route.link.address()))
            }
            WorkerError::Malformed(what) => self.protocol_error(route, what),
        }
    }

    /// The worker broke its protocol: the request fails with that error, and the worker counts a failure.
    fn protocol_error(&self, route: &Route, what: String) -> Outcome {
        let why = format!("worker {} broke its protocol: {what}", route.link.address());
        self.send(Err(EngineError::Internal(why.clone())));
        Outcome::EndedMisbehaved(why)
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
