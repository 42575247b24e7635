//! The engine's events as vLLM's `GenerateResponse` stream: `PromptInfo` first (with prompt logprobs when asked;
//! the first prompt position has no score and is reported as 0, as vLLM does), then one `SequenceOutput` per token
//! chunk (token ids and logprobs only when asked; with `top_n` candidates, each token's rank and the N most likely
//! tokens at its position, ranked from 1), and a last one with `FinishInfo` (`ABORTED` for an abort, after
//! every token produced; a stop names the EOS or stop token). The stream holds the request's [`SampleStream`]:
//! dropping it (the client went away) abandons the request in the coordinator.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::{Stream, StreamExt};
use loragate_core::{FinishReason, ModelInfo, SampleEvent, SampleStream, TopLogprobs};
use tonic::Status;
use vllm_proto as pb;

use super::request::{GenerateCall, ResponseOptions};
use crate::error::WorkerError;

/// Turns one sequence's events into response messages.
pub(crate) struct ResponseBuilder {
    options: ResponseOptions,
    prompt: Arc<[u32]>,
    eos_token_ids: Vec<u32>,
    ignore_eos: bool,
    produced: u32,
    last_token: Option<u32>,
}

impl ResponseBuilder {
    pub(crate) fn new(call: &GenerateCall, model: &ModelInfo) -> Self {
        Self {
            options: call.options,
            prompt: call.request.prompt().clone(),
            eos_token_ids: model.eos_token_ids.clone(),
            ignore_eos: call.request.params().ignore_eos(),
            produced: 0,
            last_token: None,
        }
    }

    fn prompt_info(&self, logprobs: Option<Vec<f32>>, top: Vec<TopLogprobs>) -> pb::PromptInfo {
        let wants_logprobs = self.options.prompt_logprobs || self.options.prompt_top_n.is_some();
        let logprobs = match logprobs {
            Some(logprobs) if wants_logprobs => {
                logprobs.into_iter().map(|logprob| if logprob.is_nan() { 0.0 } else { logprob }).collect()
            }
            _ => Vec::new(),
        };
        let (ranks, candidate_tokens) = candidates(top);
        pb::PromptInfo {
            num_prompt_tokens: self.prompt.len() as u32,
            token_ids: if self.options.prompt_token_ids { self.prompt.to_vec() } else { Vec::new() },
            logprobs,
            ranks,
            candidate_tokens,
        }
    }

    fn tokens(&mut self, token_ids: Vec<u32>, logprobs: Vec<f32>, top: Vec<TopLogprobs>) -> pb::SequenceOutput {
        self.produced += token_ids.len() as u32;
        self.last_token = token_ids.last().copied().or(self.last_token);
        let (ranks, candidate_tokens) = candidates(top);
        pb::SequenceOutput {
            num_tokens: token_ids.len() as u32,
            token_ids: if self.options.output_token_ids { token_ids } else { Vec::new() },
            logprobs: if self.options.output_logprobs || self.options.output_top_n > 0 { logprobs } else { Vec::new() },
            ranks,
            candidate_tokens,
            ..Default::default()
        }
    }

    fn finish(&self, reason: FinishReason) -> pb::SequenceOutput {
        use pb::finish_info::{FinishReason as Reason, StopReason};
        let (finish_reason, stop_reason) = match reason {
            FinishReason::Length => (Reason::Length, None),
            FinishReason::Abort => (Reason::Aborted, None),
            FinishReason::Stop => {
                // The stop token is the sequence's last token; EOS wins unless it was ignored (vLLM's check order).
                let stop = self.last_token.map(|token| {
                    if !self.ignore_eos && self.eos_token_ids.contains(&token) {
                        StopReason::EosTokenId(token)
                    } else {
                        StopReason::StopTokenId(token)
                    }
                });
                (Reason::Stop, stop)
            }
        };
        pb::SequenceOutput {
            finish_info: Some(pb::FinishInfo {
                num_output_tokens: self.produced,
                finish_reason: finish_reason.into(),
                stop_reason,
                ..Default::default()
            }),
            ..Default::default()
        }
    }
}

/// The ranks and candidate tokens of `top` (empty when no candidates were asked for): each position's N most likely
/// tokens, ranked from 1.
fn candidates(top: Vec<TopLogprobs>) -> (Vec<u32>, Vec<pb::CandidateTokenInfo>) {
    top.into_iter()
        .map(|position| {
            let tokens = (1..)
                .zip(position.top)
                .map(|(rank, (id, logprob))| pb::candidate_token_info::TokenInfo { id, logprob, rank })
                .collect();
            (position.rank, pb::CandidateTokenInfo { tokens })
        })
        .unzip()
}

