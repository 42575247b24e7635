//! Control endpoints: SkyRL's `/skyrl/v1/{abort,resume,wait}_lora_…` with SkyRL's shapes (plus loragate's pause
//! `mode`, `owner`, `lease_s`, `kv_policy` and `pause_id`), SkyRL 0.4's in-place reload `/skyrl/v1/load_lora_adapter`, vLLM's
//! `/v1/{load,unload}_lora_adapter` (also at the root, where prime-rl and SGLang clients call them), the cache
//! flushes clients call between steps, and SGLang's server info. Unlike SkyRL, an unknown adapter is a 404: no state
//! is ever made up for a name.
//!
//! Bodies are strict, as vLLM's and SGLang's control endpoints are: a field not listed here is a 400 naming it, so a
//! typo (`"ownr"`, `"lease"`) never turns into a pause without an owner or a lease. The fields listed are every one
//! the frameworks' released clients send (`framework-clients.md`).

use axum::Json;
use axum::extract::{Extension, State};
use http::StatusCode;
use loragate_core::{
    Action, AdapterKey, AdapterName, KvPolicy, PauseId, PauseMode, PauseRequest, Principal, parse_timeout_s,
};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::error::HttpError;
use crate::json_body::{JsonBody, OptionalJsonBody};
use crate::state::AppState;

/// How long `wait_lora_unpaused` waits when the caller says nothing (SkyRL's client default).
const DEFAULT_WAIT_TIMEOUT_S: f64 = 60.0;

/// `{"lora_name"}`: the body of unload (vLLM's `lora_int_id` is accepted and changes nothing: names identify
/// adapters here).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct UnloadBody {
    lora_name: Option<String>,
    #[allow(dead_code)]
    lora_int_id: Option<i64>,
}

/// `{"lora_name", "mode", "owner", "lease_s", "timeout_s", "kv_policy"}`: the body of abort (a pause; `mode` defaults
/// to abort, `kv_policy` — `recompute` or `reuse`, for keep mode — to recompute). `timeout_s` bounds a wait-mode
/// pause's drain: past it the pause is withdrawn and the answer is 504.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PauseBody {
    lora_name: Option<String>,
    mode: Option<String>,
    owner: Option<String>,
    lease_s: Option<f64>,
    timeout_s: Option<f64>,
    kv_policy: Option<String>,
}

/// Parses an optional `kv_policy` (`recompute`, `reuse`); absent is recompute.
pub(crate) fn parse_kv_policy(raw: Option<&str>) -> Result<KvPolicy, HttpError> {
    raw.map_or(Ok(KvPolicy::Recompute), KvPolicy::parse).map_err(HttpError::control)
}

/// `{"lora_name", "pause_id"}`: the body of resume (without `pause_id`, every pause is released).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ResumeBody {
    lora_name: Option<String>,
    pause_id: Option<String>,
}

/// `{"lora_name", "timeout_s"}`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct WaitBody {
    lora_name: Option<String>,
    timeout_s: Option<f64>,
}

/// `{"lora_name", "lora_path", "load_inplace", "kv_policy"}`. Loading under a loaded name always swaps its weights
/// and bumps its version; with vLLM's `load_inplace: true` it is the atomic keep-mode swap (running requests stop,
/// and continue on the new weights, recomputing their keys and values unless `kv_policy` is `reuse`), which is what
/// vLLM's in-place reload means for requests in flight.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct LoadBody {
    lora_name: Option<String>,
    lora_path: Option<String>,
    #[serde(default)]
    load_inplace: bool,
    kv_policy: Option<String>,
}

/// The adapter a request names, once its caller is known to be allowed `action` on it.
fn authorized(caller: &Principal, raw: Option<String>, action: Action) -> Result<AdapterName, HttpError> {
    let name = AdapterName::parse(&raw.ok_or(HttpError::MissingField("lora_name"))?).map_err(HttpError::control)?;
    caller.authorize(action, &AdapterKey::Lora(name.clone())).map_err(HttpError::control)?;
    Ok(name)
}

