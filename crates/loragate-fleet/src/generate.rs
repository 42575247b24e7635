//! Sampling on the fleet: a request's sequences each run as one streamed request on a READY worker holding the
//! request's pinned adapter version (the least busy; sequences of one request spread), with token-id prompts, in
//! the worker's protocol. Their events merge into the one [`EngineStream`] the coordinator reads; every token is
//! stamped with the pinned version.
//!
//! Dropping the stream (the caller left) ends every sequence's stream, which the worker sees as its client leaving.
//! Cancelling the request's token aborts each running sequence: by a call where the protocol has one (batched per
//! worker), waiting, bounded, for the abort finish that acknowledges it; else by closing its stream.
//!
//! Whatever a worker sends, a sequence stays bounded ([`StreamBounds`]): it ends at its budget, a worker silent past
//! the first-byte or inter-chunk timeout has its sequence handed back `Abort` with its tokens, and a token outside
//! the vocabulary is a protocol error. Each of these counts as a failure of the worker.

mod sequence;

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use loragate_core::{EngineError, EngineEvent, EngineStream, SampleRequest};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_util::sync::CancellationToken;

use crate::membership::{Membership, Route};
use crate::versions::Pin;

/// How long and how much a worker may take over one sequence.
#[derive(Clone, Copy, Debug)]
pub(crate) struct StreamBounds {
    /// How long an aborted sequence waits for its worker's abort finish.
    pub(crate) abort_ack_timeout: Duration,
    /// How long a worker may take from the request to its first event (the response head and the first chunk).
    pub(crate) first_byte_timeout: Duration,
    /// How long a worker may stay silent between two events of a stream.
    pub(crate) inter_chunk_timeout: Duration,
    /// The served vocabulary's size: a token id at or above it is a protocol error.
    pub(crate) vocab_size: u32,
}

/// What the sequences of one request share.
pub(crate) struct RequestContext {
    request: SampleRequest,
    pin: Pin,
    cancel: CancellationToken,
    events: mpsc::UnboundedSender<Result<EngineEvent, EngineError>>,
    membership: Membership,
    bounds: StreamBounds,
    /// True once the prompt's logprobs went out (or will not): other sequences start then, so that they come first.
    prompt_logprobs_sent: watch::Sender<bool>,
}

/// Starts `request`'s sequences on the fleet, pinned to `pin`'s version. Fails at once if no READY worker holds it.
pub(crate) fn start(
    request: SampleRequest,
    cancel: CancellationToken,
    pin: Pin,
    membership: Membership,
    bounds: StreamBounds,
) -> Result<EngineStream, EngineError> {
    let routes: Option<Vec<Route>> =
        (0..request.num_samples()).map(|_| membership.route(pin.engine_name(), &[])).collect();
    let routes = routes.ok_or_else(|| unroutable(&membership, pin.engine_name()))?;
    let (events, received) = mpsc::unbounded_channel();
    let (prompt_logprobs_sent, _) = watch::channel(!request.include_prompt_logprobs());
    let context = Arc::new(RequestContext { request, pin, cancel, events, membership, bounds, prompt_logprobs_sent });
    for (index, route) in (0u32..).zip(routes) {
        tokio::spawn(sequence::run(context.clone(), index, route));
    }
    Ok(UnboundedReceiverStream::new(received).boxed())
}

/// Why nothing can run `engine_name` now, naming every worker's state.
fn unroutable(membership: &Membership, engine_name: &str) -> EngineError {
    let roster = membership.roster();
    let what = if engine_name.is_empty() { "the base model" } else { engine_name };
    let workers: Vec<String> = roster
        .workers
        .iter()
        .map(|worker| {
            let holds = engine_name.is_empty() || worker.adapters.contains(engine_name);
            format!("{} {}{}", worker.link.address(), worker.state.as_str(), if holds { "" } else { " without it" })
        })
        .collect();
    EngineError::Unavailable(format!("no READY worker holds {what} [{}]", workers.join(", ")))
}
