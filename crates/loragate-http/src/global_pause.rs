//! The engine-wide pause the RL frameworks' released clients call, in each engine's own shapes, all over the one
//! global pause of the coordinator ([`Coordinator::pause_all`](loragate_core::Coordinator::pause_all)): every adapter
//! and the base model are paused under the global owner (adapters loaded meanwhile start paused), and a resume
//! releases that pause only, so an adapter a trainer paused itself stays paused.
//!
//! - vLLM: `POST /pause?mode=abort|wait|keep&clear_cache=..` (default `abort`; `clear_cache` is accepted and has
//!   nothing to clear), `POST /resume`, `GET /is_paused`.
//! - SGLang: `POST /pause_generation {"mode": "abort"|"retract"|"in_place"}` (default `abort`; `retract` and
//!   `in_place` keep), `POST /continue_generation`.
//! - AReaL's vLLM extension: `POST /areal_pause_generation` (abort), `POST /areal_continue_generation`.

use axum::Json;
use axum::extract::State;
use http::Uri;
use loragate_core::PauseMode;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::error::HttpError;
use crate::json_body::OptionalJsonBody;
use crate::server::AppState;

/// SGLang's `/pause_generation` body; an empty body or `{}` pauses in abort mode.
#[derive(Default, Deserialize)]
pub(crate) struct PauseGenerationBody {
    mode: Option<String>,
}

/// The `mode` of vLLM's `/pause` query string (other parameters, like `clear_cache`, are accepted and ignored).
fn query_mode(uri: &Uri) -> Result<PauseMode, HttpError> {
    let mode = uri
        .query()
        .unwrap_or("")
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .find_map(|(key, value)| (key == "mode").then_some(value));
    mode.map_or(Ok(PauseMode::Abort), PauseMode::parse).map_err(HttpError::control)
}

async fn pause_all(state: &AppState, mode: PauseMode) -> Result<(), HttpError> {
    let report = state.front().coordinator().pause_all(mode, None).await.map_err(HttpError::control)?;
    tracing::info!(%mode, aborted = report.aborted.len(), kept = report.kept.len(), "every adapter paused");
    Ok(())
}

async fn resume_all(state: &AppState) -> Result<(), HttpError> {
    state.front().coordinator().resume_all().await.map_err(HttpError::control)?;
    Ok(())
}

/// `POST /pause?mode=..`: vLLM's engine-wide pause.
pub(crate) async fn pause(State(state): State<AppState>, uri: Uri) -> Result<Json<Value>, HttpError> {
    pause_all(&state, query_mode(&uri)?).await?;
    Ok(Json(json!({"status": "paused"})))
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
    pause_all(&state, mode).await?;
    Ok(Json(json!({"message": "Generation paused successfully.", "status": "ok"})))
}

/// `POST /continue_generation`: SGLang's engine-wide resume.
pub(crate) async fn continue_generation(State(state): State<AppState>) -> Result<Json<Value>, HttpError> {
    resume_all(&state).await?;
    Ok(Json(json!({"message": "Generation continued successfully.", "status": "ok"})))
}

/// `POST /areal_pause_generation`: AReaL's pause (abort mode; held requests wait for the continue).
pub(crate) async fn areal_pause_generation(State(state): State<AppState>) -> Result<Json<Value>, HttpError> {
    pause_all(&state, PauseMode::Abort).await?;
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
}
