//! Choosing each sequence's next token from the model's log-probabilities.
//!
//! Semantics (those of vLLM):
//! - temperature 0 is greedy: the most likely token (the lowest id on ties);
//! - otherwise the distribution is `softmax(logits / temperature)`, restricted to the `top_k` most likely tokens,
//!   then to the smallest set of most likely tokens whose mass reaches `top_p`, renormalised, and sampled;
//! - each sequence has its own generator: sequence `i` of a request with seed `s` uses `s + i`, so the same seed
//!   gives the same tokens whatever else the engine runs; without a seed the generator is seeded from the OS;
//! - the reported logprob of a token is under the model's **raw** distribution (`log_softmax` of the logits, before
//!   temperature, top-k and top-p), which is what an RL trainer needs for importance ratios against its own policy.

use std::cmp::Ordering;

use loragate_core::SamplingParams;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// One sequence's sampler.
#[derive(Debug)]
pub(crate) struct Sampler {
    temperature: f32,
    top_k: Option<usize>,
    top_p: f32,
    rng: StdRng,
}

impl Sampler {
    /// The sampler of sequence `sequence` of a request with `params`.
    pub(crate) fn new(params: &SamplingParams, sequence: u32) -> Self {
        let rng = match params.seed() {
            Some(seed) => StdRng::seed_from_u64(seed.wrapping_add(u64::from(sequence))),
            None => StdRng::from_os_rng(),
        };
        Self {
            temperature: params.temperature(),
            top_k: params.top_k().map(|k| k as usize),
            top_p: params.top_p(),
            rng,
        }
    }

    /// Picks a token from `logprobs` (the raw `log_softmax` of the logits over the vocabulary) and returns it with
    /// its raw logprob.
    pub(crate) fn sample(&mut self, logprobs: &[f32]) -> (u32, f32) {
        let token = if self.temperature == 0.0 { argmax(logprobs) } else { self.draw(logprobs) };
        (token as u32, logprobs[token])
    }

    fn draw(&mut self, logprobs: &[f32]) -> usize {
        let mut candidates: Vec<usize> = (0..logprobs.len()).collect();
        let descending = |a: &usize, b: &usize| logprobs[*b].partial_cmp(&logprobs[*a]).unwrap_or(Ordering::Equal);
        if let Some(k) = self.top_k.filter(|&k| k < candidates.len()) {
            candidates.select_nth_unstable_by(k - 1, descending);
            candidates.truncate(k);
        }
        let restricts_mass = self.top_p < 1.0;
        if restricts_mass {
            candidates.sort_unstable_by(descending);
        }
        // Scaled by temperature and shifted by the best candidate, so exp() never overflows.
        let best = candidates.iter().map(|&i| logprobs[i]).fold(f32::NEG_INFINITY, f32::max);
        let inverse_temperature = 1.0 / f64::from(self.temperature);
        let mut weights: Vec<f64> =
            candidates.iter().map(|&i| (f64::from(logprobs[i] - best) * inverse_temperature).exp()).collect();
        if restricts_mass {
            let total: f64 = weights.iter().sum();
            let mut mass = 0.0;
            let keep = weights
                .iter()
                .position(|weight| {
                    mass += weight / total;
                    mass >= f64::from(self.top_p)
                })
                .map_or(weights.len(), |last| last + 1);
            weights.truncate(keep);
            candidates.truncate(keep);
        }
        let total: f64 = weights.iter().sum();
        let mut threshold = self.rng.random::<f64>() * total;
        for (candidate, weight) in candidates.iter().zip(&weights) {
            if threshold < *weight {
                return *candidate;
            }
            threshold -= weight;
        }
        // Rounding left a sliver of mass past the last candidate: it is the last candidate's.
        candidates.last().copied().unwrap_or_else(|| argmax(logprobs))
    }
}

/// The index of the largest value (the first one on ties; NaN never wins).
fn argmax(values: &[f32]) -> usize {
    let mut best = 0;
    for (index, value) in values.iter().enumerate() {
        if *value > values[best] || values[best].is_nan() {
            best = index;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use loragate_core::{ModelInfo, RawSampleRequest, SampleRequest};

    use super::*;

    fn params(temperature: f32, top_k: i32, top_p: Option<f32>, seed: Option<u64>) -> SamplingParams {
        let model = ModelInfo { vocab_size: 8, context_length: 64, eos_token_ids: vec![] };
        let raw = RawSampleRequest { prompt_token_ids: vec![1], temperature, top_k, top_p, seed, ..Default::default() };
        SampleRequest::parse(raw, &model).expect("valid").params().clone()
    }

    fn logprobs(weights: &[f32]) -> Vec<f32> {
        let total: f32 = weights.iter().sum();
        weights.iter().map(|w| (w / total).ln()).collect()
    }

    #[test]
    fn greedy_takes_the_most_likely_token_and_reports_its_raw_logprob() {
        let lp = logprobs(&[1.0, 5.0, 3.0, 5.0]);
        let (token, logprob) = Sampler::new(&params(0.0, 0, None, None), 0).sample(&lp);
        assert_eq!(token, 1);
        assert_eq!(logprob, lp[1]);
    }

    #[test]
    fn top_k_and_top_p_restrict_the_candidates() {
        let lp = logprobs(&[1.0, 10.0, 6.0, 3.0, 0.5]);
        let mut top_k = Sampler::new(&params(1.0, 2, None, Some(1)), 0);
        let mut top_p = Sampler::new(&params(1.0, 0, Some(0.4), Some(1)), 0);
        for _ in 0..200 {
            assert!(matches!(top_k.sample(&lp).0, 1 | 2));
            assert_eq!(top_p.sample(&lp).0, 1, "token 1 alone holds 10/20.5 ≥ 0.4 of the mass");
        }
    }

    #[test]
    fn seeds_fix_the_draws_and_sequences_get_their_own_stream() {
        let lp = logprobs(&[1.0; 8]);
        let draw = |seed, sequence| {
            let mut sampler = Sampler::new(&params(1.0, 0, None, Some(seed)), sequence);
            (0..32).map(|_| sampler.sample(&lp).0).collect::<Vec<_>>()
        };
        assert_eq!(draw(7, 0), draw(7, 0));
        assert_eq!(draw(7, 1), draw(8, 0), "sequence i of seed s draws like seed s + i");
        assert_ne!(draw(7, 0), draw(7, 1));
    }

    #[test]
    fn low_temperature_concentrates_the_mass() {
        let lp = logprobs(&[1.0, 2.0, 1.0, 1.0]);
        let mut cold = Sampler::new(&params(0.05, 0, None, Some(3)), 0);
        assert!((0..100).all(|_| cold.sample(&lp).0 == 1));
        let mut warm = Sampler::new(&params(1.0, 0, None, Some(3)), 0);
        assert!((0..100).any(|_| warm.sample(&lp).0 != 1));
    }
}
