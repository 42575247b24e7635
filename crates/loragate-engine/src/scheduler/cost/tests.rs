//! The cost model fitted to synthetic step times (the clock is the test's: nothing here is timed).

use super::*;

/// A machine whose steps cost exactly `cost`.
fn exact(cost: StepCost) -> impl Fn(StepShape) -> f64 {
    move |shape| cost.predict(shape)
}

/// Step shapes as a scheduler makes them: decode-only stretches and steps with chunks of varied sizes, from a fixed
/// pseudo-random sequence.
fn shapes(count: usize, seed: u64) -> Vec<StepShape> {
    let mut state = seed;
    let mut next = move |bound: u64| {
        state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        ((state >> 33) % bound) as usize
    };
    (0..count)
        .map(|_| {
            let decode_rows = 1 + next(40);
            let prefill_tokens = if next(3) == 0 { 0 } else { 16 + next(112) };
            StepShape { decode_rows, prefill_tokens }
        })
        .collect()
}

fn close(actual: f64, expected: f64, tolerance: f64) -> bool {
    (actual - expected).abs() <= tolerance * expected.abs()
}

const MACHINE: StepCost = StepCost { base: 0.012, per_decode_row: 0.003, per_prefill_token: 0.0011 };

#[test]
fn fits_exact_timings() {
    let mut model = StepCostModel::new(StepCostModel::cpu_prior());
    let machine = exact(MACHINE);
    for shape in shapes(300, 7) {
        model.observe(shape, machine(shape));
    }
    let cost = model.cost();
    assert!(close(cost.base, MACHINE.base, 0.02), "base {cost:?}");
    assert!(close(cost.per_decode_row, MACHINE.per_decode_row, 0.02), "per row {cost:?}");
    assert!(close(cost.per_prefill_token, MACHINE.per_prefill_token, 0.02), "per token {cost:?}");
    assert_eq!(model.steps(), 300);
}

#[test]
fn fits_noisy_timings() {
    let mut model = StepCostModel::new(StepCostModel::cpu_prior());
    let machine = exact(MACHINE);
    for (index, shape) in shapes(400, 11).into_iter().enumerate() {
        // ±10 % noise, in a fixed pattern, and now and then a step the machine interrupted (10× its cost).
        let noise = 1.0 + 0.1 * ((index * 7919 % 21) as f64 - 10.0) / 10.0;
        let interrupted = if index % 97 == 50 { 10.0 } else { 1.0 };
        model.observe(shape, machine(shape) * noise * interrupted);
    }
    let cost = model.cost();
    for shape in [StepShape { decode_rows: 33, prefill_tokens: 0 }, StepShape { decode_rows: 1, prefill_tokens: 100 }] {
        assert!(close(cost.predict(shape), MACHINE.predict(shape), 0.15), "{shape:?}: {cost:?}");
    }
}

#[test]
fn follows_a_machine_that_slows_down() {
    let mut model = StepCostModel::new(StepCostModel::cpu_prior());
    let slower = StepCost { base: 0.024, per_decode_row: 0.006, per_prefill_token: 0.0022 };
    for shape in shapes(200, 3) {
        model.observe(shape, MACHINE.predict(shape));
    }
    for shape in shapes(300, 5) {
        model.observe(shape, slower.predict(shape));
    }
    let shape = StepShape { decode_rows: 20, prefill_tokens: 64 };
    assert!(close(model.cost().predict(shape), slower.predict(shape), 0.05), "{:?}", model.cost());
}

#[test]
fn starts_from_the_prior_and_small_chunks() {
    let model = StepCostModel::new(StepCostModel::cpu_prior());
    assert_eq!(model.cost(), StepCostModel::cpu_prior());
    // Prefill priced at 10 ms a token: beside one decode row only the minimum chunk fits.
    assert_eq!(model.prefill_budget(StepTarget::DEFAULT, 1, 1, 127, 16), 16);
}

