//! Prefix reuse: a request takes the leading blocks of its prompt that the cache holds under its adapter's name and
//! version and its cache salt, and prefills only the rest — with the same tokens and logprobs as a full prefill.

use std::sync::atomic::Ordering;

use super::*;
use crate::model::BLOCK_SIZE;

fn tokens(seed: usize, len: usize) -> Vec<u32> {
    (0..len).map(|i| ((i * 7 + seed * 13 + 1) % 64) as u32).collect()
}

fn close(a: &[f32], b: &[f32]) {
    assert_eq!(a.len(), b.len());
    for (a, b) in a.iter().zip(b) {
        assert!((a - b).abs() < 1e-4, "logprobs {a} vs {b}");
    }
}

/// The same tokens, and logprobs within float tolerance.
fn same(a: &Collected, b: &Collected) {
    assert_eq!(a.sequences.len(), b.sequences.len());
    for (a, b) in a.sequences.iter().zip(&b.sequences) {
        assert_eq!(a.token_ids, b.token_ids);
        close(&a.logprobs, &b.logprobs);
        assert_eq!(a.finish, b.finish);
    }
}

#[test]
fn a_cached_prefix_is_reused_and_gives_what_a_full_prefill_gives() {
    let config = tiny_config(vec![]);
    let meow = tiny_adapter(&config, 1);
    let prompt = tokens(1, 50);
    let v1 = AdapterVersion(1);
    for budget in [512, 20] {
        let mut uncached = Harness::with_cache(config.clone(), 8, budget, 256, false);
        let (reference, prefilled) = uncached.run_keyed(greedy("meow", &prompt, 10), Some(&meow), v1, None);
        assert_eq!(prefilled, 50);
        let (again, prefilled) = uncached.run_keyed(greedy("meow", &prompt, 10), Some(&meow), v1, None);
        assert_eq!(prefilled, 50, "without prefix caching every prompt is prefilled whole");
        same(&again, &reference);

        let mut cached = Harness::with_cache(config.clone(), 8, budget, 256, true);
        let (first, prefilled) = cached.run_keyed(greedy("meow", &prompt, 10), Some(&meow), v1, None);
        assert_eq!(prefilled, 50);
        same(&first, &reference);
        let chunks_before = cached.scheduler.trace.iter().map(|step| step.chunks.len()).sum::<usize>();
        let (second, prefilled) = cached.run_keyed(greedy("meow", &prompt, 10), Some(&meow), v1, None);
        // Three full blocks are cached; the block of the last position is computed again for its logits.
        assert_eq!(prefilled, 50 - 3 * BLOCK_SIZE as u64, "budget {budget}");
        same(&second, &reference);
        assert_eq!((first.cached_tokens, second.cached_tokens), (None, Some(48)), "the engine says what it reused");
        let first_chunk = cached.scheduler.trace.iter().flat_map(|step| &step.chunks).nth(chunks_before);
        assert_eq!(first_chunk.map(|chunk| chunk.2), Some(48), "its prefill starts after the cached blocks");
        let counters = cached.pool().counters();
        assert_eq!(counters.prefix_queries.load(Ordering::Relaxed), 100);
        assert_eq!(counters.prefix_hits.load(Ordering::Relaxed), 48);
        assert_eq!(cached.pool().usage().used, 0);
        cached.pool().check();
    }
}

#[test]
fn sixteen_concurrent_identical_prompts_compute_their_shared_blocks_once() {
    let config = tiny_config(vec![]);
    let meow = tiny_adapter(&config, 1);
    let prompt = tokens(2, 70);
    let sampled = |seed| RawSampleRequest { temperature: 1.0, seed: Some(seed), ..greedy("meow", &prompt, 8) };
    let mut alone = Harness::with_cache(config.clone(), 16, 512, 512, false);
    let reference: Vec<Collected> =
        (0..16).map(|seed| alone.run_keyed(sampled(seed), Some(&meow), AdapterVersion(1), None).0).collect();
    for budget in [512, 24] {
        let mut harness = Harness::with_cache(config.clone(), 16, budget, 512, true);
        let mut streams: Vec<Events> = (0..16).map(|seed| harness.submit(sampled(seed), Some(&meow))).collect();
        harness.run_until_idle();
        // The first computes all 70 positions; the others wait for its four full blocks and compute the last six.
        assert_eq!(harness.prefilled(), 70 + 15 * 6, "budget {budget}");
        for (stream, reference) in streams.iter_mut().zip(&reference) {
            same(&drain(stream), reference);
        }
        assert_eq!(harness.pool().usage().used, 0);
        harness.pool().check();
    }
}

