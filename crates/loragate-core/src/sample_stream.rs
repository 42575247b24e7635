//! A running sampling request as the fronts see it: the engine's events, checked and enriched with version
//! segments, holding the request's [`Admission`] until the last sequence is handed back.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::{Stream, StreamExt};

use crate::adapter::{Admission, Ending};
use crate::coordinator::LiveRequest;
use crate::engine::{EngineError, EngineEvent, EngineStream};
use crate::error::CoreError;
use crate::ids::{AdapterVersion, RequestId};
use crate::metrics::{AdapterLabels, CoreMetrics};
use crate::output::{FinishReason, SampleOutput, Segment, SegmentsBuilder, SequenceOutput, TopLogprobs};

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

#[derive(Default)]
struct SequenceProgress {
    segments: SegmentsBuilder,
    finished: bool,
}

/// The output of an admitted request. Dropping it abandons the request: its admission guard cancels the engine's
/// work and leaves the registry.
pub struct SampleStream {
    request_id: RequestId,
    events: EngineStream,
    admission: Option<Admission>,
    sequences: Vec<SequenceProgress>,
    unfinished: usize,
    aborted: bool,
    _live: LiveRequest,
    metrics: Arc<CoreMetrics>,
    labels: AdapterLabels,
}

impl SampleStream {
    pub(crate) fn new(
        num_samples: u32,
        events: EngineStream,
        admission: Admission,
        live: LiveRequest,
        (metrics, labels): (Arc<CoreMetrics>, AdapterLabels),
    ) -> Self {
        let sequences: Vec<SequenceProgress> = (0..num_samples).map(|_| SequenceProgress::default()).collect();
        Self {
            request_id: admission.request_id().clone(),
            unfinished: sequences.len(),
            events,
            admission: Some(admission),
            sequences,
            aborted: false,
            _live: live,
            metrics,
            labels,
        }
    }

    /// The request's id.
    pub fn request_id(&self) -> &RequestId {
        &self.request_id
    }

    /// Drives the request to its end and gathers the finished output.
    pub async fn collect_output(mut self) -> Result<SampleOutput, CoreError> {
        let mut output = SampleOutput {
            request_id: self.request_id.clone(),
            sequences: (0..self.sequences.len())
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

    /// Checks one engine event and records its tokens' provenance.
    fn accept(&mut self, event: EngineEvent) -> Result<SampleEvent, CoreError> {
        fn progress(sequences: &mut [SequenceProgress], sequence: u32) -> Result<&mut SequenceProgress, CoreError> {
            match sequences.get_mut(sequence as usize) {
                Some(progress) if !progress.finished => Ok(progress),
                _ => Err(CoreError::Engine(EngineError::Internal(format!(
                    "engine sent an event for sequence {sequence}, which is not running"
                )))),
            }
        }
        Ok(match event {
            EngineEvent::PromptLogprobs(logprobs) => SampleEvent::PromptLogprobs(logprobs),
            EngineEvent::PromptTopLogprobs(top) => SampleEvent::PromptTopLogprobs(top),
            EngineEvent::Tokens { sequence, version, token_ids, logprobs, top_logprobs } => {
                if token_ids.len() != logprobs.len()
                    || !(top_logprobs.is_empty() || top_logprobs.len() == logprobs.len())
                {
                    return Err(CoreError::Engine(EngineError::Internal(format!(
                        "engine sent {} tokens with {} logprobs and {} top-logprob entries",
                        token_ids.len(),
                        logprobs.len(),
                        top_logprobs.len()
                    ))));
                }
                let count = u32::try_from(token_ids.len()).unwrap_or(u32::MAX);
                progress(&mut self.sequences, sequence)?.segments.push(version, count);
                self.metrics.record_tokens(&self.labels, version, token_ids.len());
                SampleEvent::Tokens { sequence, version, token_ids, logprobs, top_logprobs }
            }
            EngineEvent::Finished { sequence, reason } => {
                let progress = progress(&mut self.sequences, sequence)?;
                progress.finished = true;
                let segments = std::mem::take(&mut progress.segments).finish();
                self.unfinished -= 1;
                self.aborted |= reason == FinishReason::Abort;
                SampleEvent::Finished { sequence, reason, segments }
            }
        })
    }

    /// Hands the request back: an abort waiting for it may now return.
    fn hand_back(&mut self, ending: Ending) {
        if let Some(admission) = self.admission.take() {
            admission.hand_back(ending);
        }
    }
}

impl Stream for SampleStream {
    type Item = Result<SampleEvent, CoreError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.admission.is_none() {
            return Poll::Ready(None);
        }
        let item = match this.events.poll_next_unpin(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(Some(Ok(event))) => this.accept(event),
            Poll::Ready(Some(Err(err))) => Err(err.into()),
            Poll::Ready(None) => Err(CoreError::Engine(EngineError::Internal(format!(
                "engine ended the stream with {} of {} sequences unfinished",
                this.unfinished,
                this.sequences.len()
            )))),
        };
        match &item {
            Err(_) => this.hand_back(Ending::Failed),
            Ok(_) if this.unfinished == 0 => {
                let ending = if this.aborted { Ending::Aborted } else { Ending::Completed };
                this.hand_back(ending);
            }
            Ok(_) => {}
        }
        Poll::Ready(Some(item))
    }
}
