//! A running sampling request as the fronts see it: the events of its sequences, with version segments, in the
//! order they were produced.
//!
//! Each request is driven by its own task (`driver`), which reads the engine eagerly, so a request is handed back
//! to an abort (or kept by a keep-mode pause) as soon as the engine stops it, whether or not its client is reading.
//! The driver also continues the sequences a pause kept: it waits for the adapter to reopen, registers the request
//! again and samples `prompt + tokens so far` for each, so the caller sees one stream with a gap. Dropping the
//! [`SampleStream`] abandons the request: the driver stops, and its admission guard cancels the engine's work and
//! leaves the registry.

mod driver;
mod live;

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::task::{Context, Poll, ready};

use futures::{Stream, StreamExt};
use tokio::sync::mpsc;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::adapter::Admission;
use crate::contract::{
    AdapterVersion, CoreError, EngineError, FinishReason, RequestId, SampleOutput, Segment, SequenceOutput, TopLogprobs,
};
use crate::engine::EngineStream;

pub(crate) use self::driver::Driver;
pub(crate) use self::live::{LiveRequest, LiveRequests};

/// One step of a request's output.
#[derive(Clone, Debug, PartialEq)]
pub enum SampleEvent {
    /// Once, before any token, if prompt logprobs were asked for: one per prompt token, the first NaN.
    PromptLogprobs(Vec<f32>),
    /// Once, right after the prompt logprobs, if prompt alternatives were asked for: one per prompt token.
    PromptTopLogprobs(Vec<TopLogprobs>),
    /// New tokens of one sequence.
    Tokens {
        /// The sequence's index.
        sequence: u32,
        /// The adapter version that produced them.
        version: AdapterVersion,
        /// The oldest adapter version whose keys and values they attended to (see [`Segment::kv_version`]).
        kv_version: AdapterVersion,
        /// The tokens.
        token_ids: Vec<u32>,
        /// Their logprobs.
        logprobs: Vec<f32>,
        /// With `top_logprobs` asked for, one per token: its rank and the most likely tokens at its position.
        top_logprobs: Vec<TopLogprobs>,
    },
    /// A sequence ended.
    Finished {
        /// The sequence's index.
        sequence: u32,
        /// Why it ended.
        reason: FinishReason,
        /// The version segments of the whole sequence.
        segments: Vec<Segment>,
    },
}

/// The output of an admitted request. Dropping it abandons the request.
pub struct SampleStream {
    request_id: RequestId,
    events: mpsc::UnboundedReceiver<Result<SampleEvent, CoreError>>,
    num_samples: usize,
    unfinished: usize,
    done: bool,
    cached_prompt_tokens: Arc<AtomicU32>,
    _abandon_on_drop: DropGuard,
}

/// Reads how many prompt tokens a request found in the engine's prefix cache ([`SampleStream::cached_prompt_tokens`]).
#[derive(Clone, Debug, Default)]
pub struct CachedPromptTokens(Arc<AtomicU32>);

impl CachedPromptTokens {
    /// The count so far.
    pub fn get(&self) -> u32 {
        self.0.load(Ordering::Relaxed)
    }
}

impl SampleStream {
    /// Starts `driver` on its own task over the first attempt's `admission` and engine `events`.
    pub(crate) fn spawn(driver: Driver, admission: Admission, events: EngineStream) -> Self {
        let (out, receiver) = mpsc::unbounded_channel();
        let request_id = admission.request_id().clone();
        let num_samples = driver.num_samples();
        let cached_prompt_tokens = driver.cached_prompt_tokens();
        let abandon = CancellationToken::new();
        tokio::spawn(abandon.clone().run_until_cancelled_owned(driver.run(admission, events, out)));
        Self {
            request_id,
            events: receiver,
            num_samples,
            unfinished: num_samples,
            done: false,
            cached_prompt_tokens,
            _abandon_on_drop: abandon.drop_guard(),
        }
    }

    /// How many of the prompt's tokens the engine found in its prefix cache instead of computing them (known once
    /// the first token came; 0 before, and for an engine without a prefix cache). The handle stays readable after
    /// the stream is consumed.
    pub fn cached_prompt_tokens(&self) -> CachedPromptTokens {
        CachedPromptTokens(Arc::clone(&self.cached_prompt_tokens))
    }

    /// The request's id.
    pub fn request_id(&self) -> &RequestId {
        &self.request_id
    }

    /// Drives the request to its end and gathers the finished output.
    pub async fn collect_output(mut self) -> Result<SampleOutput, CoreError> {
        let mut output = SampleOutput {
            request_id: self.request_id.clone(),
            sequences: (0..self.num_samples)
                .map(|_| SequenceOutput {
                    token_ids: Vec::new(),
                    logprobs: Vec::new(),
                    finish_reason: FinishReason::Abort,
                    segments: Vec::new(),
                    top_logprobs: Vec::new(),
                })
                .collect(),
            prompt_logprobs: Vec::new(),
            prompt_top_logprobs: Vec::new(),
        };
        while let Some(event) = self.next().await {
            match event? {
                SampleEvent::PromptLogprobs(logprobs) => output.prompt_logprobs = logprobs,
                SampleEvent::PromptTopLogprobs(top) => output.prompt_top_logprobs = top,
                SampleEvent::Tokens { sequence, token_ids, logprobs, top_logprobs, .. } => {
                    let out = &mut output.sequences[sequence as usize];
                    out.token_ids.extend(token_ids);
                    out.logprobs.extend(logprobs);
                    out.top_logprobs.extend(top_logprobs);
                }
                SampleEvent::Finished { sequence, reason, segments } => {
                    let out = &mut output.sequences[sequence as usize];
                    out.finish_reason = reason;
                    out.segments = segments;
                }
            }
        }
        Ok(output)
    }
}

impl Stream for SampleStream {
    type Item = Result<SampleEvent, CoreError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(None);
        }
        let item = match ready!(this.events.poll_recv(cx)) {
            Some(Ok(event)) => {
                if matches!(event, SampleEvent::Finished { .. }) {
                    this.unfinished -= 1;
                    this.done = this.unfinished == 0;
                }
                Ok(event)
            }
            Some(Err(err)) => {
                this.done = true;
                Err(err)
            }
            // The driver always ends a request with every sequence finished or an error; this is a panic.
            None => {
                this.done = true;
                Err(unfinished_error(this.unfinished, this.num_samples))
            }
        };
        Poll::Ready(Some(item))
    }
}

/// The error for a driver that ended with sequences unfinished (a bug or a panic in the engine's stream).
pub(crate) fn unfinished_error(unfinished: usize, of: usize) -> CoreError {
    CoreError::Engine(EngineError::Internal(format!(
        "the request ended with {unfinished} of {of} sequences unfinished"
    )))
}