#[test]
fn a_planned_step_stays_within_its_target() {
    let mut model = StepCostModel::new(StepCostModel::cpu_prior());
    for shape in shapes(300, 13) {
        model.observe(shape, MACHINE.predict(shape));
    }
    for target in ["1.05", "1.25", "1.5", "2", "4"] {
        let target: StepTarget = target.parse().expect("a target");
        for decode_rows in [1, 2, 8, 16, 33, 64] {
            for reference_rows in [decode_rows, decode_rows + 1, decode_rows + 32] {
                let budget = 512 - decode_rows;
                let tokens = model.prefill_budget(target, decode_rows, reference_rows, budget, 16);
                let step = MACHINE.predict(StepShape { decode_rows, prefill_tokens: tokens });
                let limit =
                    target.factor() * MACHINE.predict(StepShape { decode_rows: reference_rows, prefill_tokens: 0 });
                assert!(tokens <= budget, "within the token budget");
                if tokens > 16 {
                    assert!(
                        step <= limit * 1.01,
                        "{target} {decode_rows}/{reference_rows}: {tokens} tokens, {step} s > {limit} s"
                    );
                }
                // And it does not leave more than a token's worth of the target unused, unless the budget is spent.
                if tokens < budget {
                    let one_more = MACHINE.predict(StepShape { decode_rows, prefill_tokens: tokens + 2 });
                    assert!(
                        tokens == 16 || one_more > limit * 0.99,
                        "{target} {decode_rows}/{reference_rows}: only {tokens}"
                    );
                }
            }
        }
    }
}

#[test]
fn a_larger_incoming_batch_allows_larger_chunks() {
    let mut model = StepCostModel::new(StepCostModel::cpu_prior());
    for shape in shapes(300, 17) {
        model.observe(shape, MACHINE.predict(shape));
    }
    let alone = model.prefill_budget(StepTarget::DEFAULT, 1, 1, 4096, 16);
    let incoming = model.prefill_budget(StepTarget::DEFAULT, 1, 33, 4096, 16);
    assert!(incoming > alone, "the step may cost what the batch of 33 will: {incoming} against {alone}");
}

#[test]
fn no_decode_rows_take_the_whole_budget() {
    let model = StepCostModel::new(StepCostModel::cpu_prior());
    assert_eq!(model.prefill_budget(StepTarget::DEFAULT, 0, 32, 128, 16), 128);
    assert_eq!(model.prefill_budget(StepTarget::DEFAULT, 0, 0, 7, 16), 7);
}

#[test]
fn prefill_always_progresses() {
    let mut model = StepCostModel::new(StepCostModel::cpu_prior());
    // Prompt tokens so dear that no chunk fits the target: the minimum still runs, within the budget.
    let dear = StepCost { base: 0.010, per_decode_row: 0.001, per_prefill_token: 1.0 };
    for shape in shapes(100, 19) {
        model.observe(shape, dear.predict(shape));
    }
    assert_eq!(model.prefill_budget(StepTarget::DEFAULT, 8, 8, 120, 16), 16);
    assert_eq!(model.prefill_budget(StepTarget::DEFAULT, 8, 8, 5, 16), 5, "never beyond the budget");
}

#[test]
fn ignores_impossible_timings() {
    let mut model = StepCostModel::new(StepCostModel::cpu_prior());
    let shape = StepShape { decode_rows: 4, prefill_tokens: 0 };
    for seconds in [f64::NAN, f64::INFINITY, -1.0] {
        model.observe(shape, seconds);
    }
    assert_eq!((model.steps(), model.cost()), (0, StepCostModel::cpu_prior()));
}

#[test]
fn targets_parse_within_range() {
    let target: StepTarget = "1.5".parse().expect("1.5");
    assert_eq!((target, target.to_string()), (StepTarget::DEFAULT, "1.5".to_owned()));
    assert_eq!("2".parse::<StepTarget>().expect("2").factor(), 2.0);
    for bad in ["1", "0.5", "-2", "abc", "", "1000"] {
        let err = bad.parse::<StepTarget>().expect_err(bad);
        assert!(err.contains(bad), "{err}");
    }
}

#[test]
fn a_probe_follows_steps_pinned_at_the_minimum() {
    let mut probe = ChunkProbe::default();
    let pinned: Vec<usize> = (0..2 * ChunkProbe::EVERY).map(|_| probe.allowance(16, 16, 500)).collect();
    let mut expected = vec![16; 2 * ChunkProbe::EVERY as usize];
    expected[ChunkProbe::EVERY as usize - 1] = 32;
    expected[2 * ChunkProbe::EVERY as usize - 1] = 32;
    assert_eq!(pinned, expected);
    // A step with room for more starts the count again; a budget of no more than the minimum is never exceeded.
    for _ in 0..ChunkProbe::EVERY - 1 {
        assert_eq!(probe.allowance(16, 16, 500), 16);
    }
    assert_eq!(probe.allowance(40, 16, 500), 40);
    assert_eq!(probe.allowance(16, 16, 500), 16);
    for _ in 0..2 * ChunkProbe::EVERY {
        assert_eq!(probe.allowance(12, 16, 12), 12);
    }
    for _ in 0..ChunkProbe::EVERY - 1 {
        probe.allowance(16, 16, 20);
    }
    assert_eq!(probe.allowance(16, 16, 20), 20, "within the token budget");
}
