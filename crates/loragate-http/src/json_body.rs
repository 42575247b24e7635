//! This front's request-body extractors, over the body plumbing every HTTP-based front shares
//! ([`loragate_net::json_body`]: read within the limit and by the gate deadline, parsed strictly, naming the field).
//! Every failure is a 400 (413 over the limit, 408 past the deadline) naming the field where there is one; this
//! replaces axum's `Json` extractor, whose rejections are 415/422 with plain-text bodies.

use axum::extract::{FromRequest, Request};
#[cfg(test)]
use loragate_net::json_body::from_value;
use loragate_net::json_body::read_bounded;
pub(crate) use loragate_net::json_body::{BodyError, JsonObject, field_names, parse_json};
use serde::Deserialize;
use serde::de::DeserializeOwned;
#[cfg(test)]
use serde_json::Value;

use crate::error::HttpError;
use crate::state::AppState;

/// [`from_value`] on a copy of `value` (tests build their bodies as values).
#[cfg(test)]
pub(crate) fn parse_value<T: DeserializeOwned>(value: &Value, at: &str) -> Result<T, HttpError> {
    Ok(from_value(value.clone(), at)?)
}

/// A JSON request body parsed into `T` (an extractor; must be the handler's last argument). Strict when `T` says
/// `#[serde(deny_unknown_fields)]`, as every control body does.
pub(crate) struct JsonBody<T>(pub(crate) T);

impl<T: DeserializeOwned> FromRequest<AppState> for JsonBody<T> {
    type Rejection = HttpError;

    async fn from_request(request: Request, state: &AppState) -> Result<Self, HttpError> {
        let bytes = read_bounded(request.into_body(), state.front().coordinator(), state.body_limit()).await?;
        Ok(Self(parse_json(&bytes)?))
    }
}

/// A request parsed from a whole JSON body by [`ParseBody::parse_body`] (an extractor; must be the handler's last
/// argument): for endpoints whose body is read into several types (see [`JsonObject`]).
pub(crate) struct Parsed<T>(pub(crate) T);

/// A request type parsed from a body's bytes, consuming them.
pub(crate) trait ParseBody: Sized {
    /// Parses the body.
    fn parse_body(bytes: &[u8]) -> Result<Self, HttpError>;
}

impl<T: ParseBody> FromRequest<AppState> for Parsed<T> {
    type Rejection = HttpError;

    async fn from_request(request: Request, state: &AppState) -> Result<Self, HttpError> {
        let bytes = read_bounded(request.into_body(), state.front().coordinator(), state.body_limit()).await?;
        T::parse_body(&bytes).map(Self)
    }
}

/// A JSON request body parsed into `T`, where an empty body means `T::default()` (control endpoints that clients
/// call with `{}`, with no body, or with a few fields).
pub(crate) struct OptionalJsonBody<T>(pub(crate) T);

impl<T: DeserializeOwned + Default> FromRequest<AppState> for OptionalJsonBody<T> {
    type Rejection = HttpError;

    async fn from_request(request: Request, state: &AppState) -> Result<Self, HttpError> {
        let bytes = read_bounded(request.into_body(), state.front().coordinator(), state.body_limit()).await?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(Self(T::default()));
        }
        Ok(Self(parse_json(&bytes)?))
    }
}

/// The body of endpoints that take no fields: nothing, or `{}` (a strict empty object).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct NoFields {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_endpoint_without_fields_takes_an_empty_object_and_nothing_else() {
        assert!(matches!(parse_json::<NoFields>(b"{}"), Ok(NoFields {})));
        assert!(matches!(parse_json::<NoFields>(br#"{"x": 1}"#), Err(BodyError::UnknownField { .. })));
    }
}
