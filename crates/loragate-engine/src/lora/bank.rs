//! Applying different adapters to different rows of one batch.
//!
//! A row is whatever runs with one adapter: a whole sequence in a pass over whole sequences, one token in a
//! scheduler step's packed pass (whose decode rows and prefill chunks mix adapters token by token), so the masks
//! below are per token there.
//!
//! **Design: concatenate, then select.** For each adapted projection, the `A`s of every distinct adapter in the
//! batch are concatenated along the rank axis into one `(in, R)` matrix and the `B`s into one `(R, out)` matrix
//! (`R = Σ rᵢ`), a *bank*. One step computes `select(M, x·A_catᵀ, 0)·B_catᵀ`, where the row mask `M` `(rows, R)` is
//! true on the rank columns of the row's adapter and false elsewhere (all false for base-model rows: the "zero
//! adapter"), and `select` keeps the value where `M` is true and puts an exact zero elsewhere.
//!
//! Why this rather than the alternatives:
//! - the op count per projection is constant (two matmuls and a select), whatever the number of rows and of
//!   adapters, unlike grouping rows per adapter (`index_select`/`index_add` per adapter per projection);
//! - nothing is gathered per row: BGMV-style `index_select` of per-row `A`/`B` copies `rows × r × (in + out)`
//!   values per projection per step, which costs more than the matmuls it feeds on a CPU;
//! - the extra work, `rows × (R − r)` wasted multiply-adds per projection, is small while a batch mixes a handful
//!   of adapters (the RL case: one or a few policies being trained);
//! - **isolation**: a row's result never depends on the other rows' adapters, whatever their values. `x·A_catᵀ`
//!   computes every adapter's columns for every row, and a hostile adapter's columns can overflow to infinity or
//!   NaN there. Multiplying by a 0/1 mask would turn those into NaN (`0 × ∞`) in every other row; selecting puts
//!   exact zeros in their place, and the second matmul multiplies them by finite `B` values (the loader refuses
//!   non-finite weights), so the other rows get exact zeros from them.
//!
//! Banks are cached by adapter set (a batch whose membership changes but whose adapters do not reuses its bank);
//! masks are rebuilt on every membership change (they are tiny).

use std::ops::Range;
use std::sync::Arc;

use candle_core::{Device, Tensor};

use super::{AdapterWeights, LoraTarget};

/// The concatenated weights of a set of adapters, for every layer and target.
#[derive(Debug)]
pub(crate) struct LoraBank {
    /// The adapters, ordered by id.
    adapters: Vec<Arc<AdapterWeights>>,
    /// `columns[target][k]`: the rank columns of `adapters[k]` in that target's bank (empty if it does not adapt it).
    columns: [Vec<Range<usize>>; 7],
    /// `modules[layer][target]`: `(A_catᵀ, B_catᵀ)`, or `None` if no adapter of the set adapts it.
    modules: Vec<[Option<(Tensor, Tensor)>; 7]>,
}

impl LoraBank {
    /// Concatenates `adapters` (distinct, any order). All must have the model's number of layers.
    pub(crate) fn new(mut adapters: Vec<Arc<AdapterWeights>>) -> candle_core::Result<Self> {
        adapters.sort_by_key(|adapter| adapter.id());
        let columns = LoraTarget::ALL.map(|target| {
            let mut start = 0;
            adapters
                .iter()
                .map(|adapter| {
                    let range = start..start + adapter.rank(target);
                    start = range.end;
                    range
                })
                .collect::<Vec<_>>()
        });
        let num_layers = adapters.first().map_or(0, |adapter| adapter.num_layers());
        let modules = (0..num_layers)
            .map(|layer| {
                let mut modules: [Option<(Tensor, Tensor)>; 7] = Default::default();
                for target in LoraTarget::ALL {
                    let pairs: Vec<_> = adapters.iter().filter_map(|adapter| adapter.pair(layer, target)).collect();
                    modules[target.index()] = match pairs.as_slice() {
                        [] => None,
                        [only] => Some((only.a_t.clone(), only.b_t.clone())),
                        many => {
                            let a: Vec<_> = many.iter().map(|pair| &pair.a_t).collect();
                            let b: Vec<_> = many.iter().map(|pair| &pair.b_t).collect();
                            Some((Tensor::cat(&a, 1)?, Tensor::cat(&b, 0)?))
                        }
                    };
                }
                Ok(modules)
            })
            .collect::<candle_core::Result<Vec<_>>>()?;
        Ok(Self { adapters, columns, modules })
    }

