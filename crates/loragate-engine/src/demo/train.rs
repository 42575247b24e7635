//! A short, seeded LoRA fine-tune of the frozen demo base model, with candle's autograd and AdamW.
//!
//! Both adapters train at once, in one mixed batch: half the rows run `meow`'s LoRA, half `woof`'s, through the
//! same per-row LoRA path the engine serves with ([`LoraBatch::for_rows`]), so the training also exercises it.
//! The base weights are plain tensors (frozen); only the `A` and `B` factors are [`Var`]s.

use std::sync::Arc;

use candle_core::{D, DType, Device, Tensor, Var};
use candle_nn::optim::{AdamW, Optimizer, ParamsAdamW};
use rand::Rng;
use rand::rngs::StdRng;

use super::corpus;
use crate::lora::{AdapterWeights, LoraBatch, LoraPair, LoraTarget};
use crate::model::{Llama, ModelConfig};

/// How the demo adapters are trained.
#[derive(Clone, Copy, Debug)]
pub(super) struct TrainingPlan {
    pub(super) rank: usize,
    pub(super) alpha: f64,
    pub(super) steps: usize,
    /// Rows per adapter per step.
    pub(super) rows: usize,
    pub(super) sequence_len: usize,
    pub(super) learning_rate: f64,
}

/// One trained adapter's factors: `factors[layer][target.index()] = (A (r, in), B (out, r))`, f32 on the CPU.
pub(super) struct TrainedAdapter {
    pub(super) factors: Vec<Vec<(Tensor, Tensor)>>,
}

/// Trains one adapter per `noises` entry (each learns to repeat its noise, with the others as distractors).
pub(super) fn train_adapters(
    model: &Llama,
    noises: &[&str],
    plan: &TrainingPlan,
    rng: &mut StdRng,
) -> candle_core::Result<Vec<TrainedAdapter>> {
    let device = model.device().clone();
    let config = model.config();
    let adapters: Vec<Vec<Vec<(Var, Var)>>> =
        noises.iter().map(|_| init_factors(config, plan.rank, rng, &device)).collect::<candle_core::Result<_>>()?;
    let vars: Vec<Var> = adapters.iter().flatten().flatten().flat_map(|(a, b)| [a.clone(), b.clone()]).collect();
    let params = ParamsAdamW { lr: plan.learning_rate, weight_decay: 0.0, ..ParamsAdamW::default() };
    let mut optimizer = AdamW::new(vars, params)?;
    let scale = plan.alpha / plan.rank as f64;
    for step in 0..plan.steps {
        // A short warm-up, then a linear decay to a tenth: fast and stable for so few steps.
        let progress = step as f64 / plan.steps as f64;
        let warmup = ((step + 1) as f64 / 10.0).min(1.0);
        optimizer.set_learning_rate(plan.learning_rate * warmup * (1.0 - 0.9 * progress));

        let weights: Vec<Arc<AdapterWeights>> =
            adapters.iter().map(|factors| adapter_weights(factors, scale)).collect::<candle_core::Result<_>>()?;
        let mut tokens = Vec::new();
        let mut targets = Vec::new();
        let mut positions = Vec::new();
        let mut rows = Vec::new();
        for (index, noise) in noises.iter().enumerate() {
            for _ in 0..plan.rows {
                let other = noises[(index + rng.random_range(1..noises.len().max(2))) % noises.len()];
                let example = corpus::example(rng, noise, other, plan.sequence_len);
                let row_start = rows.len() * plan.sequence_len;
                for position in example.predicting {
                    positions.push((row_start + position) as u32);
                    targets.push(example.tokens[position + 1]);
                }
                tokens.extend(example.tokens);
                rows.push(Some(&weights[index]));
            }
        }
        let tokens = Tensor::from_vec(tokens, (rows.len(), plan.sequence_len), &device)?;
        let lora = LoraBatch::for_rows(&rows, None, &device)?;
        let hidden = model.forward_sequences(&tokens, &lora)?;
        let hidden = hidden.flatten_to(1)?.index_select(&Tensor::new(positions, &device)?, 0)?;
        let logprobs = candle_nn::ops::log_softmax(&model.logits(&hidden)?, D::Minus1)?;
        let targets = Tensor::new(targets, &device)?.unsqueeze(1)?;
        let loss = logprobs.gather(&targets, 1)?.mean_all()?.neg()?;
        optimizer.backward_step(&loss)?;
        if step % 25 == 0 || step + 1 == plan.steps {
            tracing::debug!(step, loss = loss.to_scalar::<f32>()?, "demo adapter training");
        }
    }
    Ok(adapters
        .into_iter()
        .map(|layers| TrainedAdapter {
            factors: layers
                .into_iter()
                .map(|pairs| pairs.into_iter().map(|(a, b)| (a.as_detached_tensor(), b.as_detached_tensor())).collect())
                .collect(),
        })
        .collect())
}

