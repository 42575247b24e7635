//! Parking and resuming decoding sequences (KV_POLICY_REUSE): a keep-mode pause that asked to reuse keys and
//! values cancels its requests with the park signal set; each decoding row then leaves the batch **with** its
//! blocks — moved, not copied: the handle takes over the row's references — handed to the caller in a
//! [`ParkedKv`] (whoever holds it owns the blocks; dropping its last clone gives them back to the pool, so the
//! engine keeps no table that could leak). The continuation comes back with that handle and, once validated, takes
//! the blocks and rejoins the batch as a decode row under the adapter weights current at resume: no prefill at all.
//! Its first decode step feeds the last token produced before the pause, at its own position, with the new weights.
//! Its blocks mix the old version's keys and values with the new version's from then on, so they are never
//! registered for other requests to reuse (the old version's full blocks it took over stay registered under the
//! old version, which no new request names).
//!
//! A handle that does not fit (another engine's, or one whose tokens are not exactly the continuation's prompt) is
//! refused quietly: the continuation is prefilled as under RECOMPUTE, and no [`EngineEvent::Resumed`] is sent, so
//! the caller's provenance stays honest. Sequences still waiting or in the middle of their prefill have no complete
//! keys and values and are simply aborted (their continuation recomputes).

use std::sync::atomic::{AtomicU64, Ordering};

use loragate_core::{EngineEvent, FinishReason, ParkedKv};
use parking_lot::Mutex;

use super::sequence::{RequestContext, Sequence, Submission};
use crate::model::{Llama, SequenceBlocks};
use crate::sampler::Sampler;

/// The handles one step thread parks rows into: its number in the process (a handle resumes only on the thread
/// that parked it, whose pool holds its blocks).
pub(super) struct ParkedHandles {
    incarnation: u64,
}

impl ParkedHandles {
    /// The handles of a new step thread.
    pub(super) fn new() -> Self {
        static NEXT_INCARNATION: AtomicU64 = AtomicU64::new(0);
        Self { incarnation: NEXT_INCARNATION.fetch_add(1, Ordering::Relaxed) }
    }

    /// Parks `blocks`, the keys and values of a sequence whose tokens are `tokens`.
    pub(super) fn park(&self, tokens: Vec<u32>, blocks: SequenceBlocks) -> ParkedKv {
        ParkedKv::new(ParkedRow { incarnation: self.incarnation, tokens, blocks: Mutex::new(Some(blocks)) })
    }
}

/// What a [`ParkedKv`] of this engine holds: one sequence's blocks and the tokens they belong to.
struct ParkedRow {
    /// The step thread that parked it.
    incarnation: u64,
    /// Every token of the sequence: its prompt and what it generated. The blocks hold all but the last.
    tokens: Vec<u32>,
    /// The blocks, until a continuation takes them (and while it waits for a place; given back if it parks again).
    blocks: Mutex<Option<SequenceBlocks>>,
}

/// A continuation whose parked keys and values were accepted: it rejoins the batch when there is a place.
pub(super) struct Resuming {
    pub(super) submission: Box<Submission>,
    kv: ParkedKv,
    blocks: SequenceBlocks,
}

impl Resuming {
    /// Accepts `submission`'s parked handle if it fits: the same step thread, one sequence, no prompt logprobs, and
    /// the handle's tokens exactly the continuation's prompt (so its cache holds every position but the last, and
    /// the last token is the next input). Otherwise the submission comes back without its handle (dropped, which
    /// frees the keys and values) and the reason, to be prefilled as under RECOMPUTE.
    pub(super) fn accept(
        mut submission: Box<Submission>,
        handles: &ParkedHandles,
        model: &Llama,
    ) -> Result<Self, Box<Submission>> {
        let Some(kv) = submission.resume.take() else { return Err(submission) };
        let request = &submission.request;
        let refusal = match kv.downcast_ref::<ParkedRow>() {
            None => Err("parked by another kind of engine"),
            Some(row) if row.incarnation != handles.incarnation => Err("parked by another engine instance"),
            Some(_) if request.num_samples() != 1 || request.include_prompt_logprobs() => {
                Err("the continuation asks for more than decoding on")
            }
            Some(row) if row.tokens[..] != request.prompt()[..] => Err("the parked tokens are not its prompt"),
            Some(_) if request.prompt().len() >= model.context_length() => Err("no room left in the context"),
            Some(row) => match row.blocks.lock().take() {
                Some(blocks) if blocks.len() == row.tokens.len() - 1 => Ok(blocks),
                Some(_) => Err("the parked blocks do not hold every position but the last"),
                None => Err("another continuation took the parked blocks"),
            },
        };
        match refusal {
            Ok(blocks) => Ok(Self { submission, kv, blocks }),
            Err(why) => {
                tracing::debug!(request = %request.id(), why, "a parked sequence is recomputed instead of resumed");
                Err(submission)
            }
        }
    }

    /// Whether the caller cancelled it or went away while it waited for a place.
    pub(super) fn is_abandoned(&self) -> bool {
        self.submission.is_abandoned()
    }

    /// Ends it while it waits for a place: parked again (the same handle goes back, with its blocks) if the
    /// cancellation asked to park, then `Finished { Abort }`.
    pub(super) fn abort(self) {
        let Self { submission, kv, blocks } = self;
        if let Some(row) = kv.downcast_ref::<ParkedRow>() {
            *row.blocks.lock() = Some(blocks);
        }
        if submission.park.is_requested() && !submission.events.is_closed() {
            submission.events.send(Ok(EngineEvent::Parked { sequence: 0, kv }));
        }
        submission.events.send(Ok(EngineEvent::Finished { sequence: 0, reason: FinishReason::Abort }));
    }

    /// Starts it as request `id`: its decode row, with the parked blocks, announced with [`EngineEvent::Resumed`]
    /// (the handle is dropped: the row owns the blocks now).
    pub(super) fn start(self, id: u64, model: &Llama) -> Sequence {
        let Self { submission, kv, mut blocks } = self;
        drop(kv);
        let (context, request) = RequestContext::new(id, *submission, &model.config().eos_token_ids);
        let prompt = request.prompt();
        let sampler = Sampler::new(request.params(), 0, prompt, context.stop_tokens());
        let last = *prompt.last().expect("a continuation's prompt holds the tokens it continues");
        context.send(EngineEvent::Resumed { sequence: 0 });
        blocks.stop_registering();
        Sequence::resumed(context, sampler, blocks, last)
    }
}
