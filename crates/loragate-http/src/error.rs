//! This front's one error enum, and the one place errors become HTTP responses, in OpenAI's shape:
//! `{"error": {"message", "type", "code", "param"}}`. A core error's status is its class's, from the table every
//! front shares ([`loragate_net::status::http_status`]); this front's own errors (bodies, fields, routes) have theirs
//! here.
//!
//! `param` names the offending field in this API's terms: the core names fields as the gRPC contract does
//! (`sampling_params.max_tokens`, `prompt_token_ids`, `lora_name`), and [`wire_name`] renames them for each API
//! (`max_tokens` and `prompt` on completions, `sampling_params.max_tokens` and `token_ids` on vLLM's generate,
//! `sampling_params.max_new_tokens` and `input_ids` on SGLang's, `lora_name` on control endpoints).

use axum::Json;
use axum::response::{IntoResponse, Response};
use http::header::{RETRY_AFTER, WWW_AUTHENTICATE};
use http::{HeaderValue, StatusCode};
use loragate_core::{CoreError, EngineError, Field};
use loragate_net::status::http_status;
use serde::Serialize;

use crate::json_body::BodyError;

/// Which API an error arose in; it decides how fields are named.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Api {
    /// `POST /v1/completions`: OpenAI's names (`model`, `prompt`, `n`, `logprobs`, …).
    Completions,
    /// `POST /v1/chat/completions`: OpenAI's names, the prompt being `messages`.
    Chat,
    /// vLLM's `POST /inference/v1/generate`: `token_ids`, `request_id`, sampling fields under `sampling_params`.
    Generate,
    /// SGLang's `POST /generate`: `input_ids`, `rid`, `lora_path`, SGLang's sampling names under
    /// `sampling_params`.
    Sglang,
    /// The SkyRL and vLLM control endpoints: `lora_name`, `lora_path`, `timeout_s`.
    Control,
}

