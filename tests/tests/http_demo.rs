//! The HTTP front as `loragate serve` wires it (issue 6): text prompts through the demo tokenizer, and one gate
//! shared with gRPC, so a pause from either front holds requests from both.

use std::time::Duration;

use loragate_core::testing::eventually_within as eventually;
use loragate_proto::v1 as pb;
use loragate_tests::{DemoServer, PATIENCE, PROMPT, sample_request, text};
use serde_json::{Value, json};

async fn post(demo: &DemoServer, path: &str, body: Value) -> (u16, Value) {
    let response = reqwest::Client::new().post(demo.http_url(path)).json(&body).send().await.expect("HTTP request");
    let status = response.status().as_u16();
    (status, response.json().await.expect("a JSON body"))
}

fn completion(model: &str) -> Value {
    json!({"model": model, "prompt": PROMPT, "max_tokens": 24, "temperature": 0})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_completions_decode_through_the_models_tokenizer_for_every_model() {
    let demo = DemoServer::start().await;
    for (model, noise) in [("meow", "meow"), ("woof", "woof")] {
        let (status, body) = post(&demo, "/v1/completions", completion(model)).await;
        assert_eq!(status, 200, "{body}");
        let choice = &body["choices"][0];
        assert_eq!(choice["finish_reason"], "length", "{body}");
        assert!(choice["text"].as_str().expect("text").contains(noise), "{model}: {body}");
        assert_eq!(body["usage"]["prompt_tokens"], PROMPT.len(), "the demo tokenizer is byte-level: {body}");
    }
    let (status, base) = post(&demo, "/v1/completions", completion("loragate-demo")).await;
    assert_eq!(status, 200, "the served name samples the base model: {base}");

    let models: Value = reqwest::get(demo.http_url("/v1/models")).await.expect("models").json().await.expect("json");
    let mut ids: Vec<&str> = models["data"].as_array().expect("data").iter().filter_map(|m| m["id"].as_str()).collect();
    ids.sort_unstable();
    assert_eq!(ids, vec!["loragate-demo", "meow", "woof"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_from_grpc_holds_http_completions_and_a_resume_over_http_releases_grpc_samples() {
    let demo = DemoServer::start().await;
    let pause = pb::AbortLoraRequestsRequest { lora_name: "meow".into(), ..Default::default() };
    demo.control().abort_lora_requests(pause).await.expect("pause over gRPC");

    let held_http = tokio::spawn({
        let url = demo.http_url("/v1/completions");
        async move {
            let response = reqwest::Client::new().post(url).json(&completion("meow")).send().await.expect("send");
            (response.status().as_u16(), response.json::<Value>().await.expect("json"))
        }
    });
    let mut sampler = demo.sampler();
    let held_grpc = tokio::spawn(async move { sampler.sample(sample_request("meow", 24)).await });
    eventually("both requests are held at meow's gate", PATIENCE, || async { demo.status("meow").await.held == 2 })
        .await;
    let (status, woof) = post(&demo, "/v1/completions", completion("woof")).await;
    assert_eq!(status, 200, "woof is not paused: {woof}");
    assert!(!held_http.is_finished() && !held_grpc.is_finished(), "meow stays held while paused");

    let (status, resumed) = post(&demo, "/skyrl/v1/resume_lora_requests", json!({"lora_name": "meow"})).await;
    assert_eq!((status, &resumed["was_paused"]), (200, &Value::Bool(true)), "{resumed}");
    let (status, body) = tokio::time::timeout(PATIENCE, held_http).await.expect("released").expect("task");
    assert_eq!(status, 200, "{body}");
    assert!(body["choices"][0]["text"].as_str().expect("text").contains("meow"), "{body}");
    let sampled = tokio::time::timeout(PATIENCE, held_grpc).await.expect("released").expect("task").expect("ok");
    assert!(text(&sampled.into_inner().sequences[0].token_ids).contains("meow"));
    let meow = demo.status("meow").await;
    assert!(!meow.paused && meow.held == 0 && meow.in_flight == 0, "{meow:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutting_down_stops_both_fronts() {
    let demo = DemoServer::start().await;
    let health = demo.http_url("/health");
    assert_eq!(reqwest::get(&health).await.expect("health").status().as_u16(), 200);
    let grpc_addr = demo.server.grpc_addr();
    let DemoServer { server, channel, .. } = demo;
    drop(channel);
    let stopping = tokio::spawn(server.shutdown());
    tokio::time::timeout(Duration::from_secs(30), stopping).await.expect("stops in time").expect("task");
    assert!(reqwest::get(&health).await.is_err(), "the HTTP listener is closed after shutdown");
    let grpc = tonic::transport::Channel::from_shared(format!("http://{grpc_addr}")).expect("uri").connect().await;
    assert!(grpc.is_err(), "the gRPC listener is closed after shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_models_chat_template_serves_chat_and_the_token_endpoints_agree_with_it() {
    let demo = DemoServer::start().await;
    let messages = json!([{"role": "user", "content": PROMPT}]);
    let (status, chat) = post(
        &demo,
        "/v1/chat/completions",
        json!({"model": "meow", "messages": messages, "max_tokens": 12, "temperature": 0, "return_token_ids": true}),
    )
    .await;
    assert_eq!(status, 200, "{chat}");
    assert!(chat["choices"][0]["message"]["content"].as_str().expect("content").contains("meow"), "{chat}");
    let rendered = format!("<|user|>\n{PROMPT}\n<|assistant|>\n");
    assert_eq!(chat["prompt_token_ids"], json!(rendered.as_bytes()), "the demo's template, from tokenizer_config.json");
    let (_, tokenized) = post(&demo, "/tokenize", json!({"model": "loragate-demo", "messages": messages})).await;
    assert_eq!(tokenized["tokens"], chat["prompt_token_ids"], "/tokenize renders the same template");

    // The same tokens through vLLM's and SGLang's generate endpoints.
    let prompt = chat["prompt_token_ids"].clone();
    let (_, generated) = post(
        &demo,
        "/inference/v1/generate",
        json!({"model": "meow", "token_ids": prompt, "sampling_params": {"max_tokens": 12, "temperature": 0}}),
    )
    .await;
    assert_eq!(generated["choices"][0]["token_ids"], chat["choices"][0]["token_ids"], "{generated}");
    let (_, sglang) = post(
        &demo,
        "/generate",
        json!({"input_ids": prompt, "lora_path": "meow", "sampling_params": {"max_new_tokens": 12, "temperature": 0}}),
    )
    .await;
    assert_eq!(sglang["output_ids"], chat["choices"][0]["token_ids"], "{sglang}");
}
