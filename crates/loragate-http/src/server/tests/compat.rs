//! The endpoints the frameworks' clients call besides sampling: vLLM's tokenizer endpoints, the adapter-loading
//! aliases at the root, cache flushes, SGLang's server info.

use serde_json::json;

use super::*;

#[tokio::test]
async fn tokenize_and_detokenize_answer_in_vllms_shapes() {
    let harness = serve_with_chat(&["meow"]).await;
    let (status, tokenized) =
        harness.post("/tokenize", json!({"model": SERVED_NAME, "prompt": "Hi", "add_special_tokens": true})).await;
    assert_eq!(status, StatusCode::OK, "{tokenized}");
    assert_eq!(tokenized, json!({"count": 3, "max_model_len": 4096, "tokens": [256, 72, 105], "token_strs": null}));
    let (_, plain) = harness
        .post("/tokenize", json!({"prompt": "Hi", "add_special_tokens": false, "return_token_strs": true}))
        .await;
    assert_eq!((&plain["tokens"], &plain["token_strs"]), (&json!([72, 105]), &json!(["<0x48>", "<0x69>"])));
    let (_, chat) =
        harness.post("/tokenize", json!({"model": "meow", "messages": [{"role": "user", "content": "Hi"}]})).await;
    assert_eq!(chat["count"], "user: Hi\nassistant:".len(), "messages render with the chat template: {chat}");
    let (status, detokenized) =
        harness.post("/detokenize", json!({"model": SERVED_NAME, "tokens": [72, 105, 257]})).await;
    assert_eq!((status, detokenized), (StatusCode::OK, json!({"prompt": "Hi"})));
}

#[tokio::test]
async fn the_root_aliases_load_and_unload_like_the_v1_endpoints() {
    let root = tempfile::tempdir().expect("a temporary directory");
    std::fs::create_dir_all(root.path().join("prime")).expect("adapter dir");
    let adapter_root = loragate_core::AdapterRoot::new(root.path()).expect("root");
    let config = CoordinatorConfig { adapter_root: Some(adapter_root), ..CoordinatorConfig::default() };
    let harness = serve_engine(ScriptedEngine::new(HOLD_AFTER), config, &[]).await;
    for expected_version in [1, 2] {
        let (status, loaded) =
            harness.post("/load_lora_adapter", json!({"lora_name": "prime", "lora_path": "prime"})).await;
        assert_eq!((status, &loaded["version"]), (StatusCode::OK, &json!(expected_version)), "{loaded}");
    }
    let (status, _) = harness.post("/unload_lora_adapter", json!({"lora_name": "prime"})).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = harness.post("/unload_lora_adapter", json!({"lora_name": "prime"})).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "gone");
}

#[tokio::test]
async fn cache_flushes_answer_200_with_an_empty_body_and_server_info_has_slimes_fields() {
    let harness = serve(&["meow"]).await;
    for request in [
        harness.client.post(harness.url("/reset_prefix_cache")).json(&json!({"reset_running_requests": false})),
        harness.client.post(harness.url("/reset_prefix_cache")),
        harness.client.get(harness.url("/flush_cache")),
        harness.client.post(harness.url("/flush_cache")),
    ] {
        let response = request.send().await.expect("send");
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.text().await.expect("body"), "", "SkyRL reads JSON only from a non-empty body");
    }
    for path in ["/server_info", "/get_server_info"] {
        let (status, info) = harness.get(path).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!((&info["tp_size"], &info["pp_size"], &info["dp_size"]), (&json!(1), &json!(1), &json!(1)), "{info}");
        assert_eq!(info["served_model_name"], SERVED_NAME);
    }
}
