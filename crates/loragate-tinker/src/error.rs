//! This front's one error enum, and the one place errors become HTTP responses, in the Tinker API's shape:
//! `{"detail": "<message>"}` with a JSON content type and a non-empty body (the SDK takes a bodiless 400 for a proxy's
//! rejection and retries it).
//!
//! A core error answers its class's status, from the table every front shares
//! ([`loragate_net::status::http_status`]), as on the HTTP and gRPC fronts. This front's own errors follow what the SDK
//! does with each (docs/tinker.md): permanent conditions get 400, 404 or 413 (fatal in the SDK), a body that does not
//! arrive by the gate deadline 408, overload gets 429 (the SDK backs off and resubmits), 410 only for futures of an
//! earlier process (the SDK resubmits the sample) and heartbeats of a finished session (the SDK stops beating), and 5xx
//! only for real failures. 402 is never sent.

use axum::Json;
use axum::response::{IntoResponse, Response};
use http::{HeaderValue, StatusCode};
use loragate_core::{CoreError, Field};
use loragate_net::json_body::BodyError;
use loragate_net::status::http_status;
use serde_json::json;

/// Everything this front answers with an error.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TinkerError {
    /// The core refused the sampling request.
    #[error("{}", core_message(.0))]
    Core(CoreError),
    /// A field of the request is unusable; `field` is its path in the Tinker API (`sampling_params.stop`).
    #[error("{field}: {reason}")]
    InvalidField {
        /// The field's path.
        field: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The body could not be read in time, is too large, or is not the JSON this route takes.
    #[error(transparent)]
    Body(#[from] BodyError),
    /// A `base_model`, `model_path` or sampling session names nothing this server serves.
    #[error("{0}")]
    UnknownTarget(String),
    /// A Tinker feature loragate does not offer.
    #[error("{feature} is not supported: loragate's Tinker front serves sampling only")]
    NotSupported {
        /// The feature, as the user knows it.
        feature: String,
    },
    /// A route exists but not with this method.
    #[error("{method} {path} is not supported (see docs/tinker.md for the routes and their methods)")]
    WrongMethod {
        /// The method used.
        method: String,
        /// The path.
        path: String,
    },
    /// A `request_id` that was never issued, or whose result expired.
    #[error("request_id '{0}' is unknown: it was never issued by this server or its result has expired")]
    UnknownFuture(String),
    /// A `request_id` of an earlier server process whose future was not put back at start (not recorded, or its
    /// result expired).
    #[error("request_id '{0}' belongs to an earlier run of this server (it restarted); submit the sample again")]
    FutureOfEarlierProcess(String),
    /// A heartbeat of a session that was finished.
    #[error("session '{0}' was finished")]
    SessionFinished(String),
    /// Too many futures are pending.
    #[error("{pending} samples are pending, the limit of this server (--tinker-max-pending); retry shortly")]
    TooManyPending {
        /// How many are pending.
        pending: usize,
    },
    /// This front's own state could not be reached (its actor stopped: the server is stopping).
    #[error("the Tinker front is stopping")]
    Stopping,
}

impl TinkerError {
    /// An [`TinkerError::InvalidField`].
    pub(crate) fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::InvalidField { field: field.into(), reason: reason.into() }
    }

    /// The HTTP status of this error.
    pub(crate) fn status(&self) -> StatusCode {
        match self {
            // The table every front shares: the same error answers the same status as on the HTTP and gRPC fronts.
            Self::Core(error) => http_status(error.class()),
            Self::Body(BodyError::TooLarge { .. }) => StatusCode::PAYLOAD_TOO_LARGE,
            Self::Body(BodyError::Timeout) => StatusCode::REQUEST_TIMEOUT,
            Self::InvalidField { .. } | Self::Body(_) => StatusCode::BAD_REQUEST,
            Self::UnknownTarget(_) | Self::NotSupported { .. } | Self::UnknownFuture(_) => StatusCode::NOT_FOUND,
            Self::WrongMethod { .. } => StatusCode::METHOD_NOT_ALLOWED,
            Self::FutureOfEarlierProcess(_) | Self::SessionFinished(_) => StatusCode::GONE,
            Self::TooManyPending { .. } => StatusCode::TOO_MANY_REQUESTS,
            Self::Stopping => StatusCode::SERVICE_UNAVAILABLE,
        }
    }
}

impl IntoResponse for TinkerError {
    fn into_response(self) -> Response {
        let status = self.status();
        if status.is_server_error() {
            tracing::warn!(error = %self, "Tinker request failed");
        }
        let mut response = (status, Json(json!({"detail": self.to_string()}))).into_response();
        let headers = response.headers_mut();
        match self {
            // The SDK's generated client retries unless told not to; a refused feature will not start working.
            Self::NotSupported { .. } | Self::WrongMethod { .. } => {
                headers.insert("x-should-retry", HeaderValue::from_static("false"));
            }
            Self::TooManyPending { .. } => {
                headers.insert(http::header::RETRY_AFTER, HeaderValue::from_static("1"));
            }
            _ => {}
        }
        response
    }
}

