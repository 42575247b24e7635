//! Stop strings as requests send them (and the one check every front's stop strings pass): `"stop": "x"` or `"stop": ["x", "y"]` (or `null`); none may be empty.
//!
//! Limits: a request may give at most [`MAX_STOP_STRINGS`] stop strings of at most [`MAX_STOP_STRING_BYTES`] bytes
//! each (more is a 400 naming `stop`), so watching one piece of text costs at most a few microseconds' worth of
//! comparisons over a window shorter than the longest stop string.

use serde::Deserialize;
use serde_json::Value;

/// The most stop strings one request may give.
pub const MAX_STOP_STRINGS: usize = 16;
/// The longest stop string accepted, in bytes.
pub const MAX_STOP_STRING_BYTES: usize = 256;

/// Checks a request's stop strings against the limits (none may be empty either); the reason says which limit. Every
/// front that watches stop strings (the Tinker front too) checks them here.
pub fn check_stop_strings(stops: &[String]) -> Result<(), String> {
    if stops.len() > MAX_STOP_STRINGS {
        return Err(format!("has {} stop strings, the limit is {MAX_STOP_STRINGS}", stops.len()));
    }
    if stops.iter().any(String::is_empty) {
        return Err("stop strings must not be empty".to_owned());
    }
    if let Some(long) = stops.iter().find(|stop| stop.len() > MAX_STOP_STRING_BYTES) {
        return Err(format!("a stop string is {} bytes long, the limit is {MAX_STOP_STRING_BYTES}", long.len()));
    }
    Ok(())
}

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
    use super::*;

    #[test]
    fn stop_strings_are_capped_in_count_and_length() {
        let many: Vec<String> = (0..=MAX_STOP_STRINGS).map(|i| i.to_string()).collect();
        assert!(check_stop_strings(&many).expect_err("too many").contains("limit"));
        assert!(check_stop_strings(&many[..MAX_STOP_STRINGS]).is_ok());
        assert!(check_stop_strings(&["x".repeat(MAX_STOP_STRING_BYTES + 1)]).is_err());
        assert!(check_stop_strings(&["x".repeat(MAX_STOP_STRING_BYTES)]).is_ok());
        assert!(check_stop_strings(&[String::new()]).is_err());
    }
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
