//! A request whose prompt is being prefilled, one chunk per step, into blocks of the paged cache — or a preempted
//! sequence whose keys and values are being computed again.
//!
//! Starting ([`Prefill::begin`]) takes every leading block of its tokens that the prefix cache holds, computed under
//! the same adapter version and cache salt (at most all but the block of a prompt's last position, whose logits are
//! needed), and prefills only the rest; if the next block is being computed by another prefill, it waits for it
//! instead of computing it twice. The blocks it allocates for full blocks of its tokens are registered as pending,
//! then computed once their positions are written, for others to reuse.
//!
//! After each chunk: a chunk whose hidden states are not all finite fails the request (an adapter's values
//! overflowed; nothing else in the pass is touched, and its pending blocks are forgotten); the prompt logprobs of
//! the chunk's positions are computed and kept (the whole list is sent once, before any token, exactly as a
//! whole-prompt prefill would send it); after the last chunk, each of the `num_samples` sequences samples its first
//! token from the same last position, and those that go on join the decode batch sharing the prompt's blocks.

use std::sync::Arc;

use candle_core::Tensor;
use loragate_core::{EngineError, EngineEvent, FinishReason, SampleRequest, TopLogprobs};

use super::fair::Queued;
use super::sequence::{RequestContext, Sequence, Submission};
use crate::lora::AdapterWeights;
use crate::model::{
    BLOCK_SIZE, BlockHash, BlockPool, KvCache, Llama, PrefillChunk, SequenceBlocks, log_softmax, log_softmax_rows,
};
use crate::sampler::{Sampler, top_logprobs};

/// Prompt positions whose logits are materialised at once when prompt logprobs are asked for.
const PROMPT_LOGPROB_CHUNK: usize = 256;

/// A request (or a preempted sequence) whose keys and values are being computed.
pub(super) struct Prefill {
    pub(super) context: Arc<RequestContext>,
    goal: Goal,
    /// The tokens whose keys and values it computes, from position 0.
    tokens: Arc<[u32]>,
    /// The root of its blocks' names (`None`: they are never reused), and the names of its tokens' full blocks.
    root: Option<BlockHash>,
    chain: Vec<BlockHash>,
    /// `None` until it starts, and again once preempted: it holds no block and no place in the batch then.
    blocks: Option<SequenceBlocks>,
    /// The blocks it registered as pending, by index, until their positions are all written.
    pending: Vec<(usize, u32)>,
    /// When it started, in the step thread's order: the newest is preempted first.
    pub(super) stamp: u64,
    /// Whether it started before (and was preempted since).
    started_before: bool,
}

/// What comes after the prefill.
enum Goal {
    /// A new request: sample each of its sequences' first token from the prompt's last position.
    Sample { request: Box<SampleRequest>, prompt_logprobs: Option<PromptLogprobs> },
    /// A preempted sequence: once its keys and values are back, it decodes on.
    Resume(Box<Sequence>),
}

/// The prompt logprobs computed so far.
struct PromptLogprobs {
    /// NaN for the first prompt token, then `log p(prompt[i] | prompt[..i])`.
    logprobs: Vec<f32>,
    /// With `prompt_top_logprobs`: each prompt token's rank and the most likely tokens at its position.
    top: Option<(usize, Vec<TopLogprobs>)>,
}

impl PromptLogprobs {
    /// Nothing computed yet, if `request` asks for prompt logprobs.
    fn of(request: &SampleRequest) -> Option<Self> {
        request.include_prompt_logprobs().then(|| Self {
            logprobs: vec![f32::NAN],
            top: request.prompt_top_logprobs().map(|count| (count as usize, vec![TopLogprobs::default()])),
        })
    }
}

/// What became of a request after one of its chunks.
pub(super) enum ChunkOutcome {
    /// More of the prompt to prefill.
    Continue(Box<Prefill>),
    /// The prompt is prefilled and these sequences go on decoding, sharing its blocks.
    Decode(Vec<Sequence>),
    /// The request has ended: it failed, or every sequence finished with its first token.
    Ended,
}

