//! What a step costs, as the engine measures it, and how much prompt a step may therefore take.
//!
//! Every step that ran is timed, and its time fitted, by exponentially weighted least squares, to
//! `base + per_decode_row · decode rows + per_prefill_token · prefill tokens` ([`StepCostModel`]). The fit forgets
//! (each step's weight decays by [`StepCostModel::FORGETTING`] per later step, a window of about fifty steps) so that
//! it follows the load on the machine. It starts from a cautious prior (slow prefill, so the first chunks are small)
//! worth a tenth of a step, which is forgotten like a step; a faint permanent pull towards it keeps the fit defined
//! when the recent steps cannot tell the terms apart (all of them decode-only with the same rows): what the steps
//! last said of a term then stands.
//!
//! The planner ([`StepCostModel::prefill_budget`]) then gives a step with decode rows only the prompt tokens that
//! keep its predicted time within the target: [`StepTarget`] times the predicted decode-only step of the batch the
//! queued prompts are bringing in (the decode rows now plus every queued request's sequences, up to the batch's
//! places) — what the other tenants' steps will cost anyway once those requests decode. The rest of the prompts
//! waits for the steps after. A step with no decode rows keeps the whole token budget (nobody waits for it), and
//! every step takes at least a minimum chunk, so prefill always progresses.

use std::fmt;
use std::str::FromStr;

/// How much longer than a decode-only step of the batch a step with prompt chunks may take (`--max-step-slowdown`),
/// in hundredths (150 is 1.5×).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StepTarget {
    percent: u32,
}

impl StepTarget {
    /// The default: a step with prompt chunks may take 1.5× the decode-only step of the batch (measured on the
    /// real model: see `docs/engine.md`).
    pub const DEFAULT: Self = Self { percent: 150 };
    /// The smallest target: a step with prompt chunks needs some time beyond the decode rows'.
    pub const MIN_PERCENT: u32 = 105;

    /// The target as a factor of the decode-only step (1.5 for 150 %).
    pub fn factor(self) -> f64 {
        f64::from(self.percent) / 100.0
    }
}

impl Default for StepTarget {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl fmt::Display for StepTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.factor())
    }
}

impl FromStr for StepTarget {
    type Err = String;

    /// A factor such as `1.5`, at least 1.05, at most 100.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let factor: f64 = text.trim().parse().map_err(|_| format!("`{text}` is not a number such as 1.5"))?;
        let percent = (factor * 100.0).round();
        if !(f64::from(Self::MIN_PERCENT)..=10_000.0).contains(&percent) {
            return Err(format!(
                "{text} is out of range: a step with prompt chunks may take from {}× to 100× a decode-only step",
                f64::from(Self::MIN_PERCENT) / 100.0
            ));
        }
        Ok(Self { percent: percent as u32 })
    }
}

/// What one step ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct StepShape {
    /// Decode rows: one token of each decoding sequence.
    pub(crate) decode_rows: usize,
    /// Prompt tokens of every chunk.
    pub(crate) prefill_tokens: usize,
}

impl StepShape {
    fn features(self) -> [f64; 3] {
        [1.0, self.decode_rows as f64, self.prefill_tokens as f64]
    }
}

/// The fitted cost of a step, in seconds: `base + per_decode_row · rows + per_prefill_token · tokens`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepCost {
    /// What every step costs.
    pub base: f64,
    /// What each decode row adds.
    pub per_decode_row: f64,
    /// What each prompt token adds.
    pub per_prefill_token: f64,
}

impl StepCost {
    /// The predicted seconds of a step of `shape`, never negative.
    pub(crate) fn predict(&self, shape: StepShape) -> f64 {
        let [one, rows, tokens] = shape.features();
        (self.base * one + self.per_decode_row * rows + self.per_prefill_token * tokens).max(0.0)
    }

    fn from_array([base, per_decode_row, per_prefill_token]: [f64; 3]) -> Self {
        Self { base, per_decode_row, per_prefill_token }
    }

    fn to_array(self) -> [f64; 3] {
        [self.base, self.per_decode_row, self.per_prefill_token]
    }
}

/// The online fit of what a step costs (see the module's documentation).
#[derive(Clone, Debug)]
pub(crate) struct StepCostModel {
    /// The exponentially weighted sums `Σ w·x·xᵀ` and `Σ w·x·t` over the steps seen, `x` a step's features.
    weighted_xx: [[f64; 3]; 3],
    weighted_xt: [f64; 3],
    prior: StepCost,
    fitted: StepCost,
    steps: u64,
}

