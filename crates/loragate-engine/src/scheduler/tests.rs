//! The scheduler driven step by step, without its thread, so batching and cancellation are deterministic.

mod chunked;
mod interleavings;
mod park;
mod planner;
mod preemption;
mod prefix;
mod tenants;

use std::sync::Arc;

use candle_core::{Device, Tensor};
use loragate_core::{AdapterVersion, EngineEvent, FinishReason, RawSampleRequest, TopLogprobs};
use tokio_util::sync::CancellationToken;

use super::outbox::EventReceiver;
use super::*;
use crate::lora::{AdapterWeights, LoraBatch};
use crate::model::ModelConfig;
use crate::test_support::{Collected, greedy, request, tiny_adapter, tiny_config, tiny_model};

type Events = EventReceiver;

struct Harness {
    config: ModelConfig,
    scheduler: Scheduler,
    _commands: Sender<Command>,
}

impl Harness {
    /// A scheduler whose step budget covers every prompt of these tests in one step.
    fn new(config: ModelConfig, max_batch_size: usize) -> Self {
        Self::with_budget(config, max_batch_size, 512)
    }

    fn with_budget(config: ModelConfig, max_batch_size: usize, max_num_batched_tokens: usize) -> Self {
        Self::with_cache(config, max_batch_size, max_num_batched_tokens, 1024, true)
    }

    /// A scheduler over a KV cache of `blocks` blocks, reusing cached prefixes or not.
    fn with_cache(
        config: ModelConfig,
        max_batch_size: usize,
        max_num_batched_tokens: usize,
        blocks: usize,
        prefix_caching: bool,
    ) -> Self {
        let (commands, receiver) = mpsc::channel();
        let limits = StepLimits {
            max_batch_size,
            max_num_batched_tokens,
            step_target: None,
            cost_prior: StepCostModel::cpu_prior(),
        };
        let model = tiny_model(config.clone());
        let cache = model.kv_cache(blocks, prefix_caching).expect("cache");
        let scheduler = Scheduler::new(model, cache, receiver, limits);
        Self { config, scheduler, _commands: commands }
    }

    /// The KV cache's blocks.
    fn pool(&self) -> &crate::model::BlockPool {
        self.scheduler.cache.pool()
    }

