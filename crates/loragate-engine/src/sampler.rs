//! Choosing each sequence's next token from the model's output.
//!
//! Semantics (those of vLLM's sampler, in its order):
//! - the **scores** start as the raw logprobs (`log_softmax` of the logits), or as the raw logits when a repetition
//!   penalty needs their sign; until `min_tokens` tokens were generated, the end-of-sequence and stop tokens are
//!   masked out; the **penalties** then apply ([`penalties`]): repetition (prompt and output tokens), frequency
//!   and presence (output tokens);
//! - temperature 0 is greedy: the highest score (the lowest id on ties);
//! - otherwise the distribution is `softmax(scores / temperature)`, restricted to the tokens at least `min_p` times
//!   as likely as the most likely one, then to the `top_k` most likely, then to the smallest set of most likely
//!   tokens whose mass reaches `top_p`, renormalised, and sampled;
//! - each sequence has its own generator: sequence `i` of a request with seed `s` uses `s + i`, so the same seed
//!   gives the same tokens whatever else the engine runs; without a seed the generator is seeded from the OS;
//! - the reported logprob of a token, its rank and the most likely alternatives ([`top`]) are under the model's
//!   **raw** distribution (before masks, penalties, temperature and filters), which is what an RL trainer needs for
//!   importance ratios against its own policy (vLLM's default `raw_logprobs`).

mod penalties;
#[cfg(test)]
mod tests;
mod top;

use std::borrow::Cow;
use std::cmp::Ordering;

use loragate_core::{SamplingParams, TopLogprobs};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use self::penalties::Penalties;
pub(crate) use self::top::top_logprobs;

/// One sequence's sampler.
#[derive(Debug)]
pub(crate) struct Sampler {
    temperature: f32,
    top_k: Option<usize>,
    top_p: f32,
    min_p: f32,
    penalties: Option<Penalties>,
    /// The end-of-sequence and stop tokens, masked until `min_tokens` tokens were generated.
    held_back_stops: Vec<u32>,
    min_tokens: u32,
    generated: u32,
    top_logprobs: usize,
    rng: StdRng,
}

/// A sampled token with what the request asked to know about it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Sampled {
    /// The token.
    pub(crate) token: u32,
    /// Its raw logprob.
    pub(crate) logprob: f32,
    /// Its rank and the most likely tokens, if the request asked for alternatives.
    pub(crate) top: Option<TopLogprobs>,
}

impl Sampler {
    /// The sampler of sequence `sequence` of a request with `params` over `prompt`, whose sequences end at
    /// `stop_tokens` (its stop token ids and, unless it ignores them, the model's end-of-sequence tokens).
    pub(crate) fn new(params: &SamplingParams, sequence: u32, prompt: &[u32], stop_tokens: &[u32]) -> Self {
        let rng = match params.seed() {
            Some(seed) => StdRng::seed_from_u64(seed.wrapping_add(u64::from(sequence))),
            None => StdRng::from_os_rng(),
        };
        let min_tokens = params.min_tokens();
        Self {
            temperature: params.temperature(),
            top_k: params.top_k().map(|k| k as usize),
            top_p: params.top_p(),
            min_p: params.min_p(),
            penalties: params.has_penalties().then(|| Penalties::new(params, prompt)),
            held_back_stops: if min_tokens > 0 { stop_tokens.to_vec() } else { Vec::new() },
            min_tokens,
            generated: 0,
            top_logprobs: params.top_logprobs() as usize,
            rng,
        }
    }

    /// Whether requests with `params` need the raw logits besides the logprobs (a repetition penalty depends on
    /// the logits' sign, which `log_softmax` loses).
    pub(crate) fn needs_logits_for(params: &SamplingParams) -> bool {
        params.repetition_penalty() != 1.0
    }

    /// Whether [`Sampler::sample`] must be given the raw logits.
    pub(crate) fn needs_logits(&self) -> bool {
        self.penalties.as_ref().is_some_and(Penalties::needs_logits)
    }

    /// Picks a token from `logprobs` (the raw `log_softmax` of the logits over the vocabulary; `logits`, the raw
    /// logits, must be given when [`Sampler::needs_logits`]) and records it for the penalties.
    pub(crate) fn sample(&mut self, logprobs: &[f32], logits: Option<&[f32]>) -> Sampled {
        let scores = self.scores(logprobs, logits);
        let index = if self.temperature == 0.0 { argmax(&scores) } else { self.draw(&scores) };
        let token = index as u32;
        self.generated += 1;
        if let Some(penalties) = &mut self.penalties {
            penalties.record(token);
        }
        let top = (self.top_logprobs > 0).then(|| top_logprobs(logprobs, self.top_logprobs, token));
        Sampled { token, logprob: logprobs[index], top }
    }

    /// The scores to sample from: the raw logprobs themselves when nothing changes them.
    fn scores<'a>(&self, logprobs: &'a [f32], logits: Option<&[f32]>) -> Cow<'a, [f32]> {
        let mask_stops = self.generated < self.min_tokens && !self.held_back_stops.is_empty();
        let Some(penalties) = &self.penalties else {
            if !mask_stops {
                return Cow::Borrowed(logprobs);
            }
            return Cow::Owned(self.masked(logprobs.to_vec()));
        };
        let base = match logits {
            Some(logits) if penalties.needs_logits() => logits,
            _ => {
                debug_assert!(!penalties.needs_logits(), "a repetition penalty needs the raw logits");
                logprobs
            }
        };
        let mut scores = base.to_vec();
        penalties.apply(&mut scores);
        Cow::Owned(if mask_stops { self.masked(scores) } else { scores })
    }

    fn masked(&self, mut scores: Vec<f32>) -> Vec<f32> {
        for &token in &self.held_back_stops {
            if let Some(score) = scores.get_mut(token as usize) {
                *score = f32::NEG_INFINITY;
            }
        }
        scores
    }

    fn draw(&mut self, scores: &[f32]) -> usize {
        let mut candidates: Vec<usize> = (0..scores.len()).collect();
        let descending = |a: &usize, b: &usize| scores[*b].partial_cmp(&scores[*a]).unwrap_or(Ordering::Equal);
        if self.min_p > 0.0 {
            // p_i >= min_p * p_max, with p = softmax(scores / temperature), in score terms.
            let best = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let floor = best + self.temperature * self.min_p.ln();
            candidates.retain(|&i| scores[i] >= floor);
        }
        if let Some(k) = self.top_k.filter(|&k| k < candidates.len()) {
            candidates.select_nth_unstable_by(k - 1, descending);
            candidates.truncate(k);
        }
        let restricts_mass = self.top_p < 1.0;
        if restricts_mass {
            candidates.sort_unstable_by(descending);
        }
        // Scaled by temperature and shifted by the best candidate, so exp() never overflows.
        let best = candidates.iter().map(|&i| scores[i]).fold(f32::NEG_INFINITY, f32::max);
        let inverse_temperature = 1.0 / f64::from(self.temperature);
        let mut weights: Vec<f64> =
            candidates.iter().map(|&i| (f64::from(scores[i] - best) * inverse_temperature).exp()).collect();
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
        candidates.last().copied().unwrap_or_else(|| argmax(scores))
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
