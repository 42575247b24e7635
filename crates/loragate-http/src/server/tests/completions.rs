//! `POST /v1/completions`: shapes, field mapping, stop strings, logprobs, streaming, aborts.

use std::sync::Mutex;

use futures::StreamExt;
use loragate_core::{AdapterKey, SampleRequest};
use serde_json::json;

use super::*;
use loragate_text::testing::BOS;

#[tokio::test]
async fn a_completion_on_an_adapter_has_openai_shape_with_token_ids_and_segments() {
    let harness = serve(&["meow"]).await;
    let response = harness
        .client
        .post(harness.url("/v1/completions"))
        .header("X-Request-Id", "req-1")
        .json(&json!({"model": "meow", "prompt": "Hi", "max_tokens": 2}))
        .send()
        .await
        .expect("send");
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["x-request-id"], "req-1");
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["id"], "cmpl-req-1");
    assert_eq!(body["object"], "text_completion");
    assert_eq!(body["model"], "meow");
    assert!(body["created"].as_u64().is_some_and(|created| created > 1_700_000_000), "{body}");
    assert_eq!(
        body["choices"],
        json!([{
            "index": 0, "text": "\u{0}\u{1}", "logprobs": null, "finish_reason": "length", "stop_reason": null,
            "token_ids": [0, 1], "prompt_logprobs": null, "segments": [{"lora_version": 1, "kv_version": 1, "start": 0, "end": 2}],
        }])
    );
    assert_eq!(body["usage"], usage(3, 2), "BOS + Hi");

    let (status, generated) =
        harness.post("/v1/completions", json!({"model": "meow", "prompt": [72, 105], "max_tokens": 1})).await;
    assert_eq!(status, StatusCode::OK);
    let id = generated["id"].as_str().expect("id");
    assert!(id.starts_with("cmpl-") && id.len() > "cmpl-".len(), "the server makes an id without the header: {id}");
}

#[tokio::test]
async fn openai_fields_reach_the_core_with_openai_defaults() {
    let seen: Arc<Mutex<Vec<SampleRequest>>> = Arc::default();
    let record = seen.clone();
    let engine = ScriptedEngine::new(HOLD_AFTER).with_generate_hook(Box::new(move |request, _cancel| {
        record.lock().expect("lock").push(request.clone());
    }));
    let harness = serve_engine(engine, CoordinatorConfig::default(), &["meow"]).await;

    let (status, base) =
        harness.post("/v1/completions", json!({"model": SERVED_NAME, "prompt": [72, 105, 33], "max_tokens": 2})).await;
    assert_eq!(status, StatusCode::OK, "{base}");
    assert_eq!(base["choices"][0]["segments"][0]["lora_version"], 0, "the base model is version 0");
    let body = json!({
        "model": "meow", "prompt": ["Hi"], "max_tokens": 2, "temperature": 0, "top_p": 0.5, "top_k": 5,
        "seed": 7, "stop_token_ids": [9], "ignore_eos": true, "n": 2, "best_of": 2, "user": "ignored",
    });
    assert_eq!(harness.post("/v1/completions", body).await.0, StatusCode::OK);
    // Unset max_tokens means up to the context length; the stop string ends the otherwise endless request.
    let (status, unbounded) =
        harness.post("/v1/completions", json!({"model": "meow", "prompt": "Hi", "stop": "\u{2}"})).await;
    assert_eq!((status, &unbounded["choices"][0]["finish_reason"]), (StatusCode::OK, &json!("stop")));

    let seen = seen.lock().expect("lock").clone();
    let [base, tuned, unbounded] = <[SampleRequest; 3]>::try_from(seen).expect("three requests reached the engine");
    assert_eq!(base.adapter(), &AdapterKey::Base, "the served name addresses the base model");
    assert_eq!(&base.prompt()[..], &[72, 105, 33]);
    assert_eq!(base.params().temperature(), 1.0, "OpenAI's default temperature");
    assert_eq!((base.params().top_p(), base.params().top_k(), base.params().seed()), (1.0, None, None));
    assert_eq!((base.num_samples(), base.params().ignore_eos()), (1, false));

    assert_eq!(tuned.adapter().as_wire_str(), "meow");
    assert_eq!(&tuned.prompt()[..], &[BOS, 72, 105], "a text prompt is encoded with the codec's special tokens");
    assert!(tuned.params().is_greedy());
    assert_eq!((tuned.params().top_p(), tuned.params().top_k(), tuned.params().seed()), (0.5, Some(5), Some(7)));
    assert_eq!((tuned.params().stop_token_ids(), tuned.params().ignore_eos()), (&[9][..], true));
    assert_eq!((tuned.num_samples(), tuned.params().max_tokens()), (2, 2));

    assert_eq!(unbounded.params().max_tokens(), 4096 - 3, "no hidden default budget (the prompt is BOS + Hi)");
}

