//! `loragate.v1.Sampler`: `Sample` and `SampleStream`. Requests reach these handlers through the submission gate,
//! which already held them while their adapter was paused.

use std::pin::Pin;

use futures::{Stream, StreamExt};
use loragate_core::{Coordinator, GateDeadline, SampleStream};
use loragate_proto::v1 as pb;
use tonic::{Request, Response, Status};

use crate::convert::{raw_sample_request, sample_response, stream_chunk};
use crate::grpc_timeout::client_deadline;
use crate::status::status_from_core;

/// The `Sampler` service over a coordinator.
#[derive(Clone)]
pub struct SamplerService {
    coordinator: Coordinator,
}

impl SamplerService {
    /// A service driving `coordinator`.
    pub fn new(coordinator: Coordinator) -> Self {
        Self { coordinator }
    }

    /// Validates the request, admits it (waiting at its adapter's gate if it closed again since the submission gate
    /// let it through) and starts the engine.
    async fn start(&self, request: Request<pb::SampleRequest>) -> Result<SampleStream, Status> {
        let deadline = gate_deadline(&request, &self.coordinator);
        let request =
            self.coordinator.parse_sample(raw_sample_request(request.into_inner())).map_err(status_from_core)?;
        self.coordinator.sample(request, deadline).await.map_err(status_from_core)
    }
}

/// The deadline the submission gate computed at arrival, or (without the gate) the client's deadline.
fn gate_deadline<T>(request: &Request<T>, coordinator: &Coordinator) -> GateDeadline {
    match request.extensions().get::<GateDeadline>() {
        Some(deadline) => *deadline,
        None => coordinator.gate_deadline(client_deadline(request.metadata().as_ref())),
    }
}

/// The chunks of a `SampleStream` response.
pub type SampleChunks = Pin<Box<dyn Stream<Item = Result<pb::SampleStreamResponse, Status>> + Send>>;

#[tonic::async_trait]
impl pb::sampler_server::Sampler for SamplerService {
    async fn sample(&self, request: Request<pb::SampleRequest>) -> Result<Response<pb::SampleResponse>, Status> {
        let output = self.start(request).await?.collect_output().await.map_err(status_from_core)?;
        Ok(Response::new(sample_response(output)))
    }

    type SampleStreamStream = SampleChunks;

    async fn sample_stream(&self, request: Request<pb::SampleRequest>) -> Result<Response<SampleChunks>, Status> {
        let stream = self.start(request).await?;
        let request_id = stream.request_id().to_string();
        // tonic drops this stream when the client goes away, which cancels the request.
        let chunks =
            stream.map(move |event| event.map(|event| stream_chunk(&request_id, event)).map_err(status_from_core));
        Ok(Response::new(Box::pin(chunks)))
    }
}
