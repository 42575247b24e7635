//! `GET /v1/models`: OpenAI's model list. The base model under its served name, then every loaded adapter with the
//! base model as its `parent`, each with loragate's live state (`version`, `paused`, `in_flight`, `held`,
//! `waiting`) as extra fields.

use std::time::{SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::extract::{Extension, State};
use loragate_core::{AdapterKey, AdapterStatus, Principal};
use serde::Serialize;

use crate::state::AppState;

/// OpenAI's model list.
#[derive(Debug, Serialize)]
pub(crate) struct ModelList {
    object: &'static str,
    data: Vec<ModelCard>,
}

/// One model (vLLM's card: OpenAI's fields plus `parent` and `max_model_len`).
#[derive(Debug, Serialize)]
struct ModelCard {
    id: String,
    object: &'static str,
    created: u64,
    owned_by: &'static str,
    parent: Option<String>,
    max_model_len: u32,
    version: u64,
    paused: bool,
    in_flight: u32,
    held: u32,
    waiting: u32,
    /// Why the adapter cannot serve (its recorded weights could not be loaded at start); absent when it serves.
    #[serde(skip_serializing_if = "Option::is_none")]
    weights_error: Option<String>,
}

/// The handler of `GET /v1/models`.
/// A tenant sees the base model and the adapters it may sample, not other tenants'.
pub(crate) async fn list_models(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
) -> Json<ModelList> {
    let front = state.front();
    let created = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |since| since.as_secs());
    let max_model_len = front.coordinator().model_info().context_length;
    let card = |status: AdapterStatus| {
        let (id, parent) = match &status.key {
            AdapterKey::Base => (front.served_model_name().to_owned(), None),
            AdapterKey::Lora(name) => (name.to_string(), Some(front.served_model_name().to_owned())),
        };
        ModelCard {
            id,
            object: "model",
            created,
            owned_by: "loragate",
            parent,
            max_model_len,
            version: status.version.0,
            paused: status.paused,
            in_flight: status.in_flight,
            held: status.held,
            waiting: status.waiting,
            weights_error: status.weights_error,
        }
    };
    // Ordered base model first, then adapters by name.
    let statuses = front.coordinator().statuses().await.into_iter();
    let data = statuses.filter(|status| caller.may_see(&status.key)).map(card).collect();
    Json(ModelList { object: "list", data })
}
