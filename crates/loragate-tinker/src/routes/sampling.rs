//! Sampling: sampling sessions, `asample` (answers at once with the future's ids; the sample runs on its own task)
//! and `retrieve_future` (the long poll).

use axum::Json;
use axum::extract::{Extension, Path, State};
use axum::response::{IntoResponse, Response};
use http::header::CONTENT_TYPE;
use http::{HeaderValue, StatusCode};
use loragate_core::{Action, AdapterKey, Principal};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::error::TinkerError;
use crate::ids::{FutureId, KnownId, sampling_session_id, sampling_session_target};
use crate::json_body::JsonBody;
use crate::naming::{Naming, model_path_of};
use crate::sample_request::AsampleBody;
use crate::sample_task::run_sample;
use crate::state::TinkerState;
use crate::store::{Creator, DedupKey, FutureState, FutureSubject, Submission};

/// The content type of a finished sample.
const PROTOBUF: &str = "application/x-protobuf";

fn naming(state: &TinkerState) -> Naming<'_> {
    Naming { served_model_name: state.served_model_name(), coordinator: state.coordinator() }
}

/// The body of `create_sampling_session`.
#[derive(Deserialize)]
pub(crate) struct CreateSamplingSessionBody {
    base_model: Option<String>,
    model_path: Option<String>,
}

/// `POST /api/v1/create_sampling_session`: resolves the target now (so a bad name fails `create_sampling_client`)
/// and answers an id that names it.
pub(crate) async fn create_sampling_session(
    State(state): State<TinkerState>,
    Extension(caller): Extension<Principal>,
    JsonBody(body): JsonBody<CreateSamplingSessionBody>,
) -> Result<Json<Value>, TinkerError> {
    let target = naming(&state).resolve(body.base_model.as_deref(), body.model_path.as_deref())?;
    authorize(&caller, &target)?;
    Ok(Json(json!({"type": "create_sampling_session", "sampling_session_id": sampling_session_id(&target)})))
}

/// `GET /api/v1/samplers/{id}`: what a sampling session samples (the SDK asks for the base model's name).
pub(crate) async fn sampler(
    State(state): State<TinkerState>,
    Path(id): Path<String>,
) -> Result<Json<Value>, TinkerError> {
    let target = session_target(&id)?;
    Ok(Json(json!({
        "sampler_id": id,
        "base_model": state.served_model_name(),
        "model_path": model_path_of(&target),
    })))
}

/// Checks that the caller (the front's authentication puts it in the request) may sample `target`.
fn authorize(caller: &Principal, target: &AdapterKey) -> Result<(), TinkerError> {
    caller.authorize(Action::Sample, target).map_err(TinkerError::Core)
}

fn session_target(id: &str) -> Result<AdapterKey, TinkerError> {
    sampling_session_target(id).ok_or_else(|| {
        TinkerError::UnknownTarget(format!(
            "sampling session '{id}' is unknown: create one with create_sampling_client"
        ))
    })
}

/// `POST /api/v1/asample`: validates the request, records its future (durably: it survives a restart) and starts its
/// sample; answers before any token is generated. A paused adapter is no error: the sample waits inside the core, the future stays pending.
pub(crate) async fn asample(
    State(state): State<TinkerState>,
    Extension(caller): Extension<Principal>,
    JsonBody(body): JsonBody<AsampleBody>,
) -> Result<Json<Value>, TinkerError> {
    let naming = naming(&state);
    let target = match &body.sampling_session_id {
        Some(id) => {
            let target = session_target(id)?;
            naming.check_served(&target)?;
            target
        }
        None => naming.resolve(body.base_model.as_deref(), body.model_path.as_deref())?,
    };
    authorize(&caller, &target)?;
    let dedup = body
        .sampling_session_id
        .clone()
        .zip(body.seq_id)
        .map(|(sampling_session_id, seq_id)| DedupKey { sampling_session_id, seq_id });
    let id = state.ids().future_id();
    // Recorded with the future once it validated: a restart validates it again and continues it.
    let request = serde_json::to_value(&body).map_err(|err| TinkerError::invalid("body", err.to_string()))?;
    // With tenant keys, a tenant's cached prefixes are its own.
    let plan = body.into_plan(id, &target, state.coordinator(), None)?.scope_cache_to(caller.cache_scope());
    let num_samples = plan.request.num_samples();
    let subject = FutureSubject { target, creator: Creator::Caller(caller) };
    let id = match state.store().submit(id, subject, dedup, request).await? {
        Submission::New(future) => {
            tokio::spawn(run_sample(state.clone(), plan, future));
            id
        }
        Submission::Existing(earlier) => earlier,
    };
    let request_id = id.to_wire();
    let sequence_ids: Vec<String> = (0..num_samples).map(|i| format!("{request_id}:{i}")).collect();
    Ok(Json(json!({"request_id": request_id, "sample_sequence_ids": sequence_ids})))
}