/// Everything this front answers with an error. Mapped to HTTP only in [`HttpError::status`] and its siblings.
#[derive(Debug, thiserror::Error)]
pub(crate) enum HttpError {
    /// The coordinator refused or failed the request.
    #[error("{}", core_message(.error, *.api))]
    Core {
        /// What the core said.
        error: CoreError,
        /// Where it was said (for field names).
        api: Api,
    },
    /// The body could not be read, or is not the JSON this endpoint takes (a syntax error, a wrong type, a value
    /// out of range, an unknown field).
    #[error(transparent)]
    Body(#[from] BodyError),
    /// A required field is absent or null.
    #[error("{0}: this field is required")]
    MissingField(&'static str),
    /// A field this front interprets itself (a text prompt, stop strings, the request id header, a sampling field
    /// it does not implement) is unusable.
    #[error("{param}: {reason}")]
    InvalidField {
        /// The field (its path of keys).
        param: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A batch that could never be admitted whole, however long its client waited: more prompts than a limit lets
    /// in at once, or more sequences than [`MAX_BATCH_SEQUENCES`](crate::sampling::MAX_BATCH_SEQUENCES). Unlike
    /// overload (429, "try again later"), retrying cannot help.
    #[error("{param}: {reason}")]
    BatchTooLarge {
        /// The field that makes the batch (`prompt`, `input_ids`, `text`).
        param: &'static str,
        /// Which limit, by its flag or name.
        reason: String,
    },
    /// A sampling request named a model this server does not serve; the message lists the ones it does (those the
    /// caller may use).
    #[error("{}", unknown_model(.model, .served))]
    UnknownModel {
        /// The field that named it (`model`, `lora_path`).
        param: &'static str,
        /// The name asked for.
        model: String,
        /// The served names the caller may use: the base model's, then the adapters'.
        served: Vec<String>,
    },
    /// No endpoint at that path.
    #[error("no endpoint at {0}")]
    NoSuchEndpoint(String),
    /// `GET /v1/requests/{id}` of a request that is unknown, no longer kept, still running, or someone else's.
    #[error("no finished request {0:?} of yours is known here (the newest finished requests are kept)")]
    UnknownRequest(String),
    /// A browser request from another origin (this server serves no pages; such requests are refused).
    #[error("cross-origin browser requests are refused (the request carries {0})")]
    CrossOrigin(&'static str),
    /// A POST body that is not declared as JSON.
    #[error("{}", unsupported_media_type(.0.as_deref()))]
    UnsupportedMediaType(Option<String>),
    /// The metrics could not be written out.
    #[error("encoding the metrics: {0}")]
    MetricsEncoding(#[from] std::fmt::Error),
}

impl HttpError {
    /// An [`HttpError::InvalidField`].
    pub(crate) fn invalid(param: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::InvalidField { param: param.into(), reason: reason.into() }
    }

    /// A core error raised while serving a completion (the tests' shorthand).
    #[cfg(test)]
    pub(crate) fn sampling(error: CoreError) -> Self {
        Self::in_api(error, Api::Completions)
    }

    /// A core error raised while serving `api`.
    pub(crate) fn in_api(error: CoreError, api: Api) -> Self {
        Self::Core { error, api }
    }

    /// A core error raised while serving a control endpoint.
    pub(crate) fn control(error: CoreError) -> Self {
        Self::Core { error, api: Api::Control }
    }

    /// An authentication or permission refusal from the request guard (before any endpoint ran).
    pub(crate) fn access(error: CoreError) -> Self {
        Self::Core { error, api: Api::Control }
    }

    /// The HTTP status of this error (the contract's table).
    pub(crate) fn status(&self) -> StatusCode {
        match self {
            Self::Core { error, .. } => http_status(error.class()),
            Self::Body(BodyError::TooLarge { .. }) => StatusCode::PAYLOAD_TOO_LARGE,
            Self::Body(BodyError::Timeout) => StatusCode::REQUEST_TIMEOUT,
            Self::Body(_) | Self::MissingField(_) | Self::InvalidField { .. } | Self::BatchTooLarge { .. } => {
                StatusCode::BAD_REQUEST
            }
            Self::UnknownModel { .. } => StatusCode::NOT_FOUND,
            Self::NoSuchEndpoint(_) | Self::UnknownRequest(_) => StatusCode::NOT_FOUND,
            Self::CrossOrigin(_) => StatusCode::FORBIDDEN,
            Self::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::MetricsEncoding(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// A stable, low-cardinality code (the core's error kinds, plus this front's own).
    pub(crate) fn code(&self) -> &'static str {
        match self {
            Self::Core { error, .. } => error.kind(),
            Self::Body(BodyError::Json { .. }) => "invalid_json",
            Self::Body(BodyError::UnknownField { .. }) => "unknown_field",
            Self::Body(BodyError::TooLarge { .. }) => "body_too_large",
            Self::Body(BodyError::Unreadable(_)) => "unreadable_body",
            Self::Body(BodyError::Timeout) => "body_timeout",
            Self::MissingField(_) => "missing_field",
            Self::InvalidField { .. } => "invalid_argument",
            Self::BatchTooLarge { .. } => "batch_too_large",
            Self::UnknownModel { .. } => "unknown_adapter",
            Self::NoSuchEndpoint(_) => "no_such_endpoint",
            Self::UnknownRequest(_) => "unknown_request",
            Self::CrossOrigin(_) => "cross_origin",
            Self::UnsupportedMediaType(_) => "unsupported_media_type",
            Self::MetricsEncoding(_) => "internal",
        }
    }

    /// The offending field, in this API's terms, if there is one.
    pub(crate) fn param(&self) -> Option<String> {
        match self {
            Self::Core { error, api } => core_param(error, *api).map(str::to_owned),
            Self::Body(BodyError::Json { param, .. }) => param.clone(),
            Self::Body(BodyError::UnknownField { param }) => Some(param.clone()),
            Self::MissingField(param) => Some((*param).to_owned()),
            Self::InvalidField { param, .. } => Some(param.clone()),
            Self::BatchTooLarge { param, .. } | Self::UnknownModel { param, .. } => Some((*param).to_owned()),
            Self::UnsupportedMediaType(_) => Some("Content-Type".to_owned()),
            Self::CrossOrigin(header) => Some((*header).to_owned()),
            Self::Body(BodyError::TooLarge { .. } | BodyError::Timeout | BodyError::Unreadable(_))
            | Self::NoSuchEndpoint(_)
            | Self::UnknownRequest(_)
            | Self::MetricsEncoding(_) => None,
        }
    }

    /// The `{"error": {...}}` object (also sent as the last event of a stream that fails midway).
    pub(crate) fn body(&self) -> ErrorBody {
        let status = self.status();
        let kind = match status {
            StatusCode::NOT_FOUND => "not_found_error",
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::FORBIDDEN => "permission_error",
            StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
            StatusCode::SERVICE_UNAVAILABLE => "service_unavailable_error",
            status if status.is_server_error() => "server_error",
            _ => "invalid_request_error",
        };
        ErrorBody { error: ErrorObject { message: self.to_string(), kind, code: self.code(), param: self.param() } }
    }
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        if self.status().is_server_error() {
            tracing::warn!(error = %self, "request failed");
        }
        let status = self.status();
        let mut response = (status, Json(self.body())).into_response();
        match status {
            StatusCode::UNAUTHORIZED => {
                response.headers_mut().insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            StatusCode::TOO_MANY_REQUESTS => {
                response.headers_mut().insert(RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECONDS));
            }
            _ => {}
        }
        response
    }
}

/// What a 429 tells its client to wait before retrying, in seconds: a limit frees up as requests finish, which
/// takes about as long as a short generation.
const RETRY_AFTER_SECONDS: u32 = 1;

/// How many served names an unknown-model error lists before it says how many more there are.
const MAX_LISTED_MODELS: usize = 20;

fn unknown_model(model: &str, served: &[String]) -> String {
    let shown: Vec<String> = served.iter().take(MAX_LISTED_MODELS).map(|name| format!("{name:?}")).collect();
    let more = served.len().saturating_sub(MAX_LISTED_MODELS);
    let more = if more > 0 { format!(" and {more} more (GET /v1/models lists them)") } else { String::new() };
    format!("model {model:?} is not served here; this server serves {}{more}", shown.join(", "))
}

fn unsupported_media_type(content_type: Option<&str>) -> String {
    match content_type {
        Some(content_type) => format!("a POST body must be JSON (Content-Type: application/json), not {content_type}"),
        None => "a POST body must be JSON: send Content-Type: application/json".to_owned(),
    }
}

/// OpenAI's error envelope.
#[derive(Debug, Serialize)]
pub(crate) struct ErrorBody {
    error: ErrorObject,
}

#[derive(Debug, Serialize)]
struct ErrorObject {
    message: String,
    #[serde(rename = "type")]
    kind: &'static str,
    code: &'static str,
    param: Option<String>,
}

/// The name of a core field in `api`'s terms.
pub(crate) fn wire_name(field: Field, api: Api) -> &'static str {
    match (api, field) {
        (Api::Control, Field::LoraName) => "lora_name",
        (Api::Sglang, Field::LoraName) => "lora_path",
        (_, Field::LoraName) => "model",
        (Api::Generate, Field::RequestId) => "request_id",
        (Api::Sglang, Field::RequestId) => "rid",
        (_, Field::RequestId) => "X-Request-Id",
        (Api::Chat, Field::PromptTokenIds) => "messages",
        (Api::Generate, Field::PromptTokenIds) => "token_ids",
        (Api::Sglang, Field::PromptTokenIds) => "input_ids",
        (_, Field::PromptTokenIds) => "prompt",
        (Api::Chat, Field::TopLogprobs) => "top_logprobs",
        (Api::Generate, Field::TopLogprobs) => "sampling_params.logprobs",
        (Api::Generate, Field::PromptTopLogprobs) => "sampling_params.prompt_logprobs",
        (Api::Sglang, Field::TopLogprobs | Field::PromptTopLogprobs) => "top_logprobs_num",
        (_, Field::TopLogprobs) => "logprobs",
        (_, Field::PromptTopLogprobs) => "prompt_logprobs",
        (Api::Sglang, Field::MaxTokens) => "sampling_params.max_new_tokens",
        (Api::Sglang, Field::MinTokens) => "sampling_params.min_new_tokens",
        (Api::Generate | Api::Sglang, Field::NumSamples) => "sampling_params.n",
        (_, Field::NumSamples) => "n",
        (_, Field::TimeoutS) => "timeout_s",
        (_, Field::Mode) => "mode",
        (_, Field::Owner) => "owner",
        (_, Field::LeaseS) => "lease_s",
        (_, Field::PauseId) => "pause_id",
        (_, Field::Path) => "lora_path",
        // The other sampling fields keep vLLM's names: nested in `sampling_params`, or flat.
        (Api::Generate | Api::Sglang, sampling) => sampling.grpc_path(),
        (_, other) => other.grpc_path().strip_prefix("sampling_params.").unwrap_or(other.grpc_path()),
    }
}

fn core_param(error: &CoreError, api: Api) -> Option<&'static str> {
    let adapter_field = wire_name(Field::LoraName, api);
    match error {
        CoreError::InvalidArgument { field, .. } | CoreError::PathNotPermitted { field, .. } => {
            Some(wire_name(*field, api))
        }
        CoreError::UnknownAdapter(_)
        | CoreError::Engine(EngineError::AdapterNotLoaded(_))
        | CoreError::Overloaded { .. }
        | CoreError::WeightsMissing { .. }
        | CoreError::PermissionDenied { adapter: Some(_), .. } => Some(adapter_field),
        CoreError::Engine(EngineError::AdapterFiles(_) | EngineError::AdapterIncompatible(_)) => Some("lora_path"),
        CoreError::SwapFailed { source, .. } => core_param(source, api),
        _ => None,
    }
}

fn core_message(error: &CoreError, api: Api) -> String {
    match error {
        CoreError::InvalidArgument { field, reason } => format!("{}: {reason}", wire_name(*field, api)),
        // The same sentence with this front's name for the field.
        CoreError::PathNotPermitted { field, .. } => {
            let message = error.to_string();
            let rest = message.strip_prefix(field.grpc_path()).unwrap_or(&message);
            format!("{}{rest}", wire_name(*field, api))
        }
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use loragate_core::{Action, AdapterKey, AdapterName, AdapterVersion, Limit, StateError};

    use super::*;

    fn meow() -> AdapterKey {
        AdapterKey::Lora(AdapterName::parse("meow").expect("name"))
    }

    #[test]
    fn core_fields_are_renamed_to_this_apis_terms() {
        let cases = [
            (Field::PromptTokenIds, Api::Completions, "prompt"),
            (Field::MaxTokens, Api::Completions, "max_tokens"),
            (Field::Temperature, Api::Completions, "temperature"),
            (Field::TopP, Api::Completions, "top_p"),
            (Field::TopK, Api::Completions, "top_k"),
            (Field::StopTokenIds, Api::Completions, "stop_token_ids"),
            (Field::NumSamples, Api::Completions, "n"),
            (Field::RequestId, Api::Completions, "X-Request-Id"),
            (Field::LoraName, Api::Completions, "model"),
            (Field::LoraName, Api::Control, "lora_name"),
            (Field::TimeoutS, Api::Control, "timeout_s"),
            (Field::Path, Api::Control, "lora_path"),
            (Field::MinP, Api::Completions, "min_p"),
            (Field::RepetitionPenalty, Api::Chat, "repetition_penalty"),
            (Field::TopLogprobs, Api::Completions, "logprobs"),
            (Field::TopLogprobs, Api::Chat, "top_logprobs"),
            (Field::PromptTopLogprobs, Api::Completions, "prompt_logprobs"),
            (Field::PromptTokenIds, Api::Chat, "messages"),
            (Field::PromptTokenIds, Api::Generate, "token_ids"),
            (Field::MaxTokens, Api::Generate, "sampling_params.max_tokens"),
            (Field::TopLogprobs, Api::Generate, "sampling_params.logprobs"),
            (Field::MinTokens, Api::Generate, "sampling_params.min_tokens"),
            (Field::RequestId, Api::Generate, "request_id"),
            (Field::LoraName, Api::Generate, "model"),
            (Field::PromptTokenIds, Api::Sglang, "input_ids"),
            (Field::MaxTokens, Api::Sglang, "sampling_params.max_new_tokens"),
            (Field::MinTokens, Api::Sglang, "sampling_params.min_new_tokens"),
            (Field::FrequencyPenalty, Api::Sglang, "sampling_params.frequency_penalty"),
            (Field::LoraName, Api::Sglang, "lora_path"),
            (Field::RequestId, Api::Sglang, "rid"),
        ];
        for (field, api, name) in cases {
            assert_eq!(wire_name(field, api), name, "{field} in {api:?}");
        }
    }

    #[test]
    fn each_error_gets_the_contracts_status_and_names_its_subject() {
        let cases: Vec<(HttpError, StatusCode, Option<&str>, &str)> = vec![
            (
                HttpError::sampling(CoreError::invalid(Field::MaxTokens, "must be at least 1")),
                StatusCode::BAD_REQUEST,
                Some("max_tokens"),
                "max_tokens: must be at least 1",
            ),
            (HttpError::sampling(CoreError::UnknownAdapter(meow())), StatusCode::NOT_FOUND, Some("model"), "meow"),
            (HttpError::control(CoreError::UnknownAdapter(meow())), StatusCode::NOT_FOUND, Some("lora_name"), "meow"),
            (
                HttpError::sampling(CoreError::GateHoldExpired { adapter: meow(), held_for: Duration::from_secs(2) }),
                StatusCode::SERVICE_UNAVAILABLE,
                None,
                "meow",
            ),
            (HttpError::sampling(CoreError::ShuttingDown), StatusCode::SERVICE_UNAVAILABLE, None, "shutting down"),
            (
                HttpError::control(EngineError::AdapterFiles("no adapter_config.json".into()).into()),
                StatusCode::BAD_REQUEST,
                Some("lora_path"),
                "adapter_config.json",
            ),
            (
                HttpError::control(EngineError::AdapterIncompatible("q_proj has rank 0".into()).into()),
                StatusCode::UNPROCESSABLE_ENTITY,
                Some("lora_path"),
                "q_proj",
            ),
            (
                HttpError::sampling(EngineError::Internal("boom".into()).into()),
                StatusCode::INTERNAL_SERVER_ERROR,
                None,
                "boom",
            ),
            (HttpError::MissingField("model"), StatusCode::BAD_REQUEST, Some("model"), "model"),
            (HttpError::Body(BodyError::TooLarge { limit: 10 }), StatusCode::PAYLOAD_TOO_LARGE, None, "10-byte"),
            (
                HttpError::Body(BodyError::UnknownField { param: "ownr".into() }),
                StatusCode::BAD_REQUEST,
                Some("ownr"),
                "unknown field",
            ),
            (
                HttpError::UnknownModel {
                    param: "model",
                    model: "mew".into(),
                    served: vec!["demo".into(), "meow".into()],
                },
                StatusCode::NOT_FOUND,
                Some("model"),
                r#""demo", "meow""#,
            ),
            (HttpError::NoSuchEndpoint("/v2/x".into()), StatusCode::NOT_FOUND, None, "/v2/x"),
            (
                HttpError::sampling(CoreError::Overloaded { limit: Limit::Held, cap: 4, adapter: meow() }),
                StatusCode::TOO_MANY_REQUESTS,
                Some("model"),
                "--max-held",
            ),
            (
                HttpError::sampling(CoreError::WeightsMissing { adapter: meow(), reason: "/gone/meow".into() }),
                StatusCode::SERVICE_UNAVAILABLE,
                Some("model"),
                "/gone/meow",
            ),
            (
                HttpError::control(StateError::Failed("disk full".into()).into()),
                StatusCode::INTERNAL_SERVER_ERROR,
                None,
                "disk full",
            ),
            (
                HttpError::access(CoreError::Unauthenticated("no API key was presented")),
                StatusCode::UNAUTHORIZED,
                None,
                "Bearer",
            ),
            (
                HttpError::control(CoreError::PermissionDenied { action: Action::Control, adapter: Some(meow()) }),
                StatusCode::FORBIDDEN,
                Some("lora_name"),
                "meow",
            ),
            (HttpError::CrossOrigin("Origin"), StatusCode::FORBIDDEN, Some("Origin"), "cross-origin"),
            (
                HttpError::UnsupportedMediaType(Some("text/plain".into())),
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                Some("Content-Type"),
                "text/plain",
            ),
            (
                HttpError::control(CoreError::DrainTimedOut {
                    adapter: meow(),
                    still_running: 2,
                    waited: Duration::from_secs(5),
                }),
                StatusCode::GATEWAY_TIMEOUT,
                None,
                "withdrawn",
            ),
            (HttpError::sampling(CoreError::AbortedWhileKept(meow())), StatusCode::CONFLICT, None, "meow"),
            (HttpError::sampling(CoreError::AdapterUnavailable(meow())), StatusCode::SERVICE_UNAVAILABLE, None, "meow"),
            (HttpError::sampling(EngineError::Stopped.into()), StatusCode::SERVICE_UNAVAILABLE, None, "stopped"),
            (
                HttpError::sampling(EngineError::AdapterNotLoaded(AdapterName::parse("meow").expect("name")).into()),
                StatusCode::NOT_FOUND,
                Some("model"),
                "meow",
            ),
            (
                HttpError::sampling(EngineError::NonFiniteOutput("at step 3".into()).into()),
                StatusCode::INTERNAL_SERVER_ERROR,
                None,
                "non-finite",
            ),
            (
                HttpError::control(StateError::Unavailable("etcd is unreachable".into()).into()),
                StatusCode::SERVICE_UNAVAILABLE,
                None,
                "etcd",
            ),
            (
                HttpError::control(CoreError::SwapFailed {
                    adapter: AdapterName::parse("meow").expect("name"),
                    serving: AdapterVersion(3),
                    source: Box::new(EngineError::AdapterIncompatible("q_proj has rank 0".into()).into()),
                }),
                StatusCode::UNPROCESSABLE_ENTITY,
                Some("lora_path"),
                "keeps serving",
            ),
        ];
        for (error, status, param, mentions) in cases {
            let body = serde_json::to_value(error.body()).expect("serialize");
            assert_eq!(error.status(), status, "{error}");
            assert_eq!(body["error"]["param"].as_str(), param, "{body}");
            let message = body["error"]["message"].as_str().expect("message");
            assert!(message.contains(mentions), "{message:?} should mention {mentions:?}");
            assert!(body["error"]["type"].is_string() && body["error"]["code"].is_string(), "{body}");
        }
    }

    /// Every core error, in every API of this front (OpenAI's completions and chat, vLLM's and SGLang's generate,
    /// the SkyRL and vLLM control endpoints), answers its class's status, as on every other front.
    #[test]
    fn every_core_error_answers_its_classs_status_in_every_api() {
        for api in [Api::Completions, Api::Chat, Api::Generate, Api::Sglang, Api::Control] {
            for error in loragate_core::testing::every_core_error() {
                let (class, described) = (error.class(), error.to_string());
                let response = HttpError::in_api(error, api).into_response();
                assert_eq!(response.status(), http_status(class), "{described} in {api:?}");
            }
        }
    }

    #[test]
    fn refusals_carry_the_headers_clients_act_on() {
        let overloaded = HttpError::sampling(CoreError::Overloaded { limit: Limit::InFlight, cap: 1, adapter: meow() });
        let response = overloaded.into_response();
        assert_eq!(response.headers().get(RETRY_AFTER).map(HeaderValue::as_bytes), Some(b"1".as_slice()));
        let response = HttpError::access(CoreError::Unauthenticated("the API key is not valid")).into_response();
        assert_eq!(response.headers().get(WWW_AUTHENTICATE).map(HeaderValue::as_bytes), Some(b"Bearer".as_slice()));
    }
}