/// `POST /skyrl/v1/abort_lora_requests`: pauses the adapter in `mode` (default `abort`); answers once each aborted
/// request was handed back (or each kept one stopped, or, in `wait` mode, none is left running). `aborted` lists the
/// aborted requests' ids (a completion's `X-Request-Id`), `pause_id` names the pause for a targeted resume,
/// `kv_policy` is the KV policy applied (`reuse` only for a keep-mode pause that asked for it on an engine that can
/// park).
pub(crate) async fn abort_lora_requests(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    JsonBody(body): JsonBody<PauseBody>,
) -> Result<Json<Value>, HttpError> {
    let name = authorized(&caller, body.lora_name, Action::Control)?;
    let mode = body.mode.as_deref().map_or(Ok(PauseMode::Abort), PauseMode::parse).map_err(HttpError::control)?;
    let kv_policy = parse_kv_policy(body.kv_policy.as_deref())?;
    let pause = PauseRequest::parse(mode, body.owner.as_deref().unwrap_or(""), body.lease_s.unwrap_or(0.0))
        .map_err(HttpError::control)?
        .with_kv_policy(kv_policy);
    let drain_until = drain_deadline(mode, body.timeout_s)?;
    let report = state.front().coordinator().pause(&name, pause, drain_until).await.map_err(HttpError::control)?;
    let aborted: Vec<String> = report.aborted.iter().map(ToString::to_string).collect();
    let unacknowledged: Vec<String> = report.unacknowledged.iter().map(ToString::to_string).collect();
    Ok(Json(json!({
        "status": "ok",
        "count": aborted.len(),
        "aborted": aborted,
        "unacknowledged": unacknowledged,
        "pause_id": report.pause_id.as_str(),
        "mode": report.mode.as_str(),
        "kept_count": report.kept.len(),
        "kv_policy": report.kv_policy.as_str(),
    })))
}

/// The deadline of a wait-mode pause's drain, from `timeout_s` (finite, `>= 0`); only wait mode drains.
fn drain_deadline(mode: PauseMode, timeout_s: Option<f64>) -> Result<Option<Instant>, HttpError> {
    let Some(timeout_s) = timeout_s else { return Ok(None) };
    if mode != PauseMode::Wait {
        return Err(HttpError::invalid("timeout_s", format!("bounds a wait-mode pause only; this pause is {mode}")));
    }
    let timeout = parse_timeout_s(timeout_s).map_err(HttpError::control)?;
    Ok(Some(Instant::now() + timeout))
}

/// `POST /skyrl/v1/resume_lora_requests`: releases the pause `pause_id`, or every pause of the adapter; when none
/// is left it reopens, releasing every held request, kept request and waiter.
pub(crate) async fn resume_lora_requests(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    JsonBody(body): JsonBody<ResumeBody>,
) -> Result<Json<Value>, HttpError> {
    let name = authorized(&caller, body.lora_name, Action::Control)?;
    let pause_id = PauseId::parse(body.pause_id.as_deref().unwrap_or("")).map_err(HttpError::control)?;
    let report = state.front().coordinator().resume(&name, pause_id).await.map_err(HttpError::control)?;
    Ok(Json(json!({"status": "ok", "was_paused": report.was_paused, "still_paused": report.still_paused})))
}

/// The answer of `wait_lora_unpaused`: `{"paused": bool}` (serialized directly: this endpoint is polled in loops).
#[derive(Serialize)]
pub(crate) struct WaitAnswer {
    paused: bool,
}

/// `POST /skyrl/v1/wait_lora_unpaused`: long-polls until the adapter is open (`paused: false`) or `timeout_s`
/// passes (`paused: true`).
pub(crate) async fn wait_lora_unpaused(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    JsonBody(body): JsonBody<WaitBody>,
) -> Result<Json<WaitAnswer>, HttpError> {
    let name = authorized(&caller, body.lora_name, Action::Sample)?;
    let timeout = parse_timeout_s(body.timeout_s.unwrap_or(DEFAULT_WAIT_TIMEOUT_S)).map_err(HttpError::control)?;
    let paused = state.front().coordinator().wait_unpaused(&name, timeout).await.map_err(HttpError::control)?;
    Ok(Json(WaitAnswer { paused }))
}

/// `POST /v1/load_lora_adapter` (and its root alias): loads weights from a directory under the adapter root, or swaps
/// them under a loaded name; with `load_inplace: true` on a loaded name, as the atomic keep-mode swap.
pub(crate) async fn load_lora_adapter(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    JsonBody(body): JsonBody<LoadBody>,
) -> Result<Json<Value>, HttpError> {
    let swap = body.load_inplace.then_some(PauseMode::Keep);
    load(&state, &caller, body, swap).await
}

