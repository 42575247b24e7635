//! The step planner on a simulated machine (the steps' times come from a fixed cost, not the clock): a long prompt
//! arriving beside decoding streams is spread over steps that stay within the target, progresses every step, and
//! takes the whole budget when nothing decodes.

use super::step::StepClock;
use super::*;

/// A machine whose steps cost 10 ms, 1 ms a decode row and 0.5 ms a prompt token.
const MACHINE: StepCost = StepCost { base: 0.010, per_decode_row: 0.001, per_prefill_token: 0.0005 };

fn planned(max_batch_size: usize, max_num_batched_tokens: usize, target: &str) -> Harness {
    let mut harness = Harness::with_budget(tiny_config(vec![]), max_batch_size, max_num_batched_tokens);
    harness.scheduler.limits.step_target = Some(target.parse().expect("a target"));
    harness.scheduler.clock = StepClock::Simulated(MACHINE);
    harness
}

fn seconds(shape: (usize, usize)) -> f64 {
    MACHINE.predict(cost::StepShape { decode_rows: shape.0, prefill_tokens: shape.1 })
}

/// The (decode rows, prompt tokens) of each step traced from `from` on.
fn shapes(harness: &Harness, from: usize) -> Vec<(usize, usize)> {
    harness.scheduler.trace[from..]
        .iter()
        .map(|step| (step.decode.len(), step.chunks.iter().map(|chunk| chunk.3).sum()))
        .collect()
}

#[test]
fn a_long_prompt_beside_decoding_streams_keeps_their_steps_within_the_target() {
    let mut harness = planned(16, 512, "1.5");
    let mut streams: Vec<Events> = (0..8).map(|i| harness.submit(greedy("", &[i + 1, 2, 3], 400), None)).collect();
    // Decode a while, with short prompts now and then, so the model has seen both kinds of step.
    for step in 0..60u32 {
        if step % 6 == 3 {
            let short: Vec<u32> = (0..(20 + step)).map(|i| i % 64).collect();
            streams.push(harness.submit(greedy("", &short, 1), None));
        }
        harness.scheduler.run_step();
    }
    let fitted = harness.scheduler.cost.cost();
    let decode_only = fitted.predict(cost::StepShape { decode_rows: 8, prefill_tokens: 0 });
    assert!((decode_only - seconds((8, 0))).abs() < 0.05 * seconds((8, 0)), "{fitted:?}");

    let long: Vec<u32> = (0..600).map(|i| (i * 5 + 1) % 64).collect();
    let mut prompt = harness.submit(greedy("", &long, 2), None);
    let from = harness.scheduler.trace.len();
    let mut steps = 0;
    while token_count(&drain(&mut prompt)) == 0 {
        harness.scheduler.run_step();
        steps += 1;
        assert!(steps < 200, "the prompt never finished");
    }
    let shapes = shapes(&harness, from);
    // 8 decode rows; the long prompt brings one more: the target is 1.5 × the decode-only step of 9 rows.
    let limit = 1.5 * seconds((9, 0));
    for (index, &(rows, tokens)) in shapes.iter().enumerate() {
        assert_eq!(rows, 8, "step {index}: every stream decodes");
        assert!(tokens >= 16 || index + 1 == shapes.len(), "step {index}: the prompt progresses ({tokens} tokens)");
        // Its first steps refine the fit of what a prompt token costs.
        if index >= 2 {
            assert!(seconds((rows, tokens)) <= limit * 1.02, "step {index}: {tokens} tokens cost more than the target");
        }
    }
    let largest = shapes.iter().map(|shape| shape.1).max().unwrap_or(0);
    assert!(largest < 511 - 8, "chunks smaller than the token budget: {largest}");
    assert!(largest >= 19, "the chunks use the target: {largest} tokens (10.5 ms of spare per step fit 21)");
}

#[test]
fn with_nothing_decoding_a_prompt_takes_the_whole_budget() {
    let mut harness = planned(4, 64, "1.5");
    let long: Vec<u32> = (0..200).map(|i| i % 64).collect();
    let mut prompt = harness.submit(greedy("", &long, 1), None);
    while token_count(&drain(&mut prompt)) == 0 {
        harness.scheduler.run_step();
    }
    let chunks: Vec<usize> = shapes(&harness, 0).into_iter().map(|shape| shape.1).collect();
    assert_eq!(chunks, vec![64, 64, 64, 8]);
}

#[test]
fn off_keeps_the_whole_token_budget_beside_decode_rows() {
    let mut harness = Harness::with_budget(tiny_config(vec![]), 8, 64);
    harness.scheduler.clock = StepClock::Simulated(MACHINE);
    let _streams: Vec<Events> = (0..4).map(|i| harness.submit(greedy("", &[i + 1, 2], 100), None)).collect();
    harness.scheduler.run_step();
    let long: Vec<u32> = (0..200).map(|i| i % 64).collect();
    let _prompt = harness.submit(greedy("", &long, 1), None);
    let from = harness.scheduler.trace.len();
    harness.scheduler.run_step();
    assert_eq!(shapes(&harness, from), vec![(4, 60)]);
}

#[test]
fn steps_of_one_shape_do_not_freeze_an_overpriced_prompt_token() {
    // Prompt tokens cost 0.5 ms on this machine; the CPU prior says 10 ms. Four streams decode while four long
    // prompts queue behind them for hundreds of steps, so after the first steps every step has the same decode rows
    // and, as long as the planner believes the prior, the same minimum chunk: steps of one shape cannot tell a
    // prompt token's cost from the step's base, and what the streams' decode-only steps said is forgotten.
    let mut harness = planned(16, 512, "1.5");
    let _streams: Vec<Events> = (0..4).map(|i| harness.submit(greedy("", &[i + 1, 2, 3], 2500), None)).collect();
    harness.scheduler.run_step();
    let _prompts: Vec<Events> = (0..4u32)
        .map(|prompt| {
            let long: Vec<u32> = (0..1000).map(|i| (i * 7 + prompt) % 64).collect();
            harness.submit(greedy("", &long, 2000), None)
        })
        .collect();
    let from = harness.scheduler.trace.len();
    for _ in 0..300 {
        harness.scheduler.run_step();
    }
    let fitted = harness.scheduler.cost.cost();
    let truth = MACHINE.per_prefill_token;
    assert!((fitted.per_prefill_token - truth).abs() <= 0.25 * truth, "a prompt token's cost is learned: {fitted:?}");
    // Learned, it gives the prompts the room the target leaves (1.5 × the step of the 8 rows they bring, less the
    // step of the rows decoding now): in the second half of the steps that took chunks, mostly more than the minimum.
    let chunks: Vec<usize> =
        shapes(&harness, from).into_iter().map(|shape| shape.1).filter(|&tokens| tokens > 0).collect();
    let mut late = chunks[chunks.len() / 2..].to_vec();
    late.sort_unstable();
    assert!(late[late.len() / 2] > 16, "the chunks outgrow the minimum: {chunks:?}");
}