/// The response stream of one `GenerateStream` call.
pub(crate) struct GenerateResponses {
    builder: ResponseBuilder,
    samples: SampleStream,
    ready: VecDeque<Result<pb::GenerateResponse, Status>>,
    prompt_info_sent: bool,
    /// Prompt logprobs waiting for the prompt's candidates (they come right after, when asked for).
    prompt_logprobs: Option<Vec<f32>>,
    ended: bool,
}

impl GenerateResponses {
    pub(crate) fn new(builder: ResponseBuilder, samples: SampleStream) -> Self {
        let mut responses = Self {
            builder,
            samples,
            ready: VecDeque::new(),
            prompt_info_sent: false,
            prompt_logprobs: None,
            ended: false,
        };
        // Prompt logprobs come from the engine first; without them the prompt info goes out at once.
        if !responses.builder.options.prompt_logprobs && responses.builder.options.prompt_top_n.is_none() {
            responses.send_prompt_info(None, Vec::new());
        }
        responses
    }

    /// Drives the request to its end and answers with one response (unary `Generate`).
    pub(crate) async fn collect(mut self) -> Result<pb::GenerateResponse, Status> {
        let mut prompt_info = None;
        let mut output = pb::SequenceOutput::default();
        while let Some(response) = self.next().await {
            let response = response?;
            prompt_info = prompt_info.or(response.prompt_info);
            if let Some(chunk) = response.outputs {
                output.num_tokens += chunk.num_tokens;
                output.token_ids.extend(chunk.token_ids);
                output.logprobs.extend(chunk.logprobs);
                output.ranks.extend(chunk.ranks);
                output.candidate_tokens.extend(chunk.candidate_tokens);
                output.finish_info = chunk.finish_info.or(output.finish_info);
            }
        }
        Ok(pb::GenerateResponse { prompt_info, outputs: Some(output) })
    }

    fn send_prompt_info(&mut self, logprobs: Option<Vec<f32>>, top: Vec<TopLogprobs>) {
        let prompt_info = self.builder.prompt_info(logprobs, top);
        self.prompt_info_sent = true;
        self.ready.push_back(Ok(pb::GenerateResponse { prompt_info: Some(prompt_info), outputs: None }));
    }

    fn send_output(&mut self, output: pb::SequenceOutput) {
        if !self.prompt_info_sent {
            let logprobs = self.prompt_logprobs.take();
            self.send_prompt_info(logprobs, Vec::new());
        }
        self.ready.push_back(Ok(pb::GenerateResponse { prompt_info: None, outputs: Some(output) }));
    }

    fn accept(&mut self, event: SampleEvent) {
        match event {
            SampleEvent::PromptLogprobs(logprobs) if self.builder.options.prompt_top_n.is_some() => {
                self.prompt_logprobs = Some(logprobs);
            }
            SampleEvent::PromptLogprobs(logprobs) => self.send_prompt_info(Some(logprobs), Vec::new()),
            SampleEvent::PromptTopLogprobs(top) => {
                let logprobs = self.prompt_logprobs.take();
                self.send_prompt_info(logprobs, top);
            }
            SampleEvent::Tokens { token_ids, logprobs, top_logprobs, .. } => {
                let output = self.builder.tokens(token_ids, logprobs, top_logprobs);
                self.send_output(output);
            }
            SampleEvent::Finished { reason, .. } => {
                let output = self.builder.finish(reason);
                self.send_output(output);
                self.ended = true;
            }
        }
    }
}