/// `POST /skyrl/v1/load_lora_adapter`: SkyRL 0.4's in-place reload (new weights under the same name every step,
/// with generation running and no pause call), done as the atomic keep-mode swap: running requests stop, and
/// continue on the new weights with their tokens' versions recorded.
pub(crate) async fn skyrl_load_lora_adapter(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    JsonBody(body): JsonBody<LoadBody>,
) -> Result<Json<Value>, HttpError> {
    load(&state, &caller, body, Some(PauseMode::Keep)).await
}

/// Loads `body`'s adapter, as a swap in `swap` mode if given (a plain load for a name not loaded yet).
async fn load(
    state: &AppState,
    caller: &Principal,
    body: LoadBody,
    swap: Option<PauseMode>,
) -> Result<Json<Value>, HttpError> {
    let name = authorized(caller, body.lora_name, Action::Control)?;
    let coordinator = state.front().coordinator();
    // The name first: a reserved one is refused whatever the path.
    coordinator.check_loadable_name(&name).map_err(HttpError::control)?;
    let kv_policy = parse_kv_policy(body.kv_policy.as_deref())?;
    let path = body.lora_path.ok_or(HttpError::MissingField("lora_path"))?;
    let source = coordinator.resolve_adapter_path(caller, &path).await.map_err(HttpError::control)?;
    let (installed, kept, aborted, kv_policy) = match swap {
        Some(mode) => {
            let swap =
                coordinator.swap_adapter(&name, source, mode, kv_policy, None).await.map_err(HttpError::control)?;
            (swap.installed, swap.kept, swap.aborted, swap.kv_policy)
        }
        None => {
            let installed = coordinator.load_adapter(&name, source).await.map_err(HttpError::control)?;
            (installed, 0, 0, KvPolicy::Recompute)
        }
    };
    Ok(Json(json!({
        "status": "ok",
        "lora_name": name.as_str(),
        "version": installed.version.0,
        "sha256": installed.sha256.map(|sha| sha.to_hex()),
        "kept_count": kept,
        "aborted_count": aborted,
        "kv_policy": kv_policy.as_str(),
    })))
}

/// `POST /v1/unload_lora_adapter`: aborts the adapter's requests, fails its held ones, and frees its weights.
pub(crate) async fn unload_lora_adapter(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    JsonBody(body): JsonBody<UnloadBody>,
) -> Result<Json<Value>, HttpError> {
    let name = authorized(&caller, body.lora_name, Action::Control)?;
    state.front().coordinator().unload_adapter(&name).await.map_err(HttpError::control)?;
    Ok(Json(json!({"status": "ok", "lora_name": name.as_str()})))
}

/// The body of `/reset_prefix_cache` and `/flush_cache`: nothing, `{}`, or SkyRL's `{"reset_running_requests": false}`.
#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FlushBody {
    #[allow(dead_code)]
    reset_running_requests: Option<bool>,
}

/// `POST /reset_prefix_cache` (vLLM) and `GET`/`POST /flush_cache` (SGLang): drops the engine's cached prompt prefixes
/// that no running request uses, and answers 200 with an empty body (the prefixes running requests use stay, so it
/// never has to refuse while requests run, as SGLang does). The body is read (and checked) like every other: a body
/// left unread would cost the client its keep-alive connection.
pub(crate) async fn flush_cache(
    State(state): State<AppState>,
    OptionalJsonBody(_): OptionalJsonBody<FlushBody>,
) -> StatusCode {
    let dropped = state.front().coordinator().reset_prefix_cache();
    tracing::debug!(blocks = dropped, "the prefix cache was reset");
    StatusCode::OK
}

/// `GET /get_server_info` and `GET /server_info` (SGLang): the server's shape as slime reads it (one engine: every
/// parallel size 1, no disaggregation), and loragate's own facts.
pub(crate) async fn server_info(State(state): State<AppState>) -> Json<Value> {
    let front = state.front();
    let model = front.coordinator().model_info();
    Json(json!({
        "tp_size": 1,
        "pp_size": 1,
        "dp_size": 1,
        "ep_size": 1,
        "moe_dp_size": 1,
        "disaggregation_mode": "null",
        "encoder_only": false,
        "served_model_name": front.served_model_name(),
        "context_length": model.context_length,
        "vocab_size": model.vocab_size,
        "version": env!("CARGO_PKG_VERSION"),
        "engine": "loragate",
    }))
}