    /// Prompt positions computed by prefill chunks so far.
    fn prefilled(&self) -> u64 {
        self.pool().counters().prefilled_tokens.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Runs `raw` alone on `adapter` at `version` under `cache_salt`; returns its output and the prompt positions it
    /// prefilled.
    fn run_keyed(
        &mut self,
        raw: RawSampleRequest,
        adapter: Option<&Arc<AdapterWeights>>,
        version: AdapterVersion,
        cache_salt: Option<&str>,
    ) -> (Collected, u64) {
        let before = self.prefilled();
        let mut events = self.submit_keyed(raw, adapter, version, cache_salt, CancellationToken::new());
        self.run_until_idle();
        (drain(&mut events), self.prefilled() - before)
    }

    fn submit_with(
        &mut self,
        raw: RawSampleRequest,
        adapter: Option<&Arc<AdapterWeights>>,
        cancel: CancellationToken,
    ) -> Events {
        let version = if adapter.is_some() { AdapterVersion(1) } else { AdapterVersion::BASE };
        self.submit_keyed(raw, adapter, version, None, cancel)
    }

    /// Submits `raw` on `adapter` pinned at `version`, under `cache_salt`.
    fn submit_keyed(
        &mut self,
        raw: RawSampleRequest,
        adapter: Option<&Arc<AdapterWeights>>,
        version: AdapterVersion,
        cache_salt: Option<&str>,
        cancel: CancellationToken,
    ) -> Events {
        let (events, receiver) = outbox();
        let request = request(&self.config, RawSampleRequest { cache_salt: cache_salt.map(str::to_owned), ..raw });
        let (park, resume) = (loragate_core::ParkSignal::default(), None);
        let adapter = adapter.cloned();
        let submission = Submission { request, adapter, version, cancel, park, resume, events };
        self.scheduler.pending.push(submission, &self.scheduler.model);
        receiver
    }

    fn submit(&mut self, raw: RawSampleRequest, adapter: Option<&Arc<AdapterWeights>>) -> Events {
        self.submit_with(raw, adapter, CancellationToken::new())
    }

    fn run_until_idle(&mut self) {
        for _ in 0..1000 {
            if self.scheduler.is_idle() {
                return;
            }
            self.scheduler.run_step();
        }
        panic!("the scheduler did not finish its work in 1000 steps");
    }

    /// Runs `raw` alone to its end.
    fn run_alone(&mut self, raw: RawSampleRequest, adapter: Option<&Arc<AdapterWeights>>) -> Collected {
        let mut events = self.submit(raw, adapter);
        self.run_until_idle();
        drain(&mut events)
    }
}

/// Everything received so far.
fn drain(events: &mut Events) -> Collected {
    let mut collected = Collected::default();
    while let Some(event) = events.try_recv() {
        collected.record(event);
    }
    collected
}

fn token_count(collected: &Collected) -> usize {
    collected.sequences.iter().map(|sequence| sequence.token_ids.len()).sum()
}

#[test]
fn a_mixed_adapter_batch_gives_each_sequence_what_it_gets_alone() {
    let config = tiny_config(vec![]);
    let (meow, woof) = (tiny_adapter(&config, 1), tiny_adapter(&config, 2));
    let sampled =
        RawSampleRequest { temperature: 1.0, seed: Some(42), num_samples: 2, ..greedy("meow", &[9, 9, 1], 12) };
    let requests: Vec<(RawSampleRequest, Option<&Arc<AdapterWeights>>)> = vec![
        (greedy("", &[1, 2, 3, 4, 5], 12), None),
        (greedy("meow", &[7, 3, 9, 1, 1, 2, 8, 4, 4], 12), Some(&meow)),
        (greedy("woof", &[5, 6, 7], 9), Some(&woof)),
        (greedy("meow", &[40, 41, 42, 43, 44, 45, 46], 12), Some(&meow)),
        (sampled, Some(&meow)),
    ];
    let mut harness = Harness::new(config, 64);
    let alone: Vec<Collected> =
        requests.iter().map(|(raw, adapter)| harness.run_alone(raw.clone(), *adapter)).collect();

    let mut receivers: Vec<Events> =
        requests.iter().map(|(raw, adapter)| harness.submit(raw.clone(), *adapter)).collect();
    harness.scheduler.run_step();
    assert_eq!(harness.scheduler.batch.len(), 6, "every sequence runs in the same batch");
    harness.run_until_idle();
    for (index, (receiver, alone)) in receivers.iter_mut().zip(&alone).enumerate() {
        let together = drain(receiver);
        assert_eq!(together.sequences.len(), alone.sequences.len());
        for (batched, single) in together.sequences.iter().zip(&alone.sequences) {
            assert_eq!(batched.token_ids, single.token_ids, "request {index}: same tokens");
            assert_eq!(batched.finish, Some(FinishReason::Length));
            for (a, b) in batched.logprobs.iter().zip(&single.logprobs) {
                assert!((a - b).abs() < 1e-4, "request {index}: logprobs {a} vs {b}");
            }
        }
    }
}

#[test]
fn a_cancelled_sequence_ends_within_one_step_with_exactly_the_tokens_it_emitted() {
    let mut harness = Harness::new(tiny_config(vec![]), 64);
    let cancel = CancellationToken::new();
    let mut running = harness.submit_with(greedy("", &[1, 2, 3], 200), None, cancel.clone());
    let mut other = harness.submit(greedy("", &[4, 5], 200), None);
    for _ in 0..4 {
        harness.scheduler.run_step();
    }
    let before = drain(&mut running);
    let emitted = token_count(&before);
    assert_eq!(emitted, 4, "the prefill's token in the first step, then one per step");
    assert!(before.single().finish.is_none());

    cancel.cancel();
    harness.scheduler.run_step();
    let after = drain(&mut running);
    assert_eq!(after.events, vec![EngineEvent::Finished { sequence: 0, reason: FinishReason::Abort }]);
    assert_eq!(harness.scheduler.batch.len(), 1, "the other request runs on");
    assert_eq!(token_count(&drain(&mut other)), 5);
}

#[test]
fn a_request_cancelled_before_it_starts_ends_with_abort_and_no_tokens() {
    let mut harness = Harness::new(tiny_config(vec![]), 64);
    let cancel = CancellationToken::new();
    cancel.cancel();
    let raw = RawSampleRequest { num_samples: 2, ..greedy("", &[1, 2], 10) };
    let mut events = harness.submit_with(raw, None, cancel);
    harness.scheduler.run_step();
    let collected = drain(&mut events);
    assert_eq!(token_count(&collected), 0);
    assert_eq!(
        collected.events,
        (0..2).map(|sequence| EngineEvent::Finished { sequence, reason: FinishReason::Abort }).collect::<Vec<_>>()
    );
    assert!(harness.scheduler.batch.is_empty());
}

#[test]
fn a_dropped_receiver_stops_its_sequences() {
    let mut harness = Harness::new(tiny_config(vec![]), 64);
    let events = harness.submit(greedy("", &[1, 2], 200), None);
    harness.scheduler.run_step();
    assert_eq!(harness.scheduler.batch.len(), 1);
    drop(events);
    harness.scheduler.run_step();
    assert!(harness.scheduler.batch.is_empty());
}

#[test]
fn stop_tokens_eos_ignore_eos_and_max_tokens_end_sequences_as_documented() {
    let prompt = [3, 1, 4, 1, 5];
    let reference = Harness::new(tiny_config(vec![]), 64).run_alone(greedy("", &prompt, 16), None);
    let reference = reference.single().clone();
    assert_eq!((reference.token_ids.len(), reference.finish), (16, Some(FinishReason::Length)));
    let first_at = |token: u32| reference.token_ids.iter().position(|t| *t == token).expect("present") + 1;

    let eos = reference.token_ids[5];
    let mut harness = Harness::new(tiny_config(vec![eos]), 64);
    let stopped = harness.run_alone(RawSampleRequest { ignore_eos: false, ..greedy("", &prompt, 16) }, None);
    let stopped = stopped.single();
    assert_eq!(stopped.finish, Some(FinishReason::Stop));
    assert_eq!(stopped.token_ids, reference.token_ids[..first_at(eos)], "EOS ends the sequence and is included");

    let ignoring = harness.run_alone(greedy("", &prompt, 16), None);
    assert_eq!(ignoring.single(), &reference, "ignore_eos runs on to max_tokens");

    let stop = reference.token_ids[2];
    let raw = RawSampleRequest { stop_token_ids: vec![stop], ..greedy("", &prompt, 16) };
    let stopped = harness.run_alone(raw, None);
    assert_eq!(stopped.single().finish, Some(FinishReason::Stop));
    assert_eq!(stopped.single().token_ids, reference.token_ids[..first_at(stop)], "ignore_eos keeps stop tokens");

    let short = harness.run_alone(greedy("", &prompt, 3), None);
    assert_eq!(short.single().token_ids, reference.token_ids[..3]);
    assert_eq!(short.single().finish, Some(FinishReason::Length));
}

#[test]
fn samples_share_the_prefill_and_sequence_i_draws_with_seed_plus_i() {
    let config = tiny_config(vec![]);
    let mut harness = Harness::new(config, 64);
    let prompt = [10, 20, 30];
    let sampled = |seed, num_samples| RawSampleRequest {
        temperature: 1.0,
        seed: Some(seed),
        num_samples,
        ..greedy("", &prompt, 20)
    };
    let three = harness.run_alone(sampled(100, 3), None);
    assert_eq!(three.sequences.len(), 3);
    for (index, sequence) in three.sequences.iter().enumerate() {
        let alone = harness.run_alone(sampled(100 + index as u64, 1), None);
        assert_eq!(sequence.token_ids, alone.single().token_ids, "sequence {index}");
        assert_eq!(sequence.finish, Some(FinishReason::Length));
    }
    assert_ne!(three.sequences[0].token_ids, three.sequences[1].token_ids);

    let again = harness.run_alone(sampled(100, 1), None);
    assert_eq!(again.single().token_ids, three.sequences[0].token_ids, "the same seed gives the same tokens");
    let other = harness.run_alone(sampled(7, 1), None);
    assert_ne!(other.single().token_ids, again.single().token_ids, "another seed gives other tokens");

    let greedy_samples = harness.run_alone(RawSampleRequest { num_samples: 2, ..greedy("", &prompt, 8) }, None);
    assert_eq!(greedy_samples.sequences[0], greedy_samples.sequences[1]);
}

#[test]
fn prompt_logprobs_come_first_one_per_prompt_token_under_the_raw_distribution() {
    let config = tiny_config(vec![]);
    let mut harness = Harness::new(config.clone(), 64);
    let prompt = [3, 14, 15, 9, 26, 5];
    let raw = RawSampleRequest { include_prompt_logprobs: true, ..greedy("", &prompt, 4) };
    let collected = harness.run_alone(raw, None);
    assert!(matches!(collected.events.first(), Some(EngineEvent::PromptLogprobs(_))));
    let logprobs = collected.prompt_logprobs.expect("prompt logprobs");
    assert_eq!(logprobs.len(), prompt.len());
    assert!(logprobs[0].is_nan());

    let model = tiny_model(config);
    let input = Tensor::from_slice(&prompt, (1, prompt.len()), &Device::Cpu).expect("prompt");
    let hidden = model.forward_sequences(&input, &LoraBatch::base()).expect("forward");
    let all = crate::model::log_softmax(&model.logits(&hidden.squeeze(0).expect("rows")).expect("logits"))
        .expect("log_softmax")
        .to_vec2::<f32>()
        .expect("values");
    for position in 1..prompt.len() {
        let expected = all[position - 1][prompt[position] as usize];
        assert!((logprobs[position] - expected).abs() < 1e-5, "position {position}");
    }
    let without = harness.run_alone(greedy("", &prompt, 4), None);
    assert!(without.prompt_logprobs.is_none());
}

#[test]
fn requests_beyond_the_batch_size_wait_their_turn() {
    let mut harness = Harness::new(tiny_config(vec![]), 2);
    let mut first = harness.submit(greedy("", &[1], 30), None);
    let mut second = harness.submit(greedy("", &[2], 30), None);
    let mut third = harness.submit(greedy("", &[3], 5), None);
    let mut large = harness.submit(RawSampleRequest { num_samples: 3, ..greedy("", &[4], 5) }, None);
    harness.scheduler.run_step();
    assert_eq!((harness.scheduler.batch.len(), harness.scheduler.pending.waiting()), (2, 2));
    harness.run_until_idle();
    for receiver in [&mut first, &mut second, &mut third] {
        assert_eq!(drain(receiver).single().finish, Some(FinishReason::Length));
    }
    assert_eq!(drain(&mut large).sequences.len(), 3, "a request larger than the batch runs alone");
}

#[test]
fn tokens_carry_the_version_pinned_at_submission() {
    let config = tiny_config(vec![]);
    let meow = tiny_adapter(&config, 1);
    let mut harness = Harness::new(config, 64);
    let collected = harness.run_alone(greedy("meow", &[1, 2], 5), Some(&meow));
    assert_eq!(collected.single().versions, vec![1; 5]);
    let base = harness.run_alone(greedy("", &[1, 2], 5), None);
    assert_eq!(base.single().versions, vec![0; 5]);
}

#[test]
fn prompt_alternatives_follow_the_prompt_logprobs_with_ranks_under_the_raw_distribution() {
    let config = tiny_config(vec![]);
    let mut harness = Harness::new(config.clone(), 64);
    let prompt = [3, 14, 15, 9, 26, 5];
    let raw = RawSampleRequest { prompt_top_logprobs: Some(3), top_logprobs: 2, ..greedy("", &prompt, 4) };
    let collected = harness.run_alone(raw, None);
    assert!(matches!(collected.events[1], EngineEvent::PromptTopLogprobs(_)), "right after the prompt logprobs");
    let logprobs = collected.prompt_logprobs.clone().expect("asking for alternatives asks for logprobs");
    let top = collected.prompt_top_logprobs.clone().expect("prompt alternatives");
    assert_eq!(top.len(), prompt.len());
    assert_eq!(top[0], TopLogprobs::default(), "nothing predicts the first prompt token");
    for (position, entry) in top.iter().enumerate().skip(1) {
        assert_eq!(entry.top.len(), 3);
        assert!(entry.top.windows(2).all(|pair| pair[0].1 >= pair[1].1), "most likely first: {entry:?}");
        let own = logprobs[position];
        let above = entry.top.iter().filter(|(_, logprob)| *logprob >= own).count();
        assert!(entry.rank as usize >= above.max(1), "position {position}: {entry:?} vs {own}");
        if entry.rank <= 3 {
            assert!(entry.top.iter().any(|&(token, _)| token == prompt[position]), "a top-3 token is listed");
        }
    }
    let sequence = collected.single();
    assert_eq!(sequence.top_logprobs.len(), sequence.token_ids.len());
    for (token, entry) in sequence.token_ids.iter().zip(&sequence.top_logprobs) {
        assert_eq!((entry.rank, entry.top[0].0), (1, *token), "greedy takes the most likely token");
    }
}

#[test]
fn min_tokens_keeps_a_sequence_past_an_end_of_sequence_token_it_would_sample() {
    let prompt = [7, 7, 2];
    let first = Harness::new(tiny_config(vec![]), 8).run_alone(greedy("", &prompt, 1), None).single().token_ids[0];
    let mut harness = Harness::new(tiny_config(vec![first]), 8);
    let stops = RawSampleRequest { ignore_eos: false, ..greedy("", &prompt, 6) };
    let stopped = harness.run_alone(stops.clone(), None);
    assert_eq!((stopped.single().token_ids.len(), stopped.single().finish), (1, Some(FinishReason::Stop)));
    let held = harness.run_alone(RawSampleRequest { min_tokens: 4, ..stops }, None);
    let tokens = &held.single().token_ids;
    assert!(tokens.len() >= 4 && !tokens[..4].contains(&first), "{tokens:?}");
}

#[test]
fn a_repetition_penalty_in_a_mixed_batch_samples_from_the_penalised_raw_logits() {
    let config = tiny_config(vec![]);
    let prompt = [4, 4, 9, 1];
    let penalty = 3.0;
    let mut harness = Harness::new(config.clone(), 64);
    let mut plain = harness.submit(greedy("", &[5, 6], 12), None);
    let mut penalised =
        harness.submit(RawSampleRequest { repetition_penalty: Some(penalty), ..greedy("", &prompt, 12) }, None);
    harness.run_until_idle();
    assert_eq!(drain(&mut plain).single().token_ids.len(), 12);
    let tokens = drain(&mut penalised).single().token_ids.clone();
    let unpenalised = harness.run_alone(greedy("", &prompt, 12), None).single().token_ids.clone();
    assert_ne!(tokens, unpenalised, "the penalty changes this greedy sequence");

    // The reference: each step recomputed from scratch, the penalty applied by hand to the raw logits.
    let model = tiny_model(config);
    for step in 0..tokens.len() {
        let context: Vec<u32> = prompt.iter().chain(&tokens[..step]).copied().collect();
        let input = Tensor::from_slice(&context, (1, context.len()), &Device::Cpu).expect("context");
        let hidden = model.forward_sequences(&input, &LoraBatch::base()).expect("forward");
        let last = hidden.narrow(1, context.len() - 1, 1).expect("last");
        let mut scores =
            model.logits(&last).expect("logits").flatten_all().expect("flat").to_vec1::<f32>().expect("values");
        for &seen in context.iter().collect::<std::collections::HashSet<_>>() {
            let score = &mut scores[seen as usize];
            *score = if *score > 0.0 { *score / penalty } else { *score * penalty };
        }
        let best = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        assert!(
            scores[tokens[step] as usize] >= best - 1e-4,
            "step {step}: {} is not the penalised argmax",
            tokens[step]
        );
    }
}

/// An adapter of finite values that passes every load check, yet makes attention overflow from the first decode step
/// on: every layer's queries get `c·α` on dimension 0 and keys `c·α` on dimension `head_dim / 2` (`c = 1e25`). At
/// position 0 RoPE is the identity and those dimensions never meet, so a one-token prefill stays finite; from
/// position 1 on, RoPE mixes them and their products (`c² = 1e50`) overflow `f32` into NaN scores.
fn decode_overflowing_adapter(config: &ModelConfig) -> Arc<AdapterWeights> {
    use crate::lora::{LoraPair, LoraTarget};
    let cpu = &Device::Cpu;
    let a = (Tensor::ones((1, config.hidden_size), candle_core::DType::F32, cpu).expect("A") * 0.2).expect("A");
    let factor = |heads: usize, dim: usize| {
        let mut b = vec![0f32; heads * config.head_dim];
        for head in 0..heads {
            b[head * config.head_dim + dim] = 1e25;
        }
        Tensor::from_vec(b, (heads * config.head_dim, 1), cpu).expect("B")
    };
    let (q, k) = (factor(config.num_heads, 0), factor(config.num_kv_heads, config.head_dim / 2));
    let layers = (0..config.num_layers)
        .map(|_| {
            let mut pairs: [Option<LoraPair>; 7] = Default::default();
            pairs[LoraTarget::Q.index()] = Some(LoraPair::new(&a, &q, 1.0).expect("q"));
            pairs[LoraTarget::K.index()] = Some(LoraPair::new(&a, &k, 1.0).expect("k"));
            pairs
        })
        .collect();
    let adapter = AdapterWeights::new(layers);
    for target in [LoraTarget::Q, LoraTarget::K] {
        assert!(adapter.pair(0, target).expect("pair").is_finite().expect("check"), "every value is finite");
    }
    Arc::new(adapter)
}

#[test]
fn a_sequence_whose_logits_turn_non_finite_fails_and_the_rest_of_its_batch_goes_on() {
    let config = tiny_config(vec![]);
    let (meow, hostile) = (tiny_adapter(&config, 1), decode_overflowing_adapter(&config));
    let mut harness = Harness::new(config, 64);
    let base_alone = harness.run_alone(greedy("", &[1, 2, 3], 10), None);
    let meow_alone = harness.run_alone(greedy("meow", &[4, 5], 10), Some(&meow));

    let mut base = harness.submit(greedy("", &[1, 2, 3], 10), None);
    let mut hostile_decode = harness.submit(greedy("hostile", &[7], 10), Some(&hostile));
    let mut hostile_prefill = harness.submit(greedy("hostile", &[7, 8], 10), Some(&hostile));
    let mut meow_events = harness.submit(greedy("meow", &[4, 5], 10), Some(&meow));
    harness.scheduler.run_step();
    assert_eq!(harness.scheduler.batch.len(), 3, "the prefill that overflowed has left; the others decode next");
    harness.scheduler.run_step();
    assert_eq!(harness.scheduler.batch.len(), 2, "base and meow run on; both hostile requests have left");
    harness.run_until_idle();

    // A prompt of two tokens overflows in its prefill chunk: nothing is sampled.
    let prefill = drain(&mut hostile_prefill);
    assert_eq!(token_count(&prefill), 0);
    assert_eq!(prefill.errors.len(), 1, "{prefill:?}");
    assert!(prefill.errors[0].contains("non-finite"), "{prefill:?}");
    // A prompt of one token overflows at the first decode step: the prefill's token, then the error.
    let decode = drain(&mut hostile_decode);
    assert_eq!(decode.single().token_ids.len(), 1, "{decode:?}");
    assert!(decode.single().logprobs[0].is_finite());
    assert_eq!(decode.single().finish, None);
    assert_eq!(decode.errors.len(), 1, "{decode:?}");
    assert!(decode.errors[0].contains("non-finite") && decode.errors[0].contains("after 1 tokens"), "{decode:?}");

    for (events, alone) in [(&mut base, &base_alone), (&mut meow_events, &meow_alone)] {
        let together = drain(events);
        assert_eq!(together.single().token_ids, alone.single().token_ids);
        assert_eq!(together.single().finish, Some(FinishReason::Length));
        for (a, b) in together.single().logprobs.iter().zip(&alone.single().logprobs) {
            assert!((a - b).abs() < 1e-4, "logprobs {a} vs {b}");
        }
    }
}

#[test]
fn a_reader_that_never_reads_holds_a_bounded_outbox_and_never_stalls_the_step_thread() {
    let mut harness = Harness::new(tiny_config(vec![]), 64);
    let raw = RawSampleRequest { num_samples: 3, ..greedy("", &[1, 2], 500) };
    let mut unread = harness.submit(raw, None);
    let mut other = harness.submit(greedy("", &[3], 20), None);
    harness.run_until_idle();
    assert_eq!(unread.queued(), 6, "per sequence one coalesced Tokens event and one Finished, nothing more");
    let collected = drain(&mut unread);
    assert_eq!(collected.sequences.len(), 3);
    for sequence in &collected.sequences {
        assert_eq!((sequence.token_ids.len(), sequence.finish), (500, Some(FinishReason::Length)));
    }
    assert_eq!(drain(&mut other).single().token_ids.len(), 20);
}
