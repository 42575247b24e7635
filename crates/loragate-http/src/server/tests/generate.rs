//! vLLM's `POST /inference/v1/generate`: SkyRL's and prime-rl's bodies, `token_id:N` logprobs, prompt logprobs,
//! `n`, streaming, aborts, and the gate in `Coordinator::sample`.

use serde_json::json;

use super::*;

const PROMPT: [u32; 3] = [72, 105, 33];

#[tokio::test]
async fn skyrls_generate_body_answers_token_ids_logprobs_and_finish_reason() {
    let harness = serve(&["meow"]).await;
    let body = json!({"sampling_params": {"min_tokens": 1, "skip_special_tokens": true,
        "include_stop_str_in_output": true, "max_tokens": 2, "temperature": 1.0, "top_p": 1.0, "top_k": -1,
        "min_p": 0.0, "logprobs": 1, "stop": null}, "model": "meow", "token_ids": PROMPT, "cache_salt": "salt"});
    let response =
        harness.client.post(harness.url("/inference/v1/generate")).header("X-Request-Id", "g1").json(&body).send();
    let body: Value = response.await.expect("send").json().await.expect("json");
    assert_eq!(body["request_id"], "g1");
    let choice = &body["choices"][0];
    assert_eq!(
        (&choice["index"], &choice["token_ids"], &choice["finish_reason"]),
        (&json!(0), &json!([0, 1]), &json!("length"))
    );
    let content = choice["logprobs"]["content"].as_array().expect("content");
    assert_eq!(content.len(), 2, "one entry per token, as prime-rl requires");
    assert_eq!((&content[1]["token"], &content[1]["bytes"]), (&json!("token_id:1"), &json!(null)));
    assert!((content[1]["logprob"].as_f64().expect("number") + 0.01).abs() < 1e-6);
    assert_eq!(content[1]["top_logprobs"], json!([{"token": "token_id:1", "logprob": -0.01, "bytes": null}]));
    assert_eq!(choice["segments"], json!([{"lora_version": 1, "kv_version": 1, "start": 0, "end": 2}]));
    assert_eq!(body["usage"], usage(3, 2));
    assert!(body.get("prompt_logprobs").is_none(), "not asked for");
}

#[tokio::test]
async fn tinkers_sample_asks_for_n_sequences_and_prompt_logprobs() {
    let harness = serve(&["meow"]).await;
    let body = json!({"sampling_params": {"n": 2, "logprobs": 0, "output_kind": 2, "prompt_logprobs": 3,
        "temperature": 0.7, "max_tokens": 3, "seed": 5, "stop_token_ids": [257]}, "model": "meow", "token_ids": PROMPT});
    let (status, body) = harness.post("/inference/v1/generate", body).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let choices = body["choices"].as_array().expect("choices");
    assert_eq!(choices.len(), 2);
    assert!(choices.iter().all(|choice| choice["logprobs"]["content"][0]["top_logprobs"] == json!([])), "logprobs 0");
    let prompt_logprobs = body["prompt_logprobs"].as_array().expect("prompt_logprobs");
    assert_eq!((prompt_logprobs.len(), &prompt_logprobs[0]), (3, &json!(null)));
    let entry = prompt_logprobs[2].as_object().expect("an object per position");
    assert!(
        entry.contains_key("33") && entry.len() == 3,
        "three alternatives, the prompt token among them once: {entry:?}"
    );
    assert_eq!(entry["33"]["rank"], 2);
    let (status, none) = harness
        .post("/inference/v1/generate", json!({"sampling_params": {"max_tokens": 1, "prompt_logprobs": null}, "model": "meow", "token_ids": PROMPT}))
        .await;
    assert_eq!((status, none.get("prompt_logprobs")), (StatusCode::OK, None), "null asks for none");
}