#[test]
fn a_conversations_next_turn_prefills_only_its_new_tokens() {
    let config = tiny_config(vec![]);
    let meow = tiny_adapter(&config, 1);
    let mut cached = Harness::with_cache(config.clone(), 8, 64, 512, true);
    let mut uncached = Harness::with_cache(config.clone(), 8, 64, 512, false);
    let mut conversation = tokens(3, 40);
    for turn in 0..5 {
        let raw = greedy("meow", &conversation, 12);
        let (reply, prefilled) = cached.run_keyed(raw.clone(), Some(&meow), AdapterVersion(1), None);
        let (reference, _) = uncached.run_keyed(raw, Some(&meow), AdapterVersion(1), None);
        same(&reply, &reference);
        if turn > 0 {
            // What the last turn held (its prompt and all its reply but the last token) is cached in whole blocks;
            // the new tokens and at most one block more are computed.
            let new = 20 + 1;
            assert!(prefilled as usize <= new + BLOCK_SIZE, "turn {turn}: {prefilled} positions prefilled");
        }
        conversation.extend(&reply.single().token_ids);
        conversation.extend(tokens(10 + turn, 20));
    }
}

#[test]
fn a_reload_under_the_same_name_never_reuses_the_old_versions_blocks() {
    // vLLM #42125: a prefix cache keyed by adapter name serves the old weights' keys and values after a same-name
    // reload. Here the version names the blocks.
    let config = tiny_config(vec![]);
    let (v1_weights, v2_weights) = (tiny_adapter(&config, 1), tiny_adapter(&config, 2));
    let prompt = tokens(4, 60);
    let raw = greedy("meow", &prompt, 10);
    let mut harness = Harness::with_cache(config.clone(), 8, 512, 256, true);
    let (_, prefilled) = harness.run_keyed(raw.clone(), Some(&v1_weights), AdapterVersion(1), None);
    assert_eq!(prefilled, 60);
    let (reloaded, prefilled) = harness.run_keyed(raw.clone(), Some(&v2_weights), AdapterVersion(2), None);
    assert_eq!(prefilled, 60, "nothing of version 1 is reused by version 2");
    let (reference, _) = Harness::with_cache(config, 8, 512, 256, false).run_keyed(
        raw.clone(),
        Some(&v2_weights),
        AdapterVersion(2),
        None,
    );
    same(&reloaded, &reference);
    let (_, prefilled) = harness.run_keyed(raw.clone(), Some(&v2_weights), AdapterVersion(2), None);
    assert_eq!(prefilled, 60 - 48, "version 2 reuses its own blocks");
    let (_, prefilled) = harness.run_keyed(raw, Some(&v1_weights), AdapterVersion(1), None);
    assert_eq!(prefilled, 60 - 48, "a request still pinned to version 1 reuses version 1's");
}

#[test]
fn a_cache_salt_isolates_prefixes() {
    let config = tiny_config(vec![]);
    let prompt = tokens(5, 40);
    let raw = greedy("", &prompt, 4);
    let mut harness = Harness::with_cache(config, 8, 512, 256, true);
    let base = AdapterVersion::BASE;
    assert_eq!(harness.run_keyed(raw.clone(), None, base, Some("tenant-a")).1, 40);
    assert_eq!(harness.run_keyed(raw.clone(), None, base, Some("tenant-b")).1, 40, "another salt");
    assert_eq!(harness.run_keyed(raw.clone(), None, base, None).1, 40, "no salt is a salt of its own");
    assert_eq!(harness.run_keyed(raw.clone(), None, base, Some("tenant-a")).1, 40 - 32, "the same salt");
    assert_eq!(harness.run_keyed(raw, None, base, None).1, 40 - 32);
}

#[test]
fn a_reset_drops_only_the_unreferenced_prefixes() {
    let config = tiny_config(vec![]);
    let mut harness = Harness::with_cache(config, 8, 512, 256, true);
    let (done, running) = (tokens(6, 40), tokens(7, 40));
    harness.run_keyed(greedy("", &done, 4), None, AdapterVersion::BASE, None);
    let mut long = harness.submit(greedy("", &running, 200), None);
    harness.scheduler.run_step();
    let cached = harness.pool().usage().cached;
    assert!(cached >= 2, "the finished request's blocks are cached: {cached}");
    assert_eq!(harness.pool().reset_prefix_cache(), cached, "every unreferenced prefix, nothing else");
    assert_eq!(harness.pool().usage().cached, 0);
    // The running request's prefix is still found; the finished one's is gone.
    assert_eq!(harness.run_keyed(greedy("", &running, 1), None, AdapterVersion::BASE, None).1, 40 - 32);
    assert_eq!(harness.run_keyed(greedy("", &done, 1), None, AdapterVersion::BASE, None).1, 40);
    harness.run_until_idle();
    assert_eq!(token_count(&drain(&mut long)), 200);
    harness.pool().check();
}
