//! Request bodies: read within the server's limit, then parsed as JSON into this front's own request types, with
//! every failure a 400 (413 over the limit) naming the field where there is one. This replaces axum's `Json`
//! extractor, whose rejections are 415/422 with plain-text bodies.

use axum::body::Body;
use axum::extract::{FromRequest, Request};
use bytes::Bytes;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use serde::de::DeserializeOwned;
use serde_path_to_error::Segment;

use crate::error::HttpError;
use crate::server::AppState;

/// Reads a whole body, refusing more than `limit` bytes.
pub(crate) async fn read_body(body: Body, limit: usize) -> Result<Bytes, HttpError> {
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(err) if err.downcast_ref::<LengthLimitError>().is_some() => Err(HttpError::BodyTooLarge { limit }),
        Err(err) => Err(HttpError::UnreadableBody(err.to_string())),
    }
}

/// Parses a JSON document into `T`. Errors carry the path to the offending value and name its top-level field.
pub(crate) fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, HttpError> {
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut deserializer).map_err(|err| {
        let param = match err.path().iter().next() {
            Some(Segment::Map { key }) => Some(key.clone()),
            _ => None,
        };
        let path = err.path().to_string();
        let inner = err.into_inner();
        let message = if param.is_some() { format!("{path}: {inner}") } else { format!("invalid JSON body: {inner}") };
        HttpError::InvalidJson { param, message }
    })?;
    deserializer
        .end()
        .map_err(|err| HttpError::InvalidJson { param: None, message: format!("invalid JSON body: {err}") })?;
    Ok(value)
}

/// A JSON request body parsed into `T` (an extractor; must be the handler's last argument).
pub(crate) struct JsonBody<T>(pub(crate) T);

impl<T: DeserializeOwned> FromRequest<AppState> for JsonBody<T> {
    type Rejection = HttpError;

    async fn from_request(request: Request, state: &AppState) -> Result<Self, HttpError> {
        let bytes = read_body(request.into_body(), state.body_limit()).await?;
        parse_json(&bytes).map(Self)
    }
}

/// A JSON request body parsed into `T`, where an empty body means `T::default()` (control endpoints that clients
/// call with `{}`, with no body, or with a few fields).
pub(crate) struct OptionalJsonBody<T>(pub(crate) T);

impl<T: DeserializeOwned + Default> FromRequest<AppState> for OptionalJsonBody<T> {
    type Rejection = HttpError;

    async fn from_request(request: Request, state: &AppState) -> Result<Self, HttpError> {
        let bytes = read_body(request.into_body(), state.body_limit()).await?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(Self(T::default()));
        }
        parse_json(&bytes).map(Self)
    }
}

#[cfg(test)]
mod tests {
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
        let err = read_body(Body::from(vec![b'x'; 11]), 10).await.expect_err("too large");
        assert!(matches!(err, HttpError::BodyTooLarge { limit: 10 }), "{err:?}");
        assert_eq!(read_body(Body::from("1234567890"), 10).await.expect("fits").len(), 10);
    }
}
