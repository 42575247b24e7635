//! Request bodies as JSON: read within the server's limit and by the gate deadline
//! (`--gate-max-wait`: a body that never completes fails with [`BodyError::Timeout`], which the fronts answer 408, and
//! is counted in `loragate_request_body_timeouts_total{front="http"}`), then parsed as JSON into the endpoint's own
//! request types, consuming the bytes: nothing of the body (no bytes, no `serde_json::Value`) outlives the parse, so
//! a request held at a paused gate keeps only its parsed form. Every failure names the field where there is one (its
//! path of keys, such as `sampling_params.max_tokens`).
//!
//! Bodies can be **strict**: a key the endpoint does not know is [`BodyError::UnknownField`] naming it, so a typo
//! (`"ownr"` for `"owner"`) is never silently dropped. A request type refuses unknown keys with
//! `#[serde(deny_unknown_fields)]`; an endpoint whose body is read into several types (its own fields, and the
//! sampling fields its API family shares) lists every type's fields and the fields it accepts without effect
//! ([`JsonObject`]).
//!
//! This is the fronts' shared body plumbing, below them: the HTTP front and the Tinker front read their bodies with
//! it, under the same limit and deadline, and each maps a [`BodyError`] to its own status and error shape in its own
//! extractors.

use bytes::Bytes;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use loragate_core::Coordinator;
use serde::de::{DeserializeOwned, Visitor};
use serde_json::{Map, Value};
use serde_path_to_error::{Path, Segment};
use tokio::time::Instant;

/// The largest request body a front accepts unless it is configured otherwise: 4 MiB.
pub const DEFAULT_BODY_LIMIT: usize = 4 * 1024 * 1024;

/// An error of a request body's stream (the error type of `http_body_util::Limited`).
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why a request body was refused before its endpoint looked at it. Each front maps it to its own error shape.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    /// The body is larger than the limit.
    #[error("the request body is larger than the {limit}-byte limit")]
    TooLarge {
        /// The limit, in bytes.
        limit: usize,
    },
    /// The body did not arrive by the gate deadline (`--gate-max-wait`).
    #[error("the request body did not arrive in time (the limit is the server's --gate-max-wait)")]
    Timeout,
    /// The body could not be read (the client stopped sending it).
    #[error("could not read the request body: {0}")]
    Unreadable(String),
    /// The body is not the JSON this endpoint takes: a syntax error, a wrong type, a value out of range.
    #[error("{message}")]
    Json {
        /// The path of object keys down to the offending value (up to the first array index), if there is one.
        param: Option<String>,
        /// What is wrong, with the whole path to the offending value.
        message: String,
    },
    /// A key the endpoint does not take.
    #[error("{param}: unknown field: this endpoint does not take it (check its spelling)")]
    UnknownField {
        /// The key's path (`owner`, `sampling_params.top_kk`).
        param: String,
    },
}

impl BodyError {
    /// The offending field's path of keys, if there is one.
    pub fn param(&self) -> Option<String> {
        match self {
            Self::Json { param, .. } => param.clone(),
            Self::UnknownField { param } => Some(param.clone()),
            Self::TooLarge { .. } | Self::Timeout | Self::Unreadable(_) => None,
        }
    }
}

/// Reads a request's whole body within `limit` bytes and by the coordinator's gate deadline (a timeout is counted
/// in `loragate_request_body_timeouts_total{front="http"}`), and parses it into `T`. `T` is strict if it says
/// `#[serde(deny_unknown_fields)]`.
pub async fn read_json<T, B>(body: B, coordinator: &Coordinator, limit: usize) -> Result<T, BodyError>
where
    T: DeserializeOwned,
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    let bytes = read_bounded(body, coordinator, limit).await?;
    parse_json(&bytes)
}

/// Reads a whole body within `limit` bytes and by the coordinator's gate deadline, counting a timeout.
pub async fn read_bounded<B>(body: B, coordinator: &Coordinator, limit: usize) -> Result<Bytes, BodyError>
where
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    let deadline = coordinator.gate_deadline(None).hold_until();
    read_body(body, limit, deadline).await.inspect_err(|err| {
        if matches!(err, BodyError::Timeout) {
            coordinator.metrics().record_body_read_timeout("http");
        }
    })
}

