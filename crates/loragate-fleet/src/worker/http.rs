//! What vLLM's and SGLang's HTTP servers share: a pooled HTTP/1.1 client bound to the worker's base URL, JSON
//! calls bounded by a timeout, error answers in the fleet's terms (the message taken from vLLM's, SGLang's or
//! FastAPI's error shape), `GET /v1/models` (the context and the adapters, which both servers list), the sampling
//! fields both send, what their `generate` does around its own call (the prompt's logprobs scored first,
//! [`scored_then_opened`]), and their token streams (server-sent JSON chunks, [`streamed_events`]) with the parsing
//! helpers the chunks share.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use loragate_core::SampleRequest;
use reqwest::StatusCode;
use serde_json::{Map, Value, json};

use super::agent::{push_to_agent, remove_from_agent};
use super::sse::{self, SseEvent};
use super::{AbortBy, ClientSettings, OpenedSequence, SequenceEvent, SequenceRequest, WorkerError, WorkerFacts};
use crate::address::WorkerAddress;
use crate::delivery::Delivery;

/// The largest unstreamed answer read from a worker (a scoring answer carries a prompt's logprobs and their
/// candidates: tens of bytes per prompt token).
pub(super) const MAX_BODY_BYTES: usize = 64 << 20;

/// The longest a prompt-scoring request may take.
pub(super) const SCORING_TIMEOUT: Duration = Duration::from_secs(600);

/// A sequence's events as an HTTP worker streams them.
pub(super) type Events = BoxStream<'static, Result<SequenceEvent, WorkerError>>;

/// What every HTTP worker's `generate` does around its protocol's own call: when `sequence` asks for its prompt's
/// logprobs, they are scored first by a call of their own (`score`), and lead its events; `open` then starts the
/// generation and says how it is aborted.
pub(super) async fn scored_then_opened(
    sequence: &SequenceRequest<'_>,
    score: impl Future<Output = Result<SequenceEvent, WorkerError>>,
    open: impl Future<Output = Result<(Events, AbortBy), WorkerError>>,
) -> Result<OpenedSequence, WorkerError> {
    let prompt_event = match sequence.with_prompt_logprobs {
        true => Some(score.await?),
        false => None,
    };
    let (events, abort) = open.await?;
    let events = futures::stream::iter(prompt_event.map(Ok)).chain(events).boxed();
    Ok(OpenedSequence { events, abort })
}

/// The events of a streamed answer: each server-sent JSON chunk until `[DONE]`, parsed by `parse` (a chunk that is
/// not JSON, or that `parse` refuses, is an error event).
pub(super) fn streamed_events(
    response: reqwest::Response,
    mut parse: impl FnMut(&Value) -> Result<Vec<SequenceEvent>, WorkerError> + Send + 'static,
) -> Events {
    sse::events(response)
        .take_while(|event| std::future::ready(!matches!(event, Ok(SseEvent::Done))))
        .map(move |event| {
            let events = match event {
                Ok(SseEvent::Data(data)) => match serde_json::from_str::<Value>(&data) {
                    Ok(chunk) => {
                        parse(&chunk).map_or_else(|err| vec![Err(err)], |events| events.into_iter().map(Ok).collect())
                    }
                    Err(err) => vec![Err(WorkerError::Malformed(format!("a chunk that is not JSON: {err}")))],
                },
                Ok(SseEvent::Done) => Vec::new(),
                Err(err) => vec![Err(err)],
            };
            futures::stream::iter(events)
        })
        .flatten()
        .boxed()
}

/// A worker's HTTP endpoint.
pub(crate) struct HttpEndpoint {
    client: reqwest::Client,
    base: String,
    /// The worker's `loragate agent`, if its address names one: pushed versions are delivered through it.
    agent_base: Option<String>,
}

/// An answer that is not a success: its status and the message its body carried.
#[derive(Debug)]
pub(crate) struct Refusal {
    pub(crate) status: StatusCode,
    pub(crate) message: String,
    /// The body was FastAPI's own `{"detail": "Not Found"}`: the route does not exist on this server.
    pub(crate) no_such_route: bool,
}

