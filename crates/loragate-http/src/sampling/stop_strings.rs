//! Stop strings as requests send them: `"stop": "x"` or `"stop": ["x", "y"]` (or `null`), checked against the limits
//! every front's stop strings pass ([`check_stop_strings`]: too many, too long or empty is a 400 naming `stop`).

use loragate_text::check_stop_strings;
use serde::Deserialize;
use serde_json::Value;

/// The stop strings of a request.
#[derive(Debug, Default, PartialEq, Deserialize)]
#[serde(try_from = "Value")]
pub(crate) struct StopStrings(pub(crate) Vec<String>);

impl TryFrom<Value> for StopStrings {
    type Error = String;

    fn try_from(value: Value) -> Result<Self, String> {
        let strings = match value {
            Value::String(one) => vec![one],
            Value::Array(items) => items
                .into_iter()
                .map(|item| match item {
                    Value::String(text) => Ok(text),
                    other => Err(format!("must be a string or an array of strings, got {other} in the array")),
                })
                .collect::<Result<_, _>>()?,
            other => return Err(format!("must be a string or an array of strings, got {other}")),
        };
        check_stop_strings(&strings)?;
        Ok(Self(strings))
    }
}

#[cfg(test)]
mod tests {
    use loragate_text::{MAX_STOP_STRING_BYTES, MAX_STOP_STRINGS};

    use super::*;
    use crate::json_body::parse_json;

    #[derive(Debug, Deserialize)]
    struct Probe {
        stop: Option<StopStrings>,
    }

    #[test]
    fn stop_is_one_string_or_a_list_of_non_empty_strings() {
        let stop = |json: &str| parse_json::<Probe>(format!(r#"{{"stop": {json}}}"#).as_bytes()).expect(json).stop;
        assert_eq!(stop(r#""\n""#), Some(StopStrings(vec!["\n".to_owned()])));
        assert_eq!(stop(r#"["a", "bc"]"#), Some(StopStrings(vec!["a".to_owned(), "bc".to_owned()])));
        assert_eq!(stop("[]"), Some(StopStrings(Vec::new())));
        assert_eq!(stop("null"), None);
        let too_many = serde_json::to_string(&vec!["x"; MAX_STOP_STRINGS + 1]).expect("json");
        let too_long = serde_json::to_string(&"x".repeat(MAX_STOP_STRING_BYTES + 1)).expect("json");
        for json in [r#""""#, r#"["a", ""]"#, "[1]", "1", too_many.as_str(), too_long.as_str()] {
            let err = parse_json::<Probe>(format!(r#"{{"stop": {json}}}"#).as_bytes()).expect_err(json);
            assert_eq!(err.param().as_deref(), Some("stop"), "{json}");
        }
    }
}
