//! The decoding sequences: their rows in the batch KV cache, kept in the same order.

use std::sync::Arc;

use loragate_core::{EngineError, EngineEvent, FinishReason};

use super::park::ParkedHandles;
use super::sequence::Sequence;
use crate::lora::AdapterWeights;
use crate::model::{BatchKvCache, LayerKv, Llama, SequenceKv, fill_holes_from_the_end};

pub(super) struct Batch {
    /// Row `i` of the cache is `rows[i]`.
    rows: Vec<Sequence>,
    cache: BatchKvCache,
    /// The handles this batch parks rows into. While one is alive its row may come back, so the cache keeps its
    /// layout and, emptied, its buffers.
    parked: ParkedHandles,
}

impl Batch {
    /// An empty batch of at most `max_rows` rows.
    pub(super) fn new(model: &Llama, max_rows: usize) -> Self {
        Self { rows: Vec::new(), cache: empty_cache(model).reserving_rows(max_rows), parked: ParkedHandles::new() }
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
    #[cfg(test)]
    pub(super) fn rows(&self) -> &[Sequence] {
        &self.rows
    }

    /// Each row's next input token and the cache they go on, for this step's pass; `None` without rows.
    pub(super) fn decode_input(&mut self) -> Option<(Vec<u32>, &mut BatchKvCache)> {
        if self.rows.is_empty() {
            return None;
        }
        debug_assert_eq!(self.cache.rows(), self.rows.len(), "row i of the cache is rows[i]");
        Some((self.rows.iter().map(|row| row.next_input).collect(), &mut self.cache))
    }

    /// Each row's adapter, in row order.
    pub(super) fn adapters(&self) -> impl Iterator<Item = Option<&Arc<AdapterWeights>>> {
        self.rows.iter().map(|row| row.request.adapter.as_ref())
    }

    /// Whether some row samples from the raw logits too.
    pub(super) fn needs_logits(&self) -> bool {
        self.rows.iter().any(Sequence::needs_logits)
    }

    /// Adds sequences whose prompt is prefilled: each group shares one cache (a request's `num_samples` sequences).
    pub(super) fn join(&mut self, joining: Vec<(Vec<Sequence>, SequenceKv)>) -> candle_core::Result<()> {
        let caches = joining.iter().map(|(_, cache)| cache.layers()).collect::<candle_core::Result<Vec<_>>>();
        let result = caches.and_then(|caches| {
            let pushed: Vec<_> =
                caches.iter().zip(&joining).map(|(layers, (rows, _))| (&layers[..], rows.len())).collect();
            self.cache.push(&pushed)
        });
        self.rows.extend(joining.into_iter().flat_map(|(rows, _)| rows));
        if let Err(err) = &result {
            // The cache may be half rebuilt: nothing in it can run on.
            self.fail_all(&format!("cannot add sequences to the batch: {err}"));
        }
        result
    }

    /// Adds sequences that resume from parked keys and values (`(1, kv_heads, len, head_dim)` per layer, every
    /// position but the one each feeds next), with no prefill.
    pub(super) fn rejoin(&mut self, resumed: Vec<(Sequence, Vec<LayerKv>)>) -> candle_core::Result<()> {
        let joining: Vec<(&[LayerKv], usize)> = resumed.iter().map(|(_, layers)| (&layers[..], 1)).collect();
        let result = self.cache.push(&joining);
        self.rows.extend(resumed.into_iter().map(|(row, _)| row));
        if let Err(err) = &result {
            self.fail_all(&format!("cannot resume sequences in the batch: {err}"));
        }
        result
    }

    /// Ends cancelled sequences with `Abort` and drops those whose caller went away. A sequence cancelled to be
    /// parked first hands its keys and values to its caller ([`EngineEvent::Parked`], a handle of this batch's); if
    /// they cannot be copied out, it ends as a plain abort (its continuation recomputes).
    pub(super) fn drop_abandoned(&mut self) -> candle_core::Result<()> {
        if !self.rows.iter().any(Sequence::is_abandoned) {
            return Ok(());
        }
        for (index, row) in self.rows.iter().enumerate() {
            if row.request.parks() {
                match self.cache.row(index) {
                    Ok(layers) => {
                        let kv = self.parked.park(row.tokens(), layers);
                        row.request.send(EngineEvent::Parked { sequence: row.index(), kv });
                    }
                    Err(err) => tracing::warn!(error = %err, "cannot park a sequence; it will be recomputed"),
                }
            }
        }
        self.retain(|sequence| {
            if !sequence.is_abandoned() {
                return true;
            }
            sequence.finish(FinishReason::Abort);
            false
        })
    }

    /// Samples each row's next token from its row of `logprobs` (and of `logits`, given when
    /// [`Batch::needs_logits`]), `vocab` values per row, emits the tokens, and retires finished rows (and rows whose
    /// logprobs were not finite, with an error).
    pub(super) fn advance(
        &mut self,
        logprobs: &[f32],
        logits: Option<&[f32]>,
        vocab: usize,
        context_length: usize,
    ) -> candle_core::Result<()> {
        let mut finished = Vec::new();
        for (index, (row, row_logprobs)) in self.rows.iter_mut().zip(logprobs.chunks_exact(vocab)).enumerate() {
            let row_logits = logits.map(|logits| &logits[index * vocab..(index + 1) * vocab]);
            match row.advance(row_logprobs, row_logits, context_length) {
                Ok(None) => continue,
                Ok(Some(reason)) => row.finish(reason),
                // Only this row's logits overflowed: it leaves the batch, the others go on.
                Err(error) => row.fail(error),
            }
            finished.push(index);
        }
        if finished.is_empty() {
            return Ok(());
        }
        let mut index = 0;
        self.retain(|_| {
            let keep = finished.binary_search(&index).is_err();
            index += 1;
            keep
        })
    }

    /// Fails every running sequence with `reason` and empties the batch.
    pub(super) fn fail_all(&mut self, reason: &str) {
        for sequence in self.rows.drain(..) {
            sequence.fail(EngineError::Internal(reason.to_owned()));
        }
        self.reset();
    }

    /// Tells every running sequence the engine stopped.
    pub(super) fn stop_all(&mut self) {
        for sequence in self.rows.drain(..) {
            sequence.fail(EngineError::Stopped);
        }
        self.reset();
    }

    /// Whether the batch has no rows but keeps the cache's buffers for rows joining again.
    #[cfg(test)]
    pub(super) fn holds_spare_buffers(&self) -> bool {
        self.cache.holds_spare_buffers()
    }

    /// Whether the emptied batch keeps its buffers because a handle it parked a row into is alive (its rows come
    /// back together when their adapter resumes); gives the buffers back otherwise.
    pub(super) fn keeps_buffers_for_parked_rows(&mut self) -> bool {
        if self.parked.any_alive() && self.cache.holds_spare_buffers() {
            return true;
        }
        self.cache.release();
        false
    }

    fn reset(&mut self) {
        self.cache.retain(&[]).expect("emptying a cache allocates nothing");
        self.cache.release();
    }

    /// Keeps the rows (and their cache rows) for which `keep` is true (called once per row, in row order). The last
    /// kept rows fill the holes (as `Vec::swap_remove` does), so the cache copies only the rows it moves.
    fn retain(&mut self, mut keep: impl FnMut(&Sequence) -> bool) -> candle_core::Result<()> {
        let kept: Vec<bool> = self.rows.iter().map(&mut keep).collect();
        let order = fill_holes_from_the_end(&kept);
        let mut rows: Vec<Option<Sequence>> = std::mem::take(&mut self.rows).into_iter().map(Some).collect();
        self.rows = order.iter().map(|&index| rows[index].take().expect("every kept row is taken once")).collect();
        if self.parked.any_alive() { self.cache.retain_keeping_layout(&order) } else { self.cache.retain(&order) }
    }
}

fn empty_cache(model: &Llama) -> BatchKvCache {
    BatchKvCache::new(model.config().num_layers, model.context_length(), model.device(), model.dtype())
}
