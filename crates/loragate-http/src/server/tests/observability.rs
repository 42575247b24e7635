//! `/metrics`, `/health` and `/ready`.

use serde_json::json;

use super::*;

async fn scrape(harness: &Harness) -> String {
    let response = harness.client.get(harness.url("/metrics")).send().await.expect("scrape");
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["content-type"], "application/openmetrics-text; version=1.0.0; charset=utf-8");
    response.text().await.expect("text")
}

#[tokio::test]
async fn metrics_show_adapter_gauges_and_request_counts_per_server() {
    let harness = serve(&["meow"]).await;
    let other = serve(&["meow"]).await;
    let (status, _) = harness.post("/v1/completions", json!({"model": "meow", "prompt": "x", "max_tokens": 2})).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(harness.post("/v1/completions", json!({"model": "meow"})).await.0, StatusCode::BAD_REQUEST);
    harness.pause("meow").await;

    let text = scrape(&harness).await;
    for line in [
        "loragate_paused{adapter=\"meow\"} 1",
        "loragate_version{adapter=\"meow\"} 1",
        "loragate_in_flight{adapter=\"meow\"} 0",
        "loragate_held{adapter=\"meow\"} 0",
        "loragate_paused{adapter=\"\"} 0",
        "loragate_pauses_total{adapter=\"meow\"} 1",
        "loragate_generated_tokens_total{adapter=\"meow\",version=\"1\"} 2",
        "loragate_http_requests_total{endpoint=\"/v1/completions\",status=\"200\"} 1",
        "loragate_http_requests_total{endpoint=\"/v1/completions\",status=\"400\"} 1",
        "loragate_http_requests_total{endpoint=\"/skyrl/v1/abort_lora_requests\",status=\"200\"} 1",
        "loragate_http_request_duration_seconds_count{endpoint=\"/v1/completions\",status=\"200\"} 1",
    ] {
        assert!(text.contains(line), "missing {line:?} in\n{text}");
    }
    assert!(text.trim_end().ends_with("# EOF"), "OpenMetrics text ends with # EOF");

    let others = scrape(&other).await;
    assert!(!others.contains("endpoint=\"/v1/completions\""), "each server has its own registry:\n{others}");
    assert!(others.contains("loragate_paused{adapter=\"meow\"} 0"), "{others}");

    let held = harness.spawn_completion(json!({"model": "meow", "prompt": "x", "max_tokens": 2}), "scraped");
    eventually("the request is held", || async { harness.status_of("meow").await.held == 1 }).await;
    assert!(scrape(&harness).await.contains("loragate_held{adapter=\"meow\"} 1"), "gauges are refreshed per scrape");
    harness.resume("meow").await;
    assert_eq!(held.await.expect("task").0, StatusCode::OK);
}

