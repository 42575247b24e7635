//! The engine-wide pause the RL frameworks' released clients call, in each engine's own shapes, all over the one
//! global pause of the coordinator ([`Coordinator::pause_all`](loragate_core::Coordinator::pause_all)): every adapter
//! and the base model are paused under the global owner (adapters loaded meanwhile start paused), and a resume
//! releases that pause only, so an adapter a trainer paused itself stays paused.
//!
//! - vLLM: `POST /pause?mode=abort|wait|keep&kv=recompute|reuse&clear_cache=..` (default `abort`; `kv` defaults to
//!   `recompute`, and `reuse` parks the kept sequences with their keys and values where the engine can; the answer's
//!   `kv_policy` says which was applied; `clear_cache` is accepted and has nothing to clear), `POST /resume`,
//!   `GET /is_paused`.
//! - SGLang: `POST /pause_generation {"mode": "abort"|"retract"|"in_place", "kv_policy": "recompute"|"reuse"}`
//!   (default `abort`; `retract` and `in_place` keep; `kv_policy` as vLLM's `kv`), `POST /continue_generation`.
//! - AReaL's vLLM extension: `POST /areal_pause_generation` (abort), `POST /areal_continue_generation`.

use axum::Json;
use axum::extract::State;
use http::Uri;
use loragate_core::{KvPolicy, PauseMode};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::control::parse_kv_policy;
use crate::error::HttpError;
use crate::json_body::OptionalJsonBody;
use crate::server::AppState;

/// SGLang's `/pause_generation` body; an empty body or `{}` pauses in abort mode.
#[derive(Default, Deserialize)]
pub(crate) struct PauseGenerationBody {
    mode: Option<String>,
    kv_policy: Option<String>,
}

/// The value of `key` in vLLM's `/pause` query string (other parameters, like `clear_cache`, are ignored).
fn query_value<'u>(uri: &'u Uri, key: &str) -> Option<&'u str> {
    uri.query()
        .unwrap_or("")
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .find_map(|(k, v)| (k == key).then_some(v))
}

/// The `mode` of vLLM's `/pause` query string.
fn query_mode(uri: &Uri) -> Result<PauseMode, HttpError> {
    query_value(uri, "mode").map_or(Ok(PauseMode::Abort), PauseMode::parse).map_err(HttpError::control)
}

/// The `kv` of vLLM's `/pause` query string (`recompute`, `reuse`; absent is recompute).
fn query_kv_policy(uri: &Uri) -> Result<KvPolicy, HttpError> {
    let kv = query_value(uri, "kv").map_or(Ok(KvPolicy::Recompute), KvPolicy::parse);
    // The query's own name for the field.
    kv.map_err(|_| HttpError::invalid("kv", "must be one of recompute, reuse"))
}

/// Pauses everything; returns the KV policy applied.
async fn pause_all(state: &AppState, mode: PauseMode, kv_policy: KvPolicy) -> Result<KvPolicy, HttpError> {
    let coordinator = state.front().coordinator();
    let report = coordinator.pause_all(mode, kv_policy, None).await.map_err(HttpError::control)?;
    let kv_policy = coordinator.kv_policy_applied(mode, kv_policy);
    tracing::info!(%mode, %kv_policy, aborted = report.aborted.len(), kept = report.kept.len(), "every adapter paused");
    Ok(kv_policy)
}

async fn resume_all(state: &AppState) -> Result<(), HttpError> {
    state.front().coordinator().resume_all().await.map_err(HttpError::control)?;
    Ok(())
}

/// `POST /pause?mode=..&kv=..`: vLLM's engine-wide pause.
pub(crate) async fn pause(State(state): State<AppState>, uri: Uri) -> Result<Json<Value>, HttpError> {
    let kv_policy = pause_all(&state, query_mode(&uri)?, query_kv_policy(&uri)?).await?;
    Ok(Json(json!({"status": "paused", "kv_policy": kv_policy.as_str()})))
}

/// `POST /resume`: vLLM's engine-wide resume.
pub(crate) async fn resume(State(state): State<AppState>) -> Result<Json<Value>, HttpError> {
    resume_all(&state).await?;
    Ok(Json(json!({"status": "resumed"})))
}

/// `GET /is_paused`: whether the engine-wide pause is set.
pub(crate) async fn is_paused(State(state): State<AppState>) -> Result<Json<Value>, HttpError> {
    let paused = state.front().coordinator().is_paused_globally().await.map_err(HttpError::control)?;
    Ok(Json(json!({"is_paused": paused})))
}

/// `POST /pause_generation`: SGLang's engine-wide pause.
pub(crate) async fn pause_generation(
    State(state): State<AppState>,
    OptionalJsonBody(body): OptionalJsonBody<PauseGenerationBody>,
) -> Result<Json<Value>, HttpError> {
    let mode = body.mode.as_deref().map_or(Ok(PauseMode::Abort), PauseMode::parse).map_err(HttpError::control)?;
    let kv_policy = pause_all(&state, mode, parse_kv_policy(body.kv_policy.as_deref())?).await?;
    Ok(Json(json!({"message": "Generation paused successfully.", "status": "ok", "kv_policy": kv_policy.as_str()})))
}

/// `POST /continue_generation`: SGLang's engine-wide resume.
pub(crate) async fn continue_generation(State(state): State<AppState>) -> Result<Json<Value>, HttpError> {
    resume_all(&state).await?;
    Ok(Json(json!({"message": "Generation continued successfully.", "status": "ok"})))
}

/// `POST /areal_pause_generation`: AReaL's pause (abort mode; held requests wait for the continue).
pub(crate) async fn areal_pause_generation(State(state): State<AppState>) -> Result<Json<Value>, HttpError> {
    pause_all(&state, PauseMode::Abort, KvPolicy::Recompute).await?;
    Ok(Json(json!({"status": "ok"})))
}

/// `POST /areal_continue_generation`: AReaL's continue.
pub(crate) async fn areal_continue_generation(State(state): State<AppState>) -> Result<Json<Value>, HttpError> {
    resume_all(&state).await?;
    Ok(Json(json!({"status": "ok"})))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_query_mode_defaults_to_abort_and_names_the_field_when_unknown() {
        let mode = |uri: &str| query_mode(&uri.parse::<Uri>().expect("uri"));
        assert_eq!(mode("/pause").ok(), Some(PauseMode::Abort));
        assert_eq!(mode("/pause?mode=keep&clear_cache=false").ok(), Some(PauseMode::Keep));
        assert_eq!(mode("/pause?clear_cache=true&mode=wait").ok(), Some(PauseMode::Wait));
        let err = mode("/pause?mode=freeze").expect_err("unknown mode");
        assert_eq!(err.param().as_deref(), Some("mode"));
        assert_eq!(err.status(), http::StatusCode::BAD_REQUEST);
    }

    #[test]
    fn the_query_kv_policy_defaults_to_recompute_and_names_the_field_when_unknown() {
        let kv = |uri: &str| query_kv_policy(&uri.parse::<Uri>().expect("uri"));
        assert_eq!(kv("/pause?mode=keep").ok(), Some(KvPolicy::Recompute));
        assert_eq!(kv("/pause?mode=keep&kv=reuse").ok(), Some(KvPolicy::Reuse));
        assert_eq!(kv("/pause?kv=recompute&mode=keep").ok(), Some(KvPolicy::Recompute));
        let err = kv("/pause?mode=keep&kv=sometimes").expect_err("unknown policy");
        assert_eq!(err.param().as_deref(), Some("kv"));
        assert_eq!(err.status(), http::StatusCode::BAD_REQUEST);
    }
}
