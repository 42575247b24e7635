//! `GET /v1/models`: OpenAI's model list. The base model under its served name, then every loaded adapter with the
//! base model as its `parent`, each with loragate's live state (`version`, `sha256`, `paused`, `in_flight`, `held`,
//! `waiting`) as extra fields, and after each adapter its retained older versions (`--retain-versions`) as
//! `NAME@V` entries: the names that pin them.

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
    /// The SHA-256 of the version's `adapter_model.safetensors`, where this server can read it (absent for the base
    /// model).
    #[serde(skip_serializing_if = "Option::is_none")]
    sha256: Option<String>,
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
    let base = front.served_model_name().to_owned();
    let cards = |status: AdapterStatus| {
        let (id, parent) = match &status.key {
            AdapterKey::Base => (base.clone(), None),
            AdapterKey::Lora(name) => (name.to_string(), Some(base.clone())),
        };
        let current = ModelCard {
            id: id.clone(),
            object: "model",
            created,
            owned_by: "loragate",
            parent: parent.clone(),
            max_model_len,
            version: status.version.0,
            paused: status.paused,
            in_flight: status.in_flight,
            held: status.held,
            waiting: status.waiting,
            sha256: status.versions.last().and_then(|info| info.sha256).map(|sha256| sha256.to_hex()),
            weights_error: status.weights_error,
        };
        // The older versions kept for pins: their requests are counted under the adapter's own entry.
        let retained =
            status.versions.into_iter().filter(|info| info.version != status.version).map(|info| ModelCard {
                id: format!("{id}@{}", info.version.0),
                object: "model",
                created,
                owned_by: "loragate",
                parent: parent.clone(),
                max_model_len,
                version: info.version.0,
                paused: status.paused,
                in_flight: 0,
                held: 0,
                waiting: 0,
                sha256: info.sha256.map(|sha256| sha256.to_hex()),
                weights_error: None,
            });
        std::iter::once(current).chain(retained.collect::<Vec<_>>())
    };
    // Ordered base model first, then adapters by name, each followed by its retained versions, oldest first.
    let statuses = front.coordinator().statuses().await.into_iter();
    let data = statuses.filter(|status| caller.may_see(&status.key)).flat_map(cards).collect();
    Json(ModelList { object: "list", data })
}
