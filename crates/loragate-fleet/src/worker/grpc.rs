//! vLLM's own gRPC protocol (`vllm.Inference`, `vllm.Control`, `grpc.health.v1`; the pinned `vllm-proto` crate):
//! `loragate worker` and vLLM's Rust frontend. One `GenerateStream` per sequence; aborts by `Control.Abort` with the
//! sequence's own `request_id`, acknowledged by its `ABORTED` finish; health is the overall service `""`.

mod wire;

use std::time::Duration;

use futures::StreamExt;
use loragate_proto::v1 as lg;
use loragate_proto::v1::lora_control_client::LoraControlClient;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use vllm_proto as pb;
use vllm_proto::control_client::ControlClient;
use vllm_proto::inference_client::InferenceClient;

use super::{AbortBy, ClientSettings, OpenedSequence, SequenceRequest, WorkerClient, WorkerError, WorkerFacts};
use crate::address::WorkerAddress;
use crate::delivery::{Delivery, PushedFiles};

/// The largest `GenerateStream` message read from a worker (a few tokens with their candidates; the prompt's
/// logprobs with theirs): longer ones are refused by their length prefix, before being buffered.
const MAX_STREAMED_MESSAGE_BYTES: usize = 4 << 20;

/// A gRPC worker: one HTTP/2 channel (connected lazily, reconnected on demand) shared by every call, each of which
/// presents the worker key if there is one.
pub(crate) struct GrpcWorker {
    channel: Channel,
    authorization: Option<MetadataValue<Ascii>>,
}

impl GrpcWorker {
    /// A client of the worker at `address`.
    pub(crate) fn new(address: &WorkerAddress, settings: ClientSettings) -> Result<Self, WorkerError> {
        let endpoint = Endpoint::from_shared(address.http_base())
            .map_err(|err| WorkerError::InvalidArgument(err.to_string()))?
            .connect_timeout(settings.connect_timeout)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(10))
            .keep_alive_timeout(Duration::from_secs(5))
            .keep_alive_while_idle(true);
        let authorization = match &settings.key {
            Some(key) => {
                let mut value: MetadataValue<Ascii> = format!("Bearer {}", key.expose_secret())
                    .parse()
                    .map_err(|_| WorkerError::InvalidArgument("--worker-key is not a valid header value".into()))?;
                value.set_sensitive(true);
                Some(value)
            }
            None => None,
        };
        Ok(Self { channel: endpoint.connect_lazy(), authorization })
    }

    fn control(&self) -> ControlClient<Channel> {
        ControlClient::new(self.channel.clone())
    }

    /// `message` as a call presenting the worker key.
    fn call<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        if let Some(authorization) = &self.authorization {
            request.metadata_mut().insert("authorization", authorization.clone());
        }
        request
    }
}

impl GrpcWorker {
    /// Streams a pushed version's files to the worker over its channel (`loragate.v1.LoraControl/PushLoraAdapter`,
    /// presenting the worker key): the header names `engine_name` and declares the weights' SHA-256 and size, then
    /// the weights follow in chunks. The worker stores and loads them under that name and answers the SHA-256 it
    /// computed, which must be the pushed one.
    async fn push(&self, engine_name: &str, files: &PushedFiles, timeout: Duration) -> Result<(), WorkerError> {
        let header = lg::PushLoraAdapterHeader {
            lora_name: engine_name.to_owned(),
            adapter_config_json: files.config_json().await?,
            sha256: files.sha256().to_string(),
            total_bytes: files.bytes(),
            ..Default::default()
        };
        let first = lg::PushLoraAdapterRequest { part: Some(lg::push_lora_adapter_request::Part::Header(header)) };
        let mut weights = files.weights().await?;
        // The messages go through a channel: tonic's streaming call over a boxed stream is not provably `Send`.
        let (feed, messages) = tokio::sync::mpsc::channel(2);
        tokio::spawn(async move {
            let _ = feed.send(first).await;
            while let Some(chunk) = weights.next().await {
                if feed.send(chunk_message(chunk)).await.is_err() {
                    return; // the call ended
                }
            }
        });
        let messages = tokio_stream::wrappers::ReceiverStream::new(messages);
        let mut client = LoraControlClient::new(self.channel.clone());
        let receipt = bounded(timeout, client.push_lora_adapter(self.call(messages))).await?;
        files.check_receipt(&receipt.sha256, None)
    }
}

#[async_trait::async_trait]
impl WorkerClient for GrpcWorker {
    async fn check_health(&self, timeout: Duration) -> Result<(), WorkerError> {
        let mut health = HealthClient::new(self.channel.clone());
        let answer = bounded(timeout, health.check(self.call(HealthCheckRequest { service: String::new() }))).await?;
        match ServingStatus::try_from(answer.status) {
            Ok(ServingStatus::Serving) => Ok(()),
            status => Err(WorkerError::Unavailable(format!("health check: status {status:?}"))),
        }
    }

    async fn describe(&self, timeout: Duration) -> Result<WorkerFacts, WorkerError> {
        let info = bounded(timeout, self.control().get_server_info(self.call(pb::GetServerInfoRequest {}))).await?;
        let listed = bounded(timeout, self.control().list_loras(self.call(pb::ListLorasRequest {}))).await?;
        Ok(WorkerFacts {
            context_length: (info.max_model_len != 0).then_some(info.max_model_len),
            adapters: listed
                .adapters
                .into_iter()
                .map(|adapter| (adapter.lora_name, Some(adapter.source_path)))
                .collect(),
        })
    }

