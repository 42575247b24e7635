//! The KV cache through the engine's public surface: its size and what the startup line says, the admission check
//! that names the limit, the served context capped at what the cache holds, the reset, and the metrics under vLLM's
//! names.

use loragate_core::{MetricsSource, ModelInfo};
use prometheus_client::encoding::text::encode;
use prometheus_client::registry::Registry;

use super::*;
use crate::test_support::info;

/// The tiny model's bytes per cached position: 2 · 2 layers · 2 heads · 8 · 4 bytes.
const POSITION_BYTES: u64 = 256;

fn engine_with(config: EngineConfig) -> CandleEngine {
    CandleEngine::start(tiny_model(tiny_config(vec![])), None, &config).expect("engine")
}

/// An engine whose KV cache has `blocks` blocks (one of them kept zero).
fn engine_with_blocks(blocks: u64) -> CandleEngine {
    engine_with(EngineConfig { kv_cache_memory_bytes: Some(blocks * 16 * POSITION_BYTES), ..EngineConfig::default() })
}

#[tokio::test]
async fn the_cache_is_sized_in_bytes_and_says_so_and_caps_the_served_context() {
    let engine = engine_with_blocks(33);
    let facts = engine.facts();
    assert_eq!((facts.kv_cache_blocks, facts.block_size), (32, 16), "block 0 is kept zero");
    assert_eq!(facts.kv_cache_bytes, 33 * 16 * POSITION_BYTES, "exactly 2 · layers · kv_heads · head_dim · 4 each");
    assert!(facts.prefix_caching);
    assert_eq!(facts.weights, "f32", "dense weights");
    let ModelInfo { context_length, .. } = engine.model_info();
    assert_eq!(*context_length, 32 * 16, "the 4096-token context is capped at the 512 positions the cache holds");
    assert_eq!(engine_with(EngineConfig::default()).model_info().context_length, 4096, "a default cache holds it");
}

#[tokio::test]
async fn a_request_that_could_never_fit_is_refused_naming_the_limit() {
    let engine = engine_with_blocks(5);
    // The model info of an uncapped engine, as a coordinator in front of several engines might validate with.
    let mut info = info(&tiny_config(vec![]));
    info.context_length = 4096;
    let raw = greedy("", &[1; 40], 40);
    let request = SampleRequest::parse(raw, &info).expect("valid for the model");
    let err = engine.generate(request, CancellationToken::new()).await.map(|_| ()).expect_err("too large");
    assert!(matches!(&err, EngineError::TooLarge(reason) if reason.contains("--kv-cache-memory-bytes")), "{err}");
    assert_eq!(err.class(), loragate_core::ErrorClass::Invalid, "a 400, not a 500");
    let fits = sample(&engine, greedy("", &[1; 40], 24)).await;
    assert_eq!(fits.single().token_ids.len(), 24, "63 positions of the 64 the cache holds fit");
}

fn exposition(engine: &CandleEngine) -> String {
    let mut registry = Registry::default();
    engine.register(registry.sub_registry_with_prefix("loragate"));
    engine.register_vllm(registry.sub_registry_with_label(("model_name".into(), "tiny".into())));
    engine.refresh();
    let mut text = String::new();
    encode(&mut text, &registry).expect("encode");
    text
}

#[tokio::test]
async fn the_metrics_exist_at_zero_from_the_start_under_vllms_names_and_count_hits_in_tokens() {
    let engine = engine_with_blocks(65);
    let text = exposition(&engine);
    for series in [
        "vllm:kv_cache_usage_perc{model_name=\"tiny\"} 0.0",
        "vllm:prefix_cache_queries_total{model_name=\"tiny\"} 0",
        "vllm:prefix_cache_hits_total{model_name=\"tiny\"} 0",
        "vllm:num_preemptions_total{model_name=\"tiny\"} 0",
        "vllm:cache_config_info{model_name=\"tiny\",block_size=\"16\",num_gpu_blocks=\"64\",enable_prefix_caching=\"true\"} 1",
        "loragate_engine_prompt_tokens_prefilled_total 0",
    ] {
        assert!(text.contains(series), "{series} in\n{text}");
    }
    let prompt: Vec<u32> = (0..40).map(|i| i % 60).collect();
    sample(&engine, greedy("", &prompt, 2)).await;
    sample(&engine, greedy("", &prompt, 2)).await;
    let text = exposition(&engine);
    for series in [
        "vllm:prefix_cache_queries_total{model_name=\"tiny\"} 80",
        "vllm:prefix_cache_hits_total{model_name=\"tiny\"} 32",
        "loragate_engine_prompt_tokens_prefilled_total 48",
    ] {
        assert!(text.contains(series), "{series} in\n{text}");
    }
    let stats = engine.kv_cache_stats();
    assert_eq!((stats.used_blocks, stats.usage()), (0, 0.0), "nothing runs");
    assert!(stats.cached_blocks >= 2, "the prompt's blocks stay cached: {stats:?}");
    assert_eq!(Engine::reset_prefix_cache(&engine), stats.cached_blocks, "the reset drops them all");
    assert_eq!(engine.kv_cache_stats().cached_blocks, 0);
    assert_eq!(exposition(&engine).matches("vllm:prefix_cache_hits_total{model_name=\"tiny\"} 32").count(), 1);
}