impl StepCostModel {
    /// How much an observation's weight keeps per later step.
    pub(crate) const FORGETTING: f64 = 0.98;
    /// The prior's weight at the start, as steps of evidence (per coefficient, features at their scale), forgotten
    /// like a step's.
    const PRIOR_WEIGHT: f64 = 0.1;
    /// The prior's permanent weight, which only keeps the fit defined.
    const PERMANENT_PRIOR_WEIGHT: f64 = 1e-4;
    /// The scale of each feature in the prior's weight: one step, 16 decode rows, 16 prompt tokens.
    const PRIOR_SCALE: [f64; 3] = [1.0, 16.0 * 16.0, 16.0 * 16.0];
    /// An observation above this many times its prediction is taken at this many times it (a step the machine
    /// interrupted says little about the next one), once the model has seen a few steps.
    const OUTLIER_FACTOR: f64 = 3.0;
    /// Steps seen before outliers are clipped.
    const STEPS_BEFORE_CLIPPING: u64 = 8;

    /// A model that knows nothing yet but `prior`, which should overstate what prompt tokens cost (small first
    /// chunks, until measured).
    pub(crate) fn new(prior: StepCost) -> Self {
        let mut weighted_xx = [[0.0; 3]; 3];
        let mut weighted_xt = [0.0; 3];
        for (i, value) in prior.to_array().into_iter().enumerate() {
            let weight = Self::PRIOR_WEIGHT * Self::PRIOR_SCALE[i];
            weighted_xx[i][i] = weight;
            weighted_xt[i] = weight * value;
        }
        Self { weighted_xx, weighted_xt, prior, fitted: prior, steps: 0 }
    }

    /// A cautious prior for a CPU: 10 ms a step, 2 ms a decode row, 10 ms a prompt token.
    pub(crate) fn cpu_prior() -> StepCost {
        StepCost { base: 0.010, per_decode_row: 0.002, per_prefill_token: 0.010 }
    }

    /// A cautious prior for a GPU: 10 ms a step, 0.1 ms a decode row, 1 ms a prompt token.
    pub(crate) fn gpu_prior() -> StepCost {
        StepCost { base: 0.010, per_decode_row: 0.0001, per_prefill_token: 0.001 }
    }

    /// The current fit.
    pub(crate) fn cost(&self) -> StepCost {
        self.fitted
    }

    /// Steps seen.
    #[cfg(test)]
    pub(crate) fn steps(&self) -> u64 {
        self.steps
    }

    /// Takes in that a step of `shape` took `seconds`, and refits.
    pub(crate) fn observe(&mut self, shape: StepShape, seconds: f64) {
        if !seconds.is_finite() || seconds < 0.0 {
            return;
        }
        let seconds = if self.steps >= Self::STEPS_BEFORE_CLIPPING {
            seconds.min(Self::OUTLIER_FACTOR * self.fitted.predict(shape).max(f64::EPSILON))
        } else {
            seconds
        };
        let x = shape.features();
        for (i, row) in self.weighted_xx.iter_mut().enumerate() {
            for (j, cell) in row.iter_mut().enumerate() {
                *cell = Self::FORGETTING * *cell + x[i] * x[j];
            }
            self.weighted_xt[i] = Self::FORGETTING * self.weighted_xt[i] + x[i] * seconds;
        }
        self.steps += 1;
        self.refit();
    }

    /// Solves `(Σxxᵀ + P) θ = Σxt + P θ₀`: least squares (the start's prior among the sums) with a faint permanent
    /// pull `P` towards the prior `θ₀`.
    fn refit(&mut self) {
        let prior = self.prior.to_array();
        let mut matrix = self.weighted_xx;
        let mut right = self.weighted_xt;
        for i in 0..3 {
            let weight = Self::PERMANENT_PRIOR_WEIGHT * Self::PRIOR_SCALE[i];
            matrix[i][i] += weight;
            right[i] += weight * prior[i];
        }
        if let Some(solution) = solve3(matrix, right) {
            let mut fitted = StepCost::from_array(solution);
            // A step never gets cheaper with more work: a negative slope is noise, and the prior says more.
            fitted.per_decode_row = fitted.per_decode_row.max(0.0);
            fitted.per_prefill_token = fitted.per_prefill_token.max(self.prior.per_prefill_token * 1e-3);
            self.fitted = fitted;
        }
    }

