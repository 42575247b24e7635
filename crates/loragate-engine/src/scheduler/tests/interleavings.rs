//! Randomised interleavings: requests of three tenants arriving at random steps, prompts of any length, several
//! samples, cancellations, small budgets and batches. Every step is checked against the scheduler's invariants, and
//! every request's output against the same request run alone.

use std::collections::HashMap;

use proptest::prelude::*;

use super::*;

#[derive(Clone, Debug)]
struct Arrival {
    /// The step before which it is submitted.
    step: usize,
    /// 0: the base model, 1: meow, 2: woof.
    tenant: usize,
    prompt_len: usize,
    samples: u32,
    max_tokens: u32,
    /// Cancelled this many steps after it arrives.
    cancel_after: Option<usize>,
    prompt_logprobs: bool,
}

#[derive(Clone, Debug)]
struct Scenario {
    max_batch_size: usize,
    budget: usize,
    arrivals: Vec<Arrival>,
}

fn arrival() -> impl Strategy<Value = Arrival> {
    let cancel_after = prop::option::weighted(0.25, 0usize..8);
    (0usize..25, 0usize..3, 1usize..60, 1u32..4, 1u32..10, cancel_after, any::<bool>()).prop_map(
        |(step, tenant, prompt_len, samples, max_tokens, cancel_after, prompt_logprobs)| Arrival {
            step,
            tenant,
            prompt_len,
            samples,
            max_tokens,
            cancel_after,
            prompt_logprobs,
        },
    )
}

fn scenario() -> impl Strategy<Value = Scenario> {
    (1usize..7, 1usize..40, prop::collection::vec(arrival(), 1..12)).prop_map(|(max_batch_size, extra, arrivals)| {
        Scenario { max_batch_size, budget: max_batch_size + extra, arrivals }
    })
}

fn prompt(index: usize, len: usize) -> Vec<u32> {
    (0..len).map(|position| ((index * 31 + position * 7 + 3) % 64) as u32).collect()
}

/// One submitted request: its receiver, what it has produced so far, and its cancellation.
struct Running {
    events: Events,
    collected: Collected,
    cancel: CancellationToken,
    cancelled: bool,
}