impl Refusal {
    /// The refusal in the fleet's terms, by status: 400/422 a bad argument, 404 not found, 409 already exists,
    /// 401/403/405/501 a lasting refusal, anything else the worker failing.
    pub(crate) fn into_error(self) -> WorkerError {
        let message = format!("{} {}", self.status.as_u16(), self.message);
        match self.status.as_u16() {
            400 | 422 => WorkerError::InvalidArgument(message),
            404 => WorkerError::NotFound(message),
            409 => WorkerError::AlreadyExists(message),
            401 | 403 | 405 | 501 => WorkerError::Refused(message),
            _ => WorkerError::Unavailable(message),
        }
    }

    /// Whether the message says the name is loaded already (vLLM: "has already been loaded", SGLang: "already
    /// loaded" / "already exists").
    pub(crate) fn says_already_loaded(&self) -> bool {
        self.message.to_ascii_lowercase().contains("already")
    }
}

impl HttpEndpoint {
    /// An endpoint for `address`.
    pub(crate) fn new(address: &WorkerAddress, settings: ClientSettings) -> Result<Self, WorkerError> {
        let mut headers = reqwest::header::HeaderMap::new();
        if let Some(key) = &settings.key {
            let mut value = reqwest::header::HeaderValue::from_str(&format!("Bearer {}", key.expose_secret()))
                .map_err(|_| WorkerError::InvalidArgument("--worker-key is not a valid header value".into()))?;
            value.set_sensitive(true);
            headers.insert(reqwest::header::AUTHORIZATION, value);
        }
        let client = reqwest::Client::builder()
            .default_headers(headers)
            // A worker's redirect is never followed: the prompt (and the worker key) go to the worker named, or
            // nowhere. A 3xx answers as a refusal.
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(settings.connect_timeout)
            .tcp_nodelay(true)
            .pool_idle_timeout(Duration::from_secs(30))
            .build()
            .map_err(|err| WorkerError::InvalidArgument(format!("an HTTP client: {err}")))?;
        Ok(Self { client, base: address.http_base(), agent_base: address.agent_base() })
    }

    /// Loads `engine_name` with `load`, given the directory the worker loads `delivery` from: for a pushed version of
    /// a worker with an agent, where the agent wrote the files pushed to it ([`super::agent`]); else the delivery's
    /// path, as the workers see it. Where the agent received the files and the worker then refused them (or the
    /// push itself failed: the worker was never asked), the agent's copy is removed.
    pub(crate) async fn load_from<F, Fut>(
        &self,
        engine_name: &str,
        delivery: &Delivery,
        timeout: Duration,
        load: F,
    ) -> Result<(), WorkerError>
    where
        F: FnOnce(String) -> Fut,
        Fut: Future<Output = Result<(), WorkerError>>,
    {
        let (Some(agent), Some(files)) = (&self.agent_base, delivery.pushed()) else {
            return load(delivery.path().to_owned()).await;
        };
        let outcome = match push_to_agent(&self.client, agent, engine_name, files, timeout).await {
            Ok(path) => load(path).await,
            Err(err) => {
                // The worker was never asked: whatever the agent kept of this push is nobody's.
                self.remove_agent_copy(agent, engine_name, timeout).await;
                return Err(err);
            }
        };
        if outcome.is_err() {
            self.release_agent_copy(engine_name, &outcome, timeout).await;
        }
        outcome
    }

    /// Unloads `engine_name` with `unload` (the worker's own call), then releases the agent's copy of it as
    /// [`HttpEndpoint::release_agent_copy`] decides from the outcome: unloaded (or not held), it is no longer needed.
    pub(crate) async fn unload_with<F, Fut>(
        &self,
        engine_name: &str,
        timeout: Duration,
        unload: F,
    ) -> Result<(), WorkerError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<(), WorkerError>>,
    {
        let outcome = unload().await;
        self.release_agent_copy(engine_name, &outcome, timeout).await;
        outcome
    }

