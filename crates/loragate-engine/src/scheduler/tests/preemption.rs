//! Out of blocks is not an error: a pool too small for the load preempts the newest sequences, recomputes them
//! later, and every request still finishes with what it produces alone.

use proptest::prelude::*;

use super::*;

#[test]
fn a_pool_too_small_for_the_load_preempts_and_still_finishes_every_request() {
    let config = tiny_config(vec![]);
    let meow = tiny_adapter(&config, 1);
    let requests: Vec<RawSampleRequest> = (0..6)
        .map(|index| {
            let prompt: Vec<u32> = (0..20 + 4 * index).map(|i| ((i * 5 + index * 17) % 64) as u32).collect();
            RawSampleRequest { num_samples: 1 + (index % 2) as u32, ..greedy("meow", &prompt, 30) }
        })
        .collect();
    let mut alone = Harness::with_cache(config.clone(), 8, 64, 512, false);
    let reference: Vec<Collected> = requests.iter().map(|raw| alone.run_alone(raw.clone(), Some(&meow))).collect();
    for prefix_caching in [false, true] {
        // 10 blocks of 16 positions; the requests need about 40 at once.
        let mut harness = Harness::with_cache(config.clone(), 8, 64, 11, prefix_caching);
        let mut streams: Vec<Events> = requests.iter().map(|raw| harness.submit(raw.clone(), Some(&meow))).collect();
        harness.run_until_idle();
        for (index, (stream, reference)) in streams.iter_mut().zip(&reference).enumerate() {
            let together = drain(stream);
            assert!(together.errors.is_empty(), "request {index}: {:?}", together.errors);
            assert_eq!(together.sequences.len(), reference.sequences.len());
            for (a, b) in together.sequences.iter().zip(&reference.sequences) {
                assert_eq!(a.token_ids, b.token_ids, "request {index}");
                assert_eq!(a.finish, Some(FinishReason::Length));
                for (a, b) in a.logprobs.iter().zip(&b.logprobs) {
                    assert!((a - b).abs() < 1e-4, "request {index}: {a} vs {b}");
                }
            }
        }
        let preemptions = harness.pool().counters().preemptions.load(std::sync::atomic::Ordering::Relaxed);
        assert!(preemptions > 0, "the pool was too small: sequences were preempted");
        assert_eq!(harness.pool().usage().used, 0, "every block came back");
        harness.pool().check();
    }
}

#[derive(Clone, Debug)]
struct Arrival {
    step: usize,
    prompt_len: usize,
    samples: u32,
    max_tokens: u32,
    cancel_after: Option<usize>,
    /// Index of an earlier arrival whose prompt this one starts with (a shared prefix).
    shares: Option<usize>,
}

fn arrival() -> impl Strategy<Value = Arrival> {
    (0usize..8, 1usize..70, 1u32..4, 1u32..40, prop::option::weighted(0.2, 0usize..10), prop::option::of(0usize..4))
        .prop_map(|(step, prompt_len, samples, max_tokens, cancel_after, shares)| Arrival {
            step,
            prompt_len,
            samples,
            max_tokens,
            cancel_after,
            shares,
        })
}

fn prompt(arrivals: &[Arrival], index: usize) -> Vec<u32> {
    let arrival = &arrivals[index];
    let mut prompt: Vec<u32> = match arrival.shares.filter(|&shared| shared < index) {
        Some(shared) => prompt(arrivals, shared),
        None => Vec::new(),
    };
    prompt.extend((0..arrival.prompt_len).map(|i| ((i * 7 + index * 31 + 3) % 64) as u32));
    prompt.truncate(110);
    prompt
}

/// Random requests (some sharing prefixes, some cancelled) in a pool of `blocks` blocks (each request fits alone:
/// at most 110 + 40 positions, 10 blocks): every request that is not
/// cancelled ends with what it produces alone, and the pool's accounting is right after every step and back to
/// nothing at the end.
fn check(arrivals: &[Arrival], blocks: usize, budget: usize) -> Result<(), TestCaseError> {
    let config = tiny_config(vec![]);
    let raw = |index: usize| {
        let arrival = &arrivals[index];
        RawSampleRequest { num_samples: arrival.samples, ..greedy("", &prompt(arrivals, index), arrival.max_tokens) }
    };
    let mut alone = Harness::with_cache(config.clone(), 8, 512, 1024, false);
    let reference: Vec<Collected> = (0..arrivals.len()).map(|index| alone.run_alone(raw(index), None)).collect();
    let mut harness = Harness::with_cache(config, 6, budget, blocks, true);
    let mut running: Vec<Option<(Events, Collected, CancellationToken)>> = (0..arrivals.len()).map(|_| None).collect();
    let mut step = 0;
    loop {
        for (index, arrival) in arrivals.iter().enumerate() {
            if arrival.step == step {
                let cancel = CancellationToken::new();
                let events = harness.submit_with(raw(index), None, cancel.clone());
                running[index] = Some((events, Collected::default(), cancel));
            }
            if let (Some(after), Some((_, _, cancel))) = (arrival.cancel_after, &running[index])
                && arrival.step + after == step
            {
                cancel.cancel();
            }
        }
        if step > 25 && harness.scheduler.is_idle() {
            break;
        }
        prop_assert!(step < 3000, "the scheduler never finished");
        harness.scheduler.run_step();
        harness.pool().check();
        for (events, collected, _) in running.iter_mut().flatten() {
            while let Some(event) = events.try_recv() {
                collected.record(event);
            }
        }
        step += 1;
    }
    for (index, state) in running.iter().enumerate() {
        let Some((_, collected, cancel)) = state else { continue };
        prop_assert!(collected.errors.is_empty(), "request {}: {:?}", index, collected.errors);
        for (together, alone) in collected.sequences.iter().zip(&reference[index].sequences) {
            let emitted = together.token_ids.len();
            prop_assert_eq!(&together.token_ids[..], &alone.token_ids[..emitted], "request {}", index);
            if !cancel.is_cancelled() {
                prop_assert_eq!(together.finish, alone.finish, "request {} ran to its end", index);
                prop_assert_eq!(emitted, alone.token_ids.len());
            }
        }
    }
    prop_assert_eq!(harness.pool().usage().used, 0, "every block came back");
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn random_loads_in_a_small_pool_preempt_share_and_free_without_changing_any_result(
        arrivals in prop::collection::vec(arrival(), 2..12),
        blocks in 11usize..24,
        budget in 7usize..80,
    ) {
        check(&arrivals, blocks, budget)?;
    }
}
