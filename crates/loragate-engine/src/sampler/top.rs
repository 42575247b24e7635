//! The most likely tokens at a position and a token's rank there, as vLLM reports them: the rank counts the tokens
//! at least as likely as the token (so the most likely token ranks 1), and the alternatives are ordered most likely
//! first, the lowest id first on ties.

use loragate_core::TopLogprobs;

/// The `count` most likely tokens of `logprobs` and the rank of `actual` among all of them.
pub(crate) fn top_logprobs(logprobs: &[f32], count: usize, actual: u32) -> TopLogprobs {
    let own = logprobs.get(actual as usize).copied().unwrap_or(f32::NAN);
    let rank = logprobs.iter().filter(|&&logprob| logprob >= own).count();
    let order = |a: &usize, b: &usize| {
        logprobs[*b]
            .partial_cmp(&logprobs[*a])
            .unwrap_or_else(|| logprobs[*a].is_nan().cmp(&logprobs[*b].is_nan()))
            .then(a.cmp(b))
    };
    let mut indices: Vec<usize> = (0..logprobs.len()).collect();
    let count = count.min(indices.len());
    if count > 0 && count < indices.len() {
        indices.select_nth_unstable_by(count - 1, order);
    }
    indices.truncate(count);
    indices.sort_unstable_by(order);
    let top = indices.into_iter().map(|index| (index as u32, logprobs[index])).collect();
    TopLogprobs { rank: u32::try_from(rank).unwrap_or(u32::MAX), top }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_most_likely_come_first_and_the_rank_counts_ties() {
        let logprobs = [-3.0, -0.5, -2.0, -0.5, f32::NAN, -1.0];
        let top = top_logprobs(&logprobs, 3, 2);
        assert_eq!(top.top, vec![(1, -0.5), (3, -0.5), (5, -1.0)], "lowest id first on ties; NaN never ranks");
        assert_eq!(top.rank, 4);
        assert_eq!(top_logprobs(&logprobs, 0, 1), TopLogprobs { rank: 2, top: Vec::new() }, "a tie shares the rank");
        assert_eq!(top_logprobs(&logprobs, 10, 0).top.len(), 6, "at most the vocabulary");
    }
}