    /// After the worker stopped holding `engine_name` (`outcome`: its unload succeeded, or it did not hold it) or
    /// refused to load it, asks the worker's agent (if its address names one) to remove its copy; else does nothing.
    /// Never after an uncertain answer (a timeout, a 5xx): the worker may still hold the version and load it from
    /// the agent's directory again. Best effort: a failure is logged, and the copy stays until the next release.
    async fn release_agent_copy(&self, engine_name: &str, outcome: &Result<(), WorkerError>, timeout: Duration) {
        let Some(agent) = &self.agent_base else { return };
        let released = match outcome {
            Ok(()) | Err(WorkerError::NotFound(_)) => true,
            // A definite refusal of a load: nothing was loaded from the copy.
            Err(WorkerError::InvalidArgument(_) | WorkerError::FailedPrecondition(_) | WorkerError::Refused(_)) => true,
            Err(WorkerError::AlreadyExists(_) | WorkerError::Malformed(_) | WorkerError::Unavailable(_)) => false,
        };
        if released {
            self.remove_agent_copy(agent, engine_name, timeout).await;
        }
    }

    /// Asks `agent` to remove its copy of `engine_name`. Best effort: a failure is logged, and the copy stays until
    /// the next release.
    async fn remove_agent_copy(&self, agent: &str, engine_name: &str, timeout: Duration) {
        match remove_from_agent(&self.client, agent, engine_name, timeout).await {
            Ok(removed) => tracing::debug!(worker = %self.base, %engine_name, removed, "agent's copy released"),
            Err(err) => {
                tracing::warn!(worker = %self.base, %engine_name, %err, "removing the agent's copy failed; it stays on the agent's disk");
            }
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// `GET path`, bounded by `timeout`: the JSON answer (or `Null` for an empty body), else the refusal.
    pub(crate) async fn get(&self, path: &str, timeout: Duration) -> Result<Result<Value, Refusal>, WorkerError> {
        let request = self.client.get(self.url(path)).timeout(timeout);
        answer(request.send().await.map_err(transport)?).await
    }

    /// `POST path` with `body`, bounded by `timeout`: the JSON answer (or `Null`), else the refusal.
    pub(crate) async fn post(
        &self,
        path: &str,
        body: &Value,
        timeout: Duration,
    ) -> Result<Result<Value, Refusal>, WorkerError> {
        let request = self.client.post(self.url(path)).json(body).timeout(timeout);
        answer(request.send().await.map_err(transport)?).await
    }

    /// `POST path` with `body` for a streamed answer (no overall timeout: the sequence bounds it): the response once
    /// its head arrived, else the refusal in the fleet's terms.
    pub(crate) async fn post_stream(&self, path: &str, body: &Value) -> Result<reqwest::Response, WorkerError> {
        let response = self.client.post(self.url(path)).json(body).send().await.map_err(transport)?;
        if response.status().is_success() {
            return Ok(response);
        }
        match answer(response).await? {
            Ok(_) => Err(WorkerError::Unavailable("an error status with a success body".into())),
            Err(refusal) => Err(refusal.into_error()),
        }
    }

    /// `GET /health`, bounded by `timeout`: any 2xx is healthy.
    pub(crate) async fn health(&self, timeout: Duration) -> Result<(), WorkerError> {
        match self.get("/health", timeout).await? {
            Ok(_) => Ok(()),
            Err(refusal) => {
                Err(WorkerError::Unavailable(format!("health check: {} {}", refusal.status, refusal.message)))
            }
        }
    }

    /// `GET /v1/models`: the largest `max_model_len` listed, and the adapters (cards with a `parent`), with the
    /// path they were loaded from where the card's `root` says it (vLLM's does; an adapter's `root` equal to its
    /// name says nothing).
    pub(crate) async fn models(&self, timeout: Duration) -> Result<WorkerFacts, WorkerError> {
        let listed = self.get("/v1/models", timeout).await?.map_err(Refusal::into_error)?;
        let cards =
            listed["data"].as_array().ok_or_else(|| WorkerError::Malformed("/v1/models lists no data".into()))?;
        let context_length = cards
            .iter()
            .filter_map(|card| card["max_model_len"].as_u64())
            .max()
            .map(|length| u32::try_from(length).unwrap_or(u32::MAX));
        let mut adapters = BTreeMap::new();
        for card in cards.iter().filter(|card| card["parent"].is_string()) {
            let Some(name) = card["id"].as_str() else { continue };
            let root = card["root"].as_str().filter(|root| *root != name).map(str::to_owned);
            adapters.insert(name.to_owned(), root);
        }
        Ok(WorkerFacts { context_length, adapters })
    }
}

/// A response's JSON (`Null` for an empty or non-JSON success body), or its refusal. A body over
/// [`MAX_BODY_BYTES`] is a protocol error (read no further).
pub(super) async fn answer(response: reqwest::Response) -> Result<Result<Value, Refusal>, WorkerError> {
    let status = response.status();
    let text = bounded_text(response).await?;
    let json: Option<Value> = serde_json::from_str(&text).ok();
    if status.is_success() {
        return Ok(Ok(json.unwrap_or(Value::Null)));
    }
    let no_such_route = json.as_ref().is_some_and(|body| body["detail"] == "Not Found");
    let message = json.as_ref().and_then(error_message).unwrap_or_else(|| text.chars().take(500).collect());
    Ok(Err(Refusal { status, message, no_such_route }))
}

/// The body of `response` as text, read up to [`MAX_BODY_BYTES`]: a longer one is a protocol error.
async fn bounded_text(mut response: reqwest::Response) -> Result<String, WorkerError> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(transport)? {
        if body.len() + chunk.len() > MAX_BODY_BYTES {
            return Err(WorkerError::Malformed(format!("an answer over {} MiB", MAX_BODY_BYTES >> 20)));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(String::from_utf8_lossy(&body).into_owned())
}

/// The message of an error body: OpenAI's and vLLM's `{"error": {"message"}}`, vLLM's older and SGLang's
/// `{"message"}`, SGLang's LoRA `{"error_message"}`, FastAPI's `{"detail"}`.
pub(crate) fn error_message(body: &Value) -> Option<String> {
    let candidates =
        [&body["error"]["message"], &body["error"], &body["message"], &body["error_message"], &body["detail"]];
    candidates.into_iter().find_map(|value| match value {
        Value::String(text) => Some(text.clone()),
        Value::Null | Value::Object(_) => None,
        other => Some(other.to_string()),
    })
}

/// What one server calls the sampling fields whose names differ between vLLM and SGLang.
pub(super) struct SamplingNames {
    /// The budget: `max_tokens` / `max_new_tokens`.
    pub(super) max_tokens: &'static str,
    /// The seed: `seed` / `sampling_seed`.
    pub(super) seed: &'static str,
    /// The minimum length: `min_tokens` / `min_new_tokens`.
    pub(super) min_tokens: &'static str,
}

/// The sampling fields of sequence `sequence` of `request` under `names`: the real budget, temperature and top-p
/// always, the rest only where it differs from the servers' defaults (SGLang refuses fields it does not know, so a
/// seed goes only with a seed). Sequence i of a seeded request uses seed + i, as the in-process engine does.
pub(super) fn sampling_fields(request: &SampleRequest, sequence: u32, names: &SamplingNames) -> Map<String, Value> {
    let params = request.params();
    let mut fields = Map::new();
    fields.insert(names.max_tokens.into(), json!(params.max_tokens()));
    fields.insert("temperature".into(), json!(params.temperature()));
    fields.insert("top_p".into(), json!(params.top_p()));
    if let Some(top_k) = params.top_k() {
        fields.insert("top_k".into(), json!(top_k));
    }
    if params.min_p() > 0.0 {
        fields.insert("min_p".into(), json!(params.min_p()));
    }
    if let Some(seed) = params.seed() {
        fields.insert(names.seed.into(), json!(seed.wrapping_add(u64::from(sequence))));
    }
    if !params.stop_token_ids().is_empty() {
        fields.insert("stop_token_ids".into(), json!(params.stop_token_ids()));
    }
    if params.ignore_eos() {
        fields.insert("ignore_eos".into(), json!(true));
    }
    if params.repetition_penalty() != 1.0 {
        fields.insert("repetition_penalty".into(), json!(params.repetition_penalty()));
    }
    if params.presence_penalty() != 0.0 {
        fields.insert("presence_penalty".into(), json!(params.presence_penalty()));
    }
    if params.frequency_penalty() != 0.0 {
        fields.insert("frequency_penalty".into(), json!(params.frequency_penalty()));
    }
    if params.min_tokens() > 0 {
        fields.insert(names.min_tokens.into(), json!(params.min_tokens()));
    }
    fields
}

/// A transport error (connection refused or reset, timeout) in the fleet's terms.
pub(super) fn transport(err: reqwest::Error) -> WorkerError {
    let what = if err.is_timeout() {
        "no answer in time"
    } else if err.is_connect() {
        "cannot connect"
    } else {
        "transport error"
    };
    WorkerError::Unavailable(format!("{what}: {err}"))
}

/// An error chunk of a stream (`{"error": ...}`, or vLLM's older `{"object": "error", ...}`), in the fleet's terms:
/// its code if it has one, else the worker failing.
pub(crate) fn stream_error(chunk: &Value) -> Option<WorkerError> {
    let is_error = !chunk["error"].is_null() || chunk["object"] == "error";
    if !is_error {
        return None;
    }
    let message = error_message(chunk).unwrap_or_else(|| chunk.to_string());
    let code = chunk["error"]["code"].as_u64().or_else(|| chunk["code"].as_u64());
    Some(match code.and_then(|code| StatusCode::from_u16(u16::try_from(code).ok()?).ok()) {
        Some(status) => Refusal { status, message, no_such_route: false }.into_error(),
        None => WorkerError::Unavailable(format!("the stream reported an error: {message}")),
    })
}

/// A JSON number as a logprob (vLLM writes -9999.0 for -inf; `null` is not a logprob).
pub(crate) fn logprob(value: &Value) -> Option<f32> {
    value.as_f64().map(|logprob| logprob as f32)
}

/// A token id from a number, or from vLLM's `"token_id:N"` token string.
pub(crate) fn token_id(value: &Value) -> Option<u32> {
    match value {
        Value::Number(number) => number.as_u64().and_then(|id| u32::try_from(id).ok()),
        Value::String(text) => text.strip_prefix("token_id:")?.parse().ok(),
        _ => None,
    }
}

/// A JSON list of token ids.
pub(crate) fn token_ids(value: &Value) -> Option<Vec<u32>> {
    value.as_array()?.iter().map(token_id).collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn error_bodies_of_every_shape_give_their_message() {
        assert_eq!(error_message(&json!({"error": {"message": "m1", "code": 400}})).as_deref(), Some("m1"));
        assert_eq!(error_message(&json!({"object": "error", "message": "m2"})).as_deref(), Some("m2"));
        assert_eq!(error_message(&json!({"success": false, "error_message": "m3"})).as_deref(), Some("m3"));
        assert_eq!(error_message(&json!({"detail": "Not Found"})).as_deref(), Some("Not Found"));
        assert_eq!(error_message(&json!({"error": "m4"})).as_deref(), Some("m4"));
        assert_eq!(error_message(&json!({"text": "fine"})), None);
    }

    #[test]
    fn refusals_and_stream_errors_map_by_status() {
        let refusal = |code: u16| Refusal {
            status: StatusCode::from_u16(code).expect("status"),
            message: "m".into(),
            no_such_route: false,
        };
        assert!(matches!(refusal(400).into_error(), WorkerError::InvalidArgument(_)));
        assert!(matches!(refusal(404).into_error(), WorkerError::NotFound(_)));
        assert!(matches!(refusal(401).into_error(), WorkerError::Refused(_)));
        assert!(matches!(refusal(503).into_error(), WorkerError::Unavailable(_)));
        assert!(matches!(
            stream_error(&json!({"error": {"message": "x", "code": 400}})),
            Some(WorkerError::InvalidArgument(_))
        ));
        assert!(matches!(stream_error(&json!({"error": {"message": "x"}})), Some(WorkerError::Unavailable(_))));
        assert_eq!(stream_error(&json!({"choices": []})), None);
    }

    #[test]
    fn token_ids_come_as_numbers_or_token_id_strings() {
        assert_eq!(token_id(&json!(7)), Some(7));
        assert_eq!(token_id(&json!("token_id:42")), Some(42));
        assert_eq!(token_id(&json!("meow")), None);
        assert_eq!(token_ids(&json!([1, "token_id:2"])), Some(vec![1, 2]));
        assert_eq!(token_ids(&json!([1, -2])), None);
    }
}
