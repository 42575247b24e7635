//! Adapter versions over HTTP: `PUT /v1/lora_adapters/{name}` pushes a version (a `multipart/form-data` body of two
//! parts, `adapter_config.json` then `adapter_model.safetensors`, as `curl -F` and Python's `requests`/`httpx` send
//! it; query `mode`, `kv`, `sha256`), streamed part by part into the core's receiver, never held whole;
//! `GET /v1/lora_adapters/{name}` answers the adapter's state with its retained versions; and
//! `GET /v1/lora_adapters/{name}/versions/{version}/{file}` streams one of a retained version's two files (admin, or
//! the tenant owning the adapter). A thin translation: the coordinator receives, checks and installs.

use axum::Json;
use axum::body::Body;
use axum::extract::{Extension, Path, Request, State};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use http::Uri;
use http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use loragate_core::{
    Action, AdapterKey, AdapterName, AdapterVersion, CONFIG_FILE, CoreError, KvPolicy, PauseMode, Principal,
    VersionOrigin, WEIGHTS_FILE,
};
use serde_json::{Value, json};

use crate::error::HttpError;
use crate::push_body::PushBody;
use crate::state::AppState;

/// The query of a push: `mode` (`abort`, `wait`, `keep`; default keep), `kv` (`recompute`, `reuse`; default
/// recompute), `sha256` (hex, of `adapter_model.safetensors`).
struct PushQuery {
    mode: PauseMode,
    kv_policy: KvPolicy,
    sha256: String,
}

/// Parses a push's query; anything else is refused, naming it.
fn push_query(uri: &Uri) -> Result<PushQuery, HttpError> {
    let mut query = PushQuery { mode: PauseMode::Keep, kv_policy: KvPolicy::Recompute, sha256: String::new() };
    for pair in uri.query().unwrap_or("").split('&').filter(|pair| !pair.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        match key {
            "mode" => query.mode = PauseMode::parse(value).map_err(HttpError::control)?,
            "kv" => {
                query.kv_policy =
                    KvPolicy::parse(value).map_err(|_| HttpError::invalid("kv", "must be one of recompute, reuse"))?;
            }
            "sha256" => query.sha256 = value.to_owned(),
            other => return Err(HttpError::invalid(other, "unknown query parameter (this takes mode, kv, sha256)")),
        }
    }
    Ok(query)
}

/// The adapter a path names, once its caller may do `action` on it.
fn authorized(caller: &Principal, raw: &str, action: Action) -> Result<AdapterName, HttpError> {
    let name = AdapterName::parse(raw).map_err(HttpError::control)?;
    caller.authorize(action, &AdapterKey::Lora(name.clone())).map_err(HttpError::control)?;
    Ok(name)
}

/// `PUT /v1/lora_adapters/{name}`: receives the two parts, then installs the version as a swap (see the module
/// documentation). The weights part is refused as it arrives: over `--max-adapter-bytes` (413), not safetensors
/// (415), a header that does not fit the model (400/422); the old version stays served.
pub(crate) async fn push_adapter(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    Path(raw_name): Path<String>,
    request: Request,
) -> Result<Json<Value>, HttpError> {
    let name = authorized(&caller, &raw_name, Action::Control)?;
    let PushQuery { mode, kv_policy, sha256 } = push_query(request.uri())?;
    let mut body = PushBody::of(request)?;
    let coordinator = state.front().coordinator();
    let declared = body.header(&sha256).await?;
    // Dropping the upload (an error, or the client gone) removes what was received.
    let mut upload = coordinator.begin_push(&name, declared).await.map_err(HttpError::control)?;
    body.weights_into(&mut upload).await?;
    let swap = coordinator.finish_push(upload, mode, kv_policy, None).await.map_err(HttpError::control)?;
    Ok(Json(json!({
        "status": "ok",
        "lora_name": name.as_str(),
        "version": swap.installed.version.0,
        "sha256": swap.installed.sha256.map(|sha| sha.to_hex()),
        "bytes": swap.installed.bytes,
        "aborted_count": swap.aborted,
        "kept_count": swap.kept,
        "kv_policy": swap.kv_policy.as_str(),
    })))
}

