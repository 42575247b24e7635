//! The worker over a scripted engine, driven through vLLM's generated clients on 127.0.0.1:0.

use std::net::SocketAddr;
use std::sync::Arc;

use loragate_core::testing::{ScriptedEngine, eventually};
use loragate_core::{AdapterRoot, Coordinator, CoordinatorConfig, Limits};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;
use tonic::{Code, Streaming};
use vllm_proto as pb;
use vllm_proto::control_client::ControlClient;
use vllm_proto::finish_info::FinishReason;
use vllm_proto::inference_client::InferenceClient;

use super::{WorkerConfig, WorkerListeners, exposed_without_keys, serve_worker};
use crate::inference::DEFAULT_MAX_NEW_TOKENS;

mod hardening;
mod metrics;

/// What a test worker starts with: its coordinator's configuration (which the binary makes in production) and its
/// front's.
struct Setup {
    coordinator: CoordinatorConfig,
    front: WorkerConfig,
}

struct TestWorker {
    address: SocketAddr,
    /// The HTTP listener's (`/metrics`).
    http_address: SocketAddr,
    channel: Channel,
    shutdown: CancellationToken,
    served: JoinHandle<Result<(), super::WorkerServeError>>,
    _root: tempfile::TempDir,
}

impl TestWorker {
    /// A worker over a scripted engine whose requests emit `hold_after` tokens and then wait to be cancelled if
    /// their budget allows more. Its adapter root holds `meow/` and `bad/` (which the engine refuses to load).
    async fn start(hold_after: u32) -> Self {
        Self::start_with(hold_after, |setup| setup).await
    }

    /// [`TestWorker::start`] with the configurations `configure` makes of the default ones.
    async fn start_with(hold_after: u32, configure: impl FnOnce(Setup) -> Setup) -> Self {
        let root = tempfile::tempdir().expect("temp dir");
        for adapter in ["meow", "bad"] {
            std::fs::create_dir(root.path().join(adapter)).expect("adapter dir");
        }
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address: SocketAddr = listener.local_addr().expect("addr");
        let http = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let http_address: SocketAddr = http.local_addr().expect("addr");
        let setup = configure(Setup {
            coordinator: CoordinatorConfig {
                adapter_root: Some(AdapterRoot::new(root.path()).expect("root")),
                reserved_names: vec!["scripted".into()],
                ..CoordinatorConfig::default()
            },
            front: WorkerConfig { max_running_requests: 8, ..WorkerConfig::new("scripted") },
        });
        let engine = Arc::new(ScriptedEngine::new(hold_after));
        let coordinator = Coordinator::start(engine, setup.coordinator).await.expect("the coordinator starts");
        let shutdown = setup.front.shutdown.clone();
        let listeners = WorkerListeners { grpc: listener, http: Some(http) };
        let served = tokio::spawn(serve_worker(listeners, coordinator, setup.front));
        Self { address, http_address, channel: channel_to(address), shutdown, served, _root: root }
    }

    fn inference(&self) -> InferenceClient<Channel> {
        InferenceClient::new(self.channel.clone())
    }

    fn control(&self) -> ControlClient<Channel> {
        ControlClient::new(self.channel.clone())
    }

    async fn load(&self, name: &str, path: &str) -> Result<pb::LoraAdapter, tonic::Status> {
        let request = pb::LoadLoraRequest { lora_name: name.into(), source_path: path.into() };
        Ok(self.control().load_lora(request).await?.into_inner().adapter.expect("adapter"))
    }

    async fn stream(&self, request: pb::GenerateRequest) -> Result<Streaming<pb::GenerateResponse>, tonic::Status> {
        Ok(self.inference().generate_stream(request).await?.into_inner())
    }
}

/// A channel of its own (one HTTP/2 connection) to `address`.
fn channel_to(address: SocketAddr) -> Channel {
    Channel::from_shared(format!("http://{address}")).expect("uri").connect_lazy()
}

fn request(id: &str, lora_name: &str, max_new_tokens: u32) -> pb::GenerateRequest {
    pb::GenerateRequest {
        request_id: id.into(),
        lora_name: lora_name.into(),
        prompt: Some(pb::generate_request::Prompt::TokenIds(pb::TokenIds { ids: vec![72, 105] })),
        stopping: Some(pb::StoppingCriteria { max_new_tokens, ..Default::default() }),
        response: Some(pb::ResponseOptions { output_token_ids: true, output_logprobs: true, ..Default::default() }),
        ..Default::default()
    }
}

/// What a stream delivered: prompt info, tokens, logprobs, and the finish info.
#[derive(Debug, Default)]
struct Received {
    prompt_info: Option<pb::PromptInfo>,
    num_tokens: u32,
    token_ids: Vec<u32>,
    logprobs: Vec<f32>,
    finish: Option<pb::FinishInfo>,
}

