//! `vllm.Inference`: `Generate` and `GenerateStream` over the engine, with vLLM's semantics.
//!
//! Data flow: the request is parsed into the core's validated request (vLLM's defaults, errors naming vLLM's
//! fields) → registered in the worker's state under its `request_id` (held while generation is paused; `NOT_FOUND`
//! for an unknown `lora_name`) → the engine samples with the registration's cancel token, which `Abort` fires → the
//! events become `GenerateResponse`s.

mod request;
mod response;

use std::sync::Arc;

use loragate_core::Engine;
use tonic::{Request, Response, Status};
use vllm_proto as pb;

use self::request::parse_generate;
use self::response::{GenerateResponses, ResponseBuilder};
use crate::error::WorkerError;
use crate::state::WorkerHandle;

pub use self::request::DEFAULT_MAX_NEW_TOKENS;

/// The `vllm.Inference` service of a worker.
pub(crate) struct InferenceService {
    engine: Arc<dyn Engine>,
    state: WorkerHandle,
    served_model_name: Arc<str>,
}

impl InferenceService {
    pub(crate) fn new(engine: Arc<dyn Engine>, state: WorkerHandle, served_model_name: Arc<str>) -> Self {
        Self { engine, state, served_model_name }
    }

    async fn start(&self, request: pb::GenerateRequest) -> Result<GenerateResponses, WorkerError> {
        let call = parse_generate(request, self.engine.model_info(), &self.served_model_name)?;
        let builder = ResponseBuilder::new(&call, self.engine.model_info());
        let registration = self.state.admit(call.request.id(), call.lora_name.as_deref()).await?;
        let events = self.engine.generate(call.request, registration.cancel_token().clone()).await?;
        Ok(GenerateResponses::new(builder, events, registration))
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
