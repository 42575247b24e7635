//! The engine-wide pause the RL frameworks' released clients call, in each engine's own shapes, all over the one
//! global pause of the coordinator ([`Coordinator::pause_all`](loragate_core::Coordinator::pause_all)): every adapter
//! and the base model are paused under the global owner (adapters loaded meanwhile start paused), and a resume
//! releases that pause only, so an adapter a trainer paused itself stays paused.
//!
//! - vLLM: `POST /pause?mode=abort|wait|keep&kv=recompute|reuse&clear_cache=..&timeout_s=..` (default `abort`; `kv`
//!   defaults to `recompute`, and `reuse` parks the kept sequences with their keys and values where the engine can;
//!   the answer's `kv_policy` says which was applied; `clear_cache` is accepted and has nothing to clear;
//!   `timeout_s` bounds a wait-mode pause's drain: past it the pause is withdrawn everywhere and the answer is 504),
//!   `POST /resume`, `GET /is_paused`.
//! - SGLang: `POST /pause_generation {"mode": "abort"|"retract"|"in_place", "kv_policy": "recompute"|"reuse"}`
//!   (default `abort`; `retract` and `in_place` keep; `kv_policy` as vLLM's `kv`), `POST /continue_generation`.
//! - AReaL's vLLM extension: `POST /areal_pause_generation` (abort), `POST /areal_continue_generation`.
//!
//! Every one is strict: another query parameter, or a body field other than SGLang's `mode` and `kv_policy`, is a
//! 400 naming it.
//! The bodyless calls take no body or `{}`.

use axum::Json;
use axum::extract::State;
use http::Uri;
use loragate_core::{KvPolicy, PauseMode, parse_timeout_s};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::control::parse_kv_policy;
use crate::error::HttpError;
use crate::json_body::{NoFields, OptionalJsonBody};
use crate::state::AppState;

/// SGLang's `/pause_generation` body; an empty body or `{}` pauses in abort mode.
#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PauseGenerationBody {
    mode: Option<String>,
    kv_policy: Option<String>,
}

/// What vLLM's `/pause` query string asks for.
#[derive(Debug, PartialEq)]
struct PauseQuery {
    mode: PauseMode,
    kv_policy: KvPolicy,
    /// With `timeout_s` (wait mode only): when the drain gives up.
    drain_until: Option<Instant>,
}

/// Parses vLLM's `/pause` query string: `mode` (default abort), `kv` (default recompute), `clear_cache` (accepted:
/// nothing to clear) and `timeout_s`; anything else is refused, naming it.
fn pause_query(uri: &Uri) -> Result<PauseQuery, HttpError> {
    let (mut mode, mut kv_policy, mut timeout_s) = (None, KvPolicy::Recompute, None);
    for pair in uri.query().unwrap_or("").split('&').filter(|pair| !pair.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        match key {
            "mode" => mode = Some(PauseMode::parse(value).map_err(HttpError::control)?),
            "kv" => {
                // The query's own name for the field.
                kv_policy =
                    KvPolicy::parse(value).map_err(|_| HttpError::invalid("kv", "must be one of recompute, reuse"))?;
            }
            "clear_cache" => {}
            "timeout_s" => {
                let seconds = value.parse::<f64>().map_err(|_| HttpError::invalid("timeout_s", "must be a number"))?;
                timeout_s = Some(parse_timeout_s(seconds).map_err(HttpError::control)?);
            }
            other => {
                return Err(HttpError::invalid(
                    other,
                    "unknown query parameter (this takes mode, kv, clear_cache, timeout_s)",
                ));
            }
        }
    }
    let mode = mode.unwrap_or(PauseMode::Abort);
    if timeout_s.is_some() && mode != PauseMode::Wait {
        return Err(HttpError::invalid("timeout_s", format!("bounds a wait-mode pause only; this pause is {mode}")));
    }
    Ok(PauseQuery { mode, kv_policy, drain_until: timeout_s.map(|timeout| Instant::now() + timeout) })
}

/// Pauses everything; returns the KV policy applied.
async fn pause_all(
    state: &AppState,
    mode: PauseMode,
    kv_policy: KvPolicy,
    drain_until: Option<Instant>,
) -> Result<KvPolicy, HttpError> {
    let coordinator = state.front().coordinator();
    coordinator.pause_all(mode, kv_policy, drain_until).await.map_err(HttpError::control)?;
    Ok(coordinator.kv_policy_applied(mode, kv_policy))
}

