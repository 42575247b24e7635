//! The submission gate: a tower layer in front of the `Sampler` service that parses each request at the edge and
//! holds it, parsed, while its adapter is paused, letting it through the moment the adapter reopens.
//!
//! For every call it reads the single request message (unary and server-streaming RPCs send exactly one) within
//! the gate deadline, decodes it, validates it into the core's [`SampleRequest`] (errors are `INVALID_ARGUMENT`
//! naming the field), checks that the caller may sample that adapter, and only then waits at the adapter's gate
//! with [`AdapterHandle::hold_while_paused`](loragate_core::AdapterHandle::hold_while_paused), the one gate every
//! front uses, counted as held and bounded by the held limits. The request's bytes are dropped before the hold: a
//! held request keeps only its parsed form, which the context length bounds. The parsed request reaches the handler
//! in a request extension; the handler admits it with the same deadline.
//!
//! The deadline is the client's `grpc-timeout` (less a margin) capped by the server's maximum hold
//! (`--gate-max-wait`). It bounds reading the message too: a call whose message never completes fails with
//! `DEADLINE_EXCEEDED` and is counted (`loragate_request_body_timeouts_total{front="grpc"}`). Past the deadline a
//! held call fails with `UNAVAILABLE` naming the adapter. A client that goes away while held drops this future,
//! which uncounts it: nothing is left.

use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use futures::future::BoxFuture;
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use loragate_core::{Action, Coordinator, GateDeadline, SampleRequest};
use loragate_proto::v1 as pb;
use prost::Message;
use tokio::time::Instant;
use tonic::Status;
use tonic::body::Body;
use tower::{Layer, Service};

use crate::auth::caller;
use crate::convert::raw_sample_request;
use crate::grpc_timeout::client_deadline;
use crate::status::status_from_core;

/// The largest request message read: tonic's default decoding limit.
const MAX_REQUEST_MESSAGE_BYTES: usize = 4 * 1024 * 1024;

/// The gRPC frame header: a compression flag and a 4-byte length.
const FRAME_HEADER_BYTES: usize = 5;

/// What the handler receives in place of the message: an empty `SampleRequest` frame (all defaults). The real
/// request travels parsed, in [`GatedSample`].
const EMPTY_MESSAGE_FRAME: [u8; FRAME_HEADER_BYTES] = [0; FRAME_HEADER_BYTES];

/// Request extension: the parsed request the gate let through, and its waiting limits (the handler admits with the
/// same deadline if the adapter closes again before admission, and a keep-mode pause bounds its wait by the
/// client's deadline).
#[derive(Clone, Debug)]
pub(crate) struct GatedSample {
    pub(crate) request: SampleRequest,
    pub(crate) deadline: GateDeadline,
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
            match parse_and_hold(&coordinator, request).await {
                Ok(request) => ready.call(request).await,
                Err(status) => Ok(status.into_http()),
            }
        })
    }
}

/// Reads, parses and authorises the request, then holds it while its adapter's gate is closed; returns the call
/// to pass on (the parsed request in a [`GatedSample`], an empty message as its body) once the gate is open.
async fn parse_and_hold(
    coordinator: &Coordinator,
    request: http::Request<Body>,
) -> Result<http::Request<Body>, Status> {
    let deadline = coordinator.gate_deadline(client_deadline(request.headers()));
    let principal = caller(request.headers(), request.extensions(), coordinator.auth()).map_err(status_from_core)?;
    let (mut parts, body) = request.into_parts();
    let frame = read_message(coordinator, body, deadline.hold_until()).await?;
    let message = decode_message(&parts.headers, frame)?;
    let request = coordinator.parse_sample(raw_sample_request(message)).map_err(status_from_core)?;
    principal.authorize(Action::Sample, request.adapter()).map_err(status_from_core)?;
    // With tenant keys, a tenant's cached prefixes are its own; its sender may read it back once it finished (HTTP
    // `GET /v1/requests/{id}`).
    let request = request.scope_cache_to(principal.cache_scope()).owned_by(principal);
    // An unknown adapter is not held: the handler answers NOT_FOUND.
    if let Ok(adapter) = coordinator.adapter(request.adapter()) {
        adapter.hold_while_paused(deadline.hold_until()).await.map_err(status_from_core)?;
    }
    parts.extensions.insert(GatedSample { request, deadline });
    Ok(http::Request::from_parts(parts, Body::new(Full::new(Bytes::from_static(&EMPTY_MESSAGE_FRAME)))))
}