fn check(scenario: &Scenario) -> Result<(), TestCaseError> {
    let config = tiny_config(vec![]);
    let adapters = [None, Some(tiny_adapter(&config, 1)), Some(tiny_adapter(&config, 2))];
    let names = ["", "meow", "woof"];
    let raw = |index: usize, arrival: &Arrival| RawSampleRequest {
        num_samples: arrival.samples,
        include_prompt_logprobs: arrival.prompt_logprobs,
        ..greedy(names[arrival.tenant], &prompt(index, arrival.prompt_len), arrival.max_tokens)
    };
    let mut reference = Harness::new(config.clone(), 8);
    let alone: Vec<Collected> = scenario
        .arrivals
        .iter()
        .enumerate()
        .map(|(index, arrival)| reference.run_alone(raw(index, arrival), adapters[arrival.tenant].as_ref()))
        .collect();

    let mut harness = Harness::with_budget(config, scenario.max_batch_size, scenario.budget);
    let mut order: Vec<usize> = (0..scenario.arrivals.len()).collect();
    order.sort_by_key(|&index| scenario.arrivals[index].step);
    // Request ids are given in submission order.
    let mut running: HashMap<u64, (usize, Running)> = HashMap::new();
    let mut next_arrival = 0;
    let mut prefilled: HashMap<u64, usize> = HashMap::new();
    let mut step = 0;
    while next_arrival < order.len() || !harness.scheduler.batch.is_empty() || !harness.scheduler.pending.is_empty() {
        prop_assert!(step < 2000, "the scheduler never finished");
        while next_arrival < order.len() && scenario.arrivals[order[next_arrival]].step <= step {
            let index = order[next_arrival];
            let arrival = &scenario.arrivals[index];
            let cancel = CancellationToken::new();
            let events = harness.submit_with(raw(index, arrival), adapters[arrival.tenant].as_ref(), cancel.clone());
            let request = Running { events, collected: Collected::default(), cancel, cancelled: false };
            running.insert(next_arrival as u64, (index, request));
            next_arrival += 1;
        }
        for (index, request) in running.values_mut() {
            let arrival = &scenario.arrivals[*index];
            if arrival.cancel_after.is_some_and(|after| arrival.step + after <= step) && !request.cancelled {
                request.cancel.cancel();
                request.cancelled = true;
            }
        }
        harness.scheduler.run_step();
        let trace = harness.scheduler.trace.last().expect("a step").clone();

        let prefill_tokens: usize = trace.chunks.iter().map(|chunk| chunk.3).sum();
        prop_assert!(
            prefill_tokens <= scenario.budget.saturating_sub(trace.decode.len()),
            "step {}: {} decode rows and {} prompt tokens exceed the budget {}",
            step,
            trace.decode.len(),
            prefill_tokens,
            scenario.budget
        );
        for (id, _, start, tokens) in &trace.chunks {
            let done = prefilled.entry(*id).or_default();
            prop_assert_eq!(*start, *done, "chunks of request {} follow each other", id);
            *done += tokens;
        }
        let mut new_tokens: HashMap<(u64, u32), usize> = HashMap::new();
        for (id, (_, request)) in &mut running {
            while let Some(event) = request.events.try_recv() {
                if let Ok(EngineEvent::Tokens { sequence, token_ids, .. }) = &event {
                    *new_tokens.entry((*id, *sequence)).or_default() += token_ids.len();
                }
                request.collected.record(event);
            }
        }
        let requests: std::collections::HashSet<u64> = trace.decode.iter().map(|row| row.0).collect();
        prop_assert!(
            trace.decode.len() <= scenario.max_batch_size || requests.len() == 1,
            "step {}: {} decode rows in a batch of {}",
            step,
            trace.decode.len(),
            scenario.max_batch_size
        );
        for row in &trace.decode {
            prop_assert_eq!(
                new_tokens.get(row).copied(),
                Some(1),
                "step {}: decode row {:?} advanced by one token",
                step,
                row
            );
        }
        step += 1;
    }

    for (id, (index, request)) in &running {
        let (collected, alone) = (&request.collected, &alone[*index]);
        prop_assert!(collected.errors.is_empty(), "request {}: {:?}", id, collected.errors);
        prop_assert_eq!(collected.sequences.len(), alone.sequences.len(), "request {}: every sequence ended", id);
        for (together, single) in collected.sequences.iter().zip(&alone.sequences) {
            let emitted = together.token_ids.len();
            prop_assert!(emitted <= single.token_ids.len(), "request {}: {} tokens", id, emitted);
            prop_assert_eq!(&together.token_ids[..], &single.token_ids[..emitted], "request {}: as alone", id);
            close(&together.logprobs, &single.logprobs[..emitted])?;
            if !(request.cancelled && together.finish == Some(FinishReason::Abort)) {
                prop_assert_eq!(emitted, single.token_ids.len(), "request {} ran to its end", id);
                prop_assert_eq!(together.finish, single.finish);
            }
        }
        match (&collected.prompt_logprobs, &alone.prompt_logprobs) {
            (Some(together), Some(single)) => close(&together[1..], &single[1..])?,
            (None, _) => prop_assert!(request.cancelled || !scenario.arrivals[*index].prompt_logprobs),
            (Some(_), None) => prop_assert!(false, "request {}: prompt logprobs it did not ask for", id),
        }
    }
    Ok(())
}

fn close(a: &[f32], b: &[f32]) -> Result<(), TestCaseError> {
    prop_assert_eq!(a.len(), b.len());
    for (a, b) in a.iter().zip(b) {
        prop_assert!((a - b).abs() < 1e-4, "logprobs {} vs {}", a, b);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn every_step_keeps_the_budget_advances_every_decode_row_and_changes_no_result(scenario in scenario()) {
        check(&scenario)?;
    }
}