#[tokio::test]
async fn each_of_n_choices_gets_its_own_tokens_and_usage_counts_them_all() {
    let harness = serve(&["meow"]).await;
    let (status, body) =
        harness.post("/v1/completions", json!({"model": "meow", "prompt": "x", "n": 2, "max_tokens": 3})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    for index in 0..2 {
        let choice = &body["choices"][index];
        assert_eq!(choice["index"], index);
        assert_eq!(choice["token_ids"], json!([0, 1, 2]));
        assert_eq!(choice["finish_reason"], "length");
    }
    assert_eq!(body["usage"]["completion_tokens"], 6);
}

#[tokio::test]
async fn logprobs_are_openai_shaped_with_the_sampled_token_then_the_k_most_likely() {
    let harness = serve(&["meow"]).await;
    let (status, body) =
        harness.post("/v1/completions", json!({"model": "meow", "prompt": "x", "max_tokens": 3, "logprobs": 5})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let logprobs = &body["choices"][0]["logprobs"];
    assert_eq!(logprobs["tokens"], json!(["\u{0}", "\u{1}", "\u{2}"]));
    assert_eq!(logprobs["text_offset"], json!([0, 1, 2]));
    let values: Vec<f64> =
        logprobs["token_logprobs"].as_array().expect("array").iter().map(|v| v.as_f64().expect("number")).collect();
    assert_eq!(values.len(), 3);
    for (value, expected) in values.iter().zip([0.0, -0.01, -0.02]) {
        assert!((value - expected).abs() < 1e-6, "{values:?}");
    }
    let top = logprobs["top_logprobs"].as_array().expect("array");
    assert_eq!(top.len(), 3);
    let keys: Vec<String> = ["\u{1}", "\u{2}", "\u{3}", "\u{4}", "\u{5}"].map(str::to_owned).to_vec();
    assert_eq!(top[1].as_object().map(|entry| entry.keys().cloned().collect::<Vec<_>>()), Some(keys));
}

#[tokio::test]
async fn a_stop_string_truncates_the_text_and_stops_the_engine() {
    // 100 tokens per request at once (bytes 0..100), then the engine waits to be aborted.
    let harness = serve_engine(ScriptedEngine::new(100), CoordinatorConfig::default(), &["meow"]).await;
    let expected_text: String = (0u8..65).map(char::from).collect();
    let body = json!({"model": "meow", "prompt": "x", "max_tokens": 500, "stop": ["zz", "AB"]});
    let (status, unary) = harness.post("/v1/completions", body.clone()).await;
    assert_eq!(status, StatusCode::OK, "{unary}");
    let choice = &unary["choices"][0];
    assert_eq!(choice["text"], expected_text, "the text ends before the stop string");
    assert_eq!(choice["finish_reason"], "stop");
    assert_eq!(choice["token_ids"].as_array().map(Vec::len), Some(67), "tokens end with the one completing it");
    assert_eq!(choice["segments"], json!([{"lora_version": 1, "kv_version": 1, "start": 0, "end": 67}]));
    eventually("the engine's request ends", || async { harness.status_of("meow").await.in_flight == 0 }).await;

    let mut streamed = body;
    streamed["stream"] = json!(true);
    let response = harness.client.post(harness.url("/v1/completions")).json(&streamed).send().await.expect("send");
    let chunks = sse_chunks(&response.text().await.expect("body"));
    let text: String = chunks.iter().map(|chunk| chunk["choices"][0]["text"].as_str().expect("text")).collect();
    assert_eq!(text, expected_text, "a streamed stop string is never sent");
    assert_eq!(chunks.last().map(|chunk| chunk["choices"][0]["finish_reason"].clone()), Some(json!("stop")));
    eventually("the streamed request ends", || async { harness.status_of("meow").await.in_flight == 0 }).await;
}

#[tokio::test]
async fn a_stream_sends_token_chunks_then_the_finish_reason_then_done() {
    let harness = serve(&["meow"]).await;
    let body = json!({"model": "meow", "prompt": "x", "max_tokens": 3, "stream": true});
    let response = harness
        .client
        .post(harness.url("/v1/completions"))
        .header("X-Request-Id", "s-1")
        .json(&body)
        .send()
        .await
        .expect("send");
    assert_eq!(response.status(), StatusCode::OK);
    assert!(response.headers()["content-type"].to_str().is_ok_and(|t| t.starts_with("text/event-stream")));
    let chunks = sse_chunks(&response.text().await.expect("body"));
    assert!(chunks.len() >= 2, "{chunks:?}");
    let mut token_ids = Vec::new();
    for (position, chunk) in chunks.iter().enumerate() {
        assert_eq!(
            (&chunk["id"], &chunk["object"], &chunk["model"]),
            (&json!("cmpl-s-1"), &json!("text_completion"), &json!("meow"))
        );
        let choice = &chunk["choices"][0];
        let is_last = position + 1 == chunks.len();
        assert_eq!(choice["finish_reason"].is_null(), !is_last, "only the last chunk finishes: {chunk}");
        token_ids.extend(choice["token_ids"].as_array().expect("token_ids").iter().cloned());
    }
    assert_eq!(token_ids, vec![json!(0), json!(1), json!(2)]);
    let last = &chunks[chunks.len() - 1]["choices"][0];
    assert_eq!(last["finish_reason"], "length");
    assert_eq!(last["segments"], json!([{"lora_version": 1, "kv_version": 1, "start": 0, "end": 3}]));
}

#[tokio::test]
async fn an_aborted_stream_ends_with_finish_reason_abort_then_done() {
    let harness = serve(&["meow"]).await;
    let body = json!({"model": "meow", "prompt": "x", "max_tokens": 50, "n": 2, "stream": true});
    let response = harness
        .client
        .post(harness.url("/v1/completions"))
        .header("X-Request-Id", "long-1")
        .json(&body)
        .send()
        .await
        .expect("send");
    let mut bytes = response.bytes_stream();
    let mut received = String::new();
    // Both choices' first tokens arrive, then the engine waits.
    while received.matches("token_ids").count() < 2 {
        let piece = bytes.next().await.expect("more of the stream").expect("bytes");
        received.push_str(std::str::from_utf8(&piece).expect("utf-8"));
    }
    assert!(!received.contains("[DONE]"));
    let report = harness.pause("meow").await;
    assert_eq!(report["aborted"], json!(["long-1"]), "{report}");
    assert_eq!(report["count"], 1);
    while let Some(piece) = bytes.next().await {
        received.push_str(std::str::from_utf8(&piece.expect("bytes")).expect("utf-8"));
    }
    let chunks = sse_chunks(&received);
    let finishes: Vec<&Value> =
        chunks.iter().map(|chunk| &chunk["choices"][0]).filter(|c| !c["finish_reason"].is_null()).collect();
    assert_eq!(finishes.len(), 2, "each choice ends once: {chunks:?}");
    for choice in finishes {
        assert_eq!(choice["finish_reason"], "abort");
        assert_eq!(choice["segments"], json!([{"lora_version": 1, "kv_version": 1, "start": 0, "end": 3}]));
    }
    harness.resume("meow").await;
}

#[tokio::test]
async fn an_aborted_completion_returns_its_partial_tokens_with_finish_reason_abort() {
    let harness = serve(&["meow"]).await;
    let running = harness.spawn_completion(json!({"model": "meow", "prompt": "x", "max_tokens": 50}), "partial-1");
    eventually("the request runs", || async { harness.status_of("meow").await.in_flight == 1 }).await;
    assert!(!running.is_finished());
    let report = harness.pause("meow").await;
    assert_eq!(
        (&report["status"], &report["aborted"], &report["count"]),
        (&json!("ok"), &json!(["partial-1"]), &json!(1))
    );
    let (status, body) = running.await.expect("task");
    assert_eq!(status, StatusCode::OK, "{body}");
    let choice = &body["choices"][0];
    assert_eq!((&choice["finish_reason"], &choice["token_ids"]), (&json!("abort"), &json!([0, 1, 2])));
    assert_eq!(choice["text"], "\u{0}\u{1}\u{2}");
    assert_eq!(body["id"], "cmpl-partial-1");
    harness.resume("meow").await;
}

#[tokio::test]
async fn a_client_that_disconnects_midway_cancels_its_request() {
    let harness = serve(&["meow"]).await;
    let unary = harness.spawn_completion(json!({"model": "meow", "prompt": "x", "max_tokens": 50}), "left-1");
    eventually("the unary request runs", || async { harness.status_of("meow").await.in_flight == 1 }).await;
    unary.abort();
    eventually("the unary request is cancelled", || async { harness.status_of("meow").await.in_flight == 0 }).await;

    let body = json!({"model": "meow", "prompt": "x", "max_tokens": 50, "stream": true});
    let response = harness.client.post(harness.url("/v1/completions")).json(&body).send().await.expect("send");
    let mut bytes = response.bytes_stream();
    bytes.next().await.expect("a first chunk").expect("bytes");
    assert_eq!(harness.status_of("meow").await.in_flight, 1);
    drop(bytes);
    eventually("the stream is cancelled", || async { harness.status_of("meow").await.in_flight == 0 }).await;
    let meow = harness.status_of("meow").await;
    assert!(!meow.paused && meow.held == 0, "a departed client changes nothing else: {meow:?}");
}

/// A server whose engine records every request it is given.
async fn recording(adapters: &[&str]) -> (Harness, Arc<Mutex<Vec<SampleRequest>>>) {
    let seen: Arc<Mutex<Vec<SampleRequest>>> = Arc::default();
    let record = seen.clone();
    let engine = ScriptedEngine::new(HOLD_AFTER).with_generate_hook(Box::new(move |request, _cancel| {
        record.lock().expect("lock").push(request.clone());
    }));
    (serve_engine(engine, CoordinatorConfig::default(), adapters).await, seen)
}

#[tokio::test]
async fn a_batch_is_one_core_request_per_prompt_with_choices_indexed_prompt_by_sample() {
    let (harness, seen) = recording(&["meow"]).await;
    // skyrl-train's body: its sampling params flat, token-id prompts as a list of lists.
    let body = json!({"model": "meow", "prompt": [[72, 105], [33]], "n": 2, "max_tokens": 2, "temperature": 0});
    let response =
        harness.client.post(harness.url("/v1/completions")).header("X-Request-Id", "b1").json(&body).send().await;
    let response = response.expect("send");
    assert_eq!(response.headers()["x-request-id"], "b1");
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["id"], "cmpl-b1");
    let choices = body["choices"].as_array().expect("choices");
    assert_eq!(choices.len(), 4);
    for (index, choice) in choices.iter().enumerate() {
        assert_eq!((&choice["index"], &choice["token_ids"]), (&json!(index), &json!([0, 1])), "{body}");
    }
    assert_eq!(body["usage"], usage(3, 8));
    let seen = seen.lock().expect("lock").clone();
    let ids: Vec<&str> = seen.iter().map(|request| request.id().as_str()).collect();
    assert_eq!(ids, ["b1-0", "b1-1"], "one core request per prompt, each with its own id");
    assert_eq!((&seen[0].prompt()[..], &seen[1].prompt()[..]), (&[72, 105][..], &[33][..]));
    assert!(seen.iter().all(|request| request.num_samples() == 2));
}

#[tokio::test]
async fn an_abort_hands_back_every_prompt_of_a_batch_each_under_its_own_id() {
    let harness = serve(&["meow"]).await;
    let body = json!({"model": "meow", "prompt": ["a", "b"], "max_tokens": 50});
    let running = harness.spawn_completion(body, "pair");
    eventually("both prompts run", || async { harness.status_of("meow").await.in_flight == 2 }).await;
    let report = harness.pause("meow").await;
    let mut aborted: Vec<String> =
        report["aborted"].as_array().expect("ids").iter().map(|id| id.as_str().expect("id").to_owned()).collect();
    aborted.sort();
    assert_eq!(aborted, ["pair-0", "pair-1"]);
    let (status, body) = running.await.expect("task");
    assert_eq!(status, StatusCode::OK, "{body}");
    for choice in body["choices"].as_array().expect("choices") {
        assert_eq!((&choice["finish_reason"], &choice["token_ids"]), (&json!("abort"), &json!([0, 1, 2])));
    }
    harness.resume("meow").await;
}

#[tokio::test]
async fn areals_scoring_request_echoes_the_prompt_with_vllms_prompt_logprobs_on_the_base_model() {
    let (harness, seen) = recording(&["meow"]).await;
    // No model: the served base model. Prompt logprobs with one alternative each.
    let body = json!({"prompt": [72, 105, 33], "max_tokens": 1, "temperature": 0.0, "logprobs": 1,
        "prompt_logprobs": 1, "echo": true});
    let response = harness.client.post(harness.url("/v1/completions")).json(&body).send().await.expect("send");
    assert_eq!(response.status(), StatusCode::OK);
    let text = response.text().await.expect("body");
    assert!(text.find(r#""105":"#) < text.find(r#""106":"#), "the prompt token's own entry comes first: {text}");
    let body: Value = serde_json::from_str(&text).expect("json");
    let choice = &body["choices"][0];
    assert_eq!(body["model"], SERVED_NAME);
    // The scripted engine: prompt token i has logprob -0.1 i and ranks 2 behind token + 1 (logprob + 0.5).
    let prompt_logprobs = &choice["prompt_logprobs"];
    assert_eq!(prompt_logprobs[0], json!(null));
    let second = &prompt_logprobs[1];
    assert_eq!((&second["105"]["rank"], &second["105"]["decoded_token"]), (&json!(2), &json!("i")));
    assert!((second["105"]["logprob"].as_f64().expect("number") + 0.1).abs() < 1e-6);
    assert_eq!(second["106"]["rank"], 1);
    assert_eq!(prompt_logprobs.as_array().map(Vec::len), Some(3));
    assert_eq!(choice["text"], "Hi!\u{0}", "echo puts the prompt first");
    let logprobs = &choice["logprobs"];
    assert_eq!(logprobs["tokens"], json!(["H", "i", "!", "\u{0}"]));
    assert_eq!(logprobs["token_logprobs"][0], json!(null), "nothing predicts the first prompt token");
    assert_eq!(logprobs["text_offset"], json!([0, 1, 2, 3]));
    let request = seen.lock().expect("lock")[0].clone();
    assert_eq!((request.adapter(), request.prompt_top_logprobs()), (&AdapterKey::Base, Some(1)));
}

#[tokio::test]
async fn areals_generation_request_reads_token_ids_from_token_id_labels() {
    let harness = serve(&["meow-v1"]).await;
    let body = json!({"top_p": 1.0, "top_k": 100000000, "max_tokens": 3, "temperature": 0.7, "stop_token_ids": [],
        "ignore_eos": false, "skip_special_tokens": true, "return_tokens_as_token_ids": true, "logprobs": 0,
        "use_beam_search": false, "stream": false, "prompt": [72, 105], "model": "meow-v1"});
    let (status, body) = harness.post("/v1/completions", body).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let logprobs = &body["choices"][0]["logprobs"];
    let ids: Vec<u64> = logprobs["tokens"]
        .as_array()
        .expect("tokens")
        .iter()
        .map(|token| token.as_str().and_then(|t| t.split(':').nth(1)).and_then(|n| n.parse().ok()).expect("token_id:N"))
        .collect();
    assert_eq!(json!(ids), body["choices"][0]["token_ids"], "AReaL's int(tok.split(':')[1]) gives the tokens");
    assert_eq!(logprobs["top_logprobs"][1], json!({"token_id:1": -0.01}), "logprobs 0: the sampled token only");
}

#[tokio::test]
async fn a_stream_can_end_with_openais_usage_chunk() {
    let harness = serve(&["meow"]).await;
    let body = json!({"model": "meow", "prompt": [1, 2], "max_tokens": 3, "stream_options": {"include_usage": true}});
    let chunks = harness.stream("/v1/completions", body).await;
    let last = chunks.last().expect("chunks");
    assert_eq!(last["choices"], json!([]));
    assert_eq!(last["usage"], usage(2, 3));
    assert!(chunks[..chunks.len() - 1].iter().all(|chunk| chunk.get("usage").is_none()));
}

#[tokio::test]
async fn the_extended_sampling_fields_reach_the_core_and_neutral_ones_are_accepted() {
    let (harness, seen) = recording(&["meow"]).await;
    let body = json!({"model": "meow", "prompt": [1], "max_tokens": 3, "min_p": 0.05, "repetition_penalty": 1.2,
        "presence_penalty": 0.5, "frequency_penalty": -0.5, "min_tokens": 1, "include_stop_str_in_output": true,
        "stop": null, "skip_special_tokens": true, "use_beam_search": false, "best_of": 1, "logit_bias": {},
        "cache_salt": "s", "output_kind": 2});
    let (status, body) = harness.post("/v1/completions", body).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let request = seen.lock().expect("lock")[0].clone();
    let params = request.params();
    assert_eq!((params.min_p(), params.repetition_penalty(), params.min_tokens()), (0.05, 1.2, 1));
    assert_eq!((params.presence_penalty(), params.frequency_penalty()), (0.5, -0.5));
}

#[tokio::test]
async fn include_stop_str_in_output_keeps_the_stop_string_in_the_text() {
    let harness = serve_engine(ScriptedEngine::new(100), CoordinatorConfig::default(), &["meow"]).await;
    let body =
        json!({"model": "meow", "prompt": "x", "max_tokens": 500, "stop": ["AB"], "include_stop_str_in_output": true});
    let (status, body) = harness.post("/v1/completions", body).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let expected: String = (0u8..67).map(char::from).collect();
    assert_eq!(body["choices"][0]["text"], expected, "the text ends with the stop string");
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
}
