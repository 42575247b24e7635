//! `loragate agent`: the sidecar beside a vLLM or SGLang HTTP worker, which can load adapters only from a local
//! directory. It takes the same `PUT /v1/lora_adapters/{name}` push as `loragate serve` (a `multipart/form-data` body
//! of `adapter_config.json` then `adapter_model.safetensors`; query `sha256=HEX` and, from a fleet coordinator,
//! `version=V`), and writes the version under its directory as `DIR/NAME@V/`, answering
//! `{"path", "sha256", "bytes"}` with the local path the worker then loads.
//!
//! - The weights go through the core's adapter store ([`loragate_core::AdapterStore`], under `DIR/.loragate-agent/`):
//!   streamed to a temporary file while they are hashed, bounded by the size limit as they arrive, the safetensors
//!   structure checked (the agent has no model, so no layout check), the size and declared SHA-256 checked at the
//!   end. The version's directory is then assembled in a temporary directory (hard links to the stored files) and
//!   renamed into place in one step: a client gone midway leaves nothing behind, and `DIR/NAME@V/` is complete or
//!   absent.
//! - With a key (`--api-key`), every call without it is 401. Names are validated as pushed names are (no `/`, `\`,
//!   `@`, `..`, whitespace or control characters): the agent writes only under its directory.
//! - Without `version`, the next version after the highest `NAME@V` in the directory is written.
//! - `DELETE /v1/lora_adapters/{name}/versions/{version}` removes `DIR/NAME@V/` (moved into the store's temporary
//!   directory in one step, then deleted) and answers `{"removed": true|false}` (false: it was not there). The fleet
//!   coordinator calls it once the worker beside the agent has unloaded that version (a retired version, a rolled-back
//!   staging), so the directory holds only the versions the worker may still load. Same key, same name rules.
//! - At start, what a push or a removal left half done (the store's `tmp/`, its unreferenced files) is removed.

mod install;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, Request, State};
use axum::http::header::AUTHORIZATION;
use axum::routing::{delete, put};
use http::Uri;
use loragate_core::{AdapterLayout, AdapterStore, CoreError, Key, Keyring, bearer_token, check_push_name};
use serde_json::{Value, json};
use tokio::net::TcpListener;

use crate::error::HttpError;
use crate::push_body::PushBody;

/// The directory under the agent's directory where pushes are received.
pub const AGENT_STORE_DIR: &str = ".loragate-agent";

/// How an agent runs.
#[derive(Clone, Debug)]
pub struct AgentConfig {
    /// Where versions are written (`--adapter-dir`): `DIR/NAME@V/`.
    pub adapter_dir: PathBuf,
    /// The key every call must present as `Authorization: Bearer KEY` (`--api-key`); none: calls are not checked.
    pub api_key: Option<Key>,
    /// The largest `adapter_model.safetensors` accepted (`--max-adapter-bytes`).
    pub max_adapter_bytes: u64,
}

/// What every request of the agent shares.
#[derive(Clone)]
struct Agent {
    dir: Arc<PathBuf>,
    store: AdapterStore,
    keys: Keyring,
}

/// Serves the agent on `listener` until `shutdown` completes. Creates the directory (and its store) if needed.
pub async fn serve_agent(
    listener: TcpListener,
    config: AgentConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let dir = config.adapter_dir.clone();
    let (dir, store) = tokio::task::spawn_blocking(move || {
        std::fs::create_dir_all(&dir)?;
        let dir = std::fs::canonicalize(&dir)?;
        // Opening the store empties its `tmp/`: pushes and removals an earlier run left half done.
        let store = AdapterStore::open(dir.join(AGENT_STORE_DIR), config.max_adapter_bytes)?;
        // Every version's directory holds its own links to its files: the store keeps nothing between pushes.
        store.collect_garbage(&Default::default())?;
        Ok::<_, std::io::Error>((dir, store))
    })
    .await
    .map_err(std::io::Error::other)??;
    let keys = Keyring::new(None, config.api_key, Default::default()).map_err(std::io::Error::other)?;
    if let Ok(address) = listener.local_addr()
        && !keys.is_enabled()
        && !address.ip().is_loopback()
    {
        warn_open(address);
    }
    let agent = Agent { dir: Arc::new(dir), store, keys };
    let router = axum::Router::new()
        .route("/v1/lora_adapters/{name}", put(push))
        .route("/v1/lora_adapters/{name}/versions/{version}", delete(remove))
        .with_state(agent);
    axum::serve(listener, router).with_graceful_shutdown(shutdown).await
}

