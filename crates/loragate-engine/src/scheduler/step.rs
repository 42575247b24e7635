//! One step: plan it, run it in one packed forward pass, and hand each token and chunk to its request.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use candle_core::{DType, Tensor};

use super::Scheduler;
use super::cost::StepShape;
use super::fair::Limits;
use super::pending::{Scheduled, Taken};
use super::prefill::{ChunkOutcome, Prefill};
use crate::lora::{AdapterWeights, LoraBatch};
use crate::model::{PackedInput, log_softmax_rows};

/// The smallest share of a step's prefill budget dealt to one tenant while the budget allows it: smaller chunks
/// would cost more in per-chunk overhead than they gain in fairness.
const MIN_PREFILL_SHARE: usize = 16;

/// How a step's time is taken.
#[derive(Clone, Copy, Debug)]
pub(super) enum StepClock {
    /// The wall clock around the pass and its emission.
    Wall,
    /// A machine whose steps cost exactly this (tests of the planner, which must not depend on the real clock).
    #[cfg(test)]
    Simulated(super::cost::StepCost),
}

impl StepClock {
    /// The seconds a step of `shape` that started at `started` took.
    fn seconds(self, started: Instant, shape: StepShape) -> f64 {
        match self {
            Self::Wall => {
                let _ = shape;
                started.elapsed().as_secs_f64()
            }
            #[cfg(test)]
            Self::Simulated(cost) => cost.predict(shape),
        }
    }
}

/// What one step ran, for tests of the scheduler's invariants.
#[cfg(test)]
#[derive(Clone, Debug)]
pub(super) struct StepTrace {
    /// The decode rows: (request id, sequence index), in row order.
    pub(super) decode: Vec<(u64, u32)>,
    /// The prefill chunks: (request id, tenant, first position, tokens), in pass order.
    pub(super) chunks: Vec<(u64, loragate_core::AdapterKey, usize, usize)>,
}

impl Scheduler {
    /// One step: hand back abandoned requests, make room for the decode rows, plan, run every decode row and the
    /// planned chunks in one pass, emit.
    pub(super) fn run_step(&mut self) {
        self.drop_abandoned();
        self.resume_parked();
        self.reserve_decode_rows();
        let decode_rows = self.batch.len();
        let limits = Limits {
            budget: self.prefill_budget(decode_rows),
            places_taken: decode_rows + self.pending.places_taken(),
            places: self.limits.max_batch_size,
            min_share: MIN_PREFILL_SHARE,
        };
        let plan = self.pending.plan(limits, self.cache.pool());
        let Taken { mut scheduled, idle, resumed } = self.pending.take(&plan, &self.cache, &mut self.stamp);
        #[cfg(test)]
        self.trace.push(StepTrace {
            decode: self.batch.rows().iter().map(|row| (row.request.id, row.index())).collect(),
            chunks: scheduled
                .iter()
                .map(|s| (s.prefill.context.id, s.prefill.tenant().clone(), s.prefill.prefilled(), s.tokens))
                .collect(),
        });
        let ran = decode_rows > 0 || !scheduled.is_empty();
        let mut back = idle;
        if ran {
            let started = Instant::now();
            let shape = StepShape { decode_rows, prefill_tokens: scheduled.iter().map(|chunk| chunk.tokens).sum() };
            match self.run_pass(&mut scheduled) {
                Ok(hidden) => {
                    back.extend(self.emit(&hidden, decode_rows, scheduled));
                    self.cost.observe(shape, self.clock.seconds(started, shape));
                    *self.published_cost.lock() = self.cost.cost();
                }
                Err(err) => {
                    tracing::error!(error = %err, "the step's forward pass failed; failing its requests");
                    let reason = format!("the engine step failed: {err}");
                    self.batch.fail_all(&reason);
                    for Scheduled { prefill, .. } in scheduled {
                        prefill.fail(loragate_core::EngineError::Internal(reason.clone()));
                    }
                }
            }
        }
        self.batch.join(resumed);
        self.pending.put_back(back, &plan);
        if !ran && !plan.grants.is_empty() {
            self.unblock_prefills();
        }
    }

    /// The prompt tokens this step may take beside its `decode_rows`: what the token budget leaves, or with a step
    /// target, what keeps the step within it (see [`super::cost`]) — judged against the batch the queued requests
    /// bring in, and now and then a larger chunk when that is the minimum (see [`super::cost::ChunkProbe`]).
    fn prefill_budget(&mut self, decode_rows: usize) -> usize {
        let token_budget = self.limits.max_num_batched_tokens.saturating_sub(decode_rows);
        let Some(target) = self.limits.step_target else { return token_budget };
        let incoming = self.pending.queued_places() + self.resuming.len();
        let reference_rows = (decode_rows + incoming).min(self.limits.max_batch_size.max(decode_rows));
        let planned = self.cost.prefill_budget(target, decode_rows, reference_rows, token_budget, MIN_PREFILL_SHARE);
        if decode_rows == 0 || self.pending.is_empty() {
            return planned;
        }
        self.probe.allowance(planned, MIN_PREFILL_SHARE, token_budget)
    }

