//! Versions as a contract, on HTTP: the staleness bound of an adapter (`PUT` / `DELETE
//! /v1/lora_adapters/{name}/staleness`) and the provenance of a recently finished request (`GET
//! /v1/requests/{request_id}`). The minimum version (`min_lora_version`) and pins (`model: "NAME@V"`) are fields of
//! the sampling bodies, parsed with each endpoint's own fields.
//!
//! The staleness routes are control endpoints (the admin key, or a tenant key with `control` over the adapter), as
//! pausing is. A finished request is answered only to the key that sent it (or the admin); to anyone else it is
//! unknown (404), so request ids leak nothing across tenants.

use axum::Json;
use axum::Router;
use axum::extract::{Extension, Path, State};
use axum::routing::{get, put};
use loragate_core::{
    Action, AdapterKey, AdapterName, FinishedRequest, Principal, RequestId, StalenessPolicy, StalenessStatus,
};
use serde::{Deserialize, Serialize};

use crate::error::HttpError;
use crate::json_body::JsonBody;
use crate::output::{SegmentJson, segments_json};
use crate::state::AppState;

/// The routes of this module (merged into the front's own, so they pass the same guard and authentication).
pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/lora_adapters/{name}/staleness", put(set_staleness).delete(clear_staleness))
        .route("/v1/requests/{request_id}", get(finished_request))
}

/// Whether `path` is a staleness route (a control endpoint, for the guard).
pub(crate) fn is_staleness_path(path: &str) -> bool {
    path.strip_prefix("/v1/lora_adapters/")
        .and_then(|rest| rest.strip_suffix("/staleness"))
        .is_some_and(|name| !name.is_empty() && !name.contains('/'))
}

/// Whether `path` is `GET /v1/requests/{request_id}` (a sampling caller's endpoint, for the guard: the handler lets
/// each caller read only its own requests).
pub(crate) fn is_finished_request_path(path: &str) -> bool {
    path.strip_prefix("/v1/requests/").is_some_and(|id| !id.is_empty() && !id.contains('/'))
}

/// `{"max_staleness", "batch_size"}`: the body of `PUT /v1/lora_adapters/{name}/staleness`. `batch_size` 0 turns the
/// bound off, as `DELETE` does.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct StalenessBody {
    max_staleness: Option<u32>,
    batch_size: Option<u32>,
}

/// The answer of both staleness routes: the bound as it now stands (`null` when off).
#[derive(Debug, Serialize)]
struct StalenessAnswer {
    status: &'static str,
    lora_name: String,
    staleness: Option<StalenessJson>,
}

/// `LoraStaleness` as JSON.
#[derive(Debug, Serialize)]
struct StalenessJson {
    max_staleness: u32,
    batch_size: u32,
    started: u64,
    capacity: u64,
    held: u32,
}

impl From<StalenessStatus> for StalenessJson {
    fn from(status: StalenessStatus) -> Self {
        Self {
            max_staleness: status.policy.max_staleness,
            batch_size: status.policy.batch_size,
            started: status.started,
            capacity: status.capacity,
            held: status.held,
        }
    }
}

/// The adapter `{name}` names, once `caller` is known to control it.
fn controlled(caller: &Principal, raw: &str) -> Result<AdapterName, HttpError> {
    let name = AdapterName::parse(raw).map_err(HttpError::control)?;
    caller.authorize(Action::Control, &AdapterKey::Lora(name.clone())).map_err(HttpError::control)?;
    Ok(name)
}

/// `PUT /v1/lora_adapters/{name}/staleness`: sets the adapter's staleness bound at its current version (see
/// `docs/versions.md`); answers with the bound as it stands.
async fn set_staleness(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    Path(name): Path<String>,
    JsonBody(body): JsonBody<StalenessBody>,
) -> Result<Json<StalenessAnswer>, HttpError> {
    let name = controlled(&caller, &name)?;
    let max_staleness = body.max_staleness.ok_or(HttpError::MissingField("max_staleness"))?;
    let batch_size = body.batch_size.ok_or(HttpError::MissingField("batch_size"))?;
    let policy = StalenessPolicy::parse(max_staleness, batch_size).map_err(HttpError::control)?;
    answer(&state, name, policy).await
}

