//! Request bodies, read with the reader every HTTP-based front shares ([`loragate_net::json_body::read_json`]):
//! within the front's limit (413 past it) and by the server's gate deadline (408 past it, counted in
//! `loragate_request_body_timeouts_total{front="http"}`: a trickling body is cut off here as on every other route),
//! then parsed as JSON into this front's request types, every failure a 400 whose detail names the path of the
//! offending value (`sampling_params.seed: invalid type`). The SDK sends fields this front does not read (`type`,
//! …): they are ignored.

use axum::extract::{FromRequest, Request};
use serde::de::DeserializeOwned;

use crate::error::TinkerError;
use crate::state::TinkerState;

/// A JSON request body parsed into `T` (an extractor; must be the handler's last argument).
pub(crate) struct JsonBody<T>(pub(crate) T);

impl<T: DeserializeOwned> FromRequest<TinkerState> for JsonBody<T> {
    type Rejection = TinkerError;

    async fn from_request(request: Request, state: &TinkerState) -> Result<Self, TinkerError> {
        let body = request.into_body();
        Ok(Self(loragate_net::json_body::read_json(body, state.coordinator(), state.config().body_limit).await?))
    }
}

/// Parses one JSON document into `T` (tests build bodies as text).
#[cfg(test)]
pub(crate) fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, TinkerError> {
    Ok(loragate_net::json_body::parse_json(bytes)?)
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::*;

    #[derive(Debug, Deserialize)]
    struct Probe {
        #[allow(dead_code)]
        params: Option<Inner>,
    }

    #[derive(Debug, Deserialize)]
    struct Inner {
        #[allow(dead_code)]
        seed: Option<u64>,
    }

    #[test]
    fn errors_name_the_path_of_the_offending_value() {
        let message = |json: &str| match parse_json::<Probe>(json.as_bytes()) {
            Err(err) => {
                assert_eq!(err.status(), http::StatusCode::BAD_REQUEST, "{json}");
                err.to_string()
            }
            other => panic!("{json} gave {other:?}"),
        };
        assert!(message(r#"{"params": {"seed": "x"}}"#).starts_with("params.seed: "));
        assert!(message("{").starts_with("invalid JSON body"));
        assert!(message("{} {}").starts_with("invalid JSON body"));
        assert!(parse_json::<Probe>(br#"{"params": {"seed": 3}, "unknown": 1}"#).is_ok(), "unknown fields pass");
    }
}