    fn drop_abandoned(&mut self) {
        self.pending.drop_abandoned();
        self.batch.drop_abandoned();
        let mut waiting = VecDeque::with_capacity(self.resuming.len());
        for resuming in self.resuming.drain(..) {
            if resuming.is_abandoned() {
                resuming.abort();
            } else {
                waiting.push_back(resuming);
            }
        }
        self.resuming = waiting;
    }

    /// Puts parked sequences back into the batch as decode rows, as many as the batch has places for (before any
    /// new prefill takes one): they decode in this very step.
    fn resume_parked(&mut self) {
        let free = self.limits.max_batch_size.saturating_sub(self.batch.len() + self.pending.places_taken());
        let count = free.min(self.resuming.len());
        if count == 0 {
            return;
        }
        let resumed: Vec<_> = self
            .resuming
            .drain(..count)
            .map(|resuming| {
                let mut sequence = resuming.start(self.pending.next_id(), &self.model);
                self.stamp += 1;
                sequence.stamp = self.stamp;
                sequence
            })
            .collect();
        self.batch.join(resumed);
    }

    /// Runs the decode rows and the scheduled chunks in one pass; returns the final hidden states, one row per token.
    fn run_pass(&mut self, scheduled: &mut [Scheduled]) -> candle_core::Result<Tensor> {
        let lora = {
            let mut adapters: Vec<Option<&Arc<AdapterWeights>>> = self.batch.adapters().collect();
            for chunk in scheduled.iter() {
                adapters.extend(std::iter::repeat_n(chunk.prefill.adapter(), chunk.tokens));
            }
            LoraBatch::for_rows(&adapters, self.bank.as_ref(), self.model.device())?
        };
        if lora.bank().is_some() {
            self.bank = lora.bank().cloned();
        }
        let decode = self.batch.decode_input();
        let chunks = scheduled.iter_mut().map(|chunk| chunk.prefill.chunk(chunk.tokens)).collect();
        self.model.forward_packed(PackedInput { decode, chunks }, &lora, &self.cache)
    }

    /// Emits the decode rows' tokens and takes each chunk's results; returns the prefills that go on, with their
    /// tenants and orders.
    fn emit(&mut self, hidden: &Tensor, decode_rows: usize, scheduled: Vec<Scheduled>) -> Vec<(usize, usize, Prefill)> {
        if decode_rows > 0
            && let Err(err) = self.advance_decode_rows(hidden, decode_rows)
        {
            tracing::error!(error = %err, "sampling the decode rows failed; failing them");
            self.batch.fail_all(&format!("decode step failed: {err}"));
        }
        let mut continuing = Vec::new();
        let mut joining = Vec::new();
        let mut offset = decode_rows;
        for Scheduled { tenant, order, prefill, tokens } in scheduled {
            let rows = chunk_rows(hidden, offset, tokens);
            offset += tokens;
            let outcome = match rows {
                Ok((rows, finite)) => prefill.finish_chunk(&rows, finite, &self.model),
                Err(err) => {
                    prefill.fail(loragate_core::EngineError::Internal(format!("prefill failed: {err}")));
                    ChunkOutcome::Ended
                }
            };
            match outcome {
                ChunkOutcome::Continue(prefill) => continuing.push((tenant, order, *prefill)),
                ChunkOutcome::Decode(sequences) => joining.extend(sequences),
                ChunkOutcome::Ended => {}
            }
        }
        self.batch.join(joining);
        continuing
    }

    /// Samples every decode row's next token from its final hidden state, the first `rows` of `hidden`.
    fn advance_decode_rows(&mut self, hidden: &Tensor, rows: usize) -> candle_core::Result<()> {
        let logits = self.model.logits(&hidden.narrow(0, 0, rows)?)?;
        let logprobs = log_softmax_rows(&logits)?;
        // Raw logits too, only when some row's penalty needs them.
        let logits = if self.batch.needs_logits() { Some(logits.flatten_all()?.to_vec1::<f32>()?) } else { None };
        let (vocab, context_length) = (self.model.config().vocab_size, self.model.context_length());
        self.batch.advance(&logprobs, logits.as_deref(), vocab, context_length);
        Ok(())
    }
}

/// A chunk's final hidden states, rows `offset..offset + tokens` of `hidden`, and whether they are all finite (in
/// one reduction: a row's sum is finite iff its values are, as after the final norm they are far from overflowing).
fn chunk_rows(hidden: &Tensor, offset: usize, tokens: usize) -> candle_core::Result<(Tensor, bool)> {
    let rows = hidden.narrow(0, offset, tokens)?;
    let sums = rows.to_dtype(DType::F32)?.sum(1)?.to_vec1::<f32>()?;
    Ok((rows, sums.into_iter().all(f32::is_finite)))
}