impl Stream for GenerateResponses {
    type Item = Result<pb::GenerateResponse, Status>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            if let Some(item) = this.ready.pop_front() {
                return Poll::Ready(Some(item));
            }
            if this.ended {
                return Poll::Ready(None);
            }
            match this.samples.poll_next_unpin(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Ok(event))) => this.accept(event),
                Poll::Ready(Some(Err(err))) => {
                    this.ready.push_back(Err(WorkerError::from_core(err).into()));
                    this.ended = true;
                }
                // The stream ends after the (one) sequence's `Finished`, which ended this stream first.
                Poll::Ready(None) => {
                    this.ready.push_back(Err(Status::internal("the request ended without finishing")));
                    this.ended = true;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use loragate_core::{ModelInfo, RawSampleRequest, SampleRequest};
    use pb::finish_info::{FinishReason as Reason, StopReason};

    use super::*;

    fn builder(ignore_eos: bool, options: ResponseOptions) -> ResponseBuilder {
        let model = ModelInfo { vocab_size: 260, context_length: 64, eos_token_ids: vec![257] };
        let raw = RawSampleRequest { prompt_token_ids: vec![1, 2], ignore_eos, ..Default::default() };
        let call = GenerateCall { request: SampleRequest::parse(raw, &model).expect("valid"), options };
        ResponseBuilder::new(&call, &model)
    }

    #[test]
    fn top_n_candidates_carry_each_tokens_rank_and_the_most_likely_tokens_ranked_from_one() {
        let options = ResponseOptions { output_top_n: 2, prompt_top_n: Some(1), ..ResponseOptions::default() };
        let mut asked = builder(false, options);
        let top = vec![
            TopLogprobs { rank: 2, top: vec![(7, -0.1), (5, -0.3)] },
            TopLogprobs { rank: 1, top: vec![(6, -0.2), (8, -2.0)] },
        ];
        let chunk = asked.tokens(vec![5, 6], vec![-0.3, -0.2], top);
        assert_eq!(chunk.logprobs, vec![-0.3, -0.2], "candidates need the tokens' own logprobs");
        assert_eq!(chunk.ranks, vec![2, 1]);
        let first: Vec<(u32, f32, u32)> =
            chunk.candidate_tokens[0].tokens.iter().map(|token| (token.id, token.logprob, token.rank)).collect();
        assert_eq!(first, vec![(7, -0.1, 1), (5, -0.3, 2)]);
        let prompt_top = vec![TopLogprobs::default(), TopLogprobs { rank: 3, top: vec![(4, -0.01)] }];
        let info = asked.prompt_info(Some(vec![f32::NAN, -1.5]), prompt_top);
        assert_eq!((info.logprobs, info.ranks), (vec![0.0, -1.5], vec![0, 3]));
        assert_eq!(info.candidate_tokens[1].tokens.len(), 1);
    }

    #[test]
    fn a_stop_names_the_eos_or_stop_token_that_ended_the_sequence() {
        let mut eos = builder(false, ResponseOptions::default());
        eos.tokens(vec![5, 257], vec![-0.1, -0.2], Vec::new());
        let finish = eos.finish(FinishReason::Stop).finish_info.expect("finish");
        assert_eq!((finish.finish_reason(), finish.stop_reason), (Reason::Stop, Some(StopReason::EosTokenId(257))));
        assert_eq!(finish.num_output_tokens, 2);

        let mut stop = builder(true, ResponseOptions::default());
        stop.tokens(vec![257, 9], vec![-0.1, -0.2], Vec::new());
        let finish = stop.finish(FinishReason::Stop).finish_info.expect("finish");
        assert_eq!(finish.stop_reason, Some(StopReason::StopTokenId(9)));

        let aborted = builder(false, ResponseOptions::default()).finish(FinishReason::Abort).finish_info;
        assert_eq!(aborted.map(|f| (f.finish_reason(), f.stop_reason)), Some((Reason::Aborted, None)));
    }

    #[test]
    fn chunks_carry_ids_and_logprobs_only_when_asked_and_the_unscored_first_prompt_position_is_zero() {
        let mut quiet = builder(false, ResponseOptions::default());
        let chunk = quiet.tokens(vec![1, 2], vec![-0.5, -0.25], Vec::new());
        assert_eq!((chunk.num_tokens, chunk.token_ids.len(), chunk.logprobs.len()), (2, 0, 0));

        let options = ResponseOptions {
            prompt_token_ids: true,
            prompt_logprobs: true,
            output_token_ids: true,
            output_logprobs: true,
            ..ResponseOptions::default()
        };
        let mut asked = builder(false, options);
        let chunk = asked.tokens(vec![1, 2], vec![-0.5, -0.25], Vec::new());
        assert_eq!((chunk.token_ids, chunk.logprobs), (vec![1, 2], vec![-0.5, -0.25]));
        let info = asked.prompt_info(Some(vec![f32::NAN, -1.5]), Vec::new());
        assert_eq!((info.token_ids, info.logprobs, info.num_prompt_tokens), (vec![1, 2], vec![0.0, -1.5], 2));
    }
}
