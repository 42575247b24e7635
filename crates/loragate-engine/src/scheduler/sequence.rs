//! A request as the step thread sees it, and one sequence of it.

use std::sync::Arc;

use loragate_core::{
    AdapterKey, AdapterVersion, EngineError, EngineEvent, FinishReason, ParkSignal, ParkedKv, SampleRequest,
};
use tokio_util::sync::CancellationToken;

use super::outbox::EventSender;
use crate::lora::AdapterWeights;
use crate::model::{BlockHash, SequenceBlocks};
use crate::sampler::{Sampled, Sampler};

/// A request handed to the step thread, with the adapter weights and version it pinned when it was submitted.
pub(crate) struct Submission {
    pub(crate) request: SampleRequest,
    /// `None` for the base model.
    pub(crate) adapter: Option<Arc<AdapterWeights>>,
    pub(crate) version: AdapterVersion,
    pub(crate) cancel: CancellationToken,
    /// Set before `cancel` fires when the cancellation parks decoding sequences rather than dropping their cache.
    pub(crate) park: ParkSignal,
    /// The keys and values a continuation resumes from (see [`super::park`]).
    pub(crate) resume: Option<ParkedKv>,
    pub(crate) events: EventSender,
}

impl Submission {
    /// The root of its blocks' prefix chain: its adapter's name and pinned version, its caller's cache scope (a
    /// tenant's own) and its cache salt. Requests reuse each other's cached prefixes only under the same root.
    pub(crate) fn prefix_root(&self) -> BlockHash {
        let request = &self.request;
        BlockHash::root(request.adapter().as_wire_str(), self.version.0, request.cache_scope(), request.cache_salt())
    }

    /// Whether the caller cancelled it or went away.
    pub(crate) fn is_abandoned(&self) -> bool {
        self.cancel.is_cancelled() || self.events.is_closed()
    }
}

/// What the sequences of one started request share.
pub(crate) struct RequestContext {
    /// The step thread's number for the request, in arrival order (for logs and traces).
    pub(crate) id: u64,
    pub(crate) events: EventSender,
    pub(crate) cancel: CancellationToken,
    park: ParkSignal,
    /// Its tenant: the adapter it runs on, or the base model.
    pub(crate) adapter_key: AdapterKey,
    pub(crate) version: AdapterVersion,
    pub(crate) adapter: Option<Arc<AdapterWeights>>,
    /// The request's prompt: with a sequence's generated tokens, what its keys and values belong to.
    pub(crate) prompt: Arc<[u32]>,
    /// The root of its blocks' prefix chain (see [`Submission::prefix_root`]).
    pub(crate) prefix_root: BlockHash,
    max_tokens: u32,
    /// `stop_token_ids`, plus the model's end-of-sequence tokens unless `ignore_eos`.
    stop_tokens: Vec<u32>,
}

impl RequestContext {
    pub(crate) fn new(id: u64, submission: Submission, eos_token_ids: &[u32]) -> (Arc<Self>, SampleRequest) {
        let prefix_root = submission.prefix_root();
        let Submission { request, adapter, version, cancel, park, resume: _, events } = submission;
        let params = request.params();
        let mut stop_tokens = params.stop_token_ids().to_vec();
        if !params.ignore_eos() {
            stop_tokens.extend_from_slice(eos_token_ids);
        }
        let prompt = Arc::clone(request.prompt());
        let max_tokens = params.max_tokens();
        let adapter_key = request.adapter().clone();
        let context = Self {
            id,
            events,
            cancel,
            park,
            adapter_key,
            version,
            adapter,
            prompt,
            prefix_root,
            max_tokens,
            stop_tokens,
        };
        (Arc::new(context), request)
    }

    /// The tokens that end this request's sequences: its stop token ids and, unless it ignores them, the model's
    /// end-of-sequence tokens.
    pub(crate) fn stop_tokens(&self) -> &[u32] {
        &self.stop_tokens
    }

    pub(crate) fn send(&self, event: EngineEvent) {
        // A closed channel means the caller went away; the next step drops its sequences.
        self.events.send(Ok(event));
    }

    /// Whether the caller cancelled the request or went away.
    pub(crate) fn is_abandoned(&self) -> bool {
        self.cancel.is_cancelled() || self.events.is_closed()
    }

    /// Whether the request was cancelled to be parked, and its caller is there to take the keys and values.
    pub(crate) fn parks(&self) -> bool {
        self.park.is_requested() && self.cancel.is_cancelled() && !self.events.is_closed()
    }
}

