use loragate_core::{ModelInfo, RawSampleRequest, SampleRequest};

use super::*;

fn params_of(raw: RawSampleRequest) -> SamplingParams {
    let model = ModelInfo { vocab_size: 8, context_length: 64, eos_token_ids: vec![] };
    SampleRequest::parse(RawSampleRequest { prompt_token_ids: vec![1], ..raw }, &model).expect("valid").params().clone()
}

fn params(temperature: f32, top_k: i32, top_p: Option<f32>, seed: Option<u64>) -> SamplingParams {
    params_of(RawSampleRequest { temperature, top_k, top_p, seed, ..Default::default() })
}

fn logprobs(weights: &[f32]) -> Vec<f32> {
    let total: f32 = weights.iter().sum();
    weights.iter().map(|w| (w / total).ln()).collect()
}

fn sampler(params: &SamplingParams) -> Sampler {
    Sampler::new(params, 0, &[1], &[])
}

#[test]
fn greedy_takes_the_most_likely_token_and_reports_its_raw_logprob() {
    let lp = logprobs(&[1.0, 5.0, 3.0, 5.0]);
    let sampled = sampler(&params(0.0, 0, None, None)).sample(&lp, None);
    assert_eq!(sampled, Sampled { token: 1, logprob: lp[1], top: None });
}

#[test]
fn top_k_and_top_p_restrict_the_candidates() {
    let lp = logprobs(&[1.0, 10.0, 6.0, 3.0, 0.5]);
    let mut top_k = sampler(&params(1.0, 2, None, Some(1)));
    let mut top_p = sampler(&params(1.0, 0, Some(0.4), Some(1)));
    for _ in 0..200 {
        assert!(matches!(top_k.sample(&lp, None).token, 1 | 2));
        assert_eq!(top_p.sample(&lp, None).token, 1, "token 1 alone holds 10/20.5 ≥ 0.4 of the mass");
    }
}

#[test]
fn a_top_k_beyond_the_vocabulary_is_no_limit() {
    let lp = logprobs(&[1.0; 8]);
    let mut unlimited = sampler(&params_of(RawSampleRequest {
        temperature: 1.0,
        top_k: 100_000_000,
        seed: Some(2),
        ..Default::default()
    }));
    let drawn: std::collections::HashSet<u32> = (0..400).map(|_| unlimited.sample(&lp, None).token).collect();
    assert_eq!(drawn.len(), 8, "AReaL's top_k 100000000 keeps every token");
}

#[test]
fn seeds_fix_the_draws_and_sequences_get_their_own_stream() {
    let lp = logprobs(&[1.0; 8]);
    let draw = |seed, sequence| {
        let mut sampler = Sampler::new(&params(1.0, 0, None, Some(seed)), sequence, &[1], &[]);
        (0..32).map(|_| sampler.sample(&lp, None).token).collect::<Vec<_>>()
    };
    assert_eq!(draw(7, 0), draw(7, 0));
    assert_eq!(draw(7, 1), draw(8, 0), "sequence i of seed s draws like seed s + i");
    assert_ne!(draw(7, 0), draw(7, 1));
}

#[test]
fn low_temperature_concentrates_the_mass() {
    let lp = logprobs(&[1.0, 2.0, 1.0, 1.0]);
    let mut cold = sampler(&params(0.05, 0, None, Some(3)));
    assert!((0..100).all(|_| cold.sample(&lp, None).token == 1));
    let mut warm = sampler(&params(1.0, 0, None, Some(3)));
    assert!((0..100).any(|_| warm.sample(&lp, None).token != 1));
}

#[test]
fn min_p_drops_tokens_far_less_likely_than_the_best_after_temperature() {
    // Probabilities 0.5, 0.3, 0.15, 0.05: min_p 0.2 keeps tokens with p >= 0.1 at temperature 1.
    let lp = logprobs(&[0.5, 0.3, 0.15, 0.05]);
    let mut strict =
        sampler(&params_of(RawSampleRequest { temperature: 1.0, min_p: 0.2, seed: Some(4), ..Default::default() }));
    let drawn: std::collections::HashSet<u32> = (0..600).map(|_| strict.sample(&lp, None).token).collect();
    assert_eq!(drawn, [0, 1, 2].into_iter().collect(), "0.05 < 0.2 × 0.5 is never drawn");
    // At temperature 2 the distribution flattens: 0.05 becomes sqrt-weighted and passes the same threshold.
    let mut hot =
        sampler(&params_of(RawSampleRequest { temperature: 2.0, min_p: 0.2, seed: Some(4), ..Default::default() }));
    assert!((0..600).any(|_| hot.sample(&lp, None).token == 3), "min_p applies after temperature");
}

