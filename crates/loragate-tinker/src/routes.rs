//! The `/api/v1/` routes, and the handlers of the bookkeeping ones: client configuration, sessions and heartbeats,
//! telemetry, capabilities, health. Sampling lives in `routes/sampling.rs`, refusals in `routes/refused.rs`.

mod refused;
mod sampling;

use axum::Json;
use axum::Router;
use axum::extract::{Path, State};
use axum::middleware::from_fn_with_state;
use axum::routing::{MethodRouter, any, get, post};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::auth::authenticate;
use crate::error::TinkerError;
use crate::json_body::JsonBody;
use crate::state::TinkerState;

/// The SDK versions this front was checked against; others get a warning in their log at `create_session`.
const CHECKED_SDK_VERSIONS: &str = "0.38.";

/// The SDK's own default for in-flight `sample()` calls per sampling client.
const SDK_MAX_CONCURRENT_SAMPLES: usize = 2000;

/// Every Tinker route this front answers, each behind the front's authentication.
pub(crate) fn routes(state: TinkerState) -> Router {
    Router::new()
        .route("/api/v1/client/config", only(post(client_config)))
        .route("/api/v1/client/dynamic_config", only(post(dynamic_config)))
        .route("/api/v1/create_session", only(post(create_session)))
        .route("/api/v1/session_heartbeat", only(post(session_heartbeat)))
        .route("/api/v1/sessions/{session_id}/finish", only(post(finish_session)))
        .route("/api/v1/telemetry", only(post(telemetry)))
        .route("/api/v1/get_server_capabilities", only(get(server_capabilities)))
        .route("/api/v1/healthz", only(get(healthz)))
        .route("/api/v1/create_sampling_session", only(post(sampling::create_sampling_session)))
        .route("/api/v1/samplers/{sampling_session_id}", only(get(sampling::sampler)))
        .route("/api/v1/asample", only(post(sampling::asample)))
        .route("/api/v1/retrieve_future", only(post(sampling::retrieve_future)))
        .route("/api/v1/{*rest}", any(refused::not_supported))
        .route_layer(from_fn_with_state(state.clone(), authenticate))
        .with_state(state)
}

/// A route's methods, answering other methods with a `{"detail"}` 405.
fn only(methods: MethodRouter<TinkerState>) -> MethodRouter<TinkerState> {
    methods.fallback(|method: http::Method, uri: http::Uri| async move {
        TinkerError::WrongMethod { method: method.to_string(), path: uri.path().to_owned() }
    })
}

/// `POST /api/v1/client/config`: the SDK's feature flags, every one sent explicitly.
async fn client_config(State(state): State<TinkerState>) -> Json<Value> {
    let max_concurrent = state.config().retention.max_pending.min(SDK_MAX_CONCURRENT_SAMPLES);
    Json(json!({
        "pjwt_auth_enabled": false,
        "use_pyqwest_transport": true,
        "sample_use_retrieve_futures": false,
        "sample_join_sampling_session": false,
        "sample_no_retries": false,
        "sample_enable_stuck_detection": true,
        "sample_max_concurrent_requests": max_concurrent,
        "custom_loss_server_side": false,
    }))
}

/// `POST /api/v1/client/dynamic_config`: no server-side cancellation (abandoned samples run to their end and their
/// results expire).
async fn dynamic_config() -> Json<Value> {
    Json(json!({"refresh_interval_sec": 300, "sample_cancel_enabled": false, "sample_cancel_max_batch_size": 64}))
}

/// The body of `create_session` (only the SDK's version is read).
#[derive(Deserialize)]
struct CreateSessionBody {
    sdk_version: Option<String>,
}

/// `POST /api/v1/create_session`: a session is bookkeeping only; its id is made up here.
async fn create_session(State(state): State<TinkerState>, JsonBody(body): JsonBody<CreateSessionBody>) -> Json<Value> {
    let mut answer = json!({"type": "create_session", "session_id": state.ids().session_id()});
    match body.sdk_version.as_deref() {
        Some(version) if version.starts_with(CHECKED_SDK_VERSIONS) => {}
        version => {
            answer["warning_message"] = json!(format!(
                "loragate's Tinker front was checked against tinker {CHECKED_SDK_VERSIONS}x; this client is {}: \
                 pin tinker==0.38.0 if sampling misbehaves",
                version.unwrap_or("of an unknown version")
            ));
        }
    }
    Json(answer)
}

/// `{"session_id"}`.
#[derive(Deserialize)]
struct HeartbeatBody {
    session_id: Option<String>,
}

/// `POST /api/v1/session_heartbeat`: 200 for every session but a finished one (410, and the SDK stops beating). A
/// session this process never saw (it restarted) is fine.
async fn session_heartbeat(
    State(state): State<TinkerState>,
    JsonBody(body): JsonBody<HeartbeatBody>,
) -> Result<Json<Value>, TinkerError> {
    let session_id = body.session_id.ok_or_else(|| TinkerError::invalid("session_id", "is required"))?;
    if state.store().session_finished(session_id.clone()).await? {
        return Err(TinkerError::SessionFinished(session_id));
    }
    Ok(Json(json!({"type": "session_heartbeat"})))
}

/// `POST /api/v1/sessions/{session_id}/finish`: later heartbeats of the session get 410.
async fn finish_session(State(state): State<TinkerState>, Path(session_id): Path<String>) -> Json<Value> {
    state.store().finish_session(session_id);
    Json(json!({}))
}

/// `POST /api/v1/telemetry`: the SDK's own analytics, accepted and dropped.
async fn telemetry(JsonBody(_events): JsonBody<Value>) -> Json<Value> {
    Json(json!({"status": "accepted"}))
}

/// `GET /api/v1/get_server_capabilities`: the served base model (adapters are not models here: `/v1/models` lists
/// them).
async fn server_capabilities(State(state): State<TinkerState>) -> Json<Value> {
    Json(json!({"supported_models": [{
        "model_name": state.served_model_name(),
        "max_context_length": state.coordinator().model_info().context_length,
        "trainable": false,
        "sampleable": true,
    }]}))
}

/// `GET /api/v1/healthz`.
async fn healthz() -> Json<Value> {
    Json(json!({"status": "ok"}))
}