/// The next block of its prefix is being computed by another prefill: it waits.
pub(super) struct Waits;

impl Prefill {
    /// `submission` (numbered `id`), not started.
    pub(super) fn new(id: u64, submission: Submission, model: &Llama) -> Self {
        let (context, request) = RequestContext::new(id, submission, &model.config().eos_token_ids);
        let tokens = Arc::clone(request.prompt());
        let chain = BlockHash::chain(context.prefix_root, &tokens, BLOCK_SIZE);
        let goal = Goal::Sample { prompt_logprobs: PromptLogprobs::of(&request), request: Box::new(request) };
        let root = Some(context.prefix_root);
        Self { context, goal, tokens, root, chain, blocks: None, pending: Vec::new(), stamp: 0, started_before: false }
    }

    /// `sequence`, preempted: its blocks are given back now, and its keys and values (every position but its last
    /// token's) will be computed again, or taken from the prefix cache, before it decodes on.
    pub(super) fn preempted(mut sequence: Sequence, pool: &BlockPool) -> Self {
        let root = sequence.blocks.root();
        sequence.blocks = SequenceBlocks::new(pool, root);
        let mut tokens = sequence.tokens();
        tokens.pop();
        let chain = root.map(|root| BlockHash::chain(root, &tokens, BLOCK_SIZE)).unwrap_or_default();
        let context = Arc::clone(&sequence.request);
        let goal = Goal::Resume(Box::new(sequence));
        Self {
            context,
            goal,
            tokens: tokens.into(),
            root,
            chain,
            blocks: None,
            pending: Vec::new(),
            stamp: 0,
            started_before: true,
        }
    }

    /// The batch places its sequences take.
    pub(super) fn samples(&self) -> usize {
        match &self.goal {
            Goal::Sample { request, .. } => request.num_samples() as usize,
            Goal::Resume(_) => 1,
        }
    }

    /// Whether it started (holds blocks and places).
    pub(super) fn is_started(&self) -> bool {
        self.blocks.is_some()
    }

    /// The tokens whose keys and values it must compute (all of them before it starts).
    pub(super) fn remaining(&self) -> usize {
        self.tokens.len() - self.blocks.as_ref().map_or(0, SequenceBlocks::len)
    }

    /// The positions prefilled so far.
    #[cfg(test)]
    pub(super) fn prefilled(&self) -> usize {
        self.blocks.as_ref().map_or(0, SequenceBlocks::len)
    }

    /// Its tenant: the adapter it runs on, or the base model.
    #[cfg(test)]
    pub(super) fn tenant(&self) -> &loragate_core::AdapterKey {
        match &self.goal {
            Goal::Sample { request, .. } => request.adapter(),
            Goal::Resume(sequence) => &sequence.request.adapter_key,
        }
    }

    /// The adapter its tokens run with (`None`: the base model).
    pub(super) fn adapter(&self) -> Option<&Arc<AdapterWeights>> {
        self.context.adapter.as_ref()
    }

    /// The most leading blocks it may take from the prefix cache: a new request needs its prompt's last position
    /// computed (for its logits), and every position when it asked for prompt logprobs; a preempted sequence needs
    /// no logits.
    fn max_hits(&self) -> usize {
        match &self.goal {
            Goal::Sample { request, .. } if request.include_prompt_logprobs() => 0,
            Goal::Sample { .. } => (self.tokens.len() - 1) / BLOCK_SIZE,
            Goal::Resume(_) => self.tokens.len() / BLOCK_SIZE,
        }
    }

    /// What the planner sees of it: for one not started, the tokens left once the cached prefix is taken, and
    /// whether it must wait for a block another prefill computes.
    pub(super) fn queued(&self, pool: &BlockPool) -> Queued {
        if self.is_started() {
            return Queued { remaining: self.remaining(), samples: self.samples(), started: true, ready: true };
        }
        let probe = pool.probe(&self.chain[..self.max_hits().min(self.chain.len())]);
        let remaining = (self.tokens.len() - probe.hits * BLOCK_SIZE).max(1);
        Queued { remaining, samples: self.samples(), started: false, ready: !probe.pending }
    }