#[test]
fn min_tokens_holds_back_the_stop_tokens_until_enough_were_generated() {
    let lp = logprobs(&[1.0, 1.0, 8.0, 1.0]);
    let params = params_of(RawSampleRequest { min_tokens: 2, max_tokens: Some(5), ..Default::default() });
    let mut sampler = Sampler::new(&params, 0, &[1], &[2]);
    let first = sampler.sample(&lp, None);
    assert_eq!((first.token, first.logprob), (0, lp[0]), "the stop token is masked; the logprob stays raw");
    assert_eq!(sampler.sample(&lp, None).token, 0);
    assert_eq!(sampler.sample(&lp, None).token, 2, "from the third token on the stop token may come");
}

#[test]
fn frequency_and_presence_penalties_push_away_from_the_output_so_far() {
    // Two equally likely tokens; greedy takes the lowest id until penalised.
    let lp = logprobs(&[1.0, 1.0, 0.2]);
    let frequency = params_of(RawSampleRequest { frequency_penalty: 0.5, ..Default::default() });
    let mut sampler = Sampler::new(&frequency, 0, &[1], &[]);
    let tokens: Vec<u32> = (0..4).map(|_| sampler.sample(&lp, None).token).collect();
    assert_eq!(tokens, vec![0, 1, 0, 1], "each occurrence costs 0.5, so the two alternate");
    let sampled = Sampler::new(&frequency, 0, &[1], &[]).sample(&lp, None);
    assert_eq!(sampled.logprob, lp[0], "the reported logprob is raw");

    let presence = params_of(RawSampleRequest { presence_penalty: 2.0, ..Default::default() });
    let mut sampler = Sampler::new(&presence, 0, &[1], &[]);
    let tokens: Vec<u32> = (0..3).map(|_| sampler.sample(&lp, None).token).collect();
    assert_eq!(tokens, vec![0, 1, 2], "once present, a token is penalised by 2 whatever its count");
}

#[test]
fn the_repetition_penalty_works_on_logit_signs_over_prompt_and_output() {
    let params = params_of(RawSampleRequest { repetition_penalty: Some(2.0), ..Default::default() });
    assert!(Sampler::needs_logits_for(&params));
    // Logits 3 (prompt token 1), 2, -1 (prompt), 1.8: token 1 → 1.5 loses to token 2; after 2 is output it falls
    // to 1.0 and token 3's 1.8 wins.
    let logits = [-1.0, 3.0, 2.0, 1.8];
    let lp: Vec<f32> = {
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let sum: f32 = logits.iter().map(|l| (l - max).exp()).sum();
        logits.iter().map(|l| l - max - sum.ln()).collect()
    };
    let mut sampler = Sampler::new(&params, 0, &[1, 0], &[]);
    assert!(sampler.needs_logits());
    assert_eq!(sampler.sample(&lp, Some(&logits)).token, 2);
    let second = sampler.sample(&lp, Some(&logits));
    assert_eq!((second.token, second.logprob), (3, lp[3]));
    let plain = params_of(RawSampleRequest { frequency_penalty: 0.1, ..Default::default() });
    assert!(!Sampler::needs_logits_for(&plain) && !Sampler::new(&plain, 0, &[1], &[]).needs_logits());
}

#[test]
fn alternatives_come_from_the_raw_distribution_with_the_sampled_tokens_rank() {
    let lp = logprobs(&[1.0, 6.0, 3.0, 2.0]);
    let params =
        params_of(RawSampleRequest { top_logprobs: 2, min_tokens: 1, max_tokens: Some(4), ..Default::default() });
    let sampled = Sampler::new(&params, 0, &[1], &[1]).sample(&lp, None);
    assert_eq!(sampled.token, 2, "the masked stop token is not sampled");
    assert_eq!(sampled.top, Some(TopLogprobs { rank: 2, top: vec![(1, lp[1]), (2, lp[2])] }), "but it is reported");
}
