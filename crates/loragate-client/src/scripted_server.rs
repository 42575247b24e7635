//! A scripted loragate server for the client's tests: `Sampler` answers come from a responder the test supplies,
//! `WaitLoraUnpaused` answers from a queue, and every call is recorded.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use loragate_proto::v1 as pb;
use loragate_proto::v1::lora_control_server::{LoraControl, LoraControlServer};
use loragate_proto::v1::sampler_server::{Sampler, SamplerServer};
use sha2::{Digest, Sha256};
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tonic::transport::{Channel, Server};
use tonic::{Request, Response, Status};

/// Answers `Sample` calls.
pub(crate) type Responder = Box<dyn Fn(&pb::SampleRequest) -> Result<pb::SampleResponse, Status> + Send + Sync>;

/// What the scripted server answers and what it saw.
pub(crate) struct Script {
    pub(crate) responder: Responder,
    /// `paused` answers to `WaitLoraUnpaused`, in order (a `true` comes after the call's `timeout_s`); `false` once
    /// empty.
    pub(crate) waits: Mutex<VecDeque<bool>>,
    /// `LoadLoraAdapter` fails with this status when set.
    pub(crate) load_error: Mutex<Option<Status>>,
    /// `AbortLoraRequests` fails with this status when set.
    pub(crate) abort_error: Mutex<Option<Status>>,
    /// When set, `LoadLoraAdapter` waits for a notification before answering.
    pub(crate) load_blocker: Option<Arc<Notify>>,
    pub(crate) samples: Mutex<Vec<pb::SampleRequest>>,
    pub(crate) wait_calls: Mutex<Vec<pb::WaitLoraUnpausedRequest>>,
    /// Control calls as "abort meow", "load meow PATH", "resume meow".
    pub(crate) control_calls: Mutex<Vec<String>>,
    /// Every `AbortLoraRequests`, `ResumeLoraRequests`, `SwapLoraAdapter` and `SetLoraStaleness` request, in order.
    pub(crate) pauses: Mutex<Vec<pb::AbortLoraRequestsRequest>>,
    pub(crate) resumes: Mutex<Vec<pb::ResumeLoraRequestsRequest>>,
    pub(crate) swaps: Mutex<Vec<pb::SwapLoraAdapterRequest>>,
    pub(crate) staleness: Mutex<Vec<pb::SetLoraStalenessRequest>>,
    /// Every push that reached its end: the header, the bytes and the size of each chunk.
    pub(crate) pushes: Mutex<Vec<Pushed>>,
    /// What `ListLoraAdapters` answers.
    pub(crate) adapters: Mutex<Vec<pb::LoraAdapterStatus>>,
    /// When set, `PushLoraAdapter` answers this sha256 instead of the one of the bytes it received.
    pub(crate) pushed_sha256_override: Mutex<Option<String>>,
}

/// One push as the scripted server received it.
#[derive(Clone, Debug)]
pub(crate) struct Pushed {
    pub(crate) header: pb::PushLoraAdapterHeader,
    pub(crate) bytes: Vec<u8>,
    pub(crate) chunk_sizes: Vec<usize>,
}

impl Script {
    pub(crate) fn new(responder: Responder) -> Self {
        Self {
            responder,
            waits: Mutex::default(),
            load_error: Mutex::default(),
            abort_error: Mutex::default(),
            load_blocker: None,
            samples: Mutex::default(),
            wait_calls: Mutex::default(),
            control_calls: Mutex::default(),
            pauses: Mutex::default(),
            resumes: Mutex::default(),
            swaps: Mutex::default(),
            staleness: Mutex::default(),
            pushes: Mutex::default(),
            adapters: Mutex::default(),
            pushed_sha256_override: Mutex::default(),
        }
    }

    /// A script answering `Sample` calls with `answers`, in order.
    pub(crate) fn answering(answers: Vec<Result<pb::SampleResponse, Status>>) -> Self {
        let answers = Mutex::new(VecDeque::from(answers));
        Self::new(Box::new(move |_| {
            lock(&answers).pop_front().unwrap_or_else(|| Err(Status::internal("the script has no more answers")))
        }))
    }
}

pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

struct Scripted(Arc<Script>);

#[tonic::async_trait]
impl Sampler for Scripted {
    async fn sample(&self, request: Request<pb::SampleRequest>) -> Result<Response<pb::SampleResponse>, Status> {
        let request = request.into_inner();
        lock(&self.0.samples).push(request.clone());
        (self.0.responder)(&request).map(Response::new)
    }

