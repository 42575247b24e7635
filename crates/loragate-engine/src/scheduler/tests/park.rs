//! KV_POLICY_REUSE in the scheduler: parking decoding sequences with their keys and values, resuming them as decode
//! rows under new weights with no prefill, and falling back to a prefill when a handle does not fit.

use loragate_core::{ParkSignal, ParkedKv, Parking};

use super::*;
use crate::model::{PackedInput, PrefillChunk};

/// Tokens the first run produces before the pause.
const BEFORE: usize = 4;
/// The request's whole budget.
const BUDGET: u32 = 12;

fn prompt() -> Vec<u32> {
    vec![7, 3, 9, 1, 1, 2]
}

impl Harness {
    /// Submits through the step thread's own routing (parked handles go to the resume queue).
    fn submit_parking(
        &mut self,
        raw: RawSampleRequest,
        adapter: &Arc<AdapterWeights>,
        version: AdapterVersion,
        cancel: CancellationToken,
        parking: Parking,
    ) -> Events {
        let (events, receiver) = outbox();
        let request = request(&self.config, raw);
        let Parking { park_on_cancel: park, resume_from: resume } = parking;
        let adapter = Some(Arc::clone(adapter));
        self.scheduler.submit(Box::new(Submission { request, adapter, version, cancel, park, resume, events }));
        receiver
    }

    fn chunks_run(&self) -> usize {
        self.scheduler.trace.iter().map(|step| step.chunks.len()).sum()
    }
}

/// Runs `meow` v1 greedily until it produced [`BEFORE`] tokens, then parks it. Returns its tokens and handle.
fn park_after_some_tokens(harness: &mut Harness, meow: &Arc<AdapterWeights>) -> (Vec<u32>, ParkedKv) {
    let (cancel, park) = (CancellationToken::new(), ParkSignal::default());
    let parking = Parking { park_on_cancel: park.clone(), resume_from: None };
    let mut events =
        harness.submit_parking(greedy("meow", &prompt(), BUDGET), meow, AdapterVersion(1), cancel.clone(), parking);
    for _ in 0..BEFORE {
        harness.scheduler.run_step();
    }
    park.request();
    cancel.cancel();
    harness.scheduler.run_step();
    let collected = drain(&mut events);
    let sequence = collected.single();
    assert_eq!(sequence.token_ids.len(), BEFORE, "one token per step, and none after the cancellation");
    assert_eq!(sequence.finish, Some(FinishReason::Abort));
    assert!(harness.scheduler.batch.is_empty(), "the parked row left the batch");
    let parked = sequence.parked.clone().expect("the decoding sequence was parked");
    let position = collected.events.iter().position(|event| matches!(event, EngineEvent::Parked { .. }));
    assert_eq!(position, Some(collected.events.len() - 2), "parked right before its end");
    (sequence.token_ids.clone(), parked)
}

/// The tokens after the resume computed without the scheduler: the history's keys and values under `old` (every
/// position but the last, in one chunk of a sequence cache), then greedy decoding under `new` from the last token.
fn reference(
    config: &ModelConfig,
    history: &[u32],
    old: &Arc<AdapterWeights>,
    new: &Arc<AdapterWeights>,
    count: usize,
) -> Vec<u32> {
    let model = tiny_model(config.clone());
    let cache = model.kv_cache(16, false).expect("cache");
    let mut blocks = crate::model::SequenceBlocks::new(cache.pool(), None);
    let cached = history.len() - 1;
    let old_rows = LoraBatch::uniform(Some(old)).expect("lora");
    cache.reserve(&mut blocks, cached).expect("room");
    let chunk = PrefillChunk { tokens: &history[..cached], blocks: &mut blocks };
    model.forward_packed(PackedInput { decode: Vec::new(), chunks: vec![chunk] }, &old_rows, &cache).expect("old keys");
    let new_rows = LoraBatch::uniform(Some(new)).expect("lora");
    let mut next = history[cached];
    let mut tokens = Vec::new();
    for _ in 0..count {
        let input = [next];
        cache.reserve(&mut blocks, 1).expect("room");
        let chunk = PrefillChunk { tokens: &input, blocks: &mut blocks };
        let input = PackedInput { decode: Vec::new(), chunks: vec![chunk] };
        let hidden = model.forward_packed(input, &new_rows, &cache).expect("step");
        let logits = model.logits(&hidden).expect("logits").flatten_all().expect("flat");
        next = logits.argmax(0).expect("argmax").to_scalar::<u32>().expect("token");
        tokens.push(next);
    }
    tokens
}