/// Reads the whole request body (one framed message) by `deadline`.
async fn read_message(coordinator: &Coordinator, body: Body, deadline: Instant) -> Result<Bytes, Status> {
    let limit = FRAME_HEADER_BYTES + MAX_REQUEST_MESSAGE_BYTES;
    match tokio::time::timeout_at(deadline, Limited::new(body, limit).collect()).await {
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(err)) if err.downcast_ref::<LengthLimitError>().is_some() => Err(Status::out_of_range(format!(
            "the request message is larger than the {MAX_REQUEST_MESSAGE_BYTES}-byte limit"
        ))),
        Ok(Err(err)) => Err(Status::cancelled(format!("the request message could not be read: {err}"))),
        Err(_elapsed) => {
            coordinator.metrics().record_body_read_timeout("grpc");
            Err(Status::deadline_exceeded(
                "the request message did not arrive in time (the gate deadline: the client's grpc-timeout capped by \
                 the server's --gate-max-wait)",
            ))
        }
    }
}

/// Decodes the single `SampleRequest` of a body. Anything but exactly one uncompressed, well-formed message is
/// refused (`INVALID_ARGUMENT`; compressed messages, which this server never accepts, `UNIMPLEMENTED`).
fn decode_message(headers: &http::HeaderMap, mut frame: Bytes) -> Result<pb::SampleRequest, Status> {
    let compressed_stream = headers.get("grpc-encoding").is_some_and(|encoding| encoding != "identity");
    if frame.len() < FRAME_HEADER_BYTES {
        return Err(Status::invalid_argument("the call carries no complete request message"));
    }
    let compressed_flag = frame.get_u8();
    let length = frame.get_u32() as usize;
    if compressed_stream || compressed_flag != 0 {
        return Err(Status::unimplemented("compressed request messages are not accepted; send them uncompressed"));
    }
    if frame.len() != length {
        return Err(Status::invalid_argument(format!(
            "the call must carry exactly one request message of {length} bytes, it carries {} bytes after the frame \
             header",
            frame.len()
        )));
    }
    pb::SampleRequest::decode(frame)
        .map_err(|err| Status::invalid_argument(format!("the request message is not a valid SampleRequest: {err}")))
}

#[cfg(test)]
mod tests {
    use tonic::Code;

    use super::*;

    fn frame(message: &impl Message) -> Bytes {
        let body = message.encode_to_vec();
        let mut framed = vec![0u8];
        framed.extend_from_slice(&(body.len() as u32).to_be_bytes());
        framed.extend_from_slice(&body);
        framed.into()
    }

    #[test]
    fn a_framed_sample_request_decodes_whole() {
        let request = pb::SampleRequest {
            request_id: "r".into(),
            lora_name: "meow".into(),
            prompt_token_ids: vec![1, 2, 3],
            num_samples: 4,
            ..Default::default()
        };
        assert_eq!(decode_message(&http::HeaderMap::new(), frame(&request)).expect("decodes"), request);
        assert_eq!(EMPTY_MESSAGE_FRAME.as_slice(), frame(&pb::SampleRequest::default()).as_ref());
    }

    #[test]
    fn anything_but_one_plain_message_is_refused() {
        let request = pb::SampleRequest { lora_name: "meow".into(), ..Default::default() };
        let mut compressed = frame(&request).to_vec();
        compressed[0] = 1;
        let mut gzip = http::HeaderMap::new();
        gzip.insert("grpc-encoding", http::HeaderValue::from_static("gzip"));
        let mut two = frame(&request).to_vec();
        two.extend_from_slice(&frame(&request));
        let cases = [
            (http::HeaderMap::new(), Bytes::from(compressed), Code::Unimplemented),
            (gzip, frame(&request), Code::Unimplemented),
            (http::HeaderMap::new(), Bytes::from_static(&[0, 0, 0]), Code::InvalidArgument),
            (http::HeaderMap::new(), Bytes::from_static(&[0, 0, 0, 0, 9, 1]), Code::InvalidArgument),
            (http::HeaderMap::new(), Bytes::from(two), Code::InvalidArgument),
            // Field 2 (lora_name) as a varint: not protobuf for this message.
            (http::HeaderMap::new(), Bytes::from_static(&[0, 0, 0, 0, 2, 0x10, 0x01]), Code::InvalidArgument),
            // A truncated length-delimited field.
            (http::HeaderMap::new(), Bytes::from_static(&[0, 0, 0, 0, 2, 0x12, 0x09]), Code::InvalidArgument),
        ];
        for (headers, bytes, code) in cases {
            let status = decode_message(&headers, bytes.clone()).expect_err("refused");
            assert_eq!(status.code(), code, "{bytes:?}: {status:?}");
        }
    }
}