#[tokio::test]
async fn vllm_shaped_metrics_are_there_at_zero_from_the_start_and_count_requests() {
    let harness = serve(&["meow"]).await;
    let fresh = scrape(&harness).await;
    for adapter in ["", "meow"] {
        for series in [
            "vllm:num_requests_running",
            "vllm:num_requests_waiting",
            "vllm:prompt_tokens_total",
            "vllm:generation_tokens_total",
            "vllm:time_to_first_token_seconds_count",
            "vllm:inter_token_latency_seconds_count",
            "vllm:e2e_request_latency_seconds_count",
            "loragate_pauses_total",
            "loragate_gate_hold_seconds_count",
        ] {
            // vLLM's series carry vLLM's `model_name` label (the served name).
            let labels = if series.starts_with("vllm:") {
                format!("model_name=\"{SERVED_NAME}\",adapter=\"{adapter}\"")
            } else {
                format!("adapter=\"{adapter}\"")
            };
            let line = format!("{series}{{{labels}}} 0");
            assert!(fresh.contains(&line), "missing {line:?} before any request in\n{fresh}");
        }
    }

    let completion = json!({"model": "meow", "prompt": [1, 2, 3, 4], "max_tokens": 3});
    assert_eq!(harness.post("/v1/completions", completion).await.0, StatusCode::OK);
    // The request's end is recorded by its driver right after it sent the last token, so possibly after the
    // response went out.
    let ended = "vllm:e2e_request_latency_seconds_count{model_name=\"demo\",adapter=\"meow\"} 1";
    eventually("the request's end is recorded", || async { scrape(&harness).await.contains(ended) }).await;
    let text = scrape(&harness).await;
    for line in [
        "vllm:prompt_tokens_total{model_name=\"demo\",adapter=\"meow\"} 4",
        "vllm:generation_tokens_total{model_name=\"demo\",adapter=\"meow\"} 3",
        "vllm:time_to_first_token_seconds_count{model_name=\"demo\",adapter=\"meow\"} 1",
        "vllm:num_requests_running{model_name=\"demo\",adapter=\"meow\"} 0",
        "vllm:prompt_tokens_total{model_name=\"demo\",adapter=\"\"} 0",
    ] {
        assert!(text.contains(line), "missing {line:?} in\n{text}");
    }

    harness.pause("meow").await;
    let held = harness.spawn_completion(json!({"model": "meow", "prompt": "x", "max_tokens": 2}), "held");
    eventually("the request is held", || async { harness.status_of("meow").await.held == 1 }).await;
    let text = scrape(&harness).await;
    assert!(text.contains("vllm:num_requests_waiting{model_name=\"demo\",adapter=\"meow\"} 1"), "{text}");
    harness.resume("meow").await;
    assert_eq!(held.await.expect("task").0, StatusCode::OK);
}

#[tokio::test]
async fn health_and_readiness_turn_503_once_draining_begins() {
    let mut harness = serve(&["meow"]).await;
    let (status, body) = harness.get("/health").await;
    assert_eq!((status, body), (StatusCode::OK, json!({"status": "ok"})));
    assert_eq!(harness.get("/ready").await, (StatusCode::OK, json!({"status": "ready"})));
    let _ = harness.drain.take().expect("drain once").send(());
    eventually("health reports draining", || async {
        harness.get("/health").await.0 == StatusCode::SERVICE_UNAVAILABLE
    })
    .await;
    let draining = (StatusCode::SERVICE_UNAVAILABLE, json!({"status": "draining"}));
    assert_eq!(harness.get("/ready").await, draining, "not ready while draining");
    let (status, _) = harness.post("/v1/completions", json!({"model": "meow", "prompt": "x", "max_tokens": 1})).await;
    assert_eq!(status, StatusCode::OK, "draining servers still finish work (the coordinator decides when to stop)");
}

#[tokio::test]
async fn health_and_readiness_are_503_while_the_state_store_cannot_record_and_200_once_it_can() {
    let store = Arc::new(loragate_core::testing::FailingStore::default());
    let config = CoordinatorConfig { state: store.clone(), ..CoordinatorConfig::default() };
    let harness = serve_engine(ScriptedEngine::new(HOLD_AFTER), config, &["meow"]).await;
    assert_eq!(harness.get("/health").await, (StatusCode::OK, json!({"status": "ok"})));
    store.set_failing(true);
    let (status, body) = harness.get("/health").await;
    assert_eq!((status, &body["status"]), (StatusCode::SERVICE_UNAVAILABLE, &json!("unhealthy")), "{body}");
    assert!(body["reason"].as_str().is_some_and(|reason| reason.contains("disk full")), "{body}");
    let (status, body) = harness.get("/ready").await;
    assert_eq!((status, &body["status"]), (StatusCode::SERVICE_UNAVAILABLE, &json!("unhealthy")), "{body}");
    store.set_failing(false);
    assert_eq!(harness.get("/health").await, (StatusCode::OK, json!({"status": "ok"})), "healthy again at once");
    assert_eq!(harness.get("/ready").await, (StatusCode::OK, json!({"status": "ready"})), "ready again at once");
}

