//! SGLang's `POST /generate`: AReaL's, skyrl-train's, verl's and slime's bodies, SGLang's shapes (one object or a
//! list), logprob triples, finish reasons, aborts with their tokens, and the gate in `Coordinator::sample`.

use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::*;

const PROMPT: [u32; 3] = [72, 105, 33];

#[tokio::test]
async fn areals_body_answers_one_object_with_output_token_logprobs() {
    let harness = serve(&["meow-v2"]).await;
    let body = json!({"input_ids": PROMPT, "image_data": [], "sampling_params": {"top_p": 1.0, "top_k": 100000000,
        "max_new_tokens": 3, "temperature": 0.7, "stop_token_ids": [], "ignore_eos": false,
        "skip_special_tokens": true, "frequency_penalty": 0.0}, "return_logprob": true, "stream": false,
        "lora_path": "meow-v2", "rid": "areal-1"});
    let (status, body) = harness.post("/generate", body).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!((&body["text"], &body["output_ids"]), (&json!("\u{0}\u{1}\u{2}"), &json!([0, 1, 2])));
    let meta = &body["meta_info"];
    assert_eq!(
        (&meta["id"], &meta["prompt_tokens"], &meta["completion_tokens"]),
        (&json!("areal-1"), &json!(3), &json!(3))
    );
    assert_eq!(meta["finish_reason"], json!({"type": "length", "length": 3}));
    let triples = meta["output_token_logprobs"].as_array().expect("triples");
    let ids: Vec<Value> = triples.iter().map(|triple| triple[1].clone()).collect();
    assert_eq!(json!(ids), body["output_ids"], "AReaL's [x[1] for x] gives the tokens");
    assert_eq!(triples[0], json!([0.0, 0, null]));
    assert_eq!(meta["weight_version"], "1");
}

#[tokio::test]
async fn a_batch_answers_a_list_one_object_per_prompt_in_order() {
    let harness = serve(&["meow"]).await;
    // skyrl-train's SGLang body: no adapter (the base model), sampling params verbatim.
    let body = json!({"input_ids": [PROMPT, [33]], "sampling_params": {"max_new_tokens": 2, "temperature": 0}});
    let (status, body) = harness.post("/generate", body).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let outputs = body.as_array().expect("a list");
    assert_eq!(outputs.len(), 2);
    for output in outputs {
        assert_eq!(
            (&output["output_ids"], &output["meta_info"]["finish_reason"]["type"]),
            (&json!([0, 1]), &json!("length"))
        );
    }
    assert_eq!(
        (&outputs[0]["meta_info"]["prompt_tokens"], &outputs[1]["meta_info"]["prompt_tokens"]),
        (&json!(3), &json!(1))
    );
    assert!(outputs[0]["meta_info"].get("output_token_logprobs").is_none(), "not asked for");
    let (status, text) =
        harness.post("/generate", json!({"text": ["ab"], "sampling_params": {"max_new_tokens": 1}})).await;
    assert_eq!(
        (status, text[0]["meta_info"]["prompt_tokens"].clone()),
        (StatusCode::OK, json!(3)),
        "text gets the BOS"
    );
}

