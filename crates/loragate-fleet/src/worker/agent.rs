//! Delivering a pushed version to an HTTP worker through its `loragate agent` (`?agent=HOST:PORT` in its address):
//! vLLM's and SGLang's servers load adapters only from a local directory, so the coordinator streams the version's
//! two files to the agent beside the worker (`PUT /v1/lora_adapters/NAME?version=V&sha256=HEX`, a
//! `multipart/form-data` body as `curl -F` sends it, presenting the worker key), which writes them atomically under
//! its directory and answers the local path, then asks the worker to load that path. The agent's answered SHA-256
//! and size must be the pushed ones, else the delivery fails.
//!
//! Once the worker no longer holds a version (unloaded: retired, rolled back, stale after a catch-up; or its load
//! refused), the coordinator asks the agent to remove its copy (`DELETE /v1/lora_adapters/NAME/versions/V`), so the
//! agent's directory keeps only what the worker may still load: with `--retain-versions N`, the N retained versions.
//! That call is best effort: a failure is logged (WARN) and the copy stays until the agent is told again.

use std::time::Duration;

use futures::StreamExt;
use loragate_core::{CONFIG_FILE, WEIGHTS_FILE};

use super::WorkerError;
use super::http::{answer, transport};
use crate::delivery::PushedFiles;

/// Streams `files` to the agent at `agent_base` as version `engine_name` (`NAME@V`) and answers the directory the
/// agent wrote them to (as the worker beside it sees it).
pub(super) async fn push_to_agent(
    client: &reqwest::Client,
    agent_base: &str,
    engine_name: &str,
    files: &PushedFiles,
    timeout: Duration,
) -> Result<String, WorkerError> {
    let Some((name, version)) = engine_name.rsplit_once('@') else {
        return Err(WorkerError::InvalidArgument(format!("{engine_name} is not a versioned name NAME@V")));
    };
    let boundary = format!("loragate-push-{}", files.sha256());
    let config = files.config_json().await?;
    let head = format!(
        "--{boundary}\r\n{}\r\nContent-Type: application/json\r\n\r\n{config}\r\n--{boundary}\r\n{}\r\n\
         Content-Type: application/octet-stream\r\n\r\n",
        disposition(CONFIG_FILE),
        disposition(WEIGHTS_FILE),
    );
    let tail = format!("\r\n--{boundary}--\r\n");
    let body = futures::stream::once(async move { head.into_bytes() })
        .chain(files.weights().await?)
        .chain(futures::stream::once(async move { tail.into_bytes() }))
        .map(Ok::<_, std::io::Error>);
    let url = format!("{agent_base}/v1/lora_adapters/{name}?version={version}&sha256={}", files.sha256());
    let response = client
        .put(url)
        .header(reqwest::header::CONTENT_TYPE, format!("multipart/form-data; boundary={boundary}"))
        .body(reqwest::Body::wrap_stream(body))
        .timeout(timeout)
        .send()
        .await
        .map_err(|err| agent_error(transport(err)))?;
    let receipt = match answer(response).await.map_err(agent_error)? {
        Ok(receipt) => receipt,
        Err(refusal) => return Err(agent_error(refusal.into_error())),
    };
    let sha256 = receipt["sha256"].as_str().unwrap_or_default();
    files.check_receipt(sha256, receipt["bytes"].as_u64()).map_err(agent_error)?;
    match receipt["path"].as_str() {
        Some(path) if !path.is_empty() => Ok(path.to_owned()),
        _ => Err(agent_error(WorkerError::Malformed(format!("an answer without its path: {receipt}")))),
    }
}

/// Asks the agent at `agent_base` to remove its copy of `engine_name` (`NAME@V`); answers whether it had one. A name
/// that is not `NAME@V` (not the fleet's) is left alone.
pub(super) async fn remove_from_agent(
    client: &reqwest::Client,
    agent_base: &str,
    engine_name: &str,
    timeout: Duration,
) -> Result<bool, WorkerError> {
    let Some((name, version)) = engine_name.rsplit_once('@').filter(|(_, version)| version.parse::<u64>().is_ok())
    else {
        return Ok(false);
    };
    let url = format!("{agent_base}/v1/lora_adapters/{name}/versions/{version}");
    let response = client.delete(url).timeout(timeout).send().await.map_err(|err| agent_error(transport(err)))?;
    match answer(response).await.map_err(agent_error)? {
        Ok(receipt) => Ok(receipt["removed"].as_bool().unwrap_or(false)),
        Err(refusal) => Err(agent_error(refusal.into_error())),
    }
}

/// A part's `Content-Disposition` line: its name is its file's.
fn disposition(file: &str) -> String {
    format!("Content-Disposition: form-data; name=\"{file}\"; filename=\"{file}\"")
}

/// `err` as the agent's, not the worker's.
fn agent_error(err: WorkerError) -> WorkerError {
    match err {
        WorkerError::InvalidArgument(message) => WorkerError::InvalidArgument(format!("agent: {message}")),
        WorkerError::FailedPrecondition(message) => WorkerError::FailedPrecondition(format!("agent: {message}")),
        WorkerError::NotFound(message) | WorkerError::AlreadyExists(message) | WorkerError::Refused(message) => {
            WorkerError::Refused(format!("agent: {message}"))
        }
        WorkerError::Malformed(message) => WorkerError::Malformed(format!("agent: {message}")),
        WorkerError::Unavailable(message) => WorkerError::Unavailable(format!("agent: {message}")),
    }
}
