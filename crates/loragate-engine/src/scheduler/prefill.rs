//! A started request whose prompt is being prefilled, one chunk per step, into its own [`SequenceKv`].
//!
//! After each chunk: a chunk whose hidden states are not all finite fails the request (an adapter's values
//! overflowed; nothing else in the pass is touched); the prompt logprobs of the chunk's positions are computed and
//! kept (the whole list is sent once, before any token, exactly as a whole-prompt prefill would send it); after the
//! last chunk, each of the `num_samples` sequences samples its first token from the same last position, and those
//! that go on join the decode batch sharing the prompt's keys and values.

use std::sync::Arc;

use candle_core::Tensor;
use loragate_core::{EngineError, EngineEvent, SampleRequest, TopLogprobs};

use super::sequence::{RequestContext, Sequence, Submission};
use crate::lora::AdapterWeights;
use crate::model::{Llama, PrefillChunk, SequenceKv, log_softmax, log_softmax_rows};
use crate::sampler::{Sampler, top_logprobs};

/// Prompt positions whose logits are materialised at once when prompt logprobs are asked for.
const PROMPT_LOGPROB_CHUNK: usize = 256;

/// A request being prefilled.
pub(super) struct Prefill {
    pub(super) context: Arc<RequestContext>,
    request: SampleRequest,
    cache: SequenceKv,
    /// Present when the request asked for prompt logprobs.
    prompt_logprobs: Option<PromptLogprobs>,
}

/// The prompt logprobs computed so far.
struct PromptLogprobs {
    /// NaN for the first prompt token, then `log p(prompt[i] | prompt[..i])`.
    logprobs: Vec<f32>,
    /// With `prompt_top_logprobs`: each prompt token's rank and the most likely tokens at its position.
    top: Option<(usize, Vec<TopLogprobs>)>,
}

/// What became of a request after one of its chunks.
pub(super) enum ChunkOutcome {
    /// More of the prompt to prefill.
    Continue(Prefill),
    /// The prompt is prefilled and these sequences go on decoding, sharing its keys and values.
    Decode { sequences: Vec<Sequence>, cache: SequenceKv },
    /// The request has ended: it failed, or every sequence finished with its first token.
    Ended,
}

impl Prefill {
    /// Starts `submission` (numbered `id`): its cache is allocated for the whole prompt. `None` if it could not be
    /// (the request is answered with the error).
    pub(super) fn start(id: u64, submission: Submission, model: &Llama) -> Option<Self> {
        let (context, request) = RequestContext::new(id, submission, &model.config().eos_token_ids);
        let cache = match model.sequence_kv(request.prompt().len()) {
            Ok(cache) => cache,
            Err(err) => {
                tracing::error!(request = id, error = %err, "cannot allocate a prompt's cache");
                context.events.send(Err(EngineError::Internal(format!("cannot start the prefill: {err}"))));
                return None;
            }
        };
        let prompt_logprobs = request.include_prompt_logprobs().then(|| PromptLogprobs {
            logprobs: vec![f32::NAN],
            top: request.prompt_top_logprobs().map(|count| (count as usize, vec![TopLogprobs::default()])),
        });
        Some(Self { context, request, cache, prompt_logprobs })
    }

    /// The batch places its sequences take.
    pub(super) fn samples(&self) -> usize {
        self.request.num_samples() as usize
    }

    /// The prompt tokens still to prefill.
    pub(super) fn remaining(&self) -> usize {
        self.request.prompt().len() - self.cache.len()
    }

    /// The prompt positions prefilled so far.
    #[cfg(test)]
    pub(super) fn prefilled(&self) -> usize {
        self.cache.len()
    }

    /// Its tenant: the adapter it runs on, or the base model.
    #[cfg(test)]
    pub(super) fn tenant(&self) -> &loragate_core::AdapterKey {
        self.request.adapter()
    }

    /// The adapter its tokens run with (`None`: the base model).
    pub(super) fn adapter(&self) -> Option<&Arc<AdapterWeights>> {
        self.context.adapter.as_ref()
    }