/// One sequence being generated.
pub(crate) struct Sequence {
    pub(crate) request: Arc<RequestContext>,
    /// Its keys and values: every position but the last token's (fed at its next decode step).
    pub(crate) blocks: SequenceBlocks,
    /// When it started running (or joined the batch again), in the step thread's order: the newest is preempted
    /// first when the cache runs out of blocks.
    pub(crate) stamp: u64,
    index: u32,
    sampler: Sampler,
    generated: u32,
    /// The tokens this request generated for the sequence (what its keys and values hold besides the prompt).
    generated_tokens: Vec<u32>,
    /// Prompt plus generated tokens.
    context_len: usize,
    /// The token to feed at the next decode step (the last one sampled).
    pub(crate) next_input: u32,
}

impl Sequence {
    pub(crate) fn new(request: Arc<RequestContext>, index: u32, sampler: Sampler, blocks: SequenceBlocks) -> Self {
        let (generated_tokens, context_len) = (Vec::new(), request.prompt.len());
        Self { request, blocks, stamp: 0, index, sampler, generated: 0, generated_tokens, context_len, next_input: 0 }
    }

    /// The only sequence of a continuation that resumes from parked keys and values, `blocks`: they hold every
    /// position of its prompt but the last, `last`, which it feeds at its first decode step.
    pub(crate) fn resumed(request: Arc<RequestContext>, sampler: Sampler, blocks: SequenceBlocks, last: u32) -> Self {
        Self { next_input: last, ..Self::new(request, 0, sampler, blocks) }
    }

    /// Every token of the sequence: its request's prompt and what it generated. Its keys and values hold all but
    /// the last.
    pub(crate) fn tokens(&self) -> Vec<u32> {
        self.request.prompt.iter().chain(&self.generated_tokens).copied().collect()
    }

    /// Whether the caller cancelled the request or went away.
    pub(crate) fn is_abandoned(&self) -> bool {
        self.request.is_abandoned()
    }

    /// Names the blocks its last decode step filled, so that other requests with this prefix may reuse them.
    pub(crate) fn register_full_blocks(&mut self) {
        if self.blocks.root().is_some() && self.blocks.len().is_multiple_of(crate::model::BLOCK_SIZE) {
            let tokens = self.tokens();
            self.blocks.register_full_blocks(&tokens);
        }
    }

    /// The sequence's index in its request.
    pub(crate) fn index(&self) -> u32 {
        self.index
    }

    /// Whether [`Sequence::advance`] needs the raw logits besides the logprobs.
    pub(crate) fn needs_logits(&self) -> bool {
        self.sampler.needs_logits()
    }

    /// Samples the next token from `logprobs` (and `logits`, given when [`Sequence::needs_logits`]), emits it, and
    /// says whether the sequence ends with it (after at most `context_length` tokens in all). If `logprobs` holds a
    /// NaN or an infinity (an adapter's values overflowed), nothing is sampled or emitted and the sequence must fail
    /// with the error returned.
    pub(crate) fn advance(
        &mut self,
        logprobs: &[f32],
        logits: Option<&[f32]>,
        context_length: usize,
    ) -> Result<Option<FinishReason>, EngineError> {
        if !logprobs.iter().all(|logprob| logprob.is_finite()) {
            return Err(EngineError::NonFiniteOutput(format!(
                "for sequence {} after {} tokens, with adapter version {}",
                self.index, self.generated, self.request.version
            )));
        }
        let Sampled { token, logprob, top } = self.sampler.sample(logprobs, logits);
        self.generated += 1;
        self.context_len += 1;
        self.next_input = token;
        self.generated_tokens.push(token);
        self.request.send(EngineEvent::Tokens {
            sequence: self.index,
            version: self.request.version,
            token_ids: vec![token],
            logprobs: vec![logprob],
            top_logprobs: top.into_iter().collect(),
        });
        Ok(if self.request.stop_tokens.contains(&token) {
            Some(FinishReason::Stop)
        } else if self.generated >= self.request.max_tokens || self.context_len >= context_length {
            Some(FinishReason::Length)
        } else {
            None
        })
    }

    /// Emits the sequence's end.
    pub(crate) fn finish(&self, reason: FinishReason) {
        self.request.send(EngineEvent::Finished { sequence: self.index, reason });
    }

    /// Tells the caller the sequence failed.
    pub(crate) fn fail(&self, error: EngineError) {
        self.request.events.send(Err(error));
    }
}
