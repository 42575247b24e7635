//! One worker as the fleet drives it, whatever protocol it speaks: the [`WorkerClient`] trait (defined here, where it
//! is consumed: membership, staging and the sequences use nothing else), its protocol-independent requests and
//! events, and one implementation per protocol:
//!
//! - [`grpc`]: vLLM's own gRPC protocol (`loragate worker`, vLLM's Rust frontend);
//! - [`vllm_http`]: vLLM's OpenAI-compatible HTTP server;
//! - [`sglang_http`]: SGLang's HTTP server.
//!
//! [`connect`] picks the implementation from the address's scheme.

mod agent;
mod grpc;
mod http;
mod sglang_http;
mod sse;
mod vllm_http;

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures::stream::BoxStream;
use loragate_core::{FinishReason, Key, SampleRequest, TopLogprobs};

use crate::address::{Protocol, WorkerAddress};
use crate::delivery::Delivery;

/// What went wrong with a call to a worker, in the terms the fleet acts on.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum WorkerError {
    /// The worker refused the call's content (bad adapter files, a bad field).
    #[error("InvalidArgument: {0}")]
    InvalidArgument(String),
    /// The worker cannot do it as configured (LoRA disabled, an adapter it cannot serve).
    #[error("FailedPrecondition: {0}")]
    FailedPrecondition(String),
    /// The worker does not hold the named adapter (or request).
    #[error("NotFound: {0}")]
    NotFound(String),
    /// The worker holds that adapter name already.
    #[error("AlreadyExists: {0}")]
    AlreadyExists(String),
    /// The worker refused for another lasting reason (unauthorized, unimplemented).
    #[error("Refused: {0}")]
    Refused(String),
    /// The worker answered something the protocol does not allow (counts that do not match, bad JSON).
    #[error("Malformed: {0}")]
    Malformed(String),
    /// The worker failed or could not be reached (transport errors, 5xx, no answer in time).
    #[error("Unavailable: {0}")]
    Unavailable(String),
}

/// One sequence of a request, as the fleet asks a worker to run it.
pub(crate) struct SequenceRequest<'a> {
    /// The validated request.
    pub(crate) request: &'a SampleRequest,
    /// Which of its sequences this is (a seeded request's sequence i uses seed + i).
    pub(crate) sequence: u32,
    /// A fresh id, unique per attempt, so that this attempt alone can be aborted.
    pub(crate) request_id: String,
    /// The adapter version's engine-side name (`NAME@V`), or empty for the base model.
    pub(crate) engine_name: &'a str,
    /// Report the prompt's logprobs (and its top candidates if the request asks for them) first.
    pub(crate) with_prompt_logprobs: bool,
}

/// What a running sequence reports, in the core's conventions.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum SequenceEvent {
    /// The prompt's logprobs (one per prompt token, the first NaN), and its top candidates if asked for.
    PromptLogprobs { logprobs: Vec<f32>, top: Option<Vec<TopLogprobs>> },
    /// New tokens with their logprobs (and candidates if asked for: one per token, else empty).
    Tokens { token_ids: Vec<u32>, logprobs: Vec<f32>, top: Vec<TopLogprobs> },
    /// The sequence ended (an abort finish acknowledges an abort).
    Finished(FinishReason),
}

/// How a running sequence is aborted.
pub(crate) enum AbortBy {
    /// Through [`WorkerClient::abort`] with this id once it is known (vLLM's HTTP server tells it in its first
    /// chunk); the sequence's abort finish acknowledges it. Before the id is known, the stream is closed.
    Call(Arc<OnceLock<String>>),
    /// By closing its stream: the worker aborts a request whose client went away. Nothing acknowledges it: the
    /// sequence is handed back at once with what was received.
    Disconnect,
}

impl AbortBy {
    /// Abort by a call with `id`.
    pub(crate) fn call(id: String) -> Self {
        Self::Call(Arc::new(OnceLock::from(id)))
    }
}

/// A sequence the worker accepted: its events (ending with `Ok(None)`-style end of stream) and how to abort it.
pub(crate) struct OpenedSequence {
    pub(crate) events: BoxStream<'static, Result<SequenceEvent, WorkerError>>,
    pub(crate) abort: AbortBy,
}