    /// Starts it (as the `stamp`th): takes the leading blocks the prefix cache holds, or waits if the block after
    /// them is pending. Counts the prefix cache's queries and hits.
    pub(super) fn begin(&mut self, pool: &BlockPool, stamp: u64) -> Result<(), Waits> {
        let max = self.max_hits().min(self.chain.len());
        let found = pool.adopt(&self.chain[..max], max).map_err(|_| Waits)?;
        let hit_tokens = found.len() * BLOCK_SIZE;
        let counters = pool.counters();
        BlockPool::count(&counters.prefix_queries, self.tokens.len());
        BlockPool::count(&counters.prefix_hits, hit_tokens);
        self.blocks = Some(match self.root {
            Some(root) if !found.is_empty() => SequenceBlocks::with_prefix(pool, root, found, &self.chain),
            root => SequenceBlocks::new(pool, root),
        });
        if let Goal::Sample { request, prompt_logprobs } = &mut self.goal {
            *prompt_logprobs = PromptLogprobs::of(request);
            // Said once, at its first start (a preempted request may find another share of its prompt later).
            if !std::mem::replace(&mut self.started_before, true) && hit_tokens > 0 {
                let tokens = u32::try_from(hit_tokens).unwrap_or(u32::MAX);
                self.context.send(EngineEvent::PromptCached { tokens });
            }
        }
        self.stamp = stamp;
        Ok(())
    }

    /// Gives its blocks and places back: it starts again later (its cached prefix may still be there).
    pub(super) fn preempt(&mut self) {
        self.blocks = None;
        self.pending.clear();
    }

    /// Makes room for up to `tokens` more of its positions in `cache`, as far as free and cached blocks allow, and
    /// returns how many. The full blocks of its tokens among those it allocates are registered as pending.
    pub(super) fn reserve(&mut self, cache: &KvCache, tokens: usize) -> usize {
        let Some(blocks) = self.blocks.as_mut() else { return 0 };
        let room = blocks.capacity() - blocks.len() + cache.pool().available() * BLOCK_SIZE;
        let tokens = tokens.min(room).min(self.tokens.len() - blocks.len());
        if tokens == 0 || cache.reserve(blocks, tokens).is_err() {
            return 0;
        }
        let known = blocks.named_blocks();
        if known < self.chain.len() {
            let registered = blocks.register_pending(&self.chain[known..]);
            self.pending.extend(registered);
        }
        tokens
    }

