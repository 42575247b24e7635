//! Control endpoints, each on one adapter: SkyRL's `/skyrl/v1/{abort,resume,wait}_lora_…` with SkyRL's shapes, and
//! vLLM's `/v1/{load,unload}_lora_adapter`. Unlike SkyRL, an unknown adapter is a 404: no state is ever made up for
//! a name.

use axum::Json;
use axum::extract::{Extension, State};
use loragate_core::{Action, AdapterKey, AdapterName, Principal, parse_timeout_s};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::error::HttpError;
use crate::json_body::JsonBody;
use crate::server::AppState;

/// How long `wait_lora_unpaused` waits when the caller says nothing (SkyRL's client default).
const DEFAULT_WAIT_TIMEOUT_S: f64 = 60.0;

/// `{"lora_name"}`: the body of abort, resume and unload.
#[derive(Deserialize)]
pub(crate) struct LoraNameBody {
    lora_name: Option<String>,
}

/// `{"lora_name", "timeout_s"}`.
#[derive(Deserialize)]
pub(crate) struct WaitBody {
    lora_name: Option<String>,
    timeout_s: Option<f64>,
}

/// `{"lora_name", "lora_path"}` (vLLM's `load_inplace` is ignored: loading under a loaded name always swaps in
/// place and bumps the version).
#[derive(Deserialize)]
pub(crate) struct LoadBody {
    lora_name: Option<String>,
    lora_path: Option<String>,
}

/// The adapter a request names, once its caller is known to be allowed `action` on it.
fn authorized(caller: &Principal, raw: Option<String>, action: Action) -> Result<AdapterName, HttpError> {
    let name = AdapterName::parse(&raw.ok_or(HttpError::MissingField("lora_name"))?).map_err(HttpError::control)?;
    caller.authorize(action, &AdapterKey::Lora(name.clone())).map_err(HttpError::control)?;
    Ok(name)
}

/// `POST /skyrl/v1/abort_lora_requests`: pauses the adapter and aborts its requests; answers once each was handed
/// back. `aborted` lists their request ids (a completion's `X-Request-Id`).
pub(crate) async fn abort_lora_requests(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    JsonBody(body): JsonBody<LoraNameBody>,
) -> Result<Json<Value>, HttpError> {
    let name = authorized(&caller, body.lora_name, Action::Control)?;
    let report = state.front().coordinator().abort(&name).await.map_err(HttpError::control)?;
    if !report.unacknowledged.is_empty() {
        tracing::warn!(adapter = %name, unacknowledged = ?report.unacknowledged, "abort acknowledgement timed out");
    }
    let aborted: Vec<String> = report.aborted.iter().map(ToString::to_string).collect();
    let unacknowledged: Vec<String> = report.unacknowledged.iter().map(ToString::to_string).collect();
    Ok(Json(json!({"status": "ok", "count": aborted.len(), "aborted": aborted, "unacknowledged": unacknowledged})))
}

/// `POST /skyrl/v1/resume_lora_requests`: reopens the adapter, releasing every held request and waiter.
pub(crate) async fn resume_lora_requests(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    JsonBody(body): JsonBody<LoraNameBody>,
) -> Result<Json<Value>, HttpError> {
    let name = authorized(&caller, body.lora_name, Action::Control)?;
    let was_paused = state.front().coordinator().resume(&name).await.map_err(HttpError::control)?;
    Ok(Json(json!({"status": "ok", "was_paused": was_paused})))
}

/// `POST /skyrl/v1/wait_lora_unpaused`: long-polls until the adapter is open (`paused: false`) or `timeout_s`
/// passes (`paused: true`).
pub(crate) async fn wait_lora_unpaused(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    JsonBody(body): JsonBody<WaitBody>,
) -> Result<Json<Value>, HttpError> {
    let name = authorized(&caller, body.lora_name, Action::Sample)?;
    let timeout = parse_timeout_s(body.timeout_s.unwrap_or(DEFAULT_WAIT_TIMEOUT_S)).map_err(HttpError::control)?;
    let paused = state.front().coordinator().wait_unpaused(&name, timeout).await.map_err(HttpError::control)?;
    Ok(Json(json!({"paused": paused})))
}

/// `POST /v1/load_lora_adapter`: loads (or swaps in) weights from a directory under the adapter root.
pub(crate) async fn load_lora_adapter(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    JsonBody(body): JsonBody<LoadBody>,
) -> Result<Json<Value>, HttpError> {
    let name = authorized(&caller, body.lora_name, Action::Control)?;
    let path = body.lora_path.ok_or(HttpError::MissingField("lora_path"))?;
    let version = state.front().coordinator().load_adapter_at(&name, &path).await.map_err(HttpError::control)?;
    tracing::info!(adapter = %name, %version, "adapter loaded");
    Ok(Json(json!({"status": "ok", "lora_name": name.as_str(), "version": version.0})))
}

/// `POST /v1/unload_lora_adapter`: aborts the adapter's requests, fails its held ones, and frees its weights.
pub(crate) async fn unload_lora_adapter(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    JsonBody(body): JsonBody<LoraNameBody>,
) -> Result<Json<Value>, HttpError> {
    let name = authorized(&caller, body.lora_name, Action::Control)?;
    state.front().coordinator().unload_adapter(&name).await.map_err(HttpError::control)?;
    tracing::info!(adapter = %name, "adapter unloaded");
    Ok(Json(json!({"status": "ok", "lora_name": name.as_str()})))
}