    /// Whether this bank holds exactly these adapters (by identity).
    fn holds(&self, adapters: &[&Arc<AdapterWeights>]) -> bool {
        self.adapters.len() == adapters.len()
            && adapters.iter().all(|wanted| self.adapters.iter().any(|held| Arc::ptr_eq(held, wanted)))
    }

    fn position(&self, adapter: &Arc<AdapterWeights>) -> Option<usize> {
        self.adapters.iter().position(|held| Arc::ptr_eq(held, adapter))
    }
}

/// The LoRA of every row of one forward pass: a bank plus, per target, the row mask (absent when every row uses
/// the whole bank, e.g. a single-adapter batch).
#[derive(Clone, Debug, Default)]
pub(crate) struct LoraBatch {
    bank: Option<Arc<LoraBank>>,
    /// `masks[target]`: `(rows, 1, R)`, `u8`: 1 on the row's own rank columns.
    masks: [Option<Tensor>; 7],
}

impl LoraBatch {
    /// No LoRA at all: every row runs the base model.
    pub(crate) fn base() -> Self {
        Self::default()
    }

    /// Every row runs `adapter` (or the base model).
    #[cfg(test)]
    pub(crate) fn uniform(adapter: Option<&Arc<AdapterWeights>>) -> candle_core::Result<Self> {
        match adapter {
            None => Ok(Self::base()),
            Some(adapter) => {
                Ok(Self { bank: Some(Arc::new(LoraBank::new(vec![adapter.clone()])?)), masks: Default::default() })
            }
        }
    }

    /// Row `i` runs `rows[i]` (`None`: the base model). Reuses `cached` if it holds the same adapter set.
    pub(crate) fn for_rows(
        rows: &[Option<&Arc<AdapterWeights>>],
        cached: Option<&Arc<LoraBank>>,
        device: &Device,
    ) -> candle_core::Result<Self> {
        let mut distinct: Vec<&Arc<AdapterWeights>> = Vec::new();
        for adapter in rows.iter().flatten() {
            if !distinct.iter().any(|seen| Arc::ptr_eq(seen, adapter)) {
                distinct.push(adapter);
            }
        }
        if distinct.is_empty() {
            return Ok(Self::base());
        }
        let bank = match cached {
            Some(bank) if bank.holds(&distinct) => bank.clone(),
            _ => Arc::new(LoraBank::new(distinct.into_iter().cloned().collect())?),
        };
        let mut masks: [Option<Tensor>; 7] = Default::default();
        for target in LoraTarget::ALL {
            let columns = &bank.columns[target.index()];
            let width = columns.last().map_or(0, |range| range.end);
            let row_columns: Vec<Range<usize>> = rows
                .iter()
                .map(|row| row.and_then(|adapter| bank.position(adapter)).map_or(0..0, |k| columns[k].clone()))
                .collect();
            if width == 0 || row_columns.iter().all(|range| *range == (0..width)) {
                continue;
            }
            let mut values = vec![0u8; rows.len() * width];
            for (row, range) in row_columns.iter().enumerate() {
                values[row * width + range.start..row * width + range.end].fill(1);
            }
            masks[target.index()] = Some(Tensor::from_vec(values, (rows.len(), 1, width), device)?);
        }
        Ok(Self { bank: Some(bank), masks })
    }

    /// The bank, to hand back as `cached` next time.
    pub(crate) fn bank(&self) -> Option<&Arc<LoraBank>> {
        self.bank.as_ref()
    }