impl Received {
    fn reason(&self) -> FinishReason {
        self.finish.as_ref().map_or(FinishReason::NotFinished, |finish| finish.finish_reason())
    }
}

async fn read_until_tokens(stream: &mut Streaming<pb::GenerateResponse>, received: &mut Received, count: u32) {
    while received.num_tokens < count && received.finish.is_none() {
        let message = stream.message().await.expect("a message").expect("the stream goes on");
        accept(received, message);
    }
}

fn accept(received: &mut Received, message: pb::GenerateResponse) {
    if message.prompt_info.is_some() {
        assert!(received.prompt_info.is_none(), "prompt info comes once");
        received.prompt_info = message.prompt_info;
    }
    if let Some(output) = message.outputs {
        assert!(received.prompt_info.is_some(), "prompt info comes first");
        assert_eq!(output.index, 0);
        received.num_tokens += output.num_tokens;
        received.token_ids.extend(output.token_ids);
        received.logprobs.extend(output.logprobs);
        if output.finish_info.is_some() {
            received.finish = output.finish_info;
        }
    }
}

async fn read_to_end(mut stream: Streaming<pb::GenerateResponse>) -> Received {
    let mut received = Received::default();
    while let Some(message) = stream.message().await.expect("no error") {
        accept(&mut received, message);
    }
    received
}

#[tokio::test]
async fn generate_applies_vllms_defaults_and_returns_only_what_was_asked() {
    let worker = TestWorker::start(100).await;
    let bare = pb::GenerateRequest {
        prompt: Some(pb::generate_request::Prompt::TokenIds(pb::TokenIds { ids: vec![1, 2, 3] })),
        ..Default::default()
    };
    let received = read_to_end(worker.stream(bare.clone()).await.expect("stream")).await;
    assert_eq!(received.num_tokens, DEFAULT_MAX_NEW_TOKENS, "max_new_tokens = 0 is vLLM's 20");
    assert!(received.token_ids.is_empty() && received.logprobs.is_empty(), "token ids and logprobs default to off");
    assert_eq!(received.prompt_info.as_ref().map(|info| info.num_prompt_tokens), Some(3));
    let finish = received.finish.clone().expect("finish info");
    assert_eq!((finish.finish_reason(), finish.num_output_tokens), (FinishReason::Length, DEFAULT_MAX_NEW_TOKENS));

    let asked = pb::GenerateRequest {
        response: Some(pb::ResponseOptions {
            output_token_ids: true,
            output_logprobs: true,
            prompt_token_ids: true,
            ..Default::default()
        }),
        stopping: Some(pb::StoppingCriteria { max_new_tokens: 5, ..Default::default() }),
        ..bare
    };
    let unary = worker.inference().generate(asked.clone()).await.expect("generate").into_inner();
    let output = unary.outputs.expect("outputs");
    assert_eq!(output.token_ids, vec![0, 1, 2, 3, 4], "the scripted engine's tokens");
    assert_eq!(output.logprobs.len(), 5);
    assert_eq!(output.num_tokens, 5);
    assert_eq!(output.finish_info.expect("finish").finish_reason(), FinishReason::Length);
    assert_eq!(unary.prompt_info.expect("prompt info").token_ids, vec![1, 2, 3]);
    let streamed = read_to_end(worker.stream(asked).await.expect("stream")).await;
    assert_eq!(streamed.token_ids, vec![0, 1, 2, 3, 4], "the stream carries the same tokens");
}

#[tokio::test]
async fn the_lora_lifecycle_follows_vllm() {
    let worker = TestWorker::start(100).await;
    let loaded = worker.load("meow@1", "meow").await.expect("load");
    assert_eq!((loaded.lora_id, loaded.lora_name.as_str(), loaded.source_path.as_str()), (1, "meow@1", "meow"));
    let again = worker.load("meow@1", "meow").await.expect_err("a loaded name is never reloaded");
    assert_eq!(again.code(), Code::AlreadyExists, "{again:?}");
    assert_eq!(worker.load("meow@2", "meow").await.expect("a new name loads").lora_id, 2);
    let bad = worker.load("bad@1", "bad").await.expect_err("the engine refuses it");
    assert_eq!(bad.code(), Code::FailedPrecondition, "{bad:?}");
    let outside = worker.load("evil@1", "../../etc").await.expect_err("outside the root");
    assert_eq!(outside.code(), Code::InvalidArgument, "{outside:?}");
    assert!(outside.message().contains("source_path"), "{outside:?}");

    let listed = worker.control().list_loras(pb::ListLorasRequest {}).await.expect("list").into_inner();
    let names: Vec<_> = listed.adapters.iter().map(|a| a.lora_name.as_str()).collect();
    assert_eq!(names, ["meow@1", "meow@2"], "sorted by name, failed loads absent");

    let received = read_to_end(worker.stream(request("on-meow", "meow@2", 4)).await.expect("stream")).await;
    assert_eq!(received.reason(), FinishReason::Length);
    let unknown = worker.stream(request("on-woof", "woof@1", 4)).await.expect_err("unknown adapter");
    assert_eq!(unknown.code(), Code::NotFound, "{unknown:?}");

    let unloaded = worker.control().unload_lora(pb::UnloadLoraRequest { lora_name: "meow@1".into() }).await;
    assert_eq!(unloaded.expect("unload").into_inner().adapter.map(|a| a.lora_id), Some(1));
    let gone = worker.stream(request("on-old", "meow@1", 4)).await.expect_err("unloaded");
    assert_eq!(gone.code(), Code::NotFound);
    let twice = worker.control().unload_lora(pb::UnloadLoraRequest { lora_name: "meow@1".into() }).await;
    assert_eq!(twice.expect_err("already unloaded").code(), Code::NotFound);
}

