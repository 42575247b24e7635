//! `loragate.v1.Sampler`: `Sample` and `SampleStream`. Requests reach these handlers through the submission gate,
//! which already held them while their adapter was paused.

use std::pin::Pin;

use futures::{Stream, StreamExt};
use loragate_core::{Coordinator, SampleStream};
use loragate_proto::v1 as pb;
use tokio::time::Instant;
use tonic::{Request, Response, Status};

use crate::convert::{raw_sample_request, sample_response, stream_chunk};
use crate::grpc_timeout::{GRPC_TIMEOUT_HEADER, gate_deadline_for, parse_grpc_timeout};
use crate::status::status_from_core;
use crate::submission_gate::GateDeadline;

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
        let hold_until = gate_deadline(&request, &self.coordinator);
        let request =
            self.coordinator.parse_sample(raw_sample_request(request.into_inner())).map_err(status_from_core)?;
        self.coordinator.sample(request, hold_until).await.map_err(status_from_core)
    }
}

/// The deadline the submission gate computed, or (without the gate) the client's deadline capped by the server's.
fn gate_deadline<T>(request: &Request<T>, coordinator: &Coordinator) -> Instant {
    if let Some(GateDeadline(deadline)) = request.extensions().get::<GateDeadline>() {
        return *deadline;
    }
    let client = request
        .metadata()
        .get(GRPC_TIMEOUT_HEADER)
        .and_then(|value| value.to_str().ok())
        .and_then(parse_grpc_timeout)
        .and_then(gate_deadline_for);
    coordinator.gate_deadline(client)
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
        let chunks = stream.filter_map(move |event| {
            let chunk = match event {
                Ok(event) => stream_chunk(&request_id, event).map(Ok),
                Err(err) => Some(Err(status_from_core(err))),
            };
            std::future::ready(chunk)
        });
        Ok(Response::new(Box::pin(chunks)))
    }
}