/// The path of a core field in the Tinker API.
pub(crate) fn tinker_field(field: Field) -> &'static str {
    match field {
        Field::PromptTokenIds => "prompt",
        Field::MaxTokens => "sampling_params.max_tokens",
        Field::Temperature => "sampling_params.temperature",
        Field::TopP => "sampling_params.top_p",
        Field::TopK => "sampling_params.top_k",
        Field::StopTokenIds => "sampling_params.stop",
        Field::NumSamples => "num_samples",
        Field::LoraName => "model_path",
        other => other.grpc_path(),
    }
}

fn core_message(error: &CoreError) -> String {
    match error {
        CoreError::InvalidArgument { field, reason } => format!("{}: {reason}", tinker_field(*field)),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;
    use loragate_core::{AdapterKey, AdapterName};

    use super::*;

    async fn answer(error: TinkerError) -> (StatusCode, http::HeaderMap, serde_json::Value) {
        let response = error.into_response();
        let (parts, body) = response.into_parts();
        let bytes = body.collect().await.expect("body").to_bytes();
        (parts.status, parts.headers, serde_json::from_slice(&bytes).expect("a JSON body"))
    }

    #[tokio::test]
    async fn every_error_has_a_detail_body_and_the_status_the_sdk_expects() {
        let meow = AdapterKey::Lora(AdapterName::parse("meow").expect("name"));
        let cases: Vec<(TinkerError, StatusCode, &str)> = vec![
            (
                TinkerError::Core(CoreError::invalid(Field::MaxTokens, "must be at least 1")),
                StatusCode::BAD_REQUEST,
                "sampling_params.max_tokens: must be at least 1",
            ),
            (TinkerError::Core(CoreError::UnknownAdapter(meow)), StatusCode::NOT_FOUND, "meow"),
            (TinkerError::invalid("num_samples", "must be at least 1"), StatusCode::BAD_REQUEST, "num_samples"),
            (TinkerError::Body(BodyError::TooLarge { limit: 10 }), StatusCode::PAYLOAD_TOO_LARGE, "10-byte"),
            (TinkerError::Body(BodyError::Timeout), StatusCode::REQUEST_TIMEOUT, "--gate-max-wait"),
            (
                TinkerError::NotSupported { feature: "LoRA training (create_model)".into() },
                StatusCode::NOT_FOUND,
                "LoRA training (create_model) is not supported",
            ),
            (TinkerError::UnknownFuture("tk-1-2".into()), StatusCode::NOT_FOUND, "tk-1-2"),
            (TinkerError::FutureOfEarlierProcess("tk-1-2".into()), StatusCode::GONE, "earlier run"),
            (TinkerError::SessionFinished("s".into()), StatusCode::GONE, "finished"),
            (TinkerError::TooManyPending { pending: 3 }, StatusCode::TOO_MANY_REQUESTS, "3 samples are pending"),
        ];
        for (error, status, mentions) in cases {
            assert_ne!(error.status(), StatusCode::PAYMENT_REQUIRED);
            let (got, headers, body) = answer(error).await;
            assert_eq!(got, status, "{body}");
            let detail = body["detail"].as_str().expect("detail");
            assert!(detail.contains(mentions), "{detail:?} should mention {mentions:?}");
            assert!(headers[http::header::CONTENT_TYPE].to_str().expect("ascii").ends_with("json"));
        }
        let (_, headers, _) = answer(TinkerError::NotSupported { feature: "x".into() }).await;
        assert_eq!(headers["x-should-retry"], "false", "a refused feature is not retried");
    }

    /// Every core error answers its class's status, as on every other front: with etcd unreachable, 503 (it was 500
    /// here before the fronts shared one table).
    #[tokio::test]
    async fn every_core_error_answers_its_classs_status() {
        for error in loragate_core::testing::every_core_error() {
            let (class, described) = (error.class(), error.to_string());
            let (status, _, body) = answer(TinkerError::Core(error)).await;
            assert_eq!(status, http_status(class), "{described}");
            assert_ne!(status, StatusCode::PAYMENT_REQUIRED);
            assert!(body["detail"].is_string(), "{body}");
        }
        let etcd_down = TinkerError::Core(loragate_core::StateError::Unavailable("etcd is unreachable".into()).into());
        assert_eq!(etcd_down.status(), StatusCode::SERVICE_UNAVAILABLE);
    }
}