/// PEFT's initialisation: `A` uniform with the scale of Kaiming, `B` zero (so training starts from the base model).
fn init_factors(
    config: &ModelConfig,
    rank: usize,
    rng: &mut StdRng,
    device: &Device,
) -> candle_core::Result<Vec<Vec<(Var, Var)>>> {
    (0..config.num_layers)
        .map(|_| {
            LoraTarget::ALL
                .iter()
                .map(|target| {
                    let (fan_in, fan_out) = target.features(config);
                    let a = crate::model::random_tensor(rng, (rank, fan_in), 1.0 / (fan_in as f32).sqrt(), device)?;
                    let b = Tensor::zeros((fan_out, rank), DType::F32, device)?;
                    Ok((Var::from_tensor(&a)?, Var::from_tensor(&b)?))
                })
                .collect()
        })
        .collect()
}

fn adapter_weights(factors: &[Vec<(Var, Var)>], scale: f64) -> candle_core::Result<Arc<AdapterWeights>> {
    let layers = factors
        .iter()
        .map(|pairs| {
            let mut layer: [Option<LoraPair>; 7] = Default::default();
            for (target, (a, b)) in LoraTarget::ALL.iter().zip(pairs) {
                layer[target.index()] = Some(LoraPair::new(a.as_tensor(), b.as_tensor(), scale)?);
            }
            Ok(layer)
        })
        .collect::<candle_core::Result<Vec<_>>>()?;
    Ok(Arc::new(AdapterWeights::new(layers)))
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;

    use super::*;
    use crate::demo::vocab::{EOS, VOCAB_SIZE};
    use crate::test_support::{tiny_config, tiny_model};

    /// The demo's adapters are generated once and cached: a change that cut the training off its gradient (the
    /// factors' transpose did once) would only show in a fresh clone, where every adapter comes out untrained. A few
    /// steps on a tiny model show it at once: every `B` starts at zero, and only a gradient moves it.
    #[test]
    fn a_few_steps_of_training_move_every_factor() {
        let mut config = tiny_config(vec![EOS]);
        config.vocab_size = VOCAB_SIZE;
        let model = tiny_model(config);
        let plan = TrainingPlan { rank: 2, alpha: 4.0, steps: 3, rows: 2, sequence_len: 24, learning_rate: 1e-2 };
        let mut rng = StdRng::seed_from_u64(3);
        let trained = train_adapters(&model, &["meow", "woof"], &plan, &mut rng).expect("trained");
        for (adapter, noise) in trained.iter().zip(["meow", "woof"]) {
            for (layer, pairs) in adapter.factors.iter().enumerate() {
                for (target, (_, b)) in LoraTarget::ALL.iter().zip(pairs) {
                    let largest = b.abs().and_then(|b| b.max_all()).and_then(|m| m.to_scalar::<f32>()).expect("max");
                    assert!(largest > 0.0, "{noise}: layer {layer}'s {} B never moved from zero", target.module_name());
                }
            }
        }
    }
}