/// What a worker says about itself when it joins.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct WorkerFacts {
    /// The context it serves, if it says.
    pub(crate) context_length: Option<u32>,
    /// The adapters it holds: engine-side name → the path it was loaded from, if the worker says.
    pub(crate) adapters: BTreeMap<String, Option<String>>,
}

/// One worker, whatever protocol it speaks. Every call is bounded by the timeout it is given (streams by the
/// sequence's own bounds).
#[async_trait::async_trait]
pub(crate) trait WorkerClient: Send + Sync + 'static {
    /// Whether it answers its health check as serving.
    async fn check_health(&self, timeout: Duration) -> Result<(), WorkerError>;

    /// Its context and adapters, and whatever else the protocol needs to know of it (probed endpoints).
    async fn describe(&self, timeout: Duration) -> Result<WorkerFacts, WorkerError>;

    /// Loads adapter `engine_name` as `delivery` says: a pushed version's files streamed to the worker (or its agent)
    /// where the protocol can, else from the path as the worker sees it. `AlreadyExists` if it holds the name.
    async fn load_adapter(&self, engine_name: &str, delivery: &Delivery, timeout: Duration) -> Result<(), WorkerError>;

    /// Unloads adapter `engine_name`. `NotFound` if it does not hold it.
    async fn unload_adapter(&self, engine_name: &str, timeout: Duration) -> Result<(), WorkerError>;

    /// Starts one sequence (with the prompt's logprobs first if asked for).
    async fn generate(&self, sequence: SequenceRequest<'_>) -> Result<OpenedSequence, WorkerError>;

    /// Aborts the sequences with these ids (from [`AbortBy::Call`]); each one's abort finish acknowledges it.
    async fn abort(&self, ids: Vec<String>, timeout: Duration) -> Result<(), WorkerError>;
}

/// Timeouts and the credential the clients need beyond each call's own.
#[derive(Clone, Debug)]
pub(crate) struct ClientSettings {
    /// How long a connection attempt may take.
    pub(crate) connect_timeout: Duration,
    /// The key every call presents as `authorization: Bearer KEY` (`--worker-key`).
    pub(crate) key: Option<Key>,
}

/// The client for the worker at `address`, by its protocol (connected lazily).
pub(crate) fn connect(address: &WorkerAddress, settings: ClientSettings) -> Result<Arc<dyn WorkerClient>, WorkerError> {
    Ok(match address.protocol() {
        Protocol::Grpc => Arc::new(grpc::GrpcWorker::new(address, settings)?),
        Protocol::VllmHttp => Arc::new(vllm_http::VllmHttpWorker::new(address, settings)?),
        Protocol::SglangHttp => Arc::new(sglang_http::SglangHttpWorker::new(address, settings)?),
    })
}

/// The rank of `token` from the top candidates of its position, where they decide it: 1 + how many other
/// candidates were at least as likely, if `token` is among them; 0 (unknown) if it is not and the worker reports no
/// rank. Candidates are sorted most likely first.
pub(crate) fn rank_among(token: u32, candidates: &[(u32, f32)]) -> u32 {
    let Some(&(_, own)) = candidates.iter().find(|(id, _)| *id == token) else { return 0 };
    let others = candidates.iter().filter(|&&(id, logprob)| id != token && logprob >= own).count();
    u32::try_from(others).map_or(0, |others| others + 1)
}

/// Sorts candidates most likely first (ties by token id) and keeps the `keep` most likely.
pub(crate) fn most_likely(mut candidates: Vec<(u32, f32)>, keep: usize) -> Vec<(u32, f32)> {
    candidates.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    candidates.truncate(keep);
    candidates
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_come_from_the_candidates_only_where_they_decide_them() {
        let candidates = most_likely(vec![(7, -2.0), (3, -0.5), (9, -1.0)], 3);
        assert_eq!(candidates, [(3, -0.5), (9, -1.0), (7, -2.0)]);
        assert_eq!(rank_among(3, &candidates), 1);
        assert_eq!(rank_among(7, &candidates), 3);
        assert_eq!(rank_among(42, &candidates), 0, "outside the candidates: unknown, never invented");
        assert_eq!(most_likely(vec![(1, -1.0), (2, -1.0), (0, -3.0)], 2), [(1, -1.0), (2, -1.0)]);
    }
}