/// Reads a whole body by `deadline`, refusing more than `limit` bytes.
pub async fn read_body<B>(body: B, limit: usize, deadline: Instant) -> Result<Bytes, BodyError>
where
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    match tokio::time::timeout_at(deadline, copy_frames(Limited::new(body, limit))).await {
        Ok(Ok(bytes)) => Ok(bytes),
        Ok(Err(err)) if err.downcast_ref::<LengthLimitError>().is_some() => Err(BodyError::TooLarge { limit }),
        Ok(Err(err)) => Err(BodyError::Unreadable(err.to_string())),
        Err(_elapsed) => Err(BodyError::Timeout),
    }
}

/// Copies each frame of `body` into one buffer (sized by its `Content-Length`) and drops the frame at once. Each
/// frame is a piece of its connection's read buffer: collecting the frames first (as `BodyExt::collect` does) would
/// hold every piece of a large body at once, a heap of small allocations the allocator keeps after they are freed,
/// where copying lets the connection reuse one read buffer and the whole body is one allocation, returned when freed.
async fn copy_frames<B>(mut body: B) -> Result<Bytes, B::Error>
where
    B: http_body::Body<Data = Bytes> + Unpin,
{
    let expected = body.size_hint().exact().and_then(|bytes| usize::try_from(bytes).ok()).unwrap_or(0);
    let mut bytes = Vec::with_capacity(expected);
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame?.into_data() {
            bytes.extend_from_slice(&data);
        }
    }
    Ok(Bytes::from(bytes))
}

/// Parses one JSON document into `T`. Errors carry the path to the offending value and name its field.
///
/// A body that parses is parsed once, without tracking the path (which costs about as much again as the parse of a
/// small control body, on every request); only a body that fails is parsed a second time with the path tracked, for
/// the error, which is the same as that parse's.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, BodyError> {
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let unpathed = match T::deserialize(&mut deserializer) {
        Ok(value) => {
            deserializer
                .end()
                .map_err(|err| BodyError::Json { param: None, message: format!("invalid JSON body: {err}") })?;
            return Ok(value);
        }
        Err(err) => err,
    };
    match serde_path_to_error::deserialize::<_, T>(&mut serde_json::Deserializer::from_slice(bytes)) {
        Err(err) => Err(invalid_json("", err.path().clone(), err.into_inner())),
        // The same bytes cannot parse the second time; should they, the first error stands, without its path.
        Ok(_) => Err(BodyError::Json { param: None, message: format!("invalid JSON body: {unpathed}") }),
    }
}

/// Deserializes `value` into `T`, consuming it; `at` is where the value sits in the body (`""` for the body itself,
/// `"sampling_params"` for a nested object), so errors name the field by its whole path.
pub fn from_value<T: DeserializeOwned>(value: Value, at: &str) -> Result<T, BodyError> {
    serde_path_to_error::deserialize(value).map_err(|err| invalid_json(at, err.path().clone(), err.into_inner()))
}

/// The error for `inner` at `path` below `at`: `param` is the path of object keys down to the offending value (up
/// to the first array index), `message` the whole path and what is wrong. An unknown key (a type that denies them)
/// is [`BodyError::UnknownField`].
fn invalid_json(at: &str, path: Path, inner: serde_json::Error) -> BodyError {
    let mut keys: Vec<&str> = if at.is_empty() { Vec::new() } else { vec![at] };
    for segment in path.iter() {
        match segment {
            Segment::Map { key } => keys.push(key),
            _ => break,
        }
    }
    if keys.is_empty() {
        return BodyError::Json { param: None, message: format!("invalid JSON body: {inner}") };
    }
    let param = keys.join(".");
    // serde's own wording for a key a `deny_unknown_fields` type does not know.
    if inner.to_string().starts_with("unknown field") {
        return BodyError::UnknownField { param };
    }
    let full_path = if at.is_empty() { path.to_string() } else { format!("{at}.{path}") };
    BodyError::Json { param: Some(param), message: format!("{full_path}: {inner}") }
}

