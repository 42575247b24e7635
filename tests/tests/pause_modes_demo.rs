//! Pause modes, owners, leases and the atomic swap on the demo model, over gRPC and HTTP (issue 11): clients that
//! know nothing of pauses get whole samples across a keep-mode swap, with each token's version in the response.

use loragate_core::testing::eventually_within as eventually;
use loragate_proto::v1::{self as pb, FinishReason, PauseMode};
use loragate_tests::{DemoServer, PATIENCE, PROMPT, sample_request, text};
use serde_json::{Value, json};
use tokio::task::JoinHandle;
use tonic::Code;

/// The demo's " meow" repeats with a period of five tokens: a budget long enough to be paused mid-way.
const BUDGET: u32 = 96;

/// Where a sample that must be running when a pause lands stalls ([`DemoServer::stall_next`]): the pause then finds
/// it running whatever the machine's speed.
const STALL_AFTER: u32 = 8;

/// A budget for the samples that a pause parks with their keys and values (KV policy REUSE), which cannot be stalled
/// (a stalled sample is not parked): long enough that the pause lands before they could end on any machine.
const LONG_BUDGET: u32 = 1024;

fn pause(lora: &str, mode: PauseMode, owner: &str, lease_s: f64) -> pb::AbortLoraRequestsRequest {
    let kv_policy = pb::KvPolicy::Unspecified.into();
    pb::AbortLoraRequestsRequest { lora_name: lora.into(), mode: mode.into(), owner: owner.into(), lease_s, kv_policy }
}

fn resume(lora: &str, pause_id: &str) -> pb::ResumeLoraRequestsRequest {
    pb::ResumeLoraRequestsRequest { lora_name: lora.into(), pause_id: pause_id.into() }
}

fn swap(lora: &str, path: &str, mode: PauseMode) -> pb::SwapLoraAdapterRequest {
    let kv_policy = pb::KvPolicy::Unspecified.into();
    pb::SwapLoraAdapterRequest { lora_name: lora.into(), path: path.into(), mode: mode.into(), kv_policy }
}

/// A unary greedy sample of `budget` tokens, in the background.
fn spawn_sample(demo: &DemoServer, lora: &str, id: &str, budget: u32) -> JoinHandle<pb::SampleResponse> {
    let mut request = sample_request(lora, budget);
    request.request_id = id.into();
    let mut sampler = demo.sampler();
    tokio::spawn(async move { sampler.sample(request).await.expect("the sample succeeds").into_inner() })
}

async fn finished<T>(task: JoinHandle<T>) -> T {
    tokio::time::timeout(PATIENCE, task).await.expect("finished in time").expect("the sampling task")
}

async fn wait_for_tokens(demo: &DemoServer, lora: &str, version: u64, at_least: u64) {
    eventually(&format!("{lora} v{version} generated {at_least} tokens"), PATIENCE, || async {
        demo.generated_tokens(lora, version) >= at_least
    })
    .await;
}

fn versions(sequence: &pb::SampledSequence) -> Vec<u64> {
    sequence.segments.iter().map(|segment| segment.lora_version).collect()
}