#[tokio::test]
async fn areals_scoring_asks_for_input_logprobs_from_logprob_start_len() {
    let harness = serve(&["meow"]).await;
    let body = json!({"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
        "return_logprob": true, "logprob_start_len": 1, "top_logprobs_num": 0, "stream": false});
    let (status, body) = harness.post("/generate", body).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let input = body["meta_info"]["input_token_logprobs"].as_array().expect("input logprobs");
    assert_eq!(input.len(), 2, "from position 1 on");
    assert!(input.iter().all(|triple| triple[0].is_number()), "no null past position 0: {input:?}");
    assert_eq!((&input[0][1], &input[1][1]), (&json!(105), &json!(33)));
    let (_, from_zero) = harness
        .post("/generate", json!({"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 1}, "return_logprob": true, "logprob_start_len": 0, "top_logprobs_num": 1}))
        .await;
    let meta = &from_zero["meta_info"];
    assert_eq!(meta["input_token_logprobs"][0], json!([null, 72, null]));
    assert_eq!(meta["input_top_logprobs"][1], json!([[0.4, 106, null]]), "the scripted prompt token ranks 2");
}

#[tokio::test]
async fn an_aborted_generate_answers_200_with_its_tokens_and_a_held_one_waits() {
    let harness = serve(&["meow"]).await;
    let body = json!({"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 50}, "return_logprob": true,
        "lora_path": "meow", "rid": "slime-1"});
    let running = harness.spawn_post("/generate", body.clone(), "ignored");
    eventually("the request runs", || async { harness.status_of("meow").await.in_flight == 1 }).await;
    assert_eq!(harness.pause("meow").await["aborted"], json!(["slime-1"]), "the core request's id is the rid");
    let (status, aborted) = running.await.expect("task");
    assert_eq!(status, StatusCode::OK, "{aborted}");
    assert_eq!(aborted["output_ids"], json!([0, 1, 2]));
    assert_eq!(aborted["meta_info"]["finish_reason"]["type"], "abort");
    assert_eq!(aborted["meta_info"]["output_token_logprobs"].as_array().map(Vec::len), Some(3));

    let held = harness.spawn_post(
        "/generate",
        json!({"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 2}, "lora_path": "meow"}),
        "x",
    );
    eventually("the request is held", || async { harness.status_of("meow").await.held == 1 }).await;
    harness.resume("meow").await;
    let (status, released) = held.await.expect("task");
    assert_eq!((status, &released["meta_info"]["finish_reason"]["type"]), (StatusCode::OK, &json!("length")));
}

#[tokio::test]
async fn a_stream_sends_the_whole_output_so_far_in_every_chunk() {
    let harness = serve(&["meow"]).await;
    let chunks =
        harness.stream("/generate", json!({"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 3}})).await;
    let last = chunks.last().expect("chunks");
    assert_eq!((&last["output_ids"], &last["text"]), (&json!([0, 1, 2]), &json!("\u{0}\u{1}\u{2}")));
    assert_eq!(last["meta_info"]["finish_reason"]["type"], "length");
    let lengths: Vec<usize> = chunks.iter().map(|chunk| chunk["output_ids"].as_array().map_or(0, Vec::len)).collect();
    assert!(lengths.windows(2).all(|pair| pair[0] <= pair[1]), "cumulative: {lengths:?}");
}

/// Answers `/abort_request` for `rid` (or `abort_all`) while the aborted request is still held before its hand-back,
/// checking that its cancel was requested; then lets it end and checks it answers `abort` with its tokens.
async fn answers_before_the_hand_back(abort: Value, rid: &str) {
    let permits = Arc::new(tokio::sync::Semaphore::new(0));
    let cancels: Arc<std::sync::Mutex<Vec<CancellationToken>>> = Arc::default();
    let seen = cancels.clone();
    let engine = ScriptedEngine::new(HOLD_AFTER)
        .with_abort_permits(permits.clone())
        .with_generate_hook(Box::new(move |_, cancel| seen.lock().expect("lock").push(cancel.clone())));
    // Waiting for the hand-back would outlast the test.
    let config = CoordinatorConfig { abort_ack_timeout: Duration::from_secs(3600), ..CoordinatorConfig::default() };
    let harness = serve_engine(engine, config, &["meow"]).await;
    let body = json!({"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 50}, "lora_path": "meow", "rid": rid});
    let generate = harness.spawn_post("/generate", body, "x");
    eventually("it runs", || async { harness.status_of("meow").await.in_flight == 1 }).await;
    let answered = tokio::time::timeout(Duration::from_secs(60), harness.post_empty("/abort_request", abort.clone()));
    let (status, answer) = answered.await.expect("answered without waiting for the hand-back");
    assert_eq!((status, answer.as_str()), (StatusCode::OK, ""), "{abort}");
    let cancelled: Vec<bool> = cancels.lock().expect("lock").iter().map(CancellationToken::is_cancelled).collect();
    assert_eq!(cancelled, [true], "the cancel was requested before the answer ({abort})");
    assert_eq!(harness.status_of("meow").await.in_flight, 1, "answered before the hand-back ({abort})");
    permits.add_permits(1);
    let (status, aborted) = generate.await.expect("task");
    assert_eq!((status, &aborted["meta_info"]["finish_reason"]["type"]), (StatusCode::OK, &json!("abort")));
    assert_eq!(aborted["output_ids"], json!([0, 1, 2]), "handed back with its tokens");
    eventually("handed back", || async { harness.status_of("meow").await.in_flight == 0 }).await;
}

#[tokio::test]
async fn abort_request_answers_once_the_cancel_was_requested_not_once_handed_back() {
    answers_before_the_hand_back(json!({"rid": "held-rid"}), "held-rid").await;
    answers_before_the_hand_back(json!({"abort_all": true}), "held-rid").await;
}

#[tokio::test]
async fn abort_request_aborts_one_rid_or_all_without_pausing_anything() {
    let harness = serve(&["meow", "woof"]).await;
    let long = |lora: &str, rid: &str| json!({"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 50}, "lora_path": lora, "rid": rid});
    let first = harness.spawn_post("/generate", long("meow", "fwbar-rid-1"), "x");
    let other = harness.spawn_post("/generate", long("meow", "fwbar-rid-2"), "x");
    eventually("both run", || async { harness.status_of("meow").await.in_flight == 2 }).await;
    let response = harness
        .client
        .post(harness.url("/abort_request"))
        .json(&json!({"rid": "fwbar-rid-1", "abort_all": false}))
        .send();
    let response = response.await.expect("send");
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.text().await.expect("body"), "", "SGLang answers an empty 200");
    let (status, aborted) = first.await.expect("task");
    assert_eq!((status, &aborted["meta_info"]["finish_reason"]["type"]), (StatusCode::OK, &json!("abort")));
    assert_eq!(aborted["output_ids"], json!([0, 1, 2]), "handed back with its tokens");
    let meow = harness.status_of("meow").await;
    assert_eq!((meow.paused, meow.in_flight), (false, 1), "nothing paused; the other rid still runs");
    let (status, fresh) = harness
        .post("/generate", json!({"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 2}, "lora_path": "meow"}))
        .await;
    assert_eq!(
        (status, &fresh["meta_info"]["finish_reason"]["type"]),
        (StatusCode::OK, &json!("length")),
        "admitted at once"
    );

    let third = harness.spawn_post("/generate", long("woof", "slime-3"), "x");
    eventually("woof runs too", || async { harness.status_of("woof").await.in_flight == 1 }).await;
    let (status, _) = harness.post_empty("/abort_request", json!({"abort_all": true})).await;
    assert_eq!(status, StatusCode::OK);
    for task in [other, third] {
        let (_, answer) = task.await.expect("task");
        assert_eq!(answer["meta_info"]["finish_reason"]["type"], "abort", "{answer}");
    }
    let (status, _) = harness.post_empty("/abort_request", json!({"rid": "no-such-rid"})).await;
    assert_eq!(status, StatusCode::OK, "an unknown rid aborts nothing");
    let (status, _) = harness.post_empty("/abort_request", json!({"rid": "bad\nrid"})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}
