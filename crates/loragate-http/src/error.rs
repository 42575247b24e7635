//! This front's one error enum, and the one place errors become HTTP responses (the contract's error table), in
//! OpenAI's shape: `{"error": {"message", "type", "code", "param"}}`.
//!
//! `param` names the offending field in this API's terms: the core names fields as the gRPC contract does
//! (`sampling_params.max_tokens`, `prompt_token_ids`, `lora_name`), and [`wire_name`] renames them (`max_tokens`,
//! `prompt`, and `model` on completions but `lora_name` on control endpoints).

use axum::Json;
use axum::response::{IntoResponse, Response};
use http::StatusCode;
use loragate_core::{CoreError, EngineError, Field};
use serde::Serialize;

/// Which API an error arose in; it decides how fields are named.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Api {
    /// `POST /v1/completions`: OpenAI's names (`model`, `prompt`, `n`, …).
    Completions,
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
    /// The body is not the JSON this endpoint takes: a syntax error, a wrong type, a value out of range.
    #[error("{message}")]
    InvalidJson {
        /// The top-level field the error is in, if it is in one.
        param: Option<String>,
        /// What is wrong, with the path to the offending value.
        message: String,
    },
    /// A required field is absent or null.
    #[error("{0}: this field is required")]
    MissingField(&'static str),
    /// A field this front interprets itself (a text prompt, stop strings, the request id header) is unusable.
    #[error("{param}: {reason}")]
    InvalidField {
        /// The field.
        param: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The body is larger than the server's limit.
    #[error("the request body is larger than the {limit}-byte limit")]
    BodyTooLarge {
        /// The limit, in bytes.
        limit: usize,
    },
    /// The body could not be read (the client stopped sending it).
    #[error("could not read the request body: {0}")]
    UnreadableBody(String),
    /// No endpoint at that path.
    #[error("no endpoint at {0}")]
    NoSuchEndpoint(String),
    /// The metrics could not be written out.
    #[error("encoding the metrics: {0}")]
    MetricsEncoding(#[from] std::fmt::Error),
}

impl HttpError {
    /// A core error raised while serving a completion.
    pub(crate) fn sampling(error: CoreError) -> Self {
        Self::Core { error, api: Api::Completions }
    }

    /// A core error raised while serving a control endpoint.
    pub(crate) fn control(error: CoreError) -> Self {
        Self::Core { error, api: Api::Control }
    }

    /// The HTTP status of this error (the contract's table).
    pub(crate) fn status(&self) -> StatusCode {
        match self {
            Self::Core { error, .. } => core_status(error),
            Self::InvalidJson { .. } | Self::MissingField(_) | Self::InvalidField { .. } | Self::UnreadableBody(_) => {
                StatusCode::BAD_REQUEST
            }
            Self::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::NoSuchEndpoint(_) => StatusCode::NOT_FOUND,
            Self::MetricsEncoding(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// A stable, low-cardinality code (the core's error kinds, plus this front's own).
    pub(crate) fn code(&self) -> &'static str {
        match self {
            Self::Core { error, .. } => error.kind(),
            Self::InvalidJson { .. } => "invalid_json",
            Self::MissingField(_) => "missing_field",
            Self::InvalidField { .. } => "invalid_argument",
            Self::BodyTooLarge { .. } => "body_too_large",
            Self::UnreadableBody(_) => "unreadable_body",
            Self::NoSuchEndpoint(_) => "no_such_endpoint",
            Self::MetricsEncoding(_) => "internal",
        }
    }

    /// The offending field, in this API's terms, if there is one.
    pub(crate) fn param(&self) -> Option<String> {
        match self {
            Self::Core { error, api } => core_param(error, *api).map(str::to_owned),
            Self::InvalidJson { param, .. } => param.clone(),
            Self::MissingField(param) | Self::InvalidField { param, .. } => Some((*param).to_owned()),
            Self::BodyTooLarge { .. }
            | Self::UnreadableBody(_)
            | Self::NoSuchEndpoint(_)
            | Self::MetricsEncoding(_) => None,
        }
    }

    /// The `{"error": {...}}` object (also sent as the last event of a stream that fails midway).
    pub(crate) fn body(&self) -> ErrorBody {
        let status = self.status();
        let kind = match status {
            StatusCode::NOT_FOUND => "not_found_error",
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
        (self.status(), Json(self.body())).into_response()
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
    match (field, api) {
        (Field::LoraName, Api::Completions) => "model",
        (Field::LoraName, Api::Control) => "lora_name",
        (Field::RequestId, _) => "X-Request-Id",
        (Field::PromptTokenIds, _) => "prompt",
        (Field::MaxTokens, _) => "max_tokens",
        (Field::Temperature, _) => "temperature",
        (Field::TopP, _) => "top_p",
        (Field::TopK, _) => "top_k",
        (Field::StopTokenIds, _) => "stop_token_ids",
        (Field::NumSamples, _) => "n",
        (Field::TimeoutS, _) => "timeout_s",
        (Field::Mode, _) => "mode",
        (Field::Owner, _) => "owner",
        (Field::LeaseS, _) => "lease_s",
        (Field::PauseId, _) => "pause_id",
        (Field::Path, _) => "lora_path",
        (other, _) => other.grpc_path(),
    }
}

fn core_status(error: &CoreError) -> StatusCode {
    match error {
        CoreError::InvalidArgument { .. } => StatusCode::BAD_REQUEST,
        CoreError::UnknownAdapter(_) => StatusCode::NOT_FOUND,
        CoreError::GateHoldExpired { .. } | CoreError::AdapterUnavailable(_) | CoreError::ShuttingDown => {
            StatusCode::SERVICE_UNAVAILABLE
        }
        CoreError::DrainTimedOut { .. } => StatusCode::GATEWAY_TIMEOUT,
        // A failed swap answers as its load failed (bad files stay 400 / 422), with the swap's message.
        CoreError::SwapFailed { source, .. } => core_status(source),
        CoreError::Engine(engine) => match engine {
            EngineError::AdapterFiles(_) => StatusCode::BAD_REQUEST,
            EngineError::AdapterIncompatible(_) => StatusCode::UNPROCESSABLE_ENTITY,
            EngineError::AdapterNotLoaded(_) => StatusCode::NOT_FOUND,
            EngineError::Stopped => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        },
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

fn core_param(error: &CoreError, api: Api) -> Option<&'static str> {
    let adapter_field = match api {
        Api::Completions => "model",
        Api::Control => "lora_name",
    };
    match error {
        CoreError::InvalidArgument { field, .. } => Some(wire_name(*field, api)),
        CoreError::UnknownAdapter(_) | CoreError::Engine(EngineError::AdapterNotLoaded(_)) => Some(adapter_field),
        CoreError::Engine(EngineError::AdapterFiles(_) | EngineError::AdapterIncompatible(_)) => Some("lora_path"),
        CoreError::SwapFailed { source, .. } => core_param(source, api),
        _ => None,
    }
}

fn core_message(error: &CoreError, api: Api) -> String {
    match error {
        CoreError::InvalidArgument { field, reason } => format!("{}: {reason}", wire_name(*field, api)),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use loragate_core::{AdapterKey, AdapterName};

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
            (HttpError::BodyTooLarge { limit: 10 }, StatusCode::PAYLOAD_TOO_LARGE, None, "10-byte"),
            (HttpError::NoSuchEndpoint("/v2/x".into()), StatusCode::NOT_FOUND, None, "/v2/x"),
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
}