#[test]
fn a_parked_sequence_resumes_without_prefill_on_its_old_keys_under_the_new_weights() {
    let config = tiny_config(vec![]);
    let (meow, meow_v2) = (tiny_adapter(&config, 1), tiny_adapter(&config, 2));
    let mut harness = Harness::new(config.clone(), 8);
    let (before, parked) = park_after_some_tokens(&mut harness, &meow);
    let freed = parked.watch();

    let history: Vec<u32> = prompt().into_iter().chain(before.iter().copied()).collect();
    let remaining = BUDGET - BEFORE as u32;
    let continuation = greedy("meow", &history, remaining);
    let parking = Parking { park_on_cancel: ParkSignal::default(), resume_from: Some(parked) };
    let chunks_before = harness.chunks_run();
    let mut events =
        harness.submit_parking(continuation, &meow_v2, AdapterVersion(2), CancellationToken::new(), parking);
    harness.scheduler.run_step();
    assert_eq!(harness.scheduler.trace.last().map(|step| step.decode.len()), Some(1), "it decodes in the first step");
    harness.run_until_idle();
    assert_eq!(harness.chunks_run(), chunks_before, "no prefill at all");
    assert!(freed.is_freed(), "the parked keys and values were freed once copied into the batch");

    let resumed = drain(&mut events);
    assert!(matches!(resumed.events[0], EngineEvent::Resumed { sequence: 0 }), "{:?}", resumed.events[0]);
    let sequence = resumed.single();
    assert!(sequence.resumed);
    assert_eq!(sequence.versions, vec![2; remaining as usize], "every new token is the new version's");
    assert_eq!(sequence.finish, Some(FinishReason::Length));
    let expected = reference(&config, &history, &meow, &meow_v2, remaining as usize);
    assert_eq!(sequence.token_ids, expected, "the old keys and values, decoded on under the new weights");

    // Recomputing (the history's keys and values under v2 too) is another computation: the check tells them apart.
    let recomputed = reference(&config, &history, &meow_v2, &meow_v2, remaining as usize);
    assert_ne!(sequence.token_ids, recomputed, "the tokens show which keys and values they attended to");
}

#[test]
fn a_handle_that_does_not_fit_is_recomputed_and_says_nothing_of_resuming() {
    let config = tiny_config(vec![]);
    let (meow, meow_v2) = (tiny_adapter(&config, 1), tiny_adapter(&config, 2));
    let mut harness = Harness::new(config.clone(), 8);
    let (before, parked) = park_after_some_tokens(&mut harness, &meow);
    let freed = parked.watch();
    // Not the parked sequence's tokens: one token short.
    let history: Vec<u32> = prompt().into_iter().chain(before[..BEFORE - 1].iter().copied()).collect();
    let parking = Parking { park_on_cancel: ParkSignal::default(), resume_from: Some(parked) };
    let chunks_before = harness.chunks_run();
    let mut events = harness.submit_parking(
        greedy("meow", &history, 3),
        &meow_v2,
        AdapterVersion(2),
        CancellationToken::new(),
        parking,
    );
    assert!(freed.is_freed(), "a refused handle is dropped at once");
    harness.run_until_idle();
    assert!(harness.chunks_run() > chunks_before, "prefilled instead");
    let collected = drain(&mut events);
    assert!(!collected.single().resumed);
    assert_eq!(
        collected.single().token_ids,
        harness.run_alone(greedy("meow", &history, 3), Some(&meow_v2)).single().token_ids
    );

    // Another engine instance's handle is refused the same way.
    let mut other = Harness::new(config.clone(), 8);
    let (before, parked) = park_after_some_tokens(&mut harness, &meow);
    let history: Vec<u32> = prompt().into_iter().chain(before).collect();
    let parking = Parking { park_on_cancel: ParkSignal::default(), resume_from: Some(parked) };
    let mut events = other.submit_parking(
        greedy("meow", &history, 3),
        &meow_v2,
        AdapterVersion(2),
        CancellationToken::new(),
        parking,
    );
    other.run_until_idle();
    assert!(!drain(&mut events).single().resumed, "parked by another engine instance");
}

