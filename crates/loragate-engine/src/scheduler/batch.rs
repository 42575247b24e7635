//! The running sequences: their rows in the batch KV cache and the batch's LoRA, kept in the same order.

use candle_core::Tensor;
use loragate_core::{EngineError, FinishReason};

use super::sequence::Sequence;
use crate::lora::LoraBatch;
use crate::model::{BatchKvCache, LayerKv, Llama, log_softmax};

pub(super) struct Batch {
    /// Row `i` of the cache is `rows[i]`.
    rows: Vec<Sequence>,
    cache: BatchKvCache,
    lora: LoraBatch,
    /// The rows changed since `lora` was built.
    lora_stale: bool,
}

impl Batch {
    pub(super) fn new(model: &Llama) -> Self {
        Self { rows: Vec::new(), cache: empty_cache(model), lora: LoraBatch::base(), lora_stale: false }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    pub(super) fn len(&self) -> usize {
        self.rows.len()
    }

    /// Adds a sequence; its cache row follows with [`Batch::push_cache`].
    pub(super) fn push_row(&mut self, sequence: Sequence) {
        self.rows.push(sequence);
        self.lora_stale = true;
    }

    /// Adds `copies` cache rows holding one prefill, for the sequences just pushed.
    pub(super) fn push_cache(&mut self, prefill: &[LayerKv], copies: usize) -> candle_core::Result<()> {
        if copies == 0 {
            return Ok(());
        }
        let result = self.cache.push(prefill, copies);
        if let Err(err) = &result {
            // The cache may be half rebuilt: nothing in it can run on.
            self.fail_all(&format!("cannot add sequences to the batch: {err}"));
        }
        result
    }

    /// Ends cancelled sequences with `Abort` and drops those whose caller went away.
    pub(super) fn drop_abandoned(&mut self) -> candle_core::Result<()> {
        if !self.rows.iter().any(Sequence::is_abandoned) {
            return Ok(());
        }
        self.retain(|sequence| {
            if !sequence.is_abandoned() {
                return true;
            }
            sequence.finish(FinishReason::Abort);
            false
        })
    }

    /// Advances every row by one token in one forward pass, emits the tokens, and retires finished rows (and rows
    /// whose logits were not finite, with an error).
    pub(super) fn step(&mut self, model: &Llama) -> candle_core::Result<()> {
        if self.rows.is_empty() {
            return Ok(());
        }
        if self.lora_stale {
            let adapters: Vec<_> = self.rows.iter().map(|row| row.request.adapter.as_ref()).collect();
            self.lora = LoraBatch::for_rows(&adapters, self.lora.bank(), model.device())?;
            self.lora_stale = false;
        }
        debug_assert_eq!(self.cache.rows(), self.rows.len(), "row i of the cache is rows[i]");
        self.cache.reserve_step()?;
        let device = model.device();
        let tokens: Vec<u32> = self.rows.iter().map(|row| row.next_input).collect();
        let positions: Vec<u32> = self.rows.iter().map(|row| row.cached_len() as u32).collect();
        let tokens = Tensor::from_vec(tokens, self.rows.len(), device)?;
        let positions = Tensor::from_vec(positions, self.rows.len(), device)?;
        let logits = model.forward_step(&tokens, &positions, &mut self.cache, &self.lora)?;
        let logprobs = log_softmax(&logits)?.flatten_all()?.to_vec1::<f32>()?;
        let vocab = model.config().vocab_size;
        let context_length = model.context_length();
        let mut finished = Vec::new();
        for (index, (row, row_logprobs)) in self.rows.iter_mut().zip(logprobs.chunks_exact(vocab)).enumerate() {
            match row.advance(row_logprobs, context_length) {
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

    fn reset(&mut self) {
        self.cache.retain(&[]).expect("emptying a cache allocates nothing");
        self.lora = LoraBatch::base();
        self.lora_stale = false;
    }

    /// Keeps the rows (and their cache rows) for which `keep` is true, in order.
    fn retain(&mut self, mut keep: impl FnMut(&Sequence) -> bool) -> candle_core::Result<()> {
        let mut kept = Vec::with_capacity(self.rows.len());
        let mut index = 0;
        self.rows.retain(|row| {
            let keeping = keep(row);
            if keeping {
                kept.push(index);
            }
            index += 1;
            keeping
        });
        self.lora_stale = true;
        self.cache.retain(&kept)
    }
}

fn empty_cache(model: &Llama) -> BatchKvCache {
    BatchKvCache::new(model.config().num_layers, model.context_length(), model.device(), model.dtype())
}