async fn resume_all(state: &AppState) -> Result<(), HttpError> {
    state.front().coordinator().resume_all().await.map_err(HttpError::control)?;
    Ok(())
}

/// `POST /pause?mode=..&kv=..`: vLLM's engine-wide pause.
pub(crate) async fn pause(
    State(state): State<AppState>,
    uri: Uri,
    OptionalJsonBody(NoFields {}): OptionalJsonBody<NoFields>,
) -> Result<Json<Value>, HttpError> {
    let query = pause_query(&uri)?;
    let kv_policy = pause_all(&state, query.mode, query.kv_policy, query.drain_until).await?;
    Ok(Json(json!({"status": "paused", "kv_policy": kv_policy.as_str()})))
}

/// `POST /resume`: vLLM's engine-wide resume.
pub(crate) async fn resume(
    State(state): State<AppState>,
    OptionalJsonBody(NoFields {}): OptionalJsonBody<NoFields>,
) -> Result<Json<Value>, HttpError> {
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
    let kv_policy = pause_all(&state, mode, parse_kv_policy(body.kv_policy.as_deref())?, None).await?;
    Ok(Json(json!({"message": "Generation paused successfully.", "status": "ok", "kv_policy": kv_policy.as_str()})))
}

/// `POST /continue_generation`: SGLang's engine-wide resume.
pub(crate) async fn continue_generation(
    State(state): State<AppState>,
    OptionalJsonBody(NoFields {}): OptionalJsonBody<NoFields>,
) -> Result<Json<Value>, HttpError> {
    resume_all(&state).await?;
    Ok(Json(json!({"message": "Generation continued successfully.", "status": "ok"})))
}

/// `POST /areal_pause_generation`: AReaL's pause (abort mode; held requests wait for the continue).
pub(crate) async fn areal_pause_generation(
    State(state): State<AppState>,
    OptionalJsonBody(NoFields {}): OptionalJsonBody<NoFields>,
) -> Result<Json<Value>, HttpError> {
    pause_all(&state, PauseMode::Abort, KvPolicy::Recompute, None).await?;
    Ok(Json(json!({"status": "ok"})))
}

/// `POST /areal_continue_generation`: AReaL's continue.
pub(crate) async fn areal_continue_generation(
    State(state): State<AppState>,
    OptionalJsonBody(NoFields {}): OptionalJsonBody<NoFields>,
) -> Result<Json<Value>, HttpError> {
    resume_all(&state).await?;
    Ok(Json(json!({"status": "ok"})))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_query_mode_defaults_to_abort_and_unknown_values_and_parameters_are_named() {
        let query = |uri: &str| pause_query(&uri.parse::<Uri>().expect("uri"));
        let mode = |uri: &str| query(uri).map(|query| query.mode).ok();
        assert_eq!(mode("/pause"), Some(PauseMode::Abort));
        assert_eq!(mode("/pause?mode=keep&clear_cache=false"), Some(PauseMode::Keep));
        assert_eq!(mode("/pause?clear_cache=true&mode=wait"), Some(PauseMode::Wait));
        assert!(query("/pause?mode=wait&timeout_s=0.5").expect("bounded").drain_until.is_some());
        for (uri, param) in [
            ("/pause?mode=freeze", "mode"),
            ("/pause?mdoe=keep", "mdoe"),
            ("/pause?mode=abort&timeout_s=1", "timeout_s"),
            ("/pause?mode=wait&timeout_s=soon", "timeout_s"),
            ("/pause?mode=wait&timeout_s=-1", "timeout_s"),
        ] {
            let err = query(uri).expect_err(uri);
            assert_eq!(err.param().as_deref(), Some(param), "{uri}");
            assert_eq!(err.status(), http::StatusCode::BAD_REQUEST);
        }
    }

    #[test]
    fn the_query_kv_policy_defaults_to_recompute_and_names_the_field_when_unknown() {
        let kv = |uri: &str| pause_query(&uri.parse::<Uri>().expect("uri")).map(|query| query.kv_policy);
        assert_eq!(kv("/pause?mode=keep").ok(), Some(KvPolicy::Recompute));
        assert_eq!(kv("/pause?mode=keep&kv=reuse").ok(), Some(KvPolicy::Reuse));
        assert_eq!(kv("/pause?kv=recompute&mode=keep").ok(), Some(KvPolicy::Recompute));
        let err = kv("/pause?mode=keep&kv=sometimes").expect_err("unknown policy");
        assert_eq!(err.param().as_deref(), Some("kv"));
        assert_eq!(err.status(), http::StatusCode::BAD_REQUEST);
    }
}