#[test]
fn a_continuation_cancelled_before_its_place_parks_again_or_frees_its_keys() {
    let config = tiny_config(vec![]);
    let (meow, meow_v2) = (tiny_adapter(&config, 1), tiny_adapter(&config, 2));
    let mut harness = Harness::new(config.clone(), 8);
    let (before, parked) = park_after_some_tokens(&mut harness, &meow);
    let history: Vec<u32> = prompt().into_iter().chain(before).collect();

    // Parked again by a second keep pause before it even resumed: the same handle comes back.
    let (cancel, park) = (CancellationToken::new(), ParkSignal::default());
    let parking = Parking { park_on_cancel: park.clone(), resume_from: Some(parked.clone()) };
    let mut events =
        harness.submit_parking(greedy("meow", &history, 4), &meow_v2, AdapterVersion(2), cancel.clone(), parking);
    park.request();
    cancel.cancel();
    harness.scheduler.run_step();
    let collected = drain(&mut events);
    assert_eq!(collected.single().parked.as_ref(), Some(&parked), "the very same keys and values");
    assert_eq!((collected.single().finish, collected.single().token_ids.len()), (Some(FinishReason::Abort), 0));

    // Cancelled without parking (an abort, an unload): the handle is dropped and the keys and values freed.
    let freed = parked.watch();
    let cancel = CancellationToken::new();
    let parking = Parking { park_on_cancel: ParkSignal::default(), resume_from: Some(parked) };
    let mut events =
        harness.submit_parking(greedy("meow", &history, 4), &meow_v2, AdapterVersion(2), cancel.clone(), parking);
    drop(collected);
    cancel.cancel();
    harness.scheduler.run_step();
    let collected = drain(&mut events);
    assert_eq!((collected.single().finish, collected.single().parked.is_none()), (Some(FinishReason::Abort), true));
    assert!(freed.is_freed(), "nothing in the engine holds the parked row");
    assert!(harness.scheduler.is_idle());
}

#[test]
fn resumed_rows_wait_for_a_place_in_a_full_batch_and_then_decode_every_step() {
    let config = tiny_config(vec![]);
    let (meow, meow_v2) = (tiny_adapter(&config, 1), tiny_adapter(&config, 2));
    let mut harness = Harness::new(config.clone(), 1);
    let (before, parked) = park_after_some_tokens(&mut harness, &meow);
    let history: Vec<u32> = prompt().into_iter().chain(before).collect();
    let mut busy = harness.submit(greedy("", &[1, 2, 3], 3), None);
    harness.scheduler.run_step();
    let parking = Parking { park_on_cancel: ParkSignal::default(), resume_from: Some(parked) };
    let mut events = harness.submit_parking(
        greedy("meow", &history, 4),
        &meow_v2,
        AdapterVersion(2),
        CancellationToken::new(),
        parking,
    );
    harness.scheduler.run_step();
    assert_eq!(harness.scheduler.batch.len(), 1, "the batch's one place is taken: the resume waits");
    harness.run_until_idle();
    assert_eq!(drain(&mut busy).single().token_ids.len(), 3);
    let resumed = drain(&mut events);
    assert_eq!((resumed.single().resumed, resumed.single().token_ids.len()), (true, 4));
    for step in harness.scheduler.trace.iter().rev().take(3) {
        assert!(step.chunks.is_empty() && step.decode.len() == 1, "decoded every step: {step:?}");
    }
}

/// One request of a random scene, and what became of it.
struct Tracked {
    events: Events,
    collected: Collected,
    cancel: CancellationToken,
    park: ParkSignal,
    /// Tokens produced before this run (a continuation's history beyond the scene's prompt).
    history: Vec<u32>,
    /// The step at which the scene cancels it, parking it or not.
    stop_at: Option<(usize, bool)>,
    resumed_from_parked: bool,
}