    /// The next `tokens` of its tokens (reserved), to run in this step's pass.
    pub(super) fn chunk(&mut self, tokens: usize) -> PrefillChunk<'_> {
        let blocks = self.blocks.as_mut().expect("a started prefill");
        let start = blocks.len();
        PrefillChunk { tokens: &self.tokens[start..start + tokens], blocks }
    }

    /// Ends the request with `Abort` for every sequence, and no more tokens.
    pub(super) fn abort(&self) {
        match &self.goal {
            Goal::Sample { request, .. } => {
                for sequence in 0..request.num_samples() {
                    self.context.send(EngineEvent::Finished { sequence, reason: FinishReason::Abort });
                }
            }
            Goal::Resume(sequence) => sequence.finish(FinishReason::Abort),
        }
    }

    /// Tells its caller it failed with `error`.
    pub(super) fn fail(&self, error: EngineError) {
        self.context.events.send(Err(error));
    }

    /// Takes the final hidden states `(len, hidden)` of the chunk just run (`finite`: whether they are all finite).
    pub(super) fn finish_chunk(mut self, hidden: &Tensor, finite: bool, model: &Llama) -> ChunkOutcome {
        let blocks = self.blocks.as_ref().expect("a started prefill");
        let end = blocks.len();
        let len = hidden.dim(0).unwrap_or(0);
        if !finite {
            let where_ = format!(
                "in the prefill of prompt positions {}..{end}, with adapter version {}",
                end - len,
                self.context.version
            );
            self.fail(EngineError::NonFiniteOutput(where_));
            return ChunkOutcome::Ended;
        }
        BlockPool::count(&blocks.pool().counters().prefilled_tokens, len);
        self.pending.retain(|&(index, id)| {
            let written = (index + 1) * BLOCK_SIZE <= end;
            if written {
                blocks.pool().mark_computed(id);
            }
            !written
        });
        if matches!(self.goal, Goal::Resume(_)) {
            return match self.complete_without_chunk() {
                Ok(sequences) => ChunkOutcome::Decode(sequences),
                Err(this) => ChunkOutcome::Continue(this),
            };
        }
        match self.after_chunk(hidden, model) {
            Ok(None) => ChunkOutcome::Continue(Box::new(self)),
            Ok(Some(sequences)) if sequences.is_empty() => ChunkOutcome::Ended,
            Ok(Some(sequences)) => ChunkOutcome::Decode(sequences),
            Err(Failure::Sent) => ChunkOutcome::Ended,
            Err(Failure::Model(err)) => {
                tracing::error!(request = self.context.id, error = %err, "prefill failed");
                self.fail(EngineError::Internal(format!("prefill failed: {err}")));
                ChunkOutcome::Ended
            }
        }
    }

    /// A preempted sequence whose every position is computed (by its chunks, or all found in the prefix cache): it
    /// decodes on with its blocks. Anything else comes back.
    pub(super) fn complete_without_chunk(mut self) -> Result<Vec<Sequence>, Box<Self>> {
        if !self.is_started() || self.remaining() > 0 {
            return Err(Box::new(self));
        }
        match self.goal {
            Goal::Resume(mut sequence) => {
                sequence.blocks = self.blocks.take().expect("a started prefill");
                sequence.stamp = self.stamp;
                Ok(vec![*sequence])
            }
            goal @ Goal::Sample { .. } => {
                self.goal = goal;
                Err(Box::new(self))
            }
        }
    }

    /// The prompt logprobs of the chunk's positions, and after the last chunk the first tokens: `Some` of the
    /// sequences that go on once the prompt is done.
    fn after_chunk(&mut self, hidden: &Tensor, model: &Llama) -> Result<Option<Vec<Sequence>>, Failure> {
        let len = hidden.dim(0)?;
        let total = self.tokens.len();
        let end = self.blocks.as_ref().map_or(0, SequenceBlocks::len);
        let start = end - len;
        let Goal::Sample { request, prompt_logprobs } = &mut self.goal else { return Ok(None) };
        if let Some(prompt_logprobs) = prompt_logprobs {
            // Position i predicts prompt token i + 1; the last prompt position predicts the first new token.
            let predicting = end.min(total - 1) - start;
            let known = prompt_logprobs.logprobs.len();
            prompt_logprobs.extend(model, &hidden.narrow(0, 0, predicting)?, &self.tokens[start + 1..])?;
            if !prompt_logprobs.logprobs[known..].iter().all(|logprob| logprob.is_finite()) {
                let where_ = format!("in the prompt logprobs, with adapter version {}", self.context.version);
                self.context.events.send(Err(EngineError::NonFiniteOutput(where_)));
                return Err(Failure::Sent);
            }
        }
        if end < total {
            return Ok(None);
        }
        if let Some(PromptLogprobs { logprobs, top }) = prompt_logprobs.take() {
            self.context.send(EngineEvent::PromptLogprobs(logprobs));
            if let Some((_, top)) = top {
                self.context.send(EngineEvent::PromptTopLogprobs(top));
            }
        }
        let logits = model.logits(&hidden.narrow(0, len - 1, 1)?)?;
        let logprobs = log_softmax_rows(&logits)?;
        let logits = if Sampler::needs_logits_for(request.params()) {
            Some(logits.flatten_all()?.to_vec1::<f32>()?)
        } else {
            None
        };
        let prompt = request.prompt();
        let blocks = self.blocks.take().expect("a started prefill");
        let mut continuing = Vec::new();
        for index in 0..request.num_samples() {
            let sampler = Sampler::new(request.params(), index, prompt, self.context.stop_tokens());
            let mut sequence = Sequence::new(Arc::clone(&self.context), index, sampler, blocks.fork());
            sequence.stamp = self.stamp;
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
