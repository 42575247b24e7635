//! Parking and resuming decoding sequences (KV_POLICY_REUSE): a keep-mode pause that asked to reuse keys and
//! values cancels its requests with the park signal set; each decoding row then leaves the batch **with** its keys
//! and values, handed to the caller in a [`ParkedKv`] (whoever holds it owns the memory; dropping it frees it, so
//! the engine keeps no table that could leak). The continuation comes back with that handle and, once validated,
//! rejoins the batch as a decode row under the adapter weights current at resume: no prefill at all. Its first
//! decode step feeds the last token produced before the pause, at its own position, with the new weights.
//!
//! A handle that does not fit (another engine's, or one whose tokens are not exactly the continuation's prompt) is
//! refused quietly: the continuation is prefilled as under RECOMPUTE, and no [`EngineEvent::Resumed`] is sent, so
//! the caller's provenance stays honest. Sequences still waiting or in the middle of their prefill have no complete
//! keys and values and are simply aborted (their continuation recomputes).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use loragate_core::{EngineEvent, FinishReason, ParkedKv};

use super::sequence::{RequestContext, Sequence, Submission};
use crate::model::{LayerKv, Llama};
use crate::sampler::Sampler;

/// The handles one step thread parks rows into: its number in the process (a handle resumes only on the thread
/// that parked it) and a count of the handles still alive (while some are, their rows may come back).
pub(super) struct ParkedHandles {
    incarnation: u64,
    /// One strong reference here, one in each live handle.
    alive: Arc<()>,
}

impl ParkedHandles {
    /// The handles of a new step thread: none yet.
    pub(super) fn new() -> Self {
        static NEXT_INCARNATION: AtomicU64 = AtomicU64::new(0);
        Self { incarnation: NEXT_INCARNATION.fetch_add(1, Ordering::Relaxed), alive: Arc::new(()) }
    }

    /// Parks `layers`, the keys and values of a sequence whose tokens are `tokens`.
    pub(super) fn park(&self, tokens: Vec<u32>, layers: Vec<LayerKv>) -> ParkedKv {
        ParkedKv::new(ParkedRow { incarnation: self.incarnation, tokens, layers, _alive: Arc::clone(&self.alive) })
    }

    /// Whether some handle this thread parked a row into is still alive (its caller may resume it).
    pub(super) fn any_alive(&self) -> bool {
        Arc::strong_count(&self.alive) > 1
    }
}

/// What a [`ParkedKv`] of this engine holds: one sequence's keys and values and the tokens they belong to.
struct ParkedRow {
    /// The step thread that parked it.
    incarnation: u64,
    /// Every token of the sequence: its prompt and what it generated. The cache holds all but the last.
    tokens: Vec<u32>,
    /// `(1, kv_heads, tokens.len() - 1, head_dim)` per layer.
    layers: Vec<LayerKv>,
    /// Counts this handle among the parking thread's live ones ([`ParkedHandles::any_alive`]).
    _alive: Arc<()>,
}

/// A continuation whose parked keys and values were accepted: it rejoins the batch when there is a place.
pub(super) struct Resuming {
    pub(super) submission: Box<Submission>,
    kv: ParkedKv,
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
            None => Some("parked by another kind of engine"),
            Some(row) if row.incarnation != handles.incarnation => Some("parked by another engine instance"),
            Some(_) if request.num_samples() != 1 || request.include_prompt_logprobs() => {
                Some("the continuation asks for more than decoding on")
            }
            Some(row) if row.tokens[..] != request.prompt()[..] => Some("the parked tokens are not its prompt"),
            Some(row) if row.layers.len() != model.config().num_layers => Some("the parked cache has other layers"),
            Some(row) if row.layers[0].keys.dim(2).ok() != Some(row.tokens.len() - 1) => {
                Some("the parked cache does not hold every position but the last")
            }
            Some(_) if request.prompt().len() >= model.context_length() => Some("no room left in the context"),
            Some(_) => None,
        };
        match refusal {
            None => Ok(Self { submission, kv }),
            Some(why) => {
                tracing::debug!(request = %request.id(), why, "a parked sequence is recomputed instead of resumed");
                Err(submission)
            }
        }
    }

    /// Whether the caller cancelled it or went away while it waited for a place.
    pub(super) fn is_abandoned(&self) -> bool {
        self.submission.is_abandoned()
    }

    /// Ends it while it waits for a place: parked again (the same handle goes back) if the cancellation asked to
    /// park, then `Finished { Abort }`.
    pub(super) fn abort(self) {
        let Self { submission, kv } = self;
        if submission.park.is_requested() && !submission.events.is_closed() {
            submission.events.send(Ok(EngineEvent::Parked { sequence: 0, kv }));
        }
        submission.events.send(Ok(EngineEvent::Finished { sequence: 0, reason: FinishReason::Abort }));
    }

    /// Starts it as request `id`: its decode row, announced with [`EngineEvent::Resumed`], and the keys and values
    /// it rejoins the batch with (the handle is dropped once they are copied into the batch).
    pub(super) fn start(self, id: u64, model: &Llama) -> (Sequence, Vec<LayerKv>) {
        let Self { submission, kv } = self;
        let (context, request) = RequestContext::new(id, *submission, &model.config().eos_token_ids);
        let row = kv.downcast_ref::<ParkedRow>().expect("accepted handles are this engine's parked rows");
        let prompt = request.prompt();
        let sampler = Sampler::new(request.params(), 0, prompt, context.stop_tokens());
        let last = *prompt.last().expect("a continuation's prompt holds the tokens it continues");
        context.send(EngineEvent::Resumed { sequence: 0 });
        (Sequence::resumed(context, sampler, prompt.len(), last), row.layers.clone())
    }
}