#[tokio::test]
async fn abort_ends_requests_with_aborted_after_their_tokens_and_ids_are_reusable_after() {
    let worker = TestWorker::start(3).await;
    let mut stream = worker.stream(request("long", "", 100)).await.expect("stream");
    let mut received = Received::default();
    read_until_tokens(&mut stream, &mut received, 3).await;
    let abort = pb::AbortRequest { request_ids: vec!["long".into(), "unknown-id".into()] };
    worker.control().abort(abort).await.expect("abort");
    while let Some(message) = stream.message().await.expect("no error") {
        accept(&mut received, message);
    }
    assert_eq!(received.reason(), FinishReason::Aborted);
    assert_eq!(received.token_ids, vec![0, 1, 2], "every token produced before the abort");
    assert_eq!(received.finish.map(|f| f.num_output_tokens), Some(3));

    // The id can be used again.
    let mut reused = Received::default();
    let mut stream = worker.stream(request("long", "", 2)).await.expect("the id is free");
    read_until_tokens(&mut stream, &mut reused, 2).await;
}

#[tokio::test]
async fn a_client_that_leaves_leaves_nothing_behind() {
    let worker = TestWorker::start_with(3, |setup| Setup {
        coordinator: CoordinatorConfig {
            limits: Limits { max_in_flight: 1, ..Limits::default() },
            ..setup.coordinator
        },
        ..setup
    })
    .await;
    let mut stream = worker.stream(request("leaver", "", 100)).await.expect("stream");
    read_until_tokens(&mut stream, &mut Received::default(), 3).await;
    let refused = worker.stream(request("second", "", 2)).await.expect_err("over --max-in-flight");
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(refused.message().contains("--max-in-flight"), "{refused:?}");
    drop(stream);
    eventually("the request's place is free again", || async {
        match worker.stream(request("second", "", 2)).await {
            Ok(stream) => read_to_end(stream).await.reason() == FinishReason::Length,
            Err(status) => {
                assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
                false
            }
        }
    })
    .await;
}

#[tokio::test]
async fn pause_aborts_running_requests_and_holds_new_ones_until_resume() {
    let worker = TestWorker::start(3).await;
    let mut running = worker.stream(request("running", "", 100)).await.expect("stream");
    let mut received = Received::default();
    read_until_tokens(&mut running, &mut received, 3).await;

    let pause = pb::PauseGenerationRequest { mode: pb::PauseMode::Abort.into(), clear_cache: None };
    worker.control().pause_generation(pause).await.expect("pause returns once the running ones were aborted");
    while let Some(message) = running.message().await.expect("no error") {
        accept(&mut received, message);
    }
    assert_eq!((received.reason(), received.token_ids.len()), (FinishReason::Aborted, 3));
    assert!(worker.control().is_paused(pb::IsPausedRequest {}).await.expect("is paused").into_inner().paused);

    // While paused a new request waits (vLLM queues it): a short client deadline runs out first.
    let mut impatient = tonic::Request::new(request("impatient", "", 2));
    impatient.set_timeout(std::time::Duration::from_millis(500));
    let waited = worker.inference().generate(impatient).await.expect_err("held while paused");
    assert!(matches!(waited.code(), Code::DeadlineExceeded | Code::Cancelled), "{waited:?}");
    let held = tokio::spawn({
        let mut client = worker.inference();
        async move {
            let stream = client.generate_stream(request("held", "", 2)).await.expect("stream").into_inner();
            read_to_end(stream).await
        }
    });
    worker.control().resume_generation(pb::ResumeGenerationRequest {}).await.expect("resume");
    let released = held.await.expect("the held request");
    assert_eq!((released.reason(), released.num_tokens), (FinishReason::Length, 2));
}

