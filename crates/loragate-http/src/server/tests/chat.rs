//! `POST /v1/chat/completions`: the chat template, OpenAI's shapes (unary and streamed), logprobs, `n`, aborts.

use serde_json::json;

use super::*;

fn chat(model: &str, extra: Value) -> Value {
    let mut body = json!({"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_completion_tokens": 2});
    if let (Some(body), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
        body.extend(extra.clone());
    }
    body
}

#[tokio::test]
async fn messages_are_rendered_with_the_template_and_encoded_without_special_tokens() {
    let harness = serve_with_chat(&["meow"]).await;
    let body = chat("meow", json!({"return_token_ids": true, "n": 2, "temperature": 0}));
    let response =
        harness.client.post(harness.url("/v1/chat/completions")).header("X-Request-Id", "c1").json(&body).send().await;
    let body: Value = response.expect("send").json().await.expect("json");
    assert_eq!(
        (&body["id"], &body["object"], &body["model"]),
        (&json!("chatcmpl-c1"), &json!("chat.completion"), &json!("meow"))
    );
    let rendered: Vec<u32> = "user: Hi\nassistant:".bytes().map(u32::from).collect();
    assert_eq!(body["prompt_token_ids"], json!(rendered), "no BOS: the template writes its own special tokens");
    assert_eq!(body["usage"]["prompt_tokens"], rendered.len());
    let choices = body["choices"].as_array().expect("choices");
    assert_eq!(choices.len(), 2);
    for (index, choice) in choices.iter().enumerate() {
        assert_eq!(choice["index"], index);
        assert_eq!(choice["message"], json!({"role": "assistant", "content": "\u{0}\u{1}"}));
        assert_eq!(
            (&choice["finish_reason"], &choice["token_ids"], &choice["logprobs"]),
            (&json!("length"), &json!([0, 1]), &json!(null))
        );
        assert_eq!(choice["segments"], json!([{"lora_version": 1, "kv_version": 1, "start": 0, "end": 2}]));
    }
}

#[tokio::test]
async fn logprobs_are_openais_chat_content_with_the_k_most_likely() {
    let harness = serve_with_chat(&["meow"]).await;
    let (status, body) =
        harness.post("/v1/chat/completions", chat("meow", json!({"logprobs": true, "top_logprobs": 2}))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let content = body["choices"][0]["logprobs"]["content"].as_array().expect("content");
    assert_eq!(content.len(), 2);
    assert_eq!((&content[1]["token"], &content[1]["bytes"]), (&json!("\u{1}"), &json!([1])));
    let top = content[1]["top_logprobs"].as_array().expect("top");
    assert_eq!(top.len(), 2);
    assert_eq!((&top[0]["token"], &top[1]["token"]), (&json!("\u{1}"), &json!("\u{2}")));
    let (status, refused) = harness.post("/v1/chat/completions", chat("meow", json!({"top_logprobs": 2}))).await;
    assert_eq!((status, &refused["error"]["param"]), (StatusCode::BAD_REQUEST, &json!("top_logprobs")));
}

#[tokio::test]
async fn a_streamed_chat_sends_deltas_with_the_role_first_then_usage() {
    let harness = serve_with_chat(&["meow"]).await;
    let chunks =
        harness.stream("/v1/chat/completions", chat("meow", json!({"stream_options": {"include_usage": true}}))).await;
    assert!(chunks.iter().all(|chunk| chunk["object"] == "chat.completion.chunk"));
    let deltas: Vec<&Value> = chunks.iter().filter_map(|chunk| chunk["choices"].get(0)).collect();
    assert_eq!(deltas[0]["delta"]["role"], "assistant");
    assert!(deltas[1..].iter().all(|choice| choice["delta"].get("role").is_none()));
    let text: String = deltas.iter().filter_map(|choice| choice["delta"]["content"].as_str()).collect();
    assert_eq!(text, "\u{0}\u{1}");
    assert_eq!(deltas.last().map(|choice| choice["finish_reason"].clone()), Some(json!("length")));
    assert_eq!(chunks.last().map(|chunk| chunk["usage"]["completion_tokens"].clone()), Some(json!(2)));
}

#[tokio::test]
async fn an_aborted_chat_keeps_its_tokens_and_a_template_error_is_a_400() {
    let harness = serve_with_chat(&["meow"]).await;
    let running =
        harness.spawn_post("/v1/chat/completions", chat("meow", json!({"max_completion_tokens": 50})), "chat-abort");
    eventually("the chat runs", || async { harness.status_of("meow").await.in_flight == 1 }).await;
    assert_eq!(harness.pause("meow").await["aborted"], json!(["chat-abort"]));
    let (status, body) = running.await.expect("task");
    assert_eq!(status, StatusCode::OK);
    let choice = &body["choices"][0];
    assert_eq!((&choice["finish_reason"], &choice["token_ids"]), (&json!("abort"), &json!([0, 1, 2])));
    harness.resume("meow").await;

    for (body, param) in [
        (json!({"model": "meow", "messages": []}), "messages"),
        (json!({"model": "meow", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}), "messages"),
        (chat("meow", json!({"response_format": {"type": "json_object"}})), "response_format"),
        (chat("meow", json!({"tool_choice": "required"})), "tool_choice"),
        (json!({"model": "meow"}), "messages"),
    ] {
        let (status, answer) = harness.post("/v1/chat/completions", body.clone()).await;
        assert_eq!((status, &answer["error"]["param"]), (StatusCode::BAD_REQUEST, &json!(param)), "{body}");
    }
    let (status, _) = harness
        .post("/v1/chat/completions", chat("meow", json!({"response_format": {"type": "text"}, "tool_choice": "auto"})))
        .await;
    assert_eq!(status, StatusCode::OK, "neutral values are accepted");
}
