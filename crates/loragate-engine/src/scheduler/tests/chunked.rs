//! Prompts prefilled chunk by chunk under a small step budget give what a whole-prompt prefill gives, never stall the
//! decoding sequences, and still honour cancellation, `num_samples` and the isolation of a hostile adapter.

use super::*;

/// A request asking for everything a prefill produces: prompt logprobs with alternatives, and per-token alternatives.
fn detailed(lora: &str, prompt: &[u32], max_tokens: u32) -> RawSampleRequest {
    RawSampleRequest { prompt_top_logprobs: Some(3), top_logprobs: 2, ..greedy(lora, prompt, max_tokens) }
}

fn close(a: &[f32], b: &[f32], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    for (index, (a, b)) in a.iter().zip(b).enumerate() {
        assert!((a.is_nan() && b.is_nan()) || (a - b).abs() < 1e-4, "{what}[{index}]: {a} vs {b}");
    }
}

#[test]
fn chunked_prefill_equals_whole_prefill_in_tokens_logprobs_and_prompt_logprobs() {
    let config = tiny_config(vec![]);
    let meow = tiny_adapter(&config, 1);
    let prompt: Vec<u32> = (0..37).map(|i| (i * 7 + 3) % 64).collect();
    let whole = Harness::new(config.clone(), 4).run_alone(detailed("meow", &prompt, 8), Some(&meow));
    let whole_prompt = whole.prompt_logprobs.clone().expect("prompt logprobs");

    // The reference of the reference: the prompt's logprobs recomputed from scratch, without any cache.
    let model = tiny_model(config.clone());
    let input = Tensor::from_slice(&prompt, (1, prompt.len()), &Device::Cpu).expect("prompt");
    let lora = LoraBatch::uniform(Some(&meow)).expect("lora");
    let hidden = model.forward_sequences(&input, &lora).expect("forward").squeeze(0).expect("rows");
    let all = crate::model::log_softmax(&model.logits(&hidden).expect("logits")).expect("log_softmax");
    let all = all.to_vec2::<f32>().expect("values");
    for position in 1..prompt.len() {
        assert!((whole_prompt[position] - all[position - 1][prompt[position] as usize]).abs() < 1e-4);
    }
    let first = whole.single().token_ids[0] as usize;
    assert!((whole.single().logprobs[0] - all[prompt.len() - 1][first]).abs() < 1e-4, "the first token's logprob");

    for budget in [2, 5, 16, 36] {
        let mut harness = Harness::with_budget(config.clone(), 1, budget);
        let chunked = harness.run_alone(detailed("meow", &prompt, 8), Some(&meow));
        let chunks: Vec<usize> = harness.scheduler.trace.iter().flat_map(|step| &step.chunks).map(|c| c.3).collect();
        assert_eq!(chunks.len(), prompt.len().div_ceil(budget), "budget {budget}: chunks {chunks:?}");
        assert_eq!(chunks.iter().sum::<usize>(), prompt.len());
        assert_eq!(chunked.single().token_ids, whole.single().token_ids, "budget {budget}: greedy tokens");
        close(&chunked.single().logprobs, &whole.single().logprobs, "token logprobs");
        close(chunked.prompt_logprobs.as_deref().expect("prompt logprobs"), &whole_prompt, "prompt logprobs");
        let ranks = |collected: &Collected| -> Vec<(u32, Vec<u32>)> {
            let top = collected.prompt_top_logprobs.as_ref().expect("prompt alternatives");
            top.iter().map(|entry| (entry.rank, entry.top.iter().map(|(token, _)| *token).collect())).collect()
        };
        assert_eq!(ranks(&chunked), ranks(&whole), "budget {budget}: prompt alternatives");
        assert!(matches!(chunked.events[0], EngineEvent::PromptLogprobs(_)), "prompt logprobs come first");
    }
}

#[test]
fn a_long_prompt_is_prefilled_over_many_steps_while_every_stream_decodes_each_step() {
    let config = tiny_config(vec![]);
    let mut harness = Harness::with_budget(config, 4, 16);
    let mut streams: Vec<Events> = (0..3).map(|i| harness.submit(greedy("", &[i + 1, 2], 200), None)).collect();
    harness.scheduler.run_step();
    assert_eq!(harness.scheduler.batch.len(), 3);
    let long: Vec<u32> = (0..300).map(|i| i % 64).collect();
    let mut prompt = harness.submit(greedy("", &long, 4), None);
    let before = harness.scheduler.trace.len();
    let mut steps = 0;
    while token_count(&drain(&mut prompt)) == 0 {
        for stream in &mut streams {
            drain(stream);
        }
        harness.scheduler.run_step();
        steps += 1;
        for (index, stream) in streams.iter_mut().enumerate() {
            assert_eq!(token_count(&drain(stream)), 1, "step {steps}: stream {index} advanced by one token");
        }
        assert!(steps < 100, "the prompt never finished");
    }
    assert_eq!(steps, 300usize.div_ceil(13), "13 prompt tokens per step beside 3 decode rows");
    for step in &harness.scheduler.trace[before..] {
        let tokens: usize = step.chunks.iter().map(|chunk| chunk.3).sum();
        assert!(step.decode.len() + tokens <= 16, "the budget holds: {step:?}");
    }
}