#[tokio::test]
async fn a_keep_pause_freezes_running_requests_in_their_stream_until_resume() {
    // Each run emits one token, then holds until stopped if its budget allows more.
    let worker = TestWorker::start(1).await;
    let mut running = worker.stream(request("kept", "", 2)).await.expect("stream");
    let mut received = Received::default();
    read_until_tokens(&mut running, &mut received, 1).await;

    let keep = pb::PauseGenerationRequest { mode: pb::PauseMode::Keep.into(), clear_cache: None };
    worker.control().pause_generation(keep).await.expect("pause returns once the running ones were stopped");
    assert!(worker.control().is_paused(pb::IsPausedRequest {}).await.expect("is paused").into_inner().paused);
    assert!(received.finish.is_none(), "kept, not ended");
    worker.control().resume_generation(pb::ResumeGenerationRequest {}).await.expect("resume");
    while let Some(message) = running.message().await.expect("no error") {
        accept(&mut received, message);
    }
    // An abort pause would have ended it ABORTED after one token; kept, it continued after the resume (a run of its
    // own, whose one token is the scripted engine's first again) to its budget.
    assert_eq!((received.reason(), received.token_ids.as_slice()), (FinishReason::Length, &[0, 0][..]));
    assert!(!worker.control().is_paused(pb::IsPausedRequest {}).await.expect("is paused").into_inner().paused);
}

#[tokio::test]
async fn weight_transfer_sleep_and_kv_rpcs_are_unimplemented_and_discovery_answers() {
    let worker = TestWorker::start(3).await;
    let mut control = worker.control();
    let codes = [
        control.sleep(pb::SleepRequest::default()).await.map(|_| ()),
        control.is_sleeping(pb::IsSleepingRequest {}).await.map(|_| ()),
        control.update_weights(pb::UpdateWeightsRequest::default()).await.map(|_| ()),
        control.get_weight_version(pb::GetWeightVersionRequest {}).await.map(|_| ()),
        control.get_kv_event_sources(pb::GetKvEventSourcesRequest {}).await.map(|_| ()),
    ];
    for result in codes {
        assert_eq!(result.expect_err("unimplemented").code(), Code::Unimplemented);
    }
    let info = control.get_server_info(pb::GetServerInfoRequest {}).await.expect("server info").into_inner();
    assert_eq!((info.max_model_len, info.proto_version.as_str()), (4096, vllm_proto::VERSION));
    let model = control.get_model_info(pb::GetModelInfoRequest {}).await.expect("model info").into_inner();
    assert!(model.supports_lora && model.supports_token_ids_input && !model.supports_text_input);
    assert_eq!(model.served_model_name, "scripted");

    let mut health = tonic_health::pb::health_client::HealthClient::new(worker.channel.clone());
    let check = tonic_health::pb::HealthCheckRequest { service: String::new() };
    let status = health.check(check).await.expect("health").into_inner().status;
    assert_eq!(status, tonic_health::pb::health_check_response::ServingStatus::Serving as i32);
}

#[tokio::test]
async fn the_shutdown_rpc_is_refused_unless_enabled() {
    let worker = TestWorker::start(100).await;
    let refused = worker.control().shutdown(pb::ShutdownRequest {}).await.expect_err("disabled by default");
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert!(refused.message().contains("--enable-shutdown-rpc"), "{refused:?}");
    assert!(!worker.shutdown.is_cancelled());
    let received = read_to_end(worker.stream(request("after", "", 2)).await.expect("still serving")).await;
    assert_eq!(received.reason(), FinishReason::Length);
}

#[tokio::test]
async fn the_shutdown_rpc_stops_the_worker_when_enabled() {
    let worker = TestWorker::start_with(100, |setup| Setup {
        front: WorkerConfig { shutdown_rpc: true, ..setup.front },
        ..setup
    })
    .await;
    worker.control().shutdown(pb::ShutdownRequest {}).await.expect("shutdown accepted");
    let served = tokio::time::timeout(std::time::Duration::from_secs(10), worker.served).await;
    assert!(matches!(served, Ok(Ok(Ok(())))), "the worker stops cleanly: {served:?}");
    assert!(worker.shutdown.is_cancelled());
}

#[test]
fn a_worker_beyond_loopback_without_keys_is_exposed() {
    let keys = loragate_core::Keyring::new(
        None,
        Some(loragate_core::Key::parse("k-admin").expect("key")),
        loragate_core::TenantKeys::default(),
    )
    .expect("keys");
    let open = loragate_core::Keyring::open();
    let (everywhere, loopback): (SocketAddr, SocketAddr) =
        ("0.0.0.0:9001".parse().expect("address"), "127.0.0.1:9001".parse().expect("address"));
    assert!(exposed_without_keys(everywhere, &open), "warned at start");
    assert!(!exposed_without_keys(everywhere, &keys));
    assert!(!exposed_without_keys(loopback, &open));
    assert!(!exposed_without_keys("[::1]:9001".parse().expect("address"), &open));
}