    /// The prompt tokens a step with `decode_rows` may take, out of `token_budget` (what the step's token budget
    /// leaves beside them): all of them when no row decodes; else as many as keep the predicted step within `target`
    /// times the predicted decode-only step of `reference_rows` decode rows (the batch the queued prompts bring in,
    /// at least `decode_rows`); at least `min_tokens` (within the budget) whatever the prediction.
    pub(crate) fn prefill_budget(
        &self,
        target: StepTarget,
        decode_rows: usize,
        reference_rows: usize,
        token_budget: usize,
        min_tokens: usize,
    ) -> usize {
        if decode_rows == 0 {
            return token_budget;
        }
        let cost = self.fitted;
        let decode_only = cost.predict(StepShape { decode_rows, prefill_tokens: 0 });
        let reference = cost.predict(StepShape { decode_rows: reference_rows.max(decode_rows), prefill_tokens: 0 });
        let spare = target.factor() * reference - decode_only;
        let tokens = (spare / cost.per_prefill_token).floor();
        let tokens = if tokens.is_finite() && tokens > 0.0 { tokens.min(token_budget as f64) as usize } else { 0 };
        tokens.max(min_tokens).min(token_budget)
    }
}

/// Keeps the planner from freezing on a price it cannot check. Steps of one shape (the same decode rows, the same
/// chunk) cannot tell a prompt token's cost from the step's base: when every step the planner plans is the minimum
/// chunk, because the fit prices prompt tokens dearly, the fit never sees a step that would show it wrong, and a
/// cautious prior (or a price taken while the machine was loaded) stays for good — the prompts of a burst then
/// crawl in minimum chunks behind the decoding streams. So after [`Self::EVERY`] steps in a row pinned at the
/// minimum, one step takes twice the minimum: a chunk of another size, which the fit needs to measure a prompt
/// token (if prompt tokens really are that dear, the price stands and the probe cost one minimum chunk more).
#[derive(Clone, Debug, Default)]
pub(crate) struct ChunkProbe {
    pinned_steps: u32,
}

impl ChunkProbe {
    /// Steps in a row at the minimum chunk before a probe.
    pub(crate) const EVERY: u32 = 4;

    /// The prompt tokens a step may take: the planner's `planned` allowance, or twice `min_tokens` (within
    /// `token_budget`) when the planner has been pinned at the minimum for [`Self::EVERY`] steps.
    pub(crate) fn allowance(&mut self, planned: usize, min_tokens: usize, token_budget: usize) -> usize {
        if planned > min_tokens || token_budget <= min_tokens {
            self.pinned_steps = 0;
            return planned;
        }
        self.pinned_steps += 1;
        if self.pinned_steps < Self::EVERY {
            return planned;
        }
        self.pinned_steps = 0;
        (2 * min_tokens).min(token_budget)
    }
}

/// Solves the 3×3 system `matrix · x = right` by Gaussian elimination with partial pivoting; `None` if singular.
fn solve3(mut matrix: [[f64; 3]; 3], mut right: [f64; 3]) -> Option<[f64; 3]> {
    for column in 0..3 {
        let pivot = (column..3).max_by(|&a, &b| matrix[a][column].abs().total_cmp(&matrix[b][column].abs()))?;
        if matrix[pivot][column].abs() < 1e-12 {
            return None;
        }
        matrix.swap(column, pivot);
        right.swap(column, pivot);
        for row in column + 1..3 {
            let factor = matrix[row][column] / matrix[column][column];
            let pivot_row = matrix[column];
            for (cell, pivot_value) in matrix[row][column..].iter_mut().zip(&pivot_row[column..]) {
                *cell -= factor * pivot_value;
            }
            right[row] -= factor * right[column];
        }
    }
    let mut x = [0.0; 3];
    for row in (0..3).rev() {
        let tail: f64 = (row + 1..3).map(|k| matrix[row][k] * x[k]).sum();
        x[row] = (right[row] - tail) / matrix[row][row];
    }
    x.iter().all(|value| value.is_finite()).then_some(x)
}

#[cfg(test)]
mod tests;
