//! Request bodies: read within the server's limit and by the gate deadline (`--gate-max-wait`: a body that never
//! completes fails with 408 and is counted in `loragate_request_body_timeouts_total{front="http"}`), then parsed as
//! JSON into this front's own request types, with every failure a 400 (413 over the limit) naming the field where
//! there is one (its path of keys, such as `sampling_params.max_tokens`). This replaces axum's `Json` extractor,
//! whose rejections are 415/422 with plain-text bodies. The bytes are dropped once parsed: nothing downstream (a
//! request held at a paused gate included) keeps them.
//!
//! A body can also be read once as a [`JsonValue`] and parsed into several types ([`parse_value`]): the sampling
//! endpoints parse the fields every API shares into one type and their own fields into another.

use axum::body::Body;
use axum::extract::{FromRequest, Request};
use bytes::Bytes;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use serde::de::DeserializeOwned;
use serde_json::Value;
use serde_path_to_error::{Path, Segment};
use tokio::time::Instant;

use crate::error::HttpError;
use crate::server::AppState;

/// Reads a whole body by `deadline`, refusing more than `limit` bytes.
pub(crate) async fn read_body(body: Body, limit: usize, deadline: Instant) -> Result<Bytes, HttpError> {
    match tokio::time::timeout_at(deadline, Limited::new(body, limit).collect()).await {
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(err)) if err.downcast_ref::<LengthLimitError>().is_some() => Err(HttpError::BodyTooLarge { limit }),
        Ok(Err(err)) => Err(HttpError::UnreadableBody(err.to_string())),
        Err(_elapsed) => Err(HttpError::BodyTimeout),
    }
}

/// Parses a JSON document into `T`. Errors carry the path to the offending value and name its field.
pub(crate) fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, HttpError> {
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut deserializer)
        .map_err(|err| invalid_json("", err.path().clone(), err.into_inner()))?;
    deserializer
        .end()
        .map_err(|err| HttpError::InvalidJson { param: None, message: format!("invalid JSON body: {err}") })?;
    Ok(value)
}

/// Parses an already read JSON value into `T`; `at` is where the value sits in the body (`""` for the body
/// itself, `"sampling_params"` for a nested object), so errors name the field by its whole path.
pub(crate) fn parse_value<T: DeserializeOwned>(value: &Value, at: &str) -> Result<T, HttpError> {
    serde_path_to_error::deserialize(value).map_err(|err| invalid_json(at, err.path().clone(), err.into_inner()))
}

/// The error for `inner` at `path` below `at`: `param` is the path of object keys down to the offending value (up
/// to the first array index), `message` the whole path and what is wrong.
fn invalid_json(at: &str, path: Path, inner: serde_json::Error) -> HttpError {
    let mut keys: Vec<&str> = if at.is_empty() { Vec::new() } else { vec![at] };
    for segment in path.iter() {
        match segment {
            Segment::Map { key } => keys.push(key),
            _ => break,
        }
    }
    if keys.is_empty() {
        return HttpError::InvalidJson { param: None, message: format!("invalid JSON body: {inner}") };
    }
    let full_path = if at.is_empty() { path.to_string() } else { format!("{at}.{path}") };
    HttpError::InvalidJson { param: Some(keys.join(".")), message: format!("{full_path}: {inner}") }
}

/// A JSON request body parsed into `T` (an extractor; must be the handler's last argument).
pub(crate) struct JsonBody<T>(pub(crate) T);

impl<T: DeserializeOwned> FromRequest<AppState> for JsonBody<T> {
    type Rejection = HttpError;

    async fn from_request(request: Request, state: &AppState) -> Result<Self, HttpError> {
        let bytes = read_request_body(request, state).await?;
        parse_json(&bytes).map(Self)
    }
}

/// A JSON request body read as a JSON value, to be parsed with [`parse_value`] (an extractor; must be the handler's
/// last argument).
pub(crate) struct JsonValue(pub(crate) Value);

impl FromRequest<AppState> for JsonValue {
    type Rejection = HttpError;

    async fn from_request(request: Request, state: &AppState) -> Result<Self, HttpError> {
        let bytes = read_request_body(request, state).await?;
        parse_json(&bytes).map(Self)
    }
}