    /// The next `tokens` prompt tokens, to run in this step's pass.
    pub(super) fn chunk(&mut self, tokens: usize) -> PrefillChunk<'_> {
        let start = self.cache.len();
        PrefillChunk { tokens: &self.request.prompt()[start..start + tokens], cache: &mut self.cache }
    }

    /// Ends the request with `Abort` for every sequence, and no tokens.
    pub(super) fn abort(&self) {
        for sequence in 0..self.request.num_samples() {
            self.context.send(EngineEvent::Finished { sequence, reason: loragate_core::FinishReason::Abort });
        }
    }

    /// Takes the final hidden states `(len, hidden)` of the chunk just run (`finite`: whether they are all finite).
    pub(super) fn finish_chunk(mut self, hidden: &Tensor, finite: bool, model: &Llama) -> ChunkOutcome {
        if !finite {
            let end = self.cache.len();
            let start = end - hidden.dim(0).unwrap_or(0);
            let where_ = format!(
                "in the prefill of prompt positions {start}..{end}, with adapter version {}",
                self.context.version
            );
            self.context.events.send(Err(EngineError::NonFiniteOutput(where_)));
            return ChunkOutcome::Ended;
        }
        match self.after_chunk(hidden, model) {
            Ok(None) => ChunkOutcome::Continue(self),
            Ok(Some(sequences)) if sequences.is_empty() => ChunkOutcome::Ended,
            Ok(Some(sequences)) => ChunkOutcome::Decode { sequences, cache: self.cache },
            Err(Failure::Sent) => ChunkOutcome::Ended,
            Err(Failure::Model(err)) => {
                tracing::error!(request = self.context.id, error = %err, "prefill failed");
                self.context.events.send(Err(EngineError::Internal(format!("prefill failed: {err}"))));
                ChunkOutcome::Ended
            }
        }
    }

    /// The prompt logprobs of the chunk's positions, and after the last chunk the first tokens: `Some` of the
    /// sequences that go on once the prompt is done.
    fn after_chunk(&mut self, hidden: &Tensor, model: &Llama) -> Result<Option<Vec<Sequence>>, Failure> {
        let len = hidden.dim(0)?;
        let prompt_len = self.request.prompt().len();
        let end = self.cache.len();
        let start = end - len;
        if let Some(prompt_logprobs) = &mut self.prompt_logprobs {
            // Position i predicts prompt token i + 1; the last prompt position predicts the first new token.
            let predicting = end.min(prompt_len - 1) - start;
            let known = prompt_logprobs.logprobs.len();
            prompt_logprobs.extend(model, &hidden.narrow(0, 0, predicting)?, &self.request.prompt()[start + 1..])?;
            if !prompt_logprobs.logprobs[known..].iter().all(|logprob| logprob.is_finite()) {
                let where_ = format!("in the prompt logprobs, with adapter version {}", self.context.version);
                self.context.events.send(Err(EngineError::NonFiniteOutput(where_)));
                return Err(Failure::Sent);
            }
        }
        if end < prompt_len {
            return Ok(None);
        }
        if let Some(PromptLogprobs { logprobs, top }) = self.prompt_logprobs.take() {
            self.context.send(EngineEvent::PromptLogprobs(logprobs));
            if let Some((_, top)) = top {
                self.context.send(EngineEvent::PromptTopLogprobs(top));
            }
        }
        let logits = model.logits(&hidden.narrow(0, len - 1, 1)?)?;
        let logprobs = log_softmax_rows(&logits)?;
        let logits = if Sampler::needs_logits_for(self.request.params()) {
            Some(logits.flatten_all()?.to_vec1::<f32>()?)
        } else {
            None
        };
        let prompt = self.request.prompt();
        let mut continuing = Vec::new();
        for index in 0..self.request.num_samples() {
            let sampler = Sampler::new(self.request.params(), index, prompt, self.context.stop_tokens());
            let mut sequence = Sequence::new(Arc::clone(&self.context), index, sampler, prompt.len());
            match sequence.advance(&logprobs, logits.as_deref(), model.context_length()) {
                Ok(Some(reason)) => sequence.finish(reason),
                Ok(None) => continuing.push(sequence),
                Err(error) => sequence.fail(error),
            }
        }
        Ok(Some(continuing))
    }
}

impl PromptLogprobs {
    /// Appends the logprobs of `predicted[..n]` under the hidden states `(n, hidden)` of the positions before them.
    fn extend(&mut self, model: &Llama, hidden: &Tensor, predicted: &[u32]) -> candle_core::Result<()> {
        let positions = hidden.dim(0)?;
        let mut done = 0;
        while done < positions {
            let len = PROMPT_LOGPROB_CHUNK.min(positions - done);
            let logprobs = log_softmax(&model.logits(&hidden.narrow(0, done, len)?)?)?;
            let predicted = &predicted[done..done + len];
            let targets = Tensor::from_slice(predicted, (len, 1), model.device())?;
            self.logprobs.extend(logprobs.gather(&targets, 1)?.flatten_all()?.to_vec1::<f32>()?);
            if let Some((count, top)) = &mut self.top {
                let rows = logprobs.to_vec2::<f32>()?;
                top.extend(rows.iter().zip(predicted).map(|(row, &token)| top_logprobs(row, *count, token)));
            }
            done += len;
        }
        Ok(())
    }
}

/// Why a chunk's results could not be used.
enum Failure {
    /// The request was already told why.
    Sent,
    /// The model failed.
    Model(candle_core::Error),
}

impl From<candle_core::Error> for Failure {
    fn from(err: candle_core::Error) -> Self {
        Self::Model(err)
    }
}
