//! `/metrics` and `/health`.

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
async fn health_turns_503_once_draining_begins() {
    let mut harness = serve(&["meow"]).await;
    let (status, body) = harness.get("/health").await;
    assert_eq!((status, body), (StatusCode::OK, json!({"status": "ok"})));
    let _ = harness.drain.take().expect("drain once").send(());
    eventually("health reports draining", || async {
        harness.get("/health").await.0 == StatusCode::SERVICE_UNAVAILABLE
    })
    .await;
    let (status, _) = harness.post("/v1/completions", json!({"model": "meow", "prompt": "x", "max_tokens": 1})).await;
    assert_eq!(status, StatusCode::OK, "draining servers still finish work (the coordinator decides when to stop)");
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