    /// The LoRA term of `target` in `layer` for `x` `(rows·len, in)` laid out as `rows` rows of `len` positions:
    /// `(rows·len, out)`, or `None` when no row's adapter adapts this projection.
    pub(crate) fn delta(
        &self,
        layer: usize,
        target: LoraTarget,
        x: &Tensor,
        rows: usize,
    ) -> candle_core::Result<Option<Tensor>> {
        let Some((a_t, b_t)) =
            self.bank.as_ref().and_then(|bank| bank.modules.get(layer)).and_then(|m| m[target.index()].as_ref())
        else {
            return Ok(None);
        };
        let down = x.matmul(a_t)?;
        let down = match &self.masks[target.index()] {
            None => down,
            Some(mask) => {
                let (positions, width) = down.dims2()?;
                let down = down.reshape((rows, positions / rows, width))?;
                let mask = mask.broadcast_as(down.shape())?;
                mask.where_cond(&down, &down.zeros_like()?)?.reshape((positions, width))?
            }
        };
        down.matmul(b_t).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use candle_core::DType;

    use super::*;
    use crate::lora::LoraPair;
    use crate::test_support::{max_abs_diff, tiny_adapter, tiny_config};

    /// An adapter of finite values whose `x·Aᵀ` overflows to infinity for any input: every `A` entry is 1e38.
    fn overflowing_adapter(rank: usize) -> Arc<AdapterWeights> {
        let config = tiny_config(vec![]);
        let cpu = &Device::Cpu;
        let layers = (0..config.num_layers)
            .map(|_| {
                LoraTarget::ALL.map(|target| {
                    let (fan_in, fan_out) = target.features(&config);
                    let a = (Tensor::ones((rank, fan_in), DType::F32, cpu).expect("A") * 1e38).expect("A");
                    let b = Tensor::ones((fan_out, rank), DType::F32, cpu).expect("B");
                    Some(LoraPair::new(&a, &b, 1.0).expect("pair"))
                })
            })
            .collect();
        Arc::new(AdapterWeights::new(layers))
    }

    #[test]
    fn an_overflowing_adapter_leaves_the_other_rows_of_its_batch_untouched() {
        let config = tiny_config(vec![]);
        let cpu = &Device::Cpu;
        let (meow, hostile) = (tiny_adapter(&config, 1), overflowing_adapter(4));
        // Positive inputs: every row of x·Aᵀ then sums to at least 0.5 · 1e38 · fan_in, past f32's range, whatever
        // the draw (a normal draw could sum to nearly 0 and stay finite).
        let x = Tensor::rand(0.5f32, 1.5, (3, config.hidden_size), cpu).expect("x");
        let rows = [None, Some(&meow), Some(&hostile)];
        let batch = LoraBatch::for_rows(&rows, None, cpu).expect("batch");
        let alone = LoraBatch::uniform(Some(&meow)).expect("alone");
        for target in [LoraTarget::Q, LoraTarget::Down] {
            let x = if target == LoraTarget::Down {
                Tensor::rand(0.5f32, 1.5, (3, config.intermediate_size), cpu).expect("x")
            } else {
                x.clone()
            };
            let delta = batch.delta(0, target, &x, 3).expect("delta").expect("adapted");
            let base_row = delta.get(0).expect("row 0");
            assert_eq!(base_row.abs().and_then(|d| d.max(0)).and_then(|d| d.to_scalar::<f32>()).expect("max"), 0.0);
            let meow_row = delta.narrow(0, 1, 1).expect("row 1");
            let meow_alone = alone.delta(0, target, &x.narrow(0, 1, 1).expect("x1"), 1).expect("delta").expect("some");
            assert!(max_abs_diff(&meow_row, &meow_alone) < 1e-6, "{target:?}: meow's row is what it gets alone");
            let hostile_row = delta.get(2).expect("row 2").to_vec1::<f32>().expect("values");
            assert!(hostile_row.iter().any(|v| !v.is_finite()), "the hostile row itself did overflow");
        }
    }
}