#[tokio::test]
async fn extra_routes_share_the_listener_and_the_request_metrics() {
    let extra = Router::new().route(
        "/api/v1/echo/{word}",
        get(|axum::extract::Path(word): axum::extract::Path<String>| async move { word }),
    );
    let harness = serve_front(ScriptedEngine::new(HOLD_AFTER), CoordinatorConfig::default(), &[], |front| {
        front.with_routes(extra)
    })
    .await;
    let response = harness.client.get(harness.url("/api/v1/echo/meow")).send().await.expect("send");
    assert_eq!((response.status(), response.text().await.expect("text").as_str()), (StatusCode::OK, "meow"));
    let (status, _) = harness.get("/v1/models").await;
    assert_eq!(status, StatusCode::OK, "the front's own routes still answer");
    let (status, body) = harness.get("/api/v2/other").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "unknown paths keep the front's 404: {body}");
    let text = scrape(&harness).await;
    let counted = "loragate_http_requests_total{endpoint=\"/api/v1/echo/{word}\",status=\"200\"} 1";
    assert!(text.contains(counted), "missing {counted:?} in\n{text}");
}

/// The `vllm:lora_requests_info` series as the Kubernetes inference gateway's endpoint picker reads it: the family's
/// newest series (by value, a unix timestamp), its labels as a map.
fn lora_requests_info(text: &str) -> (f64, std::collections::BTreeMap<String, String>) {
    let mut newest: Option<(f64, std::collections::BTreeMap<String, String>)> = None;
    for line in text.lines().filter(|line| line.starts_with("vllm:lora_requests_info{")) {
        let (labels, value) = line["vllm:lora_requests_info{".len()..].rsplit_once("} ").expect("labels and a value");
        let value: f64 = value.trim().parse().expect("a number");
        let labels = labels
            .split("\",")
            .map(|pair| {
                let (key, quoted) = pair.split_once("=\"").expect("key=\"value\"");
                (key.to_owned(), quoted.trim_end_matches('"').to_owned())
            })
            .collect();
        if newest.as_ref().is_none_or(|(at, _)| value > *at) {
            newest = Some((value, labels));
        }
    }
    newest.expect("the family is present")
}

#[tokio::test]
async fn the_endpoint_picker_reads_a_paused_adapter_as_waiting_and_an_open_one_as_running() {
    let harness = serve(&["meow", "woof"]).await;
    let fresh = scrape(&harness).await;
    for line in [
        "vllm:request_success_total{model_name=\"demo\",finished_reason=\"stop\"} 0",
        "vllm:request_success_total{model_name=\"demo\",finished_reason=\"length\"} 0",
        "vllm:request_success_total{model_name=\"demo\",finished_reason=\"abort\"} 0",
        "loragate_overloaded_total{limit=\"max_in_flight\"} 0",
        "loragate_request_body_timeouts_total{front=\"http\"} 0",
    ] {
        assert!(fresh.contains(line), "missing {line:?} before any event in\n{fresh}");
    }
    let (_, labels) = lora_requests_info(&fresh);
    assert_eq!((labels["running_lora_adapters"].as_str(), labels["waiting_lora_adapters"].as_str()), ("meow,woof", ""));

    harness.pause("woof").await;
    let before = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_secs_f64();
    let (at, labels) = lora_requests_info(&scrape(&harness).await);
    assert!(at >= before.floor(), "valued at the scrape's unix time: {at} < {before}");
    assert_eq!(labels["max_lora"], "2");
    assert_eq!(labels["running_lora_adapters"], "meow", "{labels:?}");
    assert_eq!(labels["waiting_lora_adapters"], "woof", "a paused adapter waits: {labels:?}");
    harness.resume("woof").await;

    let completion = json!({"model": "meow", "prompt": [1, 2, 3, 4], "max_tokens": 3});
    assert_eq!(harness.post("/v1/completions", completion).await.0, StatusCode::OK);
    let counted = "vllm:request_success_total{model_name=\"demo\",finished_reason=\"length\"} 1";
    eventually("the finish is counted", || async { scrape(&harness).await.contains(counted) }).await;
}