fn assert_whole(sequence: &pb::SampledSequence, budget: u32) {
    assert_eq!(sequence.finish_reason(), FinishReason::Length, "{sequence:?}");
    assert_eq!(sequence.token_ids.len(), budget as usize, "the whole budget, never more");
    assert_eq!(sequence.logprobs.len(), sequence.token_ids.len(), "every token has its own logprob");
    assert_eq!(sequence.segments.last().map(|s| s.end), Some(budget), "segments cover every token");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keep_swap_continues_token_exact_on_the_new_weights_while_woof_never_notices() {
    let demo = DemoServer::start().await;
    let reference = finished(spawn_sample(&demo, "meow", "reference", BUDGET)).await.sequences[0].token_ids.clone();
    demo.stall_next("meow", 2, STALL_AFTER);
    let meows: Vec<_> = (0..2).map(|i| spawn_sample(&demo, "meow", &format!("meow-{i}"), BUDGET)).collect();
    let woof = spawn_sample(&demo, "woof", "woof-0", BUDGET);
    demo.wait_stalled(2).await;
    assert_eq!(demo.status("meow").await.in_flight, 2, "both meows run");

    let swapped = demo.control().swap_lora_adapter(swap("meow", "woof", PauseMode::Unspecified)).await;
    let swapped = swapped.expect("the swap").into_inner();
    assert_eq!((swapped.version, swapped.kept_count, swapped.aborted_count), (2, 2, 0), "keep is the default");
    assert!(!demo.status("meow").await.paused, "the swap reopened meow");

    for meow in meows {
        let sequence = &finished(meow).await.sequences[0];
        assert_whole(sequence, BUDGET);
        assert_eq!(versions(sequence), vec![1, 2], "{:?}", sequence.segments);
        assert_eq!(sequence.segments[0].end, STALL_AFTER, "v1 produced the tokens before the swap");
        let (old, new) = sequence.token_ids.split_at(sequence.segments[0].end as usize);
        assert_eq!(old, &reference[..old.len()], "the first segment is the uninterrupted greedy run's prefix");
        assert!(text(new).contains("woof"), "the rest comes from the new weights: {:?}", text(new));
    }
    let sequence = &finished(woof).await.sequences[0];
    assert_whole(sequence, BUDGET);
    assert_eq!(versions(sequence), vec![1], "woof never noticed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_stream_pauses_then_delivers_the_rest_in_the_same_stream() {
    let demo = DemoServer::start().await;
    demo.stall_next("meow", 1, STALL_AFTER);
    let mut request = sample_request("meow", BUDGET);
    request.request_id = "streamed".into();
    let mut stream = demo.sampler().sample_stream(request).await.expect("stream").into_inner();
    let mut token_ids = Vec::new();
    while token_ids.len() < STALL_AFTER as usize {
        let chunk = stream.message().await.expect("healthy").expect("not finished yet");
        assert_eq!(chunk.finish_reason(), FinishReason::Unspecified);
        token_ids.extend(chunk.token_ids);
    }
    let paused = demo.control().abort_lora_requests(pause("meow", PauseMode::Keep, "trainer", 0.0)).await;
    let paused = paused.expect("keep pause").into_inner();
    assert_eq!((paused.kept_count, paused.aborted_count), (1, 0));
    let status = demo.status("meow").await;
    assert_eq!((status.kept, status.in_flight, status.paused), (1, 0, true), "{status:?}");
    assert_eq!(status.pauses[0].owner, "trainer");
    assert_eq!(status.pauses[0].mode(), PauseMode::Keep);

    let resumed = demo.control().resume_lora_requests(resume("meow", &paused.pause_id)).await.expect("resume");
    assert!(!resumed.into_inner().still_paused);
    let segments = loop {
        let chunk = tokio::time::timeout(PATIENCE, stream.message()).await.expect("in time").expect("healthy");
        let chunk = chunk.expect("a last chunk with the finish reason");
        token_ids.extend(&chunk.token_ids);
        if chunk.finish_reason() != FinishReason::Unspecified {
            assert_eq!(chunk.finish_reason(), FinishReason::Length, "no abort ever reaches the client");
            break chunk.segments;
        }
    };
    assert_eq!(token_ids.len(), BUDGET as usize);
    assert_eq!(segments.iter().map(|s| (s.lora_version, s.start, s.end)).collect::<Vec<_>>(), vec![(1, 0, BUDGET)]);
    assert!(stream.message().await.expect("healthy").is_none(), "one stream, one end");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_mode_lets_the_running_sample_finish_and_holds_new_ones() {
    let demo = DemoServer::start().await;
    let running = spawn_sample(&demo, "meow", "running", BUDGET);
    wait_for_tokens(&demo, "meow", 1, 4).await;
    let control = demo.control();
    let waiting = tokio::spawn(async move {
        let mut control = control;
        control.abort_lora_requests(pause("meow", PauseMode::Wait, "eval", 0.0)).await
    });
    eventually("meow is paused", PATIENCE, || async { demo.status("meow").await.paused }).await;
    let held = spawn_sample(&demo, "meow", "held", 8);
    eventually("a fresh sample is held", PATIENCE, || async { demo.status("meow").await.held == 1 }).await;

    let drained = finished(waiting).await.expect("the wait pause answers once drained").into_inner();
    assert_eq!((drained.aborted_count, drained.kept_count), (0, 0));
    assert_whole(&finished(running).await.sequences[0], BUDGET);
    assert!(!held.is_finished() && demo.status("meow").await.paused);
    demo.control().resume_lora_requests(resume("meow", "")).await.expect("resume");
    assert_whole(&finished(held).await.sequences[0], 8);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_runs_out_unload_ends_kept_samples_and_a_failed_swap_rolls_back() {
    let demo = DemoServer::start().await;
    // A pause whose owner never resumes it ends by itself and releases what it held.
    demo.control().abort_lora_requests(pause("woof", PauseMode::Abort, "crashed", 1.5)).await.expect("lease");
    let held = spawn_sample(&demo, "woof", "held", 8);
    eventually("held by the leased pause", PATIENCE, || async { demo.status("woof").await.held == 1 }).await;
    assert_whole(&finished(held).await.sequences[0], 8);
    assert!(demo.status("woof").await.pauses.is_empty());

    // A failed swap: the old version keeps serving, the adapter reopens, the kept sample continues on v1.
    let bad = demo.adapter_root.join("bad");
    std::fs::create_dir_all(&bad).expect("mkdir");
    std::fs::write(bad.join("adapter_config.json"), r#"{"r": 4, "lora_alpha": 8, "target_modules": ["nope"]}"#)
        .expect("write");
    demo.stall_next("meow", 1, STALL_AFTER);
    let sample = spawn_sample(&demo, "meow", "kept", BUDGET);
    demo.wait_stalled(1).await;
    let err = demo.control().swap_lora_adapter(swap("meow", "bad", PauseMode::Keep)).await.expect_err("bad files");
    assert!(matches!(err.code(), Code::InvalidArgument | Code::FailedPrecondition), "{err:?}");
    assert!(err.message().contains("keeps serving v1"), "{err:?}");
    let sequence = &finished(sample).await.sequences[0];
    assert_whole(sequence, BUDGET);
    assert_eq!(versions(sequence), vec![1]);
    let meow = demo.status("meow").await;
    assert!(!meow.paused && meow.version == 1, "{meow:?}");

    // Unloading an adapter while a sample is kept hands it back aborted, with its tokens.
    demo.stall_next("meow", 1, STALL_AFTER);
    let kept = spawn_sample(&demo, "meow", "unloaded", BUDGET);
    demo.wait_stalled(1).await;
    let paused = demo.control().abort_lora_requests(pause("meow", PauseMode::Keep, "", 0.0)).await.expect("keep");
    assert_eq!(paused.into_inner().kept_count, 1);
    let unload = pb::UnloadLoraAdapterRequest { lora_name: "meow".into() };
    demo.control().unload_lora_adapter(unload).await.expect("unload");
    let sequence = &finished(kept).await.sequences[0];
    assert_eq!(sequence.finish_reason(), FinishReason::Abort);
    assert_eq!(sequence.token_ids.len(), STALL_AFTER as usize, "the tokens produced before the pause");
}

async fn post(demo: &DemoServer, path: &str, body: Option<Value>) -> (u16, Value) {
    let request = reqwest::Client::new().post(demo.http_url(path));
    let request = match body {
        Some(body) => request.json(&body),
        None => request,
    };
    let response = request.send().await.expect("HTTP request");
    let status = response.status().as_u16();
    (status, response.json().await.expect("a JSON body"))
}

fn spawn_completion(demo: &DemoServer, model: &str) -> JoinHandle<(u16, Value)> {
    let url = demo.http_url("/v1/completions");
    let body = json!({"model": model, "prompt": PROMPT, "max_tokens": BUDGET, "temperature": 0});
    tokio::spawn(async move {
        let response = reqwest::Client::new().post(url).json(&body).send().await.expect("HTTP request");
        let status = response.status().as_u16();
        (status, response.json().await.expect("a JSON body"))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skyrls_global_keep_pause_load_and_resume_finish_every_completion_with_provenance() {
    let demo = DemoServer::start().await;
    demo.stall_next("meow", 1, STALL_AFTER);
    demo.stall_next("", 1, STALL_AFTER);
    let meow = spawn_completion(&demo, "meow");
    let base = spawn_completion(&demo, "loragate-demo");
    demo.wait_stalled(2).await;

    let paused = post(&demo, "/pause?mode=keep&clear_cache=false", None).await;
    assert_eq!(paused, (200, json!({"status": "paused", "kv_policy": "recompute"})));
    let paused: Value = reqwest::get(demo.http_url("/is_paused")).await.expect("is_paused").json().await.expect("json");
    assert_eq!(paused, json!({"is_paused": true}));
    let load = json!({"lora_name": "meow", "lora_path": "woof"});
    let (status, loaded) = post(&demo, "/v1/load_lora_adapter", Some(load)).await;
    assert_eq!((status, &loaded["version"]), (200, &json!(2)), "{loaded}");
    assert_eq!(post(&demo, "/resume", None).await, (200, json!({"status": "resumed"})));

    for (task, expected) in [(meow, vec![1, 2]), (base, vec![0])] {
        let (status, body) = finished(task).await;
        assert_eq!(status, 200, "{body}");
        let choice = &body["choices"][0];
        assert_eq!(choice["finish_reason"], "length", "{body}");
        assert_eq!(choice["token_ids"].as_array().map(Vec::len), Some(BUDGET as usize), "{body}");
        let versions: Vec<u64> = choice["segments"]
            .as_array()
            .expect("segments")
            .iter()
            .filter_map(|s| s["lora_version"].as_u64())
            .collect();
        assert_eq!(versions, expected, "{body}");
    }

    // SkyRL 0.4's in-place reload swaps in keep mode under the same name, without a pause call.
    demo.stall_next("meow", 1, STALL_AFTER);
    let meow = spawn_completion(&demo, "meow");
    demo.wait_stalled(1).await;
    let reload = json!({"lora_name": "meow", "lora_path": "meow"});
    let (status, reloaded) = post(&demo, "/skyrl/v1/load_lora_adapter", Some(reload)).await;
    assert_eq!((status, &reloaded["version"], &reloaded["kept_count"]), (200, &json!(3), &json!(1)), "{reloaded}");
    let (_, body) = finished(meow).await;
    let versions: Vec<u64> = body["choices"][0]["segments"]
        .as_array()
        .expect("segments")
        .iter()
        .filter_map(|s| s["lora_version"].as_u64())
        .collect();
    assert_eq!((versions, &body["choices"][0]["finish_reason"]), (vec![2, 3], &json!("length")), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skyrl_endpoints_take_owners_modes_and_pause_ids() {
    let demo = DemoServer::start().await;
    let first = json!({"lora_name": "meow", "mode": "keep", "owner": "trainer"});
    let (status, trainer) = post(&demo, "/skyrl/v1/abort_lora_requests", Some(first)).await;
    assert_eq!((status, &trainer["mode"]), (200, &json!("keep")), "{trainer}");
    let second = json!({"lora_name": "meow", "mode": "abort", "owner": "evaluator", "lease_s": 60});
    let (_, evaluator) = post(&demo, "/skyrl/v1/abort_lora_requests", Some(second)).await;
    assert_ne!(trainer["pause_id"], evaluator["pause_id"]);

    let release = json!({"lora_name": "meow", "pause_id": trainer["pause_id"]});
    let (_, released) = post(&demo, "/skyrl/v1/resume_lora_requests", Some(release)).await;
    assert_eq!(released, json!({"status": "ok", "was_paused": true, "still_paused": true}));
    let bad_mode = json!({"lora_name": "meow", "mode": "freeze"});
    let (status, refused) = post(&demo, "/skyrl/v1/abort_lora_requests", Some(bad_mode)).await;
    assert_eq!((status, &refused["error"]["param"]), (400, &json!("mode")), "{refused}");
    let bad_lease = json!({"lora_name": "meow", "lease_s": -1});
    let (status, refused) = post(&demo, "/skyrl/v1/abort_lora_requests", Some(bad_lease)).await;
    assert_eq!((status, &refused["error"]["param"]), (400, &json!("lease_s")), "{refused}");
    let (_, released) = post(&demo, "/skyrl/v1/resume_lora_requests", Some(json!({"lora_name": "meow"}))).await;
    assert_eq!(released["still_paused"], json!(false), "{released}");

    // SGLang's and AReaL's engine-wide pause and continue.
    let (status, paused) = post(&demo, "/pause_generation", Some(json!({"mode": "retract"}))).await;
    assert_eq!((status, &paused["status"]), (200, &json!("ok")), "{paused}");
    assert!(demo.status("woof").await.paused);
    let (status, _) = post(&demo, "/continue_generation", Some(json!({}))).await;
    assert_eq!(status, 200);
    assert_eq!(post(&demo, "/areal_pause_generation", Some(json!({}))).await.0, 200);
    assert!(demo.status("meow").await.paused);
    assert_eq!(post(&demo, "/areal_continue_generation", Some(json!({}))).await.0, 200);
    assert!(!demo.status("meow").await.paused && !demo.status("woof").await.paused);
}

fn kv_versions(sequence: &pb::SampledSequence) -> Vec<(u64, u64)> {
    sequence.segments.iter().map(|segment| (segment.lora_version, segment.kv_version)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reuse_swap_decodes_on_the_parked_keys_and_the_segments_say_so() {
    let demo = DemoServer::start().await;
    let meows: Vec<_> = (0..2).map(|i| spawn_sample(&demo, "meow", &format!("meow-{i}"), LONG_BUDGET)).collect();
    eventually("both meows run", PATIENCE, || async { demo.status("meow").await.in_flight == 2 }).await;
    wait_for_tokens(&demo, "meow", 1, 16).await;

    let mut reuse = swap("meow", "woof", PauseMode::Keep);
    reuse.kv_policy = pb::KvPolicy::Reuse.into();
    let swapped = demo.control().swap_lora_adapter(reuse).await.expect("the swap").into_inner();
    assert_eq!((swapped.version, swapped.kept_count), (2, 2));
    assert_eq!(swapped.kv_policy(), pb::KvPolicy::Reuse, "the embedded engine parks");
    for meow in meows {
        let sequence = &finished(meow).await.sequences[0];
        assert_whole(sequence, LONG_BUDGET);
        assert_eq!(kv_versions(sequence), vec![(1, 1), (2, 1)], "v2's tokens attended to v1's keys and values");
    }

    // The default swap recomputes: every key and value of the continuation is the new version's.
    demo.stall_next("meow", 1, STALL_AFTER);
    let meow = spawn_sample(&demo, "meow", "meow-recomputed", BUDGET);
    demo.wait_stalled(1).await;
    let swapped = demo.control().swap_lora_adapter(swap("meow", "meow", PauseMode::Keep)).await.expect("swap");
    let swapped = swapped.into_inner();
    assert_eq!((swapped.kept_count, swapped.kv_policy()), (1, pb::KvPolicy::Recompute));
    let sequence = &finished(meow).await.sequences[0];
    assert_whole(sequence, BUDGET);
    assert_eq!(kv_versions(sequence), vec![(2, 2), (3, 3)]);

    // Unloaded while parked: the request ends with its tokens and FINISH_REASON_ABORT (and its parked keys and
    // values are dropped with it), and the server serves on.
    let baseline = demo.generated_tokens("meow", 3);
    let meow = spawn_sample(&demo, "meow", "meow-unloaded", LONG_BUDGET);
    wait_for_tokens(&demo, "meow", 3, baseline + 8).await;
    let mut park = pause("meow", PauseMode::Keep, "trainer", 0.0);
    park.kv_policy = pb::KvPolicy::Reuse.into();
    let parked = demo.control().abort_lora_requests(park).await.expect("the keep pause").into_inner();
    assert_eq!((parked.kept_count, parked.kv_policy()), (1, pb::KvPolicy::Reuse));
    let unload = pb::UnloadLoraAdapterRequest { lora_name: "meow".into() };
    demo.control().unload_lora_adapter(unload).await.expect("unloaded");
    let sequence = &finished(meow).await.sequences[0];
    assert_eq!(sequence.finish_reason(), FinishReason::Abort, "{sequence:?}");
    assert!(sequence.token_ids.len() >= 8 && kv_versions(sequence) == vec![(3, 3)], "{sequence:?}");

    // HTTP: vLLM's global pause takes `kv=reuse` and echoes it; SkyRL's segments carry `kv_version`.
    let woof = spawn_completion(&demo, "woof");
    wait_for_tokens(&demo, "woof", 1, 8).await;
    let paused = post(&demo, "/pause?mode=keep&kv=reuse", None).await;
    assert_eq!(paused, (200, json!({"status": "paused", "kv_policy": "reuse"})));
    assert_eq!(post(&demo, "/resume", None).await, (200, json!({"status": "resumed"})));
    let (status, body) = finished(woof).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["choices"][0]["finish_reason"], "length", "{body}");
    let segments = &body["choices"][0]["segments"];
    assert_eq!(segments, &json!([{"lora_version": 1, "kv_version": 1, "start": 0, "end": BUDGET}]), "{body}");
}