/// The field names `T`'s derived `Deserialize` reads (its aliases included): what a [`JsonObject`] lets through
/// for it. `T` must be a struct with named fields.
pub fn field_names<T: DeserializeOwned>() -> &'static [&'static str] {
    /// A deserializer that only records the field list serde's derive hands to `deserialize_struct`.
    struct FieldNames<'a>(&'a mut &'static [&'static str]);

    impl<'de> serde::Deserializer<'de> for FieldNames<'_> {
        type Error = serde::de::value::Error;

        fn deserialize_any<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, Self::Error> {
            Err(serde::de::Error::custom("not a struct"))
        }

        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _name: &'static str,
            fields: &'static [&'static str],
            _visitor: V,
        ) -> Result<V::Value, Self::Error> {
            *self.0 = fields;
            Err(serde::de::Error::custom("fields recorded"))
        }

        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf option unit
            unit_struct newtype_struct seq tuple tuple_struct map enum identifier ignored_any
        }
    }

    let mut fields: &'static [&'static str] = &[];
    let _ = T::deserialize(FieldNames(&mut fields));
    fields
}

/// A JSON object read into several request types at once (an endpoint's own fields and the sampling fields it
/// shares with its API family), strictly: every key must belong to one of the types, or to the endpoint's list of
/// fields accepted without effect. Each [`JsonObject::take`] moves its type's fields out, so the object is consumed
/// as it is parsed.
pub struct JsonObject {
    fields: Map<String, Value>,
    at: &'static str,
}

impl JsonObject {
    /// The body `bytes`, which must be one JSON object whose every key is in one of `known`.
    pub fn parse(bytes: &[u8], known: &[&[&str]]) -> Result<Self, BodyError> {
        let fields: Map<String, Value> = parse_json(bytes)?;
        Self::check(fields, "", known)
    }