/// The body of `retrieve_future` (`allow_metadata_only` is ignored: results are small and sent whole).
#[derive(Deserialize)]
pub(crate) struct RetrieveFutureBody {
    request_id: Option<String>,
}

/// `POST /api/v1/retrieve_future`: holds the poll until the future is final or the hold time passes, then answers
/// the `SampleResponse` (protobuf), the failure, or `try_again` with the adapter's queue state.
pub(crate) async fn retrieve_future(
    State(state): State<TinkerState>,
    Extension(caller): Extension<Principal>,
    JsonBody(body): JsonBody<RetrieveFutureBody>,
) -> Result<Response, TinkerError> {
    let raw = body.request_id.ok_or_else(|| TinkerError::invalid("request_id", "is required"))?;
    let (id, earlier) = match FutureId::classify(&raw, state.ids().epoch()) {
        KnownId::Ours(id) => (id, false),
        KnownId::EarlierProcess(id) => (id, true),
        KnownId::Foreign => return Err(TinkerError::UnknownFuture(raw)),
    };
    let watch = match state.store().watch(id).await? {
        Some(watch) => watch,
        // An earlier process's future that was not put back at start (not recorded, or its result expired).
        None if earlier => return Err(TinkerError::FutureOfEarlierProcess(raw)),
        None => return Err(TinkerError::UnknownFuture(raw)),
    };
    // Only the key that created a future may read it (base-model futures included); to any other caller it does not
    // exist, so an id learnt elsewhere tells nothing.
    if !watch.subject.creator.may_read(&caller, &watch.subject.target) {
        return Err(TinkerError::UnknownFuture(raw));
    }
    let target = watch.subject.target;
    let mut future = watch.state;
    let settled = match tokio::time::timeout(state.config().poll_hold, future.wait_for(FutureState::is_final)).await {
        Ok(Ok(final_state)) => final_state.clone(),
        Ok(Err(_dropped)) => return Err(TinkerError::UnknownFuture(raw)),
        Err(_hold_passed) => FutureState::Pending,
    };
    let response = match settled {
        FutureState::Pending => return Ok(Json(try_again(&state, &raw, &target)).into_response()),
        FutureState::Finished(bytes) => {
            let mut response = (StatusCode::OK, bytes).into_response();
            response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(PROTOBUF));
            response
        }
        FutureState::Failed(failure) => {
            Json(json!({"error": failure.message, "category": failure.category.as_str()})).into_response()
        }
    };
    state.store().delivered(id);
    Ok(response)
}

/// `try_again`, with `paused_capacity` while the target's gate is closed (read from the core).
fn try_again(state: &TinkerState, request_id: &str, target: &AdapterKey) -> Value {
    let paused = state.coordinator().adapter(target).is_ok_and(|adapter| adapter.gate().paused);
    if paused {
        json!({
            "type": "try_again",
            "request_id": request_id,
            "queue_state": "paused_capacity",
            "queue_state_reason": format!(
                "{target} is paused for a weight update; the sample continues after resume"
            ),
        })
    } else {
        json!({"type": "try_again", "request_id": request_id, "queue_state": "active"})
    }
}
