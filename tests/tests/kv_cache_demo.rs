//! The paged KV cache's prefix reuse as `loragate serve` wires it (issue 33): what a request reused is reported in
//! its usage (OpenAI/vLLM) and `meta_info` (SGLang), `cache_salt` and tenant keys keep prefixes apart, the metrics
//! carry vLLM's names from the start, and `/reset_prefix_cache` and `/flush_cache` really drop cached prefixes.

use loragate_tests::DemoServer;
use serde_json::{Value, json};

/// A prompt of 50 token ids: three full blocks of 16 are reusable (the last position is computed for its logits).
fn prompt() -> Vec<u32> {
    (0..50).map(|i| 97 + i % 26).collect()
}

async fn post(demo: &DemoServer, path: &str, key: Option<&str>, body: Value) -> Value {
    let mut request = reqwest::Client::new().post(demo.http_url(path)).json(&body);
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    let response = request.send().await.expect("HTTP request");
    assert!(response.status().is_success(), "{path}: {}", response.status());
    response.json().await.unwrap_or(Value::Null)
}

/// The cached tokens a `/v1/completions` of the prompt reports, under `salt` and `key`.
async fn cached(demo: &DemoServer, salt: Option<&str>, key: Option<&str>) -> u64 {
    let mut body = json!({"model": "loragate-demo", "prompt": prompt(), "max_tokens": 2, "temperature": 0});
    if let Some(salt) = salt {
        body["cache_salt"] = json!(salt);
    }
    let answer = post(demo, "/v1/completions", key, body).await;
    assert_eq!(answer["usage"]["prompt_tokens"], 50, "{answer}");
    answer["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().expect("cached_tokens")
}

async fn metrics(demo: &DemoServer) -> String {
    reqwest::get(demo.http_url("/metrics")).await.expect("metrics").text().await.expect("text")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reused_prefixes_are_reported_counted_salted_and_dropped_by_a_reset() {
    let demo = DemoServer::start().await;
    let text = metrics(&demo).await;
    for name in [
        "vllm:kv_cache_usage_perc{",
        "vllm:prefix_cache_queries_total{",
        "vllm:prefix_cache_hits_total{",
        "vllm:num_preemptions_total{",
        "vllm:cache_config_info{",
        "block_size=\"16\"",
    ] {
        assert!(text.contains(name), "{name} is there from the start:\n{text}");
    }
    assert!(text.contains("vllm:prefix_cache_hits_total{model_name=\"loragate-demo\"} 0"), "{text}");

    assert_eq!(cached(&demo, None, None).await, 0, "nothing cached yet");
    assert_eq!(cached(&demo, None, None).await, 48, "three full blocks reused");
    assert!(metrics(&demo).await.contains("vllm:prefix_cache_hits_total{model_name=\"loragate-demo\"} 48"));
    assert_eq!(cached(&demo, Some("a"), None).await, 0, "another salt shares nothing");
    assert_eq!(cached(&demo, Some("a"), None).await, 48);

    post(&demo, "/reset_prefix_cache", None, json!({})).await;
    assert_eq!(cached(&demo, None, None).await, 0, "the reset dropped the cached prefixes");
    reqwest::get(demo.http_url("/flush_cache")).await.expect("flush");
    assert_eq!(cached(&demo, Some("a"), None).await, 0, "and so did SGLang's flush");

    let generate = json!({"input_ids": prompt(), "sampling_params": {"max_new_tokens": 2}, "cache_salt": "a"});
    let answer = post(&demo, "/generate", None, generate).await;
    assert_eq!(answer["meta_info"]["cached_tokens"], 48, "SGLang's meta_info: {answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_tenant_keys_two_tenants_never_share_a_cached_prefix() {
    let keys = tempfile::Builder::new().prefix("loragate-tenant-keys-").tempdir().expect("a temporary directory");
    let file = keys.path().join("tenants.json");
    let tenants = json!({"k-team-a": {"adapters": ["meow"]}, "k-team-b": {"adapters": ["woof"]}});
    std::fs::write(&file, tenants.to_string()).expect("tenant file");
    let demo = DemoServer::start_with(|config| config.authentication.tenant_keys = Some(file)).await;
    assert_eq!(cached(&demo, None, Some("k-team-a")).await, 0);
    assert_eq!(cached(&demo, None, Some("k-team-b")).await, 0, "the same prompt and salt, another tenant");
    assert_eq!(cached(&demo, None, Some("k-team-a")).await, 48, "a tenant reuses its own");
    assert_eq!(cached(&demo, Some("s"), Some("k-team-b")).await, 0);
    assert_eq!(cached(&demo, Some("s"), Some("k-team-b")).await, 48);
}