    type SampleStreamStream = tokio_stream::Empty<Result<pb::SampleStreamResponse, Status>>;

    async fn sample_stream(
        &self,
        _request: Request<pb::SampleRequest>,
    ) -> Result<Response<Self::SampleStreamStream>, Status> {
        Err(Status::unimplemented("the client does not stream"))
    }
}

#[tonic::async_trait]
impl LoraControl for Scripted {
    async fn abort_lora_requests(
        &self,
        request: Request<pb::AbortLoraRequestsRequest>,
    ) -> Result<Response<pb::AbortLoraRequestsResponse>, Status> {
        lock(&self.0.control_calls).push(format!("abort {}", request.get_ref().lora_name));
        lock(&self.0.pauses).push(request.get_ref().clone());
        if let Some(status) = lock(&self.0.abort_error).take() {
            return Err(status);
        }
        Ok(Response::new(pb::AbortLoraRequestsResponse {
            aborted_count: 2,
            aborted_request_ids: vec!["a".into(), "b".into()],
            unacknowledged_request_ids: vec![],
            pause_id: "pause-1".into(),
            kept_count: 0,
            kv_policy: pb::KvPolicy::Recompute.into(),
        }))
    }

    async fn resume_lora_requests(
        &self,
        request: Request<pb::ResumeLoraRequestsRequest>,
    ) -> Result<Response<pb::ResumeLoraRequestsResponse>, Status> {
        lock(&self.0.control_calls).push(format!("resume {}", request.get_ref().lora_name));
        lock(&self.0.resumes).push(request.get_ref().clone());
        Ok(Response::new(pb::ResumeLoraRequestsResponse { was_paused: true, still_paused: false }))
    }

    async fn wait_lora_unpaused(
        &self,
        request: Request<pb::WaitLoraUnpausedRequest>,
    ) -> Result<Response<pb::WaitLoraUnpausedResponse>, Status> {
        let request = request.into_inner();
        let timeout = std::time::Duration::from_secs_f64(request.timeout_s);
        lock(&self.0.wait_calls).push(request);
        let paused = lock(&self.0.waits).pop_front().unwrap_or(false);
        if paused {
            // Like the real server: "still paused" is the answer after the whole timeout.
            tokio::time::sleep(timeout).await;
        }
        Ok(Response::new(pb::WaitLoraUnpausedResponse { paused }))
    }

    async fn load_lora_adapter(
        &self,
        request: Request<pb::LoadLoraAdapterRequest>,
    ) -> Result<Response<pb::LoadLoraAdapterResponse>, Status> {
        let request = request.into_inner();
        lock(&self.0.control_calls).push(format!("load {} {}", request.lora_name, request.path));
        if let Some(blocker) = &self.0.load_blocker {
            blocker.notified().await;
        }
        if let Some(status) = lock(&self.0.load_error).take() {
            return Err(status);
        }
        Ok(Response::new(pb::LoadLoraAdapterResponse { version: 7, ..Default::default() }))
    }

    async fn swap_lora_adapter(
        &self,
        request: Request<pb::SwapLoraAdapterRequest>,
    ) -> Result<Response<pb::SwapLoraAdapterResponse>, Status> {
        let request = request.into_inner();
        let kv_policy = request.kv_policy;
        lock(&self.0.swaps).push(request);
        Ok(Response::new(pb::SwapLoraAdapterResponse {
            version: 8,
            kept_count: 1,
            kv_policy,
            sha256: "ab".repeat(32),
            ..Default::default()
        }))
    }

    async fn unload_lora_adapter(
        &self,
        _request: Request<pb::UnloadLoraAdapterRequest>,
    ) -> Result<Response<pb::UnloadLoraAdapterResponse>, Status> {
        Err(Status::unimplemented("not scripted"))
    }

    async fn list_lora_adapters(
        &self,
        _request: Request<pb::ListLoraAdaptersRequest>,
    ) -> Result<Response<pb::ListLoraAdaptersResponse>, Status> {
        Ok(Response::new(pb::ListLoraAdaptersResponse { adapters: lock(&self.0.adapters).clone() }))
    }

    async fn list_replicas(
        &self,
        _request: Request<pb::ListReplicasRequest>,
    ) -> Result<Response<pb::ListReplicasResponse>, Status> {
        Err(Status::unimplemented("not scripted"))
    }