/// `DELETE /v1/lora_adapters/{name}/staleness`: turns the adapter's staleness bound off (requests held by it are
/// admitted).
async fn clear_staleness(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    Path(name): Path<String>,
) -> Result<Json<StalenessAnswer>, HttpError> {
    let name = controlled(&caller, &name)?;
    answer(&state, name, None).await
}

async fn answer(
    state: &AppState,
    name: AdapterName,
    policy: Option<StalenessPolicy>,
) -> Result<Json<StalenessAnswer>, HttpError> {
    let set = state.front().coordinator().set_staleness(&name, policy).await.map_err(HttpError::control)?;
    Ok(Json(StalenessAnswer { status: "ok", lora_name: name.to_string(), staleness: set.map(StalenessJson::from) }))
}

/// The answer of `GET /v1/requests/{request_id}`.
#[derive(Debug, Serialize)]
struct FinishedJson {
    request_id: String,
    /// The served name it sampled: an adapter's, or the base model's.
    model: String,
    /// Unix seconds when its last sequence ended.
    finished_at: u64,
    sequences: Vec<FinishedSequenceJson>,
}

#[derive(Debug, Serialize)]
struct FinishedSequenceJson {
    index: usize,
    finish_reason: &'static str,
    num_tokens: u32,
    segments: Vec<SegmentJson>,
}

/// `GET /v1/requests/{request_id}`: a recently finished request's sequences (finish reason, token count, version
/// segments), to the key that sent it. A request of an HTTP batch is `<id>-<i>` (one per prompt).
async fn finished_request(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    Path(raw): Path<String>,
) -> Result<Json<FinishedJson>, HttpError> {
    let unknown = || HttpError::UnknownRequest(raw.clone());
    let id = RequestId::parse_or_generate(&raw).ok().filter(|_| !raw.is_empty()).ok_or_else(unknown)?;
    let front = state.front();
    let finished = front.coordinator().finished_request(&id, &caller).ok_or_else(unknown)?;
    Ok(Json(finished_json(&finished, front.served_model_name())))
}

fn finished_json(finished: &FinishedRequest, served_model_name: &str) -> FinishedJson {
    let model = match &finished.adapter {
        AdapterKey::Base => served_model_name.to_owned(),
        AdapterKey::Lora(name) => name.to_string(),
    };
    let finished_at = finished.finished_at.duration_since(std::time::UNIX_EPOCH).map_or(0, |since| since.as_secs());
    let sequences = finished
        .sequences
        .iter()
        .enumerate()
        .map(|(index, sequence)| FinishedSequenceJson {
            index,
            finish_reason: sequence.finish_reason.as_str(),
            num_tokens: sequence.token_count,
            segments: segments_json(&sequence.segments),
        })
        .collect();
    FinishedJson { request_id: finished.request_id.to_string(), model, finished_at, sequences }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_guard_classifies_only_well_formed_paths() {
        assert!(is_staleness_path("/v1/lora_adapters/meow/staleness"));
        assert!(is_staleness_path("/v1/lora_adapters/team-a%2Fpolicy/staleness"));
        assert!(!is_staleness_path("/v1/lora_adapters//staleness"));
        assert!(!is_staleness_path("/v1/lora_adapters/a/b/staleness"));
        assert!(!is_staleness_path("/v1/lora_adapters/meow"));
        assert!(is_finished_request_path("/v1/requests/r-1"));
        assert!(!is_finished_request_path("/v1/requests/"));
        assert!(!is_finished_request_path("/v1/requests/a/b"));
    }
}