    /// The nested object `value` (`null` or absent: an empty one) at `at`, whose every key is in one of `known`.
    pub fn nested(value: Option<Value>, at: &'static str, known: &[&[&str]]) -> Result<Self, BodyError> {
        let fields = match value {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(fields)) => fields,
            Some(other) => {
                return Err(BodyError::Json {
                    param: Some(at.to_owned()),
                    message: format!("{at}: must be an object, got {other}"),
                });
            }
        };
        Self::check(fields, at, known)
    }

    fn check(fields: Map<String, Value>, at: &'static str, known: &[&[&str]]) -> Result<Self, BodyError> {
        if let Some(unknown) = fields.keys().find(|key| !known.iter().any(|names| names.contains(&key.as_str()))) {
            let param = if at.is_empty() { unknown.clone() } else { format!("{at}.{unknown}") };
            return Err(BodyError::UnknownField { param });
        }
        Ok(Self { fields, at })
    }

    /// Moves `T`'s fields out of the object and deserializes them.
    pub fn take<T: DeserializeOwned>(&mut self) -> Result<T, BodyError> {
        let names = field_names::<T>();
        let mine: Map<String, Value> = names.iter().filter_map(|name| self.fields.remove_entry(*name)).collect();
        from_value(Value::Object(mine), self.at)
    }

    /// Moves the value of `key` out of the object.
    pub fn take_value(&mut self, key: &str) -> Option<Value> {
        self.fields.remove(key)
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;
    use http_body::Frame;
    use http_body_util::{Full, StreamBody};
    use serde::Deserialize;

    use super::*;

    #[derive(Debug, Deserialize)]
    struct Probe {
        max_tokens: Option<u32>,
        stop: Option<Vec<String>>,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Strict {
        #[allow(dead_code)]
        lora_name: Option<String>,
        #[allow(dead_code)]
        #[serde(alias = "lease")]
        lease_s: Option<f64>,
    }

    fn param_of(json: &str) -> Option<String> {
        match parse_json::<Probe>(json.as_bytes()) {
            Err(BodyError::Json { param, .. }) => param,
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
    fn a_body_that_parses_gives_its_value_and_one_that_fails_the_error_with_its_path() {
        // A valid body is parsed once without path tracking; a failing one again with it, for the message.
        let probe = parse_json::<Probe>(br#"{"max_tokens": 7, "stop": ["x"]}"#).expect("valid");
        assert_eq!((probe.max_tokens, probe.stop.as_deref()), (Some(7), Some(&["x".to_owned()][..])));
        match parse_json::<Probe>(br#"{"stop": ["a"], "max_tokens": "ten"}"#) {
            Err(BodyError::Json { param, message }) => {
                assert_eq!(param.as_deref(), Some("max_tokens"));
                assert!(message.starts_with("max_tokens: invalid type: string \"ten\""), "{message}");
            }
            other => panic!("{other:?}"),
        }
        match parse_json::<Probe>(br#"{"max_tokens": 7} x"#) {
            Err(BodyError::Json { param: None, message }) => {
                assert!(message.starts_with("invalid JSON body: trailing characters"), "{message}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn nested_errors_name_the_whole_path_of_keys() {
        #[derive(Debug, Deserialize)]
        struct Outer {
            #[allow(dead_code)]
            sampling_params: Option<Probe>,
        }
        let value: Value = serde_json::from_str(r#"{"sampling_params": {"max_tokens": "ten"}}"#).expect("json");
        match from_value::<Outer>(value, "") {
            Err(BodyError::Json { param, message }) => {
                assert_eq!(param.as_deref(), Some("sampling_params.max_tokens"));
                assert!(message.starts_with("sampling_params.max_tokens: "), "{message}");
            }
            other => panic!("{other:?}"),
        }
        let nested: Value = serde_json::from_str(r#"{"stop": ["a", 3]}"#).expect("json");
        match from_value::<Probe>(nested, "sampling_params") {
            Err(BodyError::Json { param, .. }) => assert_eq!(param.as_deref(), Some("sampling_params.stop")),
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
    fn a_strict_type_names_the_unknown_field() {
        match parse_json::<Strict>(br#"{"lora_name": "meow", "ownr": "x"}"#) {
            Err(BodyError::UnknownField { param }) => assert_eq!(param, "ownr"),
            other => panic!("{other:?}"),
        }
        assert!(parse_json::<Strict>(br#"{"lora_name": "meow", "lease": 5}"#).is_ok(), "aliases are fields");
    }

    #[test]
    fn field_names_lists_a_structs_fields_with_their_aliases() {
        assert_eq!(field_names::<Probe>(), &["max_tokens", "stop"]);
        let strict = field_names::<Strict>();
        assert!(strict.contains(&"lora_name") && strict.contains(&"lease_s") && strict.contains(&"lease"));
    }

    #[test]
    fn an_object_read_into_several_types_refuses_keys_none_of_them_knows() {
        let known: &[&[&str]] = &[field_names::<Probe>(), &["user"]];
        let mut object = JsonObject::parse(br#"{"max_tokens": 3, "user": "u", "stop": ["a"]}"#, known).expect("ok");
        let probe: Probe = object.take().expect("probe");
        assert_eq!((probe.max_tokens, probe.stop), (Some(3), Some(vec!["a".to_owned()])));
        match JsonObject::parse(br#"{"max_tokens": 3, "frequency_penalty": 0.5}"#, known) {
            Err(BodyError::UnknownField { param }) => assert_eq!(param, "frequency_penalty"),
            other => panic!("{:?}", other.map(|_| ())),
        }
        let nested = serde_json::json!({"top_kk": 1});
        match JsonObject::nested(Some(nested), "sampling_params", known) {
            Err(BodyError::UnknownField { param }) => assert_eq!(param, "sampling_params.top_kk"),
            other => panic!("{:?}", other.map(|_| ())),
        }
        assert!(JsonObject::nested(None, "sampling_params", known).is_ok(), "absent is empty");
    }

    #[tokio::test]
    async fn bodies_over_the_limit_are_refused() {
        let later = Instant::now() + std::time::Duration::from_secs(10);
        let err = read_body(Full::new(Bytes::from(vec![b'x'; 11])), 10, later).await.expect_err("too large");
        assert!(matches!(err, BodyError::TooLarge { limit: 10 }), "{err:?}");
        assert_eq!(read_body(Full::new(Bytes::from("1234567890")), 10, later).await.expect("fits").len(), 10);
    }

    #[tokio::test]
    async fn a_body_that_never_completes_fails_at_the_deadline() {
        let trickle = futures::stream::once(async { Ok::<_, std::io::Error>(Frame::data(Bytes::from_static(b"{"))) })
            .chain(futures::stream::pending());
        let deadline = Instant::now() + std::time::Duration::from_millis(50);
        let body = StreamBody::new(Box::pin(trickle));
        let err = read_body(body, 100, deadline).await.expect_err("never completes");
        assert!(matches!(err, BodyError::Timeout), "{err:?}");
    }
}
