//! The submission gate: a tower layer in front of the `Sampler` service that holds a request while its adapter is
//! paused and lets it through the moment the adapter reopens.
//!
//! The layer reads the adapter from the request message itself (its `lora_name`, field 2 of `SampleRequest`), so
//! clients need no extra header: it buffers the single request message (unary and server-streaming RPCs send
//! exactly one), decodes only that field, waits at the adapter's gate, and passes the same bytes on. The hold is
//! bounded by the client's `grpc-timeout` and the server's maximum; past it the call fails with `UNAVAILABLE`
//! naming the adapter. A client that goes away while held drops this future, which uncounts it: nothing is left.
//!
//! Requests it cannot read (compressed messages, unknown or malformed names) pass through untouched: the handler
//! rejects bad ones, and admission in the core still never admits into a closed gate.

use std::task::{Context, Poll};

use bytes::Bytes;
use futures::future::BoxFuture;
use http_body_util::{BodyExt, Full, Limited};
use loragate_core::{AdapterKey, Coordinator};
use prost::Message;
use tonic::Status;
use tonic::body::Body;
use tower::{Layer, Service};

use crate::grpc_timeout::client_deadline;
use crate::status::status_from_core;

/// The largest request the gate buffers: tonic's default decoding limit plus the gRPC frame header.
const MAX_GATED_REQUEST_BYTES: usize = 4 * 1024 * 1024 + 5;

/// The one field of `SampleRequest` the gate reads; prost skips every other field.
#[derive(Clone, PartialEq, Message)]
struct LoraNameProbe {
    #[prost(string, tag = "2")]
    lora_name: String,
}

/// Applies [`SubmissionGate`] to a service (with `tonic::service::LayerExt::named_layer`, so that only the
/// `Sampler` service is gated, never health or reflection).
#[derive(Clone)]
pub struct SubmissionGateLayer {
    coordinator: Coordinator,
}

impl SubmissionGateLayer {
    /// A gate over `coordinator`'s adapters.
    pub fn new(coordinator: Coordinator) -> Self {
        Self { coordinator }
    }
}

impl<S> Layer<S> for SubmissionGateLayer {
    type Service = SubmissionGate<S>;

    fn layer(&self, inner: S) -> SubmissionGate<S> {
        SubmissionGate { inner, coordinator: self.coordinator.clone() }
    }
}

/// The gate in front of one service. See the module documentation.
#[derive(Clone)]
pub struct SubmissionGate<S> {
    inner: S,
    coordinator: Coordinator,
}

impl<S> Service<http::Request<Body>> for SubmissionGate<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        // Keep the service that was driven ready; leave a fresh clone for the next call.
        let fresh = self.inner.clone();
        let mut ready = std::mem::replace(&mut self.inner, fresh);
        let coordinator = self.coordinator.clone();
        Box::pin(async move {
            match hold_while_paused(&coordinator, request).await {
                Ok(request) => ready.call(request).await,
                Err(status) => Ok(status.into_http()),
            }
        })
    }
}

/// Holds `request` while its adapter's gate is closed; returns it once open, with its
/// [`GateDeadline`](loragate_core::GateDeadline) as a request extension (the handler admits with the same deadline
/// if the adapter closes again before admission, and a keep-mode pause bounds its wait by the client's deadline).
async fn hold_while_paused(
    coordinator: &Coordinator,
    request: http::Request<Body>,
) -> Result<http::Request<Body>, Status> {
    let deadline = coordinator.gate_deadline(client_deadline(request.headers()));
    let (mut parts, body) = request.into_parts();
    let message = Limited::new(body, MAX_GATED_REQUEST_BYTES)
        .collect()
        .await
        .map_err(|err| Status::out_of_range(format!("could not read the request: {err}")))?
        .to_bytes();
    if let Some(adapter) = adapter_of(&parts.headers, &message).and_then(|key| coordinator.adapter(&key).ok()) {
        adapter.hold_while_paused(deadline.hold_until()).await.map_err(status_from_core)?;
    }
    parts.extensions.insert(deadline);
    Ok(http::Request::from_parts(parts, Body::new(Full::new(message))))
}

/// The adapter a buffered `SampleRequest` frame addresses, if it can be read.
fn adapter_of(headers: &http::HeaderMap, frame: &Bytes) -> Option<AdapterKey> {
    let compressed_stream = headers.get("grpc-encoding").is_some_and(|encoding| encoding != "identity");
    let (&compressed_flag, rest) = frame.split_first()?;
    if compressed_stream || compressed_flag != 0 || rest.len() < 4 {
        return None;
    }
    let (length, message) = rest.split_at(4);
    let length = u32::from_be_bytes(length.try_into().ok()?) as usize;
    let probe = LoraNameProbe::decode(message.get(..length)?).ok()?;
    AdapterKey::parse(&probe.lora_name).ok()
}

#[cfg(test)]
mod tests {
    use loragate_proto::v1::SampleRequest;

    use super::*;

    fn frame(message: &impl Message) -> Bytes {
        let body = message.encode_to_vec();
        let mut framed = vec![0u8];
        framed.extend_from_slice(&(body.len() as u32).to_be_bytes());
        framed.extend_from_slice(&body);
        framed.into()
    }

    #[test]
    fn the_probe_reads_lora_name_from_a_full_sample_request() {
        let request = SampleRequest {
            request_id: "r".into(),
            lora_name: "meow".into(),
            prompt_token_ids: vec![1, 2, 3],
            num_samples: 4,
            ..Default::default()
        };
        let key = adapter_of(&http::HeaderMap::new(), &frame(&request));
        assert_eq!(key.map(|key| key.as_wire_str().to_owned()), Some("meow".to_owned()));
        let base = SampleRequest { prompt_token_ids: vec![1], ..Default::default() };
        assert_eq!(adapter_of(&http::HeaderMap::new(), &frame(&base)), Some(AdapterKey::Base));
    }

    #[test]
    fn unreadable_frames_are_passed_through() {
        let request = SampleRequest { lora_name: "meow".into(), ..Default::default() };
        let mut compressed = frame(&request).to_vec();
        compressed[0] = 1;
        let mut gzip = http::HeaderMap::new();
        gzip.insert("grpc-encoding", http::HeaderValue::from_static("gzip"));
        for (headers, bytes) in [
            (http::HeaderMap::new(), Bytes::from(compressed)),
            (gzip, frame(&request)),
            (http::HeaderMap::new(), Bytes::from_static(&[0, 0, 0])),
            (http::HeaderMap::new(), Bytes::from_static(&[0, 0, 0, 0, 9, 1])),
        ] {
            assert_eq!(adapter_of(&headers, &bytes), None);
        }
    }
}