/// `GET /v1/lora_adapters/{name}`: the adapter's state, its current `version` and `sha256`, and every servable
/// version (`versions: [{version, sha256, bytes, source}]`, oldest first; `source` is the path or `push`).
pub(crate) async fn adapter_state(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    Path(raw_name): Path<String>,
) -> Result<Json<Value>, HttpError> {
    let name = authorized(&caller, &raw_name, Action::Sample)?;
    let key = AdapterKey::Lora(name.clone());
    let coordinator = state.front().coordinator();
    let status = coordinator.adapter(&key).map_err(HttpError::control)?.status().await.map_err(HttpError::control)?;
    let current = status.versions.iter().find(|held| held.version == status.version);
    let versions: Vec<Value> = status
        .versions
        .iter()
        .map(|held| {
            json!({
                "version": held.version.0,
                "sha256": held.sha256.map(|sha| sha.to_hex()),
                "bytes": held.bytes,
                "source": match &held.origin {
                    VersionOrigin::Push => "push".to_owned(),
                    VersionOrigin::Path(path) => path.display().to_string(),
                },
            })
        })
        .collect();
    Ok(Json(json!({
        "lora_name": name.as_str(),
        "version": status.version.0,
        "sha256": current.and_then(|held| held.sha256).map(|sha| sha.to_hex()),
        "paused": status.paused,
        "in_flight": status.in_flight,
        "held": status.held,
        "waiting": status.waiting,
        "weights_error": status.weights_error,
        "versions": versions,
    })))
}

/// `GET /v1/lora_adapters/{name}/versions/{version}/{file}`: streams `adapter_config.json` or
/// `adapter_model.safetensors` of a servable version (what replicas and workers pull).
pub(crate) async fn version_file(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    Path((raw_name, raw_version, file)): Path<(String, String, String)>,
) -> Result<Response, HttpError> {
    let name = authorized(&caller, &raw_name, Action::Control)?;
    let version = raw_version
        .parse::<u64>()
        .map(AdapterVersion)
        .map_err(|_| HttpError::invalid("version", format!("{raw_version:?} is not a version number")))?;
    let file: &'static str = match file.as_str() {
        CONFIG_FILE => CONFIG_FILE,
        WEIGHTS_FILE => WEIGHTS_FILE,
        _ => return Err(HttpError::NoSuchEndpoint(format!("/v1/lora_adapters/{name}/versions/{version}/{file}"))),
    };
    let source = state.front().coordinator().version_source(&name, version).await.map_err(HttpError::control)?;
    let opened = tokio::task::spawn_blocking(move || source.open_file(file)).await;
    let (file, len) = match opened {
        Ok(Ok(opened)) => opened,
        Ok(Err(err)) => {
            let missing = CoreError::WeightsMissing { adapter: AdapterKey::Lora(name), reason: err.to_string() };
            return Err(HttpError::control(missing));
        }
        Err(_) => return Err(HttpError::control(CoreError::ShuttingDown)),
    };
    let chunks = futures::stream::unfold(Some(file), |file| async move {
        let mut file = file?;
        let read = tokio::task::spawn_blocking(move || {
            use std::io::Read;
            let mut buffer = vec![0u8; 1 << 20];
            let read = file.read(&mut buffer).map(|n| {
                buffer.truncate(n);
                buffer
            });
            (file, read)
        })
        .await;
        match read {
            Ok((_, Ok(buffer))) if buffer.is_empty() => None,
            Ok((file, Ok(buffer))) => Some((Ok(bytes::Bytes::from(buffer)), Some(file))),
            Ok((_, Err(err))) => Some((Err(err), None)),
            Err(err) => Some((Err(std::io::Error::other(err)), None)),
        }
    });
    let mut response = Body::from_stream(chunks.boxed()).into_response();
    response.headers_mut().insert(CONTENT_LENGTH, len.into());
    response.headers_mut().insert(CONTENT_TYPE, http::HeaderValue::from_static("application/octet-stream"));
    Ok(response)
}