    /// A pushed version is streamed to the worker (`PushLoraAdapter`, see [`GrpcWorker::push`]); any other is
    /// loaded from its path (`LoadLora`).
    async fn load_adapter(&self, engine_name: &str, delivery: &Delivery, timeout: Duration) -> Result<(), WorkerError> {
        if let Some(files) = delivery.pushed() {
            return self.push(engine_name, files, timeout).await;
        }
        let request =
            pb::LoadLoraRequest { lora_name: engine_name.to_owned(), source_path: delivery.path().to_owned() };
        bounded(timeout, self.control().load_lora(self.call(request))).await.map(drop)
    }

    async fn unload_adapter(&self, engine_name: &str, timeout: Duration) -> Result<(), WorkerError> {
        let request = pb::UnloadLoraRequest { lora_name: engine_name.to_owned() };
        bounded(timeout, self.control().unload_lora(self.call(request))).await.map(drop)
    }

    async fn generate(&self, sequence: SequenceRequest<'_>) -> Result<OpenedSequence, WorkerError> {
        let request = sequence.request;
        let expected = wire::Expected {
            prompt_len: request.prompt().len(),
            prompt_logprobs: sequence.with_prompt_logprobs,
            prompt_candidates: sequence.with_prompt_logprobs && request.prompt_top_logprobs().is_some(),
            output_candidates: request.params().top_logprobs() > 0,
        };
        let message = wire::generate_request(
            request,
            sequence.sequence,
            sequence.request_id.clone(),
            sequence.engine_name,
            sequence.with_prompt_logprobs,
        );
        let mut inference =
            InferenceClient::new(self.channel.clone()).max_decoding_message_size(MAX_STREAMED_MESSAGE_BYTES);
        let stream = inference.generate_stream(self.call(message)).await.map_err(from_status)?.into_inner();
        let events = stream
            .map(move |message| match message {
                Ok(response) => futures::stream::iter(wire::events(response, expected)),
                Err(status) => futures::stream::iter(vec![Err(from_stream_status(status))]),
            })
            .flatten()
            .boxed();
        Ok(OpenedSequence { events, abort: AbortBy::call(sequence.request_id) })
    }

    async fn abort(&self, ids: Vec<String>, timeout: Duration) -> Result<(), WorkerError> {
        bounded(timeout, self.control().abort(self.call(pb::AbortRequest { request_ids: ids }))).await.map(drop)
    }
}

/// A chunk of pushed weights as a push's message.
fn chunk_message(chunk: Vec<u8>) -> lg::PushLoraAdapterRequest {
    lg::PushLoraAdapterRequest { part: Some(lg::push_lora_adapter_request::Part::Chunk(chunk.into())) }
}

/// Runs `call` for at most `timeout`; running out is `Unavailable`.
async fn bounded<T>(
    timeout: Duration,
    call: impl Future<Output = Result<tonic::Response<T>, Status>>,
) -> Result<T, WorkerError> {
    match tokio::time::timeout(timeout, call).await {
        Ok(result) => result.map(tonic::Response::into_inner).map_err(from_status),
        Err(_) => Err(WorkerError::Unavailable(format!("no answer within {timeout:?}"))),
    }
}

/// A status ending a `GenerateStream`: a message over [`MAX_STREAMED_MESSAGE_BYTES`] (refused by its length
/// prefix, before its body is read) is the worker breaking its protocol; anything else as [`from_status`].
fn from_stream_status(status: Status) -> WorkerError {
    if status.code() == Code::OutOfRange && status.message().contains("message length too large") {
        return WorkerError::Malformed(status.message().to_owned());
    }
    from_status(status)
}

/// A gRPC status in the fleet's terms.
fn from_status(status: Status) -> WorkerError {
    let message = status.message().to_owned();
    match status.code() {
        Code::InvalidArgument | Code::OutOfRange => WorkerError::InvalidArgument(message),
        Code::FailedPrecondition => WorkerError::FailedPrecondition(message),
        Code::NotFound => WorkerError::NotFound(message),
        Code::AlreadyExists => WorkerError::AlreadyExists(message),
        Code::Unimplemented | Code::PermissionDenied | Code::Unauthenticated => {
            WorkerError::Refused(format!("{:?}: {message}", status.code()))
        }
        code => WorkerError::Unavailable(format!("{code:?}: {message}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_to_what_the_fleet_does_about_them() {
        assert_eq!(from_status(Status::invalid_argument("bad")), WorkerError::InvalidArgument("bad".into()));
        assert_eq!(from_status(Status::not_found("meow@1")), WorkerError::NotFound("meow@1".into()));
        assert_eq!(from_status(Status::already_exists("meow@1")), WorkerError::AlreadyExists("meow@1".into()));
        assert!(matches!(from_status(Status::unauthenticated("key")), WorkerError::Refused(_)));
        assert!(matches!(from_status(Status::unavailable("gone")), WorkerError::Unavailable(_)));
        assert!(matches!(from_status(Status::internal("boom")), WorkerError::Unavailable(_)));
        let oversize = Status::out_of_range("Error, decoded message length too large: found 9 bytes, the limit is: 4");
        assert!(matches!(from_stream_status(oversize), WorkerError::Malformed(_)));
        assert!(matches!(from_stream_status(Status::out_of_range("past the end")), WorkerError::InvalidArgument(_)));
    }
}
