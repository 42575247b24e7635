//! The submission gate: a middleware in front of `POST /v1/completions` (and nothing else) that holds a request while
//! its adapter is paused and lets it through the moment the adapter reopens.
//!
//! It buffers the JSON body (within the body limit), reads only its `model`, maps it to the adapter (the base
//! model's served name → the base model) and, if that adapter is loaded and paused, waits at its gate with
//! [`AdapterHandle::hold_while_paused`], counted as held. The hold is bounded by the server's maximum
//! ([`Coordinator::gate_deadline`](loragate_core::Coordinator::gate_deadline)); past it the request fails with 503
//! naming the adapter. The same bytes are then passed on, with the deadline as a
//! [`GateDeadline`](loragate_core::GateDeadline) extension so the handler admits with the same deadline. A client that goes away while held drops this future, which uncounts it:
//! nothing is left behind.
//!
//! Bodies it cannot read as JSON with a string `model` pass through untouched: the handler rejects them with 400,
//! and admission in the core still never admits into a closed gate.

use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use loragate_core::{AdapterHandle, AdapterKey};
use serde::Deserialize;

use crate::error::HttpError;
use crate::json_body::read_body;
use crate::server::{AppState, HttpFront};

/// The one field of a completion request the gate reads; every other field is skipped.
#[derive(Deserialize)]
struct ModelProbe {
    model: String,
}

/// The middleware (apply it with `axum::middleware::from_fn_with_state`).
pub(crate) async fn submission_gate(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let (mut parts, body) = request.into_parts();
    let bytes = match read_body(body, state.body_limit()).await {
        Ok(bytes) => bytes,
        Err(err) => return err.into_response(),
    };
    let deadline = state.front().coordinator().gate_deadline(None);
    if let Some(adapter) = gated_adapter(state.front(), &bytes)
        && let Err(err) = adapter.hold_while_paused(deadline.hold_until()).await
    {
        return HttpError::sampling(err).into_response();
    }
    parts.extensions.insert(deadline);
    next.run(Request::from_parts(parts, Body::from(bytes))).await
}

/// The loaded adapter (or base model) a buffered completion request addresses, if it can be read.
fn gated_adapter(front: &HttpFront, body: &[u8]) -> Option<AdapterHandle> {
    let probe: ModelProbe = serde_json::from_slice(body).ok()?;
    let key = AdapterKey::parse(front.lora_name_for(&probe.model)).ok()?;
    front.coordinator().adapter(&key).ok()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use loragate_core::testing::ScriptedEngine;
    use loragate_core::{AdapterName, AdapterSource, Coordinator, CoordinatorConfig};

    use super::*;
    use crate::test_codec::ByteCodec;

    #[tokio::test]
    async fn the_probe_maps_model_to_the_adapter_and_passes_unreadable_bodies() {
        let coordinator =
            Coordinator::start(Arc::new(ScriptedEngine::new(1)), CoordinatorConfig::default()).await.expect("start");
        let meow = AdapterName::parse("meow").expect("name");
        coordinator.load_adapter(&meow, AdapterSource::trusted("/a/meow")).await.expect("load");
        let front = HttpFront::new(coordinator, "demo", Arc::new(ByteCodec));
        let key_of = |body: &str| gated_adapter(&front, body.as_bytes()).map(|handle| handle.key().clone());

        assert_eq!(key_of(r#"{"prompt": "x", "model": "meow", "n": 2}"#), Some(AdapterKey::Lora(meow)));
        assert_eq!(key_of(r#"{"model": "demo"}"#), Some(AdapterKey::Base), "the served name is the base model");
        for passed_through in [r#"{"model": "ghost"}"#, r#"{"model": 7}"#, r#"{"prompt": "x"}"#, "not json", ""] {
            assert_eq!(key_of(passed_through), None, "{passed_through}");
        }
    }
}
