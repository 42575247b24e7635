//! SkyRL-compatible pause control, vLLM-compatible loading, and the model list.

use loragate_core::AdapterRoot;
use serde_json::json;

use super::*;

#[tokio::test]
async fn abort_resume_and_wait_answer_with_skyrls_shapes() {
    let harness = serve(&["meow"]).await;
    let mut report = harness.pause("meow").await;
    let pause_id = report["pause_id"].take();
    assert!(pause_id.as_str().is_some_and(|id| !id.is_empty()), "{pause_id}");
    assert_eq!(
        report,
        json!({"status": "ok", "aborted": [], "count": 0, "unacknowledged": [], "pause_id": null, "mode": "abort",
               "kept_count": 0, "kv_policy": "recompute"})
    );
    let again = harness.pause("meow").await;
    assert_eq!(again["count"], 0, "abort is idempotent");
    assert_eq!(again["pause_id"], pause_id, "the anonymous owner's pause is renewed, not doubled");
    let (status, wait) =
        harness.post("/skyrl/v1/wait_lora_unpaused", json!({"lora_name": "meow", "timeout_s": 0.05})).await;
    assert_eq!((status, wait), (StatusCode::OK, json!({"paused": true})));

    let (status, resumed) = harness.post("/skyrl/v1/resume_lora_requests", json!({"lora_name": "meow"})).await;
    assert_eq!((status, resumed), (StatusCode::OK, json!({"status": "ok", "was_paused": true, "still_paused": false})));
    let (status, resumed) = harness.post("/skyrl/v1/resume_lora_requests", json!({"lora_name": "meow"})).await;
    assert_eq!((status, resumed["was_paused"].clone()), (StatusCode::OK, json!(false)), "resume is idempotent");
    let (status, wait) = harness.post("/skyrl/v1/wait_lora_unpaused", json!({"lora_name": "meow"})).await;
    assert_eq!((status, wait), (StatusCode::OK, json!({"paused": false})), "an open adapter answers at once");
}

#[tokio::test]
async fn a_long_poll_is_released_by_resume() {
    let harness = serve(&["meow"]).await;
    harness.pause("meow").await;
    let request = harness
        .client
        .post(harness.url("/skyrl/v1/wait_lora_unpaused"))
        .json(&json!({"lora_name": "meow", "timeout_s": 30}));
    let waiter = tokio::spawn(async move { request.send().await.expect("send").json::<Value>().await.expect("json") });
    eventually("the caller waits", || async { harness.status_of("meow").await.waiting == 1 }).await;
    assert!(!waiter.is_finished());
    harness.resume("meow").await;
    assert_eq!(waiter.await.expect("task"), json!({"paused": false}));
    assert_eq!(harness.status_of("meow").await.waiting, 0);
}

/// A temporary adapter root with the directories `step-2` and `bad` (the scripted engine refuses `bad`); `step-2`'s
/// weights file holds the bytes `the weights of step-2` (the scripted engine reads nothing, the digest is taken).
fn temp_root() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("a temporary directory");
    for adapter in ["step-2", "bad"] {
        std::fs::create_dir_all(dir.path().join(adapter)).expect("mkdir");
    }
    std::fs::write(dir.path().join("step-2/adapter_model.safetensors"), "the weights of step-2").expect("weights");
    dir
}

