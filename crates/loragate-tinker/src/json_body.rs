//! Request bodies: read within the server's limit (413 past it), then parsed as JSON into this front's request types,
//! every failure a 400 whose detail names the path of the offending value (`sampling_params.seed: invalid type`).

use axum::extract::{FromRequest, Request};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use serde::de::DeserializeOwned;

use crate::error::TinkerError;
use crate::front::TinkerState;

/// A JSON request body parsed into `T` (an extractor; must be the handler's last argument).
pub(crate) struct JsonBody<T>(pub(crate) T);

impl<T: DeserializeOwned> FromRequest<TinkerState> for JsonBody<T> {
    type Rejection = TinkerError;

    async fn from_request(request: Request, state: &TinkerState) -> Result<Self, TinkerError> {
        let limit = state.config().body_limit;
        let bytes = match Limited::new(request.into_body(), limit).collect().await {
            Ok(collected) => collected.to_bytes(),
            Err(err) if err.downcast_ref::<LengthLimitError>().is_some() => {
                return Err(TinkerError::BodyTooLarge { limit });
            }
            Err(err) => return Err(TinkerError::UnreadableBody(err.to_string())),
        };
        parse_json(&bytes).map(Self)
    }
}

/// Parses one JSON document into `T`; errors carry the path to the offending value.
pub(crate) fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, TinkerError> {
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut deserializer).map_err(|err| {
        let path = err.path().to_string();
        let inner = err.into_inner();
        // The path is "." at the top level and "?" where the document broke off before naming a field.
        TinkerError::InvalidJson(match path.as_str() {
            "." | "?" => format!("invalid JSON body: {inner}"),
            _ => format!("{path}: {inner}"),
        })
    })?;
    deserializer.end().map_err(|err| TinkerError::InvalidJson(format!("invalid JSON body: {err}")))?;
    Ok(value)
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
            Err(TinkerError::InvalidJson(message)) => message,
            other => panic!("{json} gave {other:?}"),
        };
        assert!(message(r#"{"params": {"seed": "x"}}"#).starts_with("params.seed: "));
        assert!(message("{").starts_with("invalid JSON body"));
        assert!(message("{} {}").starts_with("invalid JSON body"));
        assert!(parse_json::<Probe>(br#"{"params": {"seed": 3}, "unknown": 1}"#).is_ok(), "unknown fields pass");
    }
}