#[test]
fn random_interleavings_of_park_resume_cancel_and_unload_leave_nothing_behind() {
    use rand::{Rng, SeedableRng};
    let config = tiny_config(vec![]);
    let (meow, meow_v2) = (tiny_adapter(&config, 1), tiny_adapter(&config, 2));
    for seed in 0..48u64 {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut harness = Harness::with_budget(config.clone(), rng.random_range(1..5), rng.random_range(4..40));
        let mut tracked: Vec<Tracked> = Vec::new();
        let mut watches = Vec::new();
        let start =
            |harness: &mut Harness, rng: &mut rand::rngs::StdRng, history: Vec<u32>, resume: Option<ParkedKv>| {
                let (cancel, park) = (CancellationToken::new(), ParkSignal::default());
                let budget = BUDGET - history.len() as u32;
                let prompt: Vec<u32> = prompt().into_iter().chain(history.iter().copied()).collect();
                let (adapter, version) = if resume.is_some() { (&meow_v2, 2) } else { (&meow, 1) };
                let resumed_from_parked = resume.is_some();
                let parking = Parking { park_on_cancel: park.clone(), resume_from: resume };
                let raw = greedy("meow", &prompt, budget);
                let events = harness.submit_parking(raw, adapter, AdapterVersion(version), cancel.clone(), parking);
                let stop_at = rng.random_bool(0.6).then(|| (rng.random_range(0..6), rng.random_bool(0.7)));
                Tracked { events, collected: Collected::default(), cancel, park, history, stop_at, resumed_from_parked }
            };
        for _ in 0..rng.random_range(1..4) {
            let run = start(&mut harness, &mut rng, Vec::new(), None);
            tracked.push(run);
        }
        let mut step = 0;
        while !harness.scheduler.is_idle()
            || tracked.iter().any(|run| run.collected.sequences.first().is_none_or(|s| s.finish.is_none()))
        {
            assert!(step < 500, "seed {seed}: the scene did not settle");
            for run in &mut tracked {
                if let Some((at, parks)) = run.stop_at
                    && at == step
                {
                    if parks {
                        run.park.request();
                    }
                    run.cancel.cancel();
                }
            }
            harness.scheduler.run_step();
            step += 1;
            let mut continuations = Vec::new();
            for run in &mut tracked {
                while let Some(event) = run.events.try_recv() {
                    run.collected.record(event);
                }
                let Some(sequence) = run.collected.sequences.first_mut() else { continue };
                if sequence.finish.is_none() {
                    continue;
                }
                let Some(parked) = sequence.parked.take() else { continue };
                run.collected.events.clear();
                watches.push((seed, parked.watch()));
                let history: Vec<u32> = run.history.iter().chain(&sequence.token_ids).copied().collect();
                // Resume it under v2 (a keep swap), or drop the handle (an unload while parked).
                if history.len() < BUDGET as usize && rng.random_bool(0.75) {
                    continuations.push((history, parked));
                }
            }
            for (history, parked) in continuations {
                let run = start(&mut harness, &mut rng, history, Some(parked));
                tracked.push(run);
            }
        }
        for run in &tracked {
            let sequence = run.collected.single();
            let finish = sequence.finish.expect("every sequence ended");
            if run.resumed_from_parked && !sequence.token_ids.is_empty() {
                assert!(sequence.resumed, "seed {seed}: a handle of this engine, with its tokens, always fits");
                assert!(sequence.versions.iter().all(|&version| version == 2), "seed {seed}: resumed under v2");
            }
            if finish == FinishReason::Length {
                assert_eq!(run.history.len() + sequence.token_ids.len(), BUDGET as usize, "seed {seed}: the budget");
            }
        }
        drop(tracked);
        assert!(harness.scheduler.is_idle() && harness.scheduler.batch.is_empty(), "seed {seed}");
        for (seed, watch) in watches {
            assert!(watch.is_freed(), "seed {seed}: parked keys and values outlived their requests");
        }
        assert_eq!(harness.pool().usage().used, 0, "seed {seed}: no block outlived its sequence or handle");
        harness.pool().check();
    }
}

#[test]
fn a_parked_row_keeps_its_blocks_by_reference_until_a_continuation_takes_them_or_its_handle_goes() {
    let config = tiny_config(vec![]);
    let (meow, meow_v2) = (tiny_adapter(&config, 1), tiny_adapter(&config, 2));
    let mut harness = Harness::new(config.clone(), 8);
    // The sequence holds prompt + BEFORE - 1 positions: one block of 16.
    let (before, parked) = park_after_some_tokens(&mut harness, &meow);
    assert!(harness.scheduler.batch.is_empty());
    assert_eq!(harness.pool().usage().used, 1, "the parked row's block stays in use, held by its handle");

    // It resumes with those very blocks (nothing copied, nothing allocated), and runs to its end.
    let history: Vec<u32> = prompt().into_iter().chain(before.iter().copied()).collect();
    let parking = Parking { park_on_cancel: ParkSignal::default(), resume_from: Some(parked.clone()) };
    let continuation = greedy("meow", &history, BUDGET - BEFORE as u32);
    let mut events =
        harness.submit_parking(continuation, &meow_v2, AdapterVersion(2), CancellationToken::new(), parking);
    harness.scheduler.run_step();
    assert_eq!(harness.pool().usage().used, 1, "the resumed row writes into the block it took over");
    harness.run_until_idle();
    assert_eq!(drain(&mut events).single().finish, Some(FinishReason::Length));
    assert_eq!(harness.pool().usage().used, 0, "the continuation took the blocks: the handle holds none any more");
    drop(parked);
    harness.pool().check();

    // Parked, then dropped without a resume (an unload, an abort): its blocks go back at once.
    let (_, parked) = park_after_some_tokens(&mut harness, &meow);
    assert_eq!(harness.pool().usage().used, 1);
    drop(parked);
    assert_eq!(harness.pool().usage().used, 0, "freed with the handle");
    harness.pool().check();
}