    async fn push_lora_adapter(
        &self,
        request: Request<tonic::Streaming<pb::PushLoraAdapterRequest>>,
    ) -> Result<Response<pb::PushLoraAdapterResponse>, Status> {
        use pb::push_lora_adapter_request::Part;
        let mut messages = request.into_inner();
        let Some(Part::Header(header)) = messages.message().await?.and_then(|message| message.part) else {
            return Err(Status::invalid_argument("header: the first message must be the header"));
        };
        let (mut bytes, mut chunk_sizes) = (Vec::new(), Vec::new());
        while let Some(message) = messages.message().await? {
            match message.part {
                Some(Part::Chunk(chunk)) => {
                    chunk_sizes.push(chunk.len());
                    bytes.extend_from_slice(&chunk);
                }
                _ => return Err(Status::invalid_argument("header: only the first message may be the header")),
            }
        }
        let sha256: String = Sha256::digest(&bytes).iter().map(|byte| format!("{byte:02x}")).collect();
        if header.total_bytes != 0 && header.total_bytes != bytes.len() as u64 {
            return Err(Status::invalid_argument("total_bytes: does not match the bytes received"));
        }
        if !header.sha256.is_empty() && header.sha256 != sha256 {
            return Err(Status::invalid_argument("sha256: does not match the bytes received"));
        }
        let kv_policy = header.kv_policy;
        lock(&self.0.pushes).push(Pushed { header, bytes, chunk_sizes });
        let sha256 = lock(&self.0.pushed_sha256_override).clone().unwrap_or(sha256);
        Ok(Response::new(pb::PushLoraAdapterResponse { version: 9, sha256, kv_policy, ..Default::default() }))
    }

    async fn set_lora_staleness(
        &self,
        request: Request<pb::SetLoraStalenessRequest>,
    ) -> Result<Response<pb::SetLoraStalenessResponse>, Status> {
        let request = request.into_inner();
        let staleness = (request.batch_size > 0).then(|| pb::LoraStaleness {
            max_staleness: request.max_staleness,
            batch_size: request.batch_size,
            capacity: u64::from(request.max_staleness + 1) * u64::from(request.batch_size),
            ..Default::default()
        });
        lock(&self.0.staleness).push(request);
        Ok(Response::new(pb::SetLoraStalenessResponse { staleness }))
    }
}

/// Serves `script` on 127.0.0.1:0 for the rest of the test; returns a channel to it.
pub(crate) async fn serve(script: Arc<Script>) -> Channel {
    serve_with(script, None).await
}

/// Serves `script` on 127.0.0.1:0, refusing calls without `authorization: Bearer KEY` when `key` is set.
pub(crate) async fn serve_with(script: Arc<Script>, key: Option<&str>) -> Channel {
    let expected = key.map(|key| format!("Bearer {key}"));
    let check = move |request: Request<()>| -> Result<Request<()>, Status> {
        let Some(expected) = &expected else { return Ok(request) };
        match request.metadata().get("authorization").and_then(|value| value.to_str().ok()) {
            Some(presented) if presented == expected => Ok(request),
            _ => Err(Status::unauthenticated("no valid key")),
        }
    };
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address");
    let server = Server::builder()
        .add_service(tonic::service::interceptor::InterceptedService::new(
            SamplerServer::new(Scripted(script.clone())),
            check.clone(),
        ))
        .add_service(tonic::service::interceptor::InterceptedService::new(
            LoraControlServer::new(Scripted(script)),
            check,
        ))
        .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener));
    tokio::spawn(server);
    Channel::from_shared(format!("http://{address}")).expect("uri").connect().await.expect("connect")
}

/// A one-sequence response.
pub(crate) fn response(tokens: &[u32], reason: pb::FinishReason, version: u64) -> pb::SampleResponse {
    pb::SampleResponse {
        request_id: "r".into(),
        sequences: vec![sequence(tokens, reason, version)],
        prompt_logprobs: vec![],
    }
}

/// A sequence whose logprob of token `t` is `-t / 100` and whose tokens all come from `version`.
pub(crate) fn sequence(tokens: &[u32], reason: pb::FinishReason, version: u64) -> pb::SampledSequence {
    let segments = if tokens.is_empty() {
        vec![]
    } else {
        vec![pb::VersionSegment { lora_version: version, kv_version: version, start: 0, end: tokens.len() as u32 }]
    };
    pb::SampledSequence {
        token_ids: tokens.to_vec(),
        logprobs: tokens.iter().map(|&t| -(t as f32) / 100.0).collect(),
        finish_reason: reason.into(),
        segments,
    }
}
