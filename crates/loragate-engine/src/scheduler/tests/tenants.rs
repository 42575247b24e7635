//! Fairness across tenants: one adapter's many waiting requests (a swap's kept continuations) never starve another
//! tenant's new request of prefill budget.

use loragate_core::AdapterKey;

use super::*;

fn key(name: &str) -> AdapterKey {
    AdapterKey::parse(name).expect("key")
}

/// Prefill tokens each tenant got in one traced step.
fn shares(step: &step::StepTrace) -> Vec<(AdapterKey, usize)> {
    let mut shares: Vec<(AdapterKey, usize)> = Vec::new();
    for (_, tenant, _, tokens) in &step.chunks {
        match shares.iter_mut().find(|(key, _)| key == tenant) {
            Some((_, total)) => *total += tokens,
            None => shares.push((tenant.clone(), *tokens)),
        }
    }
    shares
}

#[test]
fn a_new_tenant_gets_prefill_budget_in_the_very_next_step_beside_thirty_two_waiting_continuations() {
    let config = tiny_config(vec![]);
    let (meow, woof) = (tiny_adapter(&config, 1), tiny_adapter(&config, 2));
    let mut harness = Harness::with_budget(config, 64, 64);
    let mut stream = harness.submit(greedy("", &[1, 2, 3], 100), None);
    harness.scheduler.run_step();
    let continuations: Vec<Events> = (0..32)
        .map(|index| {
            let prompt: Vec<u32> = (0..40).map(|i| (i + index) % 64).collect();
            harness.submit(greedy("meow", &prompt, 4), Some(&meow))
        })
        .collect();
    harness.scheduler.run_step();
    assert_eq!(shares(harness.scheduler.trace.last().expect("step")), vec![(key("meow"), 63)], "alone, meow takes all");

    let mut newcomer =
        harness.submit(greedy("woof", &[9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 1, 2, 3, 4, 5, 6], 4), Some(&woof));
    harness.scheduler.run_step();
    let step = harness.scheduler.trace.last().expect("step").clone();
    let decode_rows = step.decode.len();
    let shares = shares(&step);
    assert_eq!(shares.iter().find(|(tenant, _)| *tenant == key("woof")).map(|s| s.1), Some(16), "{step:?}");
    let meow_share = shares.iter().find(|(tenant, _)| *tenant == key("meow")).map_or(0, |s| s.1);
    assert_eq!(meow_share + 16 + decode_rows, 64, "meow uses what woof leaves: {step:?}");
    let first = drain(&mut newcomer);
    assert_eq!(token_count(&first), 1, "woof's whole prompt ran in that step: its first token is out");

    harness.run_until_idle();
    assert_eq!(drain(&mut stream).single().token_ids.len(), 100);
    for mut events in continuations {
        assert_eq!(drain(&mut events).single().finish, Some(FinishReason::Length));
    }
}

#[test]
fn tenants_share_each_steps_budget_and_the_base_model_is_a_tenant_too() {
    let config = tiny_config(vec![]);
    let meow = tiny_adapter(&config, 1);
    let mut harness = Harness::with_budget(config, 64, 96);
    let long: Vec<u32> = (0..400).map(|i| (i * 3) % 64).collect();
    let _meow_long = harness.submit(greedy("meow", &long, 2), Some(&meow));
    let _base_long = harness.submit(greedy("", &long, 2), None);
    for _ in 0..5 {
        harness.scheduler.run_step();
        let step = harness.scheduler.trace.last().expect("step").clone();
        let shares = shares(&step);
        assert_eq!(shares.len(), 2, "both tenants prefill in every step: {step:?}");
        assert!(shares.iter().all(|(_, tokens)| *tokens == 48), "an equal split: {step:?}");
    }
}

#[test]
fn within_a_tenant_requests_are_served_first_come_first_served() {
    let config = tiny_config(vec![]);
    let mut harness = Harness::with_budget(config, 64, 24);
    let mut events: Vec<Events> =
        (0..4).map(|index| harness.submit(greedy("", &[index as u32 + 1; 30], 2), None)).collect();
    let mut first_token_step = vec![None; 4];
    for step in 0..20 {
        harness.scheduler.run_step();
        for (index, receiver) in events.iter_mut().enumerate() {
            if first_token_step[index].is_none() && token_count(&drain(receiver)) > 0 {
                first_token_step[index] = Some(step);
            }
        }
    }
    let steps: Vec<usize> = first_token_step.into_iter().map(|step| step.expect("every request started")).collect();
    assert!(steps.windows(2).all(|pair| pair[0] <= pair[1]), "in arrival order: {steps:?}");
    for step in &harness.scheduler.trace {
        let ids: Vec<u64> = step.chunks.iter().map(|chunk| chunk.0).collect();
        assert!(ids.windows(2).all(|pair| pair[0] < pair[1]), "the earliest request first: {step:?}");
    }
}
