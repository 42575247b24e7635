//! `vllm.Inference`: `Generate` and `GenerateStream` over the coordinator, with vLLM's semantics.
//!
//! Data flow: the request is parsed into the core's validated request (vLLM's defaults, errors naming vLLM's
//! fields) → [`Coordinator::sample`] admits it (held while generation is paused, up to `--gate-max-wait` and within
//! `--max-held`; `RESOURCE_EXHAUSTED` past `--max-in-flight`; `NOT_FOUND` for an unknown `lora_name`) and samples,
//! registered under its `request_id` so that `Abort` reaches it → its events become `GenerateResponse`s. Dropping
//! the response stream (the client went away) abandons the request.

mod request;
mod response;

use std::sync::Arc;

use loragate_core::Coordinator;
use tonic::{Request, Response, Status};
use vllm_proto as pb;

use self::request::parse_generate;
use self::response::{GenerateResponses, ResponseBuilder};
use crate::error::WorkerError;

pub use self::request::DEFAULT_MAX_NEW_TOKENS;

/// The `vllm.Inference` service of a worker.
pub(crate) struct InferenceService {
    coordinator: Coordinator,
    served_model_name: Arc<str>,
}

impl InferenceService {
    pub(crate) fn new(coordinator: Coordinator, served_model_name: Arc<str>) -> Self {
        Self { coordinator, served_model_name }
    }

    async fn start(&self, request: pb::GenerateRequest) -> Result<GenerateResponses, WorkerError> {
        let model = self.coordinator.model_info();
        let call = parse_generate(request, model, &self.served_model_name)?;
        let builder = ResponseBuilder::new(&call, model);
        // The client's own deadline (`grpc-timeout`) is enforced by the transport, which drops this call.
        let deadline = self.coordinator.gate_deadline(None);
        let samples = self.coordinator.sample(call.request, deadline).await?;
        Ok(GenerateResponses::new(builder, samples))
    }
}

#[tonic::async_trait]
impl pb::inference_server::Inference for InferenceService {
    type GenerateStreamStream = GenerateResponses;

    async fn generate(&self, request: Request<pb::GenerateRequest>) -> Result<Response<pb::GenerateResponse>, Status> {
        let responses = self.start(request.into_inner()).await?;
        Ok(Response::new(responses.collect().await?))
    }

    async fn generate_stream(
        &self,
        request: Request<pb::GenerateRequest>,
    ) -> Result<Response<Self::GenerateStreamStream>, Status> {
        Ok(Response::new(self.start(request.into_inner()).await?))
    }
}