#[test]
fn a_request_cancelled_in_the_middle_of_its_prefill_ends_within_one_step() {
    let config = tiny_config(vec![]);
    let mut harness = Harness::with_budget(config, 8, 20);
    let mut other = harness.submit(greedy("", &[5, 6, 7], 50), None);
    let cancel = CancellationToken::new();
    let long: Vec<u32> = (0..200).map(|i| (i * 3) % 64).collect();
    let raw = RawSampleRequest { num_samples: 2, ..greedy("", &long, 10) };
    let mut cancelled = harness.submit_with(raw, None, cancel.clone());
    for _ in 0..3 {
        harness.scheduler.run_step();
    }
    let prefilling = harness.scheduler.pending.prefilling();
    assert_eq!(prefilling.len(), 1, "{prefilling:?}");
    assert!(prefilling[0].2 > 0 && prefilling[0].2 < 200, "in the middle of its prefill: {prefilling:?}");
    cancel.cancel();
    harness.scheduler.run_step();
    let collected = drain(&mut cancelled);
    assert_eq!(token_count(&collected), 0);
    assert_eq!(
        collected.events,
        (0..2).map(|sequence| EngineEvent::Finished { sequence, reason: FinishReason::Abort }).collect::<Vec<_>>()
    );
    assert!(harness.scheduler.pending.is_empty(), "its cache and places are released");
    assert_eq!(harness.scheduler.batch.len(), 1, "the other request decodes on");
    harness.run_until_idle();
    assert_eq!(drain(&mut other).single().token_ids.len(), 50);
}

#[test]
fn samples_of_a_chunked_prompt_share_its_prefill_and_draw_as_they_do_alone() {
    let config = tiny_config(vec![]);
    let prompt: Vec<u32> = (0..50).map(|i| (i * 5 + 1) % 64).collect();
    let sampled = |seed, num_samples| RawSampleRequest {
        temperature: 1.0,
        seed: Some(seed),
        num_samples,
        ..greedy("", &prompt, 12)
    };
    let mut chunked = Harness::with_budget(config.clone(), 4, 7);
    let three = chunked.run_alone(sampled(100, 3), None);
    assert_eq!(three.sequences.len(), 3);
    let prefilled: usize = chunked.scheduler.trace.iter().flat_map(|step| &step.chunks).map(|chunk| chunk.3).sum();
    assert_eq!(prefilled, prompt.len(), "one prefill for the three sequences");
    let mut whole = Harness::new(config, 4);
    for (index, sequence) in three.sequences.iter().enumerate() {
        let alone = whole.run_alone(sampled(100 + index as u64, 1), None);
        assert_eq!(sequence.token_ids, alone.single().token_ids, "sequence {index}");
        close(&sequence.logprobs, &alone.single().logprobs, "logprobs");
    }
}

#[test]
fn a_hostile_adapters_chunk_fails_only_its_request() {
    let config = tiny_config(vec![]);
    let (meow, hostile) = (tiny_adapter(&config, 1), decode_overflowing_adapter(&config));
    let meow_prompt: Vec<u32> = (0..30).map(|i| (i * 11) % 64).collect();
    let base_alone = Harness::new(config.clone(), 8).run_alone(greedy("", &[1, 2, 3], 12), None);
    let meow_alone = Harness::new(config.clone(), 8).run_alone(greedy("meow", &meow_prompt, 6), Some(&meow));

    let mut harness = Harness::with_budget(config, 8, 40);
    let mut base = harness.submit(greedy("", &[1, 2, 3], 12), None);
    harness.scheduler.run_step();
    let hostile_prompt: Vec<u32> = (0..60).map(|i| (i * 13) % 64).collect();
    let mut failed = harness.submit(greedy("hostile", &hostile_prompt, 6), Some(&hostile));
    let mut meow_events = harness.submit(greedy("meow", &meow_prompt, 6), Some(&meow));
    harness.scheduler.run_step();
    let step = harness.scheduler.trace.last().expect("a step").clone();
    assert_eq!(step.decode.len(), 1);
    assert_eq!(step.chunks.len(), 2, "the hostile chunk ran in the same pass as meow's and the decode row: {step:?}");
    let failure = drain(&mut failed);
    assert_eq!(token_count(&failure), 0);
    assert_eq!(failure.errors.len(), 1, "{failure:?}");
    assert!(
        failure.errors[0].contains("non-finite") && failure.errors[0].contains("prompt positions 0.."),
        "{failure:?}"
    );
    assert!(harness.scheduler.pending.prefilling().iter().all(|prefill| prefill.1 != failing_key()));
    harness.run_until_idle();
    for (events, alone) in [(&mut base, &base_alone), (&mut meow_events, &meow_alone)] {
        let together = drain(events);
        assert_eq!(together.single().token_ids, alone.single().token_ids);
        close(&together.single().logprobs, &alone.single().logprobs, "logprobs");
    }
}

fn failing_key() -> loragate_core::AdapterKey {
    loragate_core::AdapterKey::parse("hostile").expect("key")
}