#[tokio::test]
async fn prime_rls_prefill_logprobs_reads_the_first_value_of_each_position() {
    let harness = serve(&["meow"]).await;
    // No model: the base model; unset max_tokens would mean up to the context, here 1. The scripted alternative
    // of prompt token 99 is 100, which sorts before it as text: the order must be kept, not sorted.
    let body = json!({"token_ids": [72, 99], "sampling_params": {"max_tokens": 1, "temperature": 1.0, "top_p": 1.0, "prompt_logprobs": 1}});
    let response = harness.client.post(harness.url("/inference/v1/generate")).json(&body).send().await.expect("send");
    let text = response.text().await.expect("body");
    assert!(text.find(r#""99":"#) < text.find(r#""100":"#), "the prompt token's own entry first: {text}");
    let body: Value = serde_json::from_str(&text).expect("json");
    assert_eq!(body["model"], SERVED_NAME);
    assert!((body["prompt_logprobs"][1]["99"]["logprob"].as_f64().expect("number") + 0.1).abs() < 1e-6);
}

#[tokio::test]
async fn an_aborted_generate_returns_its_tokens_and_a_held_one_waits_for_resume() {
    let harness = serve(&["meow"]).await;
    let body = json!({"model": "meow", "token_ids": PROMPT, "sampling_params": {"max_tokens": 50, "logprobs": 0}});
    let running = harness.spawn_post("/inference/v1/generate", body.clone(), "gen-abort");
    eventually("the request runs", || async { harness.status_of("meow").await.in_flight == 1 }).await;
    let report = harness.pause("meow").await;
    assert_eq!(report["aborted"], json!(["gen-abort"]));
    let (status, aborted) = running.await.expect("task");
    assert_eq!(status, StatusCode::OK, "{aborted}");
    let choice = &aborted["choices"][0];
    assert_eq!((&choice["finish_reason"], &choice["token_ids"]), (&json!("abort"), &json!([0, 1, 2])));
    assert_eq!(choice["logprobs"]["content"].as_array().map(Vec::len), Some(3));

    // Not behind the middleware: the core's gate holds the parsed request.
    let held = harness.spawn_post(
        "/inference/v1/generate",
        json!({"model": "meow", "token_ids": PROMPT, "sampling_params": {"max_tokens": 2}}),
        "gen-held",
    );
    eventually("the request is held", || async { harness.status_of("meow").await.held == 1 }).await;
    assert!(!held.is_finished());
    harness.resume("meow").await;
    let (status, released) = held.await.expect("task");
    assert_eq!((status, &released["choices"][0]["finish_reason"]), (StatusCode::OK, &json!("length")));
}

#[tokio::test]
async fn a_streamed_generate_sends_token_chunks_then_usage() {
    let harness = serve(&["meow"]).await;
    let body = json!({"model": "meow", "token_ids": PROMPT, "sampling_params": {"max_tokens": 3, "logprobs": 0},
        "stream_options": {"include_usage": true}});
    let chunks = harness.stream("/inference/v1/generate", body).await;
    let tokens: Vec<Value> = chunks
        .iter()
        .flat_map(|chunk| chunk["choices"].as_array().into_iter().flatten())
        .flat_map(|choice| choice["token_ids"].as_array().cloned().unwrap_or_default())
        .collect();
    assert_eq!(tokens, vec![json!(0), json!(1), json!(2)]);
    let finishes: Vec<&Value> =
        chunks.iter().filter_map(|chunk| chunk["choices"][0].get("finish_reason")).filter(|r| !r.is_null()).collect();
    assert_eq!(finishes, vec![&json!("length")]);
    assert_eq!(chunks.last().map(|chunk| chunk["usage"]["completion_tokens"].clone()), Some(json!(3)));
}

#[tokio::test]
async fn abort_requests_aborts_generate_requests_by_id_without_pausing_anything() {
    let harness = serve(&["meow"]).await;
    let body = |id: &str| json!({"model": "meow", "token_ids": PROMPT, "request_id": id, "sampling_params": {"max_tokens": 50, "logprobs": 0}});
    let first = harness.spawn_post("/inference/v1/generate", body("fleet-1"), "x");
    let other = harness.spawn_post("/inference/v1/generate", body("fleet-2"), "y");
    eventually("both run", || async { harness.status_of("meow").await.in_flight == 2 }).await;
    let (status, _) = harness.post_empty("/inference/v1/abort_requests", json!({"request_ids": ["fleet-1"]})).await;
    assert_eq!(status, StatusCode::OK);
    let (status, aborted) = first.await.expect("task");
    assert_eq!(status, StatusCode::OK, "{aborted}");
    assert_eq!(aborted["request_id"], "fleet-1", "the id the caller gave is the id to abort");
    let choice = &aborted["choices"][0];
    assert_eq!((&choice["finish_reason"], &choice["token_ids"]), (&json!("abort"), &json!([0, 1, 2])));
    let meow = harness.status_of("meow").await;
    assert_eq!((meow.paused, meow.in_flight), (false, 1), "nothing paused; the other request still runs");

    let (status, _) = harness.post_empty("/inference/v1/abort_requests", json!({"request_ids": []})).await;
    assert_eq!(status, StatusCode::OK, "an empty list aborts nothing");
    assert_eq!(harness.status_of("meow").await.in_flight, 1);
    let (status, _) = harness.post_empty("/inference/v1/abort_requests", json!({})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "request_ids is required");
    let (status, _) = harness.post_empty("/inference/v1/abort_requests", json!({"request_ids": ["fleet-2"]})).await;
    assert_eq!(status, StatusCode::OK);
    let (_, aborted) = other.await.expect("task");
    assert_eq!(aborted["choices"][0]["finish_reason"], "abort");
}
