//! `loragate.v1.Sampler`: `Sample` and `SampleStream`. Requests reach these handlers through the submission gate,
//! which already parsed and authorised them, and held them while their adapter was paused.

use std::pin::Pin;

use futures::{Stream, StreamExt};
use loragate_core::{Coordinator, SampleStream};
use loragate_proto::v1 as pb;
use tonic::{Request, Response, Status};

use crate::convert::{sample_response, stream_chunk};
use crate::status::status_from_core;
use crate::submission_gate::GatedSample;

/// The `Sampler` service over a coordinator. It serves only calls that passed the
/// [`SubmissionGateLayer`](crate::SubmissionGateLayer), which parses each request at the edge.
#[derive(Clone)]
pub struct SamplerService {
    coordinator: Coordinator,
}

impl SamplerService {
    /// A service driving `coordinator`.
    pub fn new(coordinator: Coordinator) -> Self {
        Self { coordinator }
    }

    /// Admits the request the gate parsed (waiting at its adapter's gate if it closed again since the submission
    /// gate let it through) and starts the engine.
    async fn start(&self, mut request: Request<pb::SampleRequest>) -> Result<SampleStream, Status> {
        let Some(GatedSample { request, deadline }) = request.extensions_mut().remove::<GatedSample>() else {
            return Err(Status::internal("the Sampler service must be served behind its SubmissionGateLayer"));
        };
        self.coordinator.sample(request, deadline).await.map_err(status_from_core)
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
