//! The decoding sequences, each with its own blocks of the paged cache.

use std::sync::Arc;

use loragate_core::{EngineError, EngineEvent, FinishReason};

use super::park::ParkedHandles;
use super::sequence::Sequence;
use crate::lora::AdapterWeights;
use crate::model::DecodeRow;

pub(super) struct Batch {
    rows: Vec<Sequence>,
    /// The handles this batch parks rows into: only their rows resume here.
    parked: ParkedHandles,
}

impl Batch {
    /// An empty batch.
    pub(super) fn new() -> Self {
        Self { rows: Vec::new(), parked: ParkedHandles::new() }
    }

    /// The handles this batch parks rows into: only their rows resume here.
    pub(super) fn parked(&self) -> &ParkedHandles {
        &self.parked
    }

    pub(super) fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    pub(super) fn len(&self) -> usize {
        self.rows.len()
    }

    /// The decoding sequences, in row order.
    pub(super) fn rows(&self) -> &[Sequence] {
        &self.rows
    }

    /// The decoding sequences, in row order, to make room in their blocks.
    pub(super) fn rows_mut(&mut self) -> &mut [Sequence] {
        &mut self.rows
    }

    /// Each row's next input token and its blocks, for this step's pass.
    pub(super) fn decode_input(&mut self) -> Vec<DecodeRow<'_>> {
        self.rows.iter_mut().map(|row| DecodeRow { token: row.next_input, blocks: &mut row.blocks }).collect()
    }

    /// Each row's adapter, in row order.
    pub(super) fn adapters(&self) -> impl Iterator<Item = Option<&Arc<AdapterWeights>>> {
        self.rows.iter().map(|row| row.request.adapter.as_ref())
    }

    /// Whether some row samples from the raw logits too.
    pub(super) fn needs_logits(&self) -> bool {
        self.rows.iter().any(Sequence::needs_logits)
    }

    /// Adds sequences whose keys and values are computed (prefilled, recomputed after a preemption, or parked).
    pub(super) fn join(&mut self, joining: impl IntoIterator<Item = Sequence>) {
        self.rows.extend(joining);
    }

    /// Takes the rows at `indices` (ascending) out of the batch (to be preempted).
    pub(super) fn take_rows(&mut self, indices: &[usize]) -> Vec<Sequence> {
        let mut taken = Vec::with_capacity(indices.len());
        for &index in indices.iter().rev() {
            taken.push(self.rows.swap_remove(index));
        }
        taken.reverse();
        taken
    }

    /// Ends cancelled sequences with `Abort` and drops those whose caller went away. A sequence cancelled to be
    /// parked first hands its blocks to its caller ([`EngineEvent::Parked`], a handle of this batch's).
    pub(super) fn drop_abandoned(&mut self) {
        if !self.rows.iter().any(Sequence::is_abandoned) {
            return;
        }
        let parked = &self.parked;
        self.rows.retain_mut(|row| {
            if !row.is_abandoned() {
                return true;
            }
            if row.request.parks() {
                let kv = parked.park(row.tokens(), row.blocks.take());
                row.request.send(EngineEvent::Parked { sequence: row.index(), kv });
            }
            row.finish(FinishReason::Abort);
            false
        });
    }

    /// Samples each row's next token from its row of `logprobs` (and of `logits`, given when
    /// [`Batch::needs_logits`]), `vocab` values per row, emits the tokens, names the blocks the step filled (for
    /// other requests to reuse), and retires finished rows (and rows whose logprobs were not finite, with an error).
    pub(super) fn advance(&mut self, logprobs: &[f32], logits: Option<&[f32]>, vocab: usize, context_length: usize) {
        let mut index = 0;
        self.rows.retain_mut(|row| {
            let row_logprobs = &logprobs[index * vocab..(index + 1) * vocab];
            let row_logits = logits.map(|logits| &logits[index * vocab..(index + 1) * vocab]);
            index += 1;
            match row.advance(row_logprobs, row_logits, context_length) {
                Ok(None) => {
                    row.register_full_blocks();
                    true
                }
                Ok(Some(reason)) => {
                    row.register_full_blocks();
                    row.finish(reason);
                    false
                }
                // Only this row's logits overflowed: it leaves the batch, the others go on.
                Err(error) => {
                    row.fail(error);
                    false
                }
            }
        });
    }

    /// Fails every running sequence with `reason` and empties the batch.
    pub(super) fn fail_all(&mut self, reason: &str) {
        for sequence in self.rows.drain(..) {
            sequence.fail(EngineError::Internal(reason.to_owned()));
        }
    }

    /// Tells every running sequence the engine stopped.
    pub(super) fn stop_all(&mut self) {
        for sequence in self.rows.drain(..) {
            sequence.fail(EngineError::Stopped);
        }
    }
}
