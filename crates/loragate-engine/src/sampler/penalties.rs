//! vLLM's penalties, applied to one sequence's scores before temperature:
//! - **repetition** `r`: every token seen in the prompt or in the output so far has its logit divided by `r` if
//!   positive, multiplied by `r` otherwise (so it applies to raw logits, whose sign means something);
//! - **frequency** `f`: `f × count` is subtracted from every token in the output so far;
//! - **presence** `p`: `p` is subtracted from every token in the output so far.
//!
//! A constant shift of all scores changes nothing, so frequency and presence give the same distribution applied
//! to logprobs as to logits; only the repetition penalty needs the logits.

use std::collections::{HashMap, HashSet};

use loragate_core::SamplingParams;

/// One sequence's penalty state.
#[derive(Debug)]
pub(super) struct Penalties {
    repetition: f32,
    presence: f32,
    frequency: f32,
    /// The distinct prompt tokens (kept only for a repetition penalty).
    prompt_tokens: HashSet<u32>,
    /// How often each token occurs in the output so far.
    output_counts: HashMap<u32, u32>,
}

impl Penalties {
    pub(super) fn new(params: &SamplingParams, prompt: &[u32]) -> Self {
        let repetition = params.repetition_penalty();
        let prompt_tokens = if repetition != 1.0 { prompt.iter().copied().collect() } else { HashSet::new() };
        Self {
            repetition,
            presence: params.presence_penalty(),
            frequency: params.frequency_penalty(),
            prompt_tokens,
            output_counts: HashMap::new(),
        }
    }

    /// Whether the scores must be the raw logits.
    pub(super) fn needs_logits(&self) -> bool {
        self.repetition != 1.0
    }

    /// Counts a generated token.
    pub(super) fn record(&mut self, token: u32) {
        *self.output_counts.entry(token).or_insert(0) += 1;
    }

    /// Applies the penalties to `scores` (indexed by token id).
    pub(super) fn apply(&self, scores: &mut [f32]) {
        if self.repetition != 1.0 {
            let seen =
                self.prompt_tokens.iter().chain(self.output_counts.keys().filter(|t| !self.prompt_tokens.contains(t)));
            for &token in seen {
                if let Some(score) = scores.get_mut(token as usize) {
                    *score = if *score > 0.0 { *score / self.repetition } else { *score * self.repetition };
                }
            }
        }
        if self.frequency != 0.0 || self.presence != 0.0 {
            for (&token, &count) in &self.output_counts {
                if let Some(score) = scores.get_mut(token as usize) {
                    *score -= self.frequency * count as f32 + self.presence;
                }
            }
        }
    }
}