/// Reads a request's body within the server's limit and by the gate deadline, counting a body that timed out.
async fn read_request_body(request: Request, state: &AppState) -> Result<Bytes, HttpError> {
    let coordinator = state.front().coordinator();
    let deadline = coordinator.gate_deadline(None).hold_until();
    read_body(request.into_body(), state.body_limit(), deadline).await.inspect_err(|err| {
        if matches!(err, HttpError::BodyTimeout) {
            coordinator.metrics().record_body_read_timeout("http");
        }
    })
}

/// A JSON request body parsed into `T`, where an empty body means `T::default()` (control endpoints that clients
/// call with `{}`, with no body, or with a few fields).
pub(crate) struct OptionalJsonBody<T>(pub(crate) T);

impl<T: DeserializeOwned + Default> FromRequest<AppState> for OptionalJsonBody<T> {
    type Rejection = HttpError;

    async fn from_request(request: Request, state: &AppState) -> Result<Self, HttpError> {
        let bytes = read_request_body(request, state).await?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(Self(T::default()));
        }
        parse_json(&bytes).map(Self)
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;
    use serde::Deserialize;

    use super::*;

    #[derive(Debug, Deserialize)]
    struct Probe {
        max_tokens: Option<u32>,
        stop: Option<Vec<String>>,
    }

    fn param_of(json: &str) -> Option<String> {
        match parse_json::<Probe>(json.as_bytes()) {
            Err(HttpError::InvalidJson { param, .. }) => param,
            other => panic!("{json} gave {other:?}"),
        }
    }

    #[test]
    fn type_errors_name_the_top_level_field() {
        assert_eq!(param_of(r#"{"max_tokens": "ten"}"#).as_deref(), Some("max_tokens"));
        assert_eq!(param_of(r#"{"max_tokens": -1}"#).as_deref(), Some("max_tokens"));
        assert_eq!(param_of(r#"{"stop": ["a", 3]}"#).as_deref(), Some("stop"));
    }

    #[test]
    fn nested_errors_name_the_whole_path_of_keys() {
        #[derive(Debug, Deserialize)]
        struct Outer {
            #[allow(dead_code)]
            sampling_params: Option<Probe>,
        }
        let value: Value = serde_json::from_str(r#"{"sampling_params": {"max_tokens": "ten"}}"#).expect("json");
        match parse_value::<Outer>(&value, "") {
            Err(HttpError::InvalidJson { param, message }) => {
                assert_eq!(param.as_deref(), Some("sampling_params.max_tokens"));
                assert!(message.starts_with("sampling_params.max_tokens: "), "{message}");
            }
            other => panic!("{other:?}"),
        }
        let nested: Value = serde_json::from_str(r#"{"stop": ["a", 3]}"#).expect("json");
        match parse_value::<Probe>(&nested, "sampling_params") {
            Err(HttpError::InvalidJson { param, .. }) => assert_eq!(param.as_deref(), Some("sampling_params.stop")),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn documents_that_are_not_one_json_object_name_no_field() {
        for json in ["", "{", "[1]", "{} {}", "null"] {
            assert_eq!(param_of(json), None, "{json:?}");
        }
    }

    #[test]
    fn unknown_fields_are_ignored() {
        let probe: Probe = parse_json(br#"{"max_tokens": 3, "frequency_penalty": 0.5, "stop": []}"#).expect("valid");
        assert_eq!((probe.max_tokens, probe.stop), (Some(3), Some(vec![])));
    }

    #[tokio::test]
    async fn bodies_over_the_limit_are_refused() {
        let later = Instant::now() + std::time::Duration::from_secs(10);
        let err = read_body(Body::from(vec![b'x'; 11]), 10, later).await.expect_err("too large");
        assert!(matches!(err, HttpError::BodyTooLarge { limit: 10 }), "{err:?}");
        assert_eq!(read_body(Body::from("1234567890"), 10, later).await.expect("fits").len(), 10);
    }

    #[tokio::test]
    async fn a_body_that_never_completes_fails_at_the_deadline() {
        let trickle = futures::stream::once(async { Ok::<_, std::io::Error>(Bytes::from_static(b"{")) })
            .chain(futures::stream::pending());
        let deadline = Instant::now() + std::time::Duration::from_millis(50);
        let err = read_body(Body::from_stream(trickle), 100, deadline).await.expect_err("never completes");
        assert!(matches!(err, HttpError::BodyTimeout), "{err:?}");
    }
}
