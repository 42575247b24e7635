//! Out of blocks is not an error: when a decode row needs a block and the pool has none free or cached, the newest
//! running sequence — a decode row or a started prefill, by when it started — is **preempted** (vLLM V1's policy):
//! its blocks go back to the pool, and it is queued again at the front of its tenant's requests not started, to
//! have its keys and values computed again (or taken back from the prefix cache, if its blocks were not evicted
//! meanwhile) before it decodes on with the same sampler, tokens and budget. Its caller sees nothing but a pause.
//! The oldest running sequence therefore always gets its blocks; a request that could not fit in the pool even
//! alone is refused before it gets here (`CandleEngine::generate`).

use loragate_core::EngineError;

use super::Scheduler;
use super::prefill::Prefill;
use crate::model::{BLOCK_SIZE, BlockPool, ReserveError, SequenceBlocks, kv_cache_error};

impl Scheduler {
    /// Gives every decode row room for this step's position, oldest first, preempting the newest running sequences
    /// while the pool has no block for one.
    pub(super) fn reserve_decode_rows(&mut self) {
        let rows = self.batch.len();
        let mut order: Vec<usize> = (0..rows).collect();
        order.sort_by_key(|&index| self.batch.rows()[index].stamp);
        let mut preempted = vec![false; rows];
        let mut failed = Vec::new();
        for &index in &order {
            while !preempted[index] {
                let row = &mut self.batch.rows_mut()[index];
                match self.cache.reserve(&mut row.blocks, 1) {
                    Ok(()) => break,
                    Err(ReserveError::Model(err)) => {
                        failed.push((index, err.to_string()));
                        preempted[index] = true;
                    }
                    Err(ReserveError::OutOfBlocks) => self.preempt_newest(&mut preempted),
                }
            }
        }
        let mut indices: Vec<usize> = (0..rows).filter(|&index| preempted[index]).collect();
        indices.sort_unstable();
        let pool = self.cache.pool().clone();
        for (index, sequence) in indices.iter().zip(self.batch.take_rows(&indices)) {
            if let Some((_, reason)) = failed.iter().find(|(failed, _)| failed == index) {
                sequence.fail(EngineError::Internal(format!("cannot make room in the KV cache: {reason}")));
            } else if !fits_alone(&pool, sequence.blocks.len() + 1) {
                sequence.fail(EngineError::Internal(kv_cache_error(sequence.blocks.len() + 1, pool.usage().total)));
            } else {
                self.pending.push_preempted(Prefill::preempted(sequence, &pool));
            }
        }
    }

    /// Preempts the newest running sequence among the decode rows not `preempted` yet and the started prefills.
    fn preempt_newest(&mut self, preempted: &mut [bool]) {
        let newest_row =
            (0..preempted.len()).filter(|&index| !preempted[index]).max_by_key(|&index| self.batch.rows()[index].stamp);
        let row_stamp = newest_row.map(|index| self.batch.rows()[index].stamp);
        let pool = self.cache.pool().clone();
        BlockPool::count(&pool.counters().preemptions, 1);
        match (newest_row, row_stamp, self.pending.newest_started()) {
            (_, Some(row), Some(prefill)) if prefill > row => {
                self.pending.preempt_newest();
            }
            (Some(index), _, _) => {
                preempted[index] = true;
                let row = &mut self.batch.rows_mut()[index];
                // Its blocks go back now, so that the older rows' reservations can take them.
                row.blocks = SequenceBlocks::new(&pool, row.blocks.root());
            }
            (None, _, _) => {
                self.pending.preempt_newest();
            }
        }
    }

    /// When nothing could run in a step (no decode row, no chunk) because started prefills hold every block between
    /// them, the newest gives its blocks back so that the others can go on.
    pub(super) fn unblock_prefills(&mut self) {
        if self.cache.pool().available() == 0 && self.pending.preempt_newest() {
            BlockPool::count(&self.cache.pool().counters().preemptions, 1);
        }
    }
}

/// Whether a sequence of `positions` positions fits in `pool` alone.
pub(super) fn fits_alone(pool: &BlockPool, positions: usize) -> bool {
    positions.div_ceil(BLOCK_SIZE) <= pool.usage().total
}