#[tokio::test]
async fn adapters_load_swap_and_unload_through_the_adapter_root() {
    let root = temp_root();
    let config = CoordinatorConfig {
        adapter_root: Some(AdapterRoot::new(root.path()).expect("root")),
        ..CoordinatorConfig::default()
    };
    let harness = serve_engine(ScriptedEngine::new(HOLD_AFTER), config, &["meow"]).await;

    let swap = json!({"lora_name": "meow", "lora_path": "step-2", "load_inplace": true, "kv_policy": "reuse"});
    let (status, loaded) = harness.post("/v1/load_lora_adapter", swap).await;
    assert_eq!(
        (status, loaded),
        (
            StatusCode::OK,
            json!({"status": "ok", "lora_name": "meow", "version": 2, "kept_count": 0, "aborted_count": 0,
                   "kv_policy": "recompute", "sha256": "575b65a29efac695ad0222d444d68d2c143bb141c876b2eb7c7f9c1de734668d"})
        ),
        "a scripted engine cannot park: REUSE is answered RECOMPUTE"
    );
    let (status, fresh) =
        harness.post("/v1/load_lora_adapter", json!({"lora_name": "fresh", "lora_path": "step-2"})).await;
    assert_eq!((status, fresh["version"].clone()), (StatusCode::OK, json!(1)));
    let (_, completion) =
        harness.post("/v1/completions", json!({"model": "meow", "prompt": "x", "max_tokens": 1})).await;
    assert_eq!(completion["choices"][0]["segments"][0]["lora_version"], 2, "new requests see the swapped weights");

    let (status, refused) =
        harness.post("/v1/load_lora_adapter", json!({"lora_name": "meow", "lora_path": "bad"})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{refused}");
    assert_eq!(refused["error"]["param"], "lora_path");
    assert_eq!(harness.status_of("meow").await.version.0, 2, "the old weights stay served");
    let (status, escape) =
        harness.post("/v1/load_lora_adapter", json!({"lora_name": "meow", "lora_path": "../../etc"})).await;
    assert_eq!((status, escape["error"]["param"].clone()), (StatusCode::BAD_REQUEST, json!("lora_path")));

    let (status, unloaded) = harness.post("/v1/unload_lora_adapter", json!({"lora_name": "fresh"})).await;
    assert_eq!((status, unloaded), (StatusCode::OK, json!({"status": "ok", "lora_name": "fresh"})));
    let (status, gone) = harness.post("/v1/completions", json!({"model": "fresh", "prompt": "x"})).await;
    assert_eq!((status, gone["error"]["param"].clone()), (StatusCode::NOT_FOUND, json!("model")));
    let (_, models) = harness.get("/v1/models").await;
    let ids: Vec<&str> = models["data"].as_array().expect("data").iter().filter_map(|m| m["id"].as_str()).collect();
    assert_eq!(ids, [SERVED_NAME, "meow"]);
}

#[tokio::test]
async fn models_list_the_base_model_then_each_adapter_with_its_state() {
    let harness = serve(&["meow", "woof"]).await;
    harness.pause("woof").await;
    let (status, models) = harness.get("/v1/models").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(models["object"], "list");
    let data = models["data"].as_array().expect("data");
    assert_eq!(data.len(), 3, "{models}");
    let base = &data[0];
    assert_eq!(
        (&base["id"], &base["object"], &base["owned_by"]),
        (&json!(SERVED_NAME), &json!("model"), &json!("loragate"))
    );
    assert_eq!((&base["parent"], &base["version"], &base["max_model_len"]), (&json!(null), &json!(0), &json!(4096)));
    for (card, name, paused) in [(&data[1], "meow", false), (&data[2], "woof", true)] {
        assert_eq!((&card["id"], &card["parent"]), (&json!(name), &json!(SERVED_NAME)));
        assert_eq!((&card["version"], &card["paused"], &card["held"]), (&json!(1), &json!(paused), &json!(0)));
        assert!(card["created"].is_u64() && card["in_flight"] == 0 && card["waiting"] == 0, "{card}");
    }
    harness.resume("woof").await;
}

#[tokio::test]
async fn kv_policies_are_parsed_on_every_pause_and_the_applied_one_is_echoed() {
    let harness = serve(&["meow"]).await;
    let (status, paused) = harness.post("/pause?mode=keep&kv=reuse", json!({})).await;
    // A scripted engine cannot park: REUSE is applied as RECOMPUTE, and said so.
    assert_eq!((status, paused), (StatusCode::OK, json!({"status": "paused", "kv_policy": "recompute"})));
    let (status, refused) = harness.post("/pause?mode=keep&kv=sometimes", json!({})).await;
    assert_eq!((status, &refused["error"]["param"]), (StatusCode::BAD_REQUEST, &json!("kv")));
    let (status, _) = harness.post("/resume", json!({})).await;
    assert_eq!(status, StatusCode::OK);

    let keep = json!({"lora_name": "meow", "mode": "keep", "kv_policy": "reuse"});
    let (status, report) = harness.post("/skyrl/v1/abort_lora_requests", keep).await;
    assert_eq!((status, &report["kv_policy"]), (StatusCode::OK, &json!("recompute")), "{report}");
    let bad = json!({"lora_name": "meow", "mode": "keep", "kv_policy": "maybe"});
    let (status, refused) = harness.post("/skyrl/v1/abort_lora_requests", bad).await;
    assert_eq!((status, &refused["error"]["param"]), (StatusCode::BAD_REQUEST, &json!("kv_policy")));
    let (status, paused) = harness.post("/pause_generation", json!({"mode": "in_place", "kv_policy": "reuse"})).await;
    assert_eq!((status, &paused["kv_policy"]), (StatusCode::OK, &json!("recompute")), "{paused}");
}