fn warn_open(address: SocketAddr) {
    tracing::warn!(
        %address,
        "this agent listens beyond loopback without a key: anyone who reaches the port can write adapters into its \
         directory; start it with --api-key (the fleet coordinator's --worker-key)"
    );
}

/// The query of a push to an agent: `sha256` (hex) and `version` (the fleet's version number).
struct AgentQuery {
    sha256: String,
    version: Option<u64>,
}

fn agent_query(uri: &Uri) -> Result<AgentQuery, HttpError> {
    let mut query = AgentQuery { sha256: String::new(), version: None };
    for pair in uri.query().unwrap_or("").split('&').filter(|pair| !pair.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        match key {
            "sha256" => query.sha256 = value.to_owned(),
            "version" => match value.parse::<u64>() {
                Ok(version) if version > 0 => query.version = Some(version),
                _ => return Err(HttpError::invalid("version", "must be a whole number from 1")),
            },
            other => return Err(HttpError::invalid(other, "unknown query parameter (an agent takes sha256, version)")),
        }
    }
    Ok(query)
}

/// Authenticates the call and validates the adapter's name: a name the agent may write or remove under its directory.
fn admitted(agent: &Agent, headers: &http::HeaderMap, name: &str) -> Result<(), HttpError> {
    let presented = headers.get(AUTHORIZATION).and_then(|value| value.to_str().ok()).and_then(bearer_token);
    agent.keys.authenticate(presented).map_err(HttpError::control)?;
    loragate_core::AdapterName::parse(name).map_err(HttpError::control)?;
    check_push_name(name).map_err(HttpError::control)
}

/// `DELETE /v1/lora_adapters/{name}/versions/{version}`: removes `DIR/NAME@V/`.
async fn remove(
    State(agent): State<Agent>,
    Path((name, version)): Path<(String, String)>,
    headers: http::HeaderMap,
) -> Result<Json<Value>, HttpError> {
    admitted(&agent, &headers, &name)?;
    let version = match version.parse::<u64>() {
        Ok(version) if version > 0 => version,
        _ => return Err(HttpError::invalid("version", "must be a whole number from 1")),
    };
    let (dir, store) = (agent.dir.clone(), agent.store.clone());
    // On the blocking pool, to its end even if the client goes away now.
    let removed = tokio::task::spawn_blocking(move || {
        install::remove_version(&dir, &store, &name, version).map(|removed| (removed, name))
    })
    .await
    .map_err(|_| HttpError::control(CoreError::ShuttingDown))?;
    let (removed, name) = removed.map_err(|err| HttpError::control(install::store_failed("removing", &err)))?;
    if removed {
        tracing::info!(adapter = %name, version, "agent: adapter version removed");
    }
    Ok(Json(json!({"removed": removed})))
}

/// `PUT /v1/lora_adapters/{name}`: receives the two parts into the store, then writes `DIR/NAME@V/`.
async fn push(
    State(agent): State<Agent>,
    Path(name): Path<String>,
    request: Request,
) -> Result<Json<Value>, HttpError> {
    admitted(&agent, request.headers(), &name)?;
    let AgentQuery { sha256, version } = agent_query(request.uri())?;
    let mut body = PushBody::of(request)?;
    let declared = body.header(&sha256).await?;
    // No model here: the safetensors structure is checked by the receiver, the layout by the worker when it loads.
    let no_layout_check = Arc::new(|_: &AdapterLayout| Ok::<(), CoreError>(()));
    // Dropping the receiver (an error, or the client gone) removes what was received.
    let mut receiver = agent.store.receive(declared, no_layout_check).await.map_err(HttpError::control)?;
    body.weights_into(&mut receiver).await?;
    let stored = receiver.finish().await.map_err(HttpError::control)?;
    let (sha256, bytes) = (stored.sha256, stored.bytes);
    let (dir, store, blob) = (agent.dir.clone(), agent.store.clone(), stored.source.dir().to_owned());
    // On the blocking pool, to its end even if the client goes away now.
    let written = tokio::task::spawn_blocking(move || {
        let written = install::write_version(&dir, &store, &name, version, &blob);
        drop(stored.lease);
        // The version's directory holds its own links to the files: the store keeps nothing.
        if let Err(err) = store.collect_garbage(&Default::default()) {
            tracing::warn!(%err, "agent: cleaning the store failed; it is cleaned at the next push");
        }
        written
    })
    .await
    .map_err(|_| HttpError::control(CoreError::ShuttingDown))?;
    let path = written.map_err(|err| HttpError::control(install::store_failed("writing", &err)))?;
    tracing::info!(path = %path.display(), %sha256, bytes, "agent: adapter version written");
    Ok(Json(json!({"path": path.display().to_string(), "sha256": sha256.to_hex(), "bytes": bytes})))
}
