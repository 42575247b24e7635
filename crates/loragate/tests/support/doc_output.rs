//! Comparing a documented output with what the command printed, after normalising what varies from run to run
//! (the rules are listed in `docs/README.md`):
//!
//! - a `json` output is a sequence of JSON values (pretty-printed or not) compared value by value;
//! - any other output is compared line by line, a line that is JSON after an optional `data: ` (server-sent events)
//!   as JSON;
//! - ids the server generates (`lg-` + 8 hex digits + `-N`) compare equal to one another, as do the values of the
//!   keys in [`VARYING_KEYS`] (times and timestamps, and the absolute paths adapters were loaded from);
//! - integers compare exactly, other numbers to a relative 1e-3 or an absolute 1e-5 (logprobs' last digits depend on
//!   the CPU's kernels and the order of a sum: a logprob a hair below 0 carries the normaliser's f32 rounding, ~1e-6);
//! - a stream's consecutive token chunks of one sequence are compared merged (how many tokens one chunk carries
//!   depends on when the server sent them: on a loaded machine two tokens can leave together): gRPC's chunks in a
//!   `json` output, and in server-sent events the completion chunks of one unfinished choice (their `text`, chat
//!   `delta.content` and `token_ids` concatenated; the blank lines between events are not compared).

#![allow(dead_code, unreachable_pub)]

use serde_json::Value;

/// Keys whose values are times, or the absolute paths (`source`) adapters were loaded from on the machine that runs
/// the examples: compared for presence only.
pub const VARYING_KEYS: &[&str] = &[
    "created",
    "finished_at",
    "timestamp",
    "lease_left_s",
    "leaseLeftS",
    "latency_ms",
    "next_probe_unix_ms",
    "nextProbeUnixMs",
    "source",
];

/// Whether `expected` (a documented output in language `language`) matches `actual`; else a message showing both.
pub fn compare(language: &str, expected: &str, actual: &str) -> Result<(), String> {
    let outcome =
        if language == "json" { compare_json_stream(expected, actual) } else { compare_lines(expected, actual) };
    outcome.map_err(|why| format!("{why}\n--- documented:\n{expected}--- printed:\n{actual}"))
}

/// What `printed` should be documented as, in a block of `language` (`LORAGATE_BLESS_DOCS`, see `docs/README.md`):
/// each JSON value as printed (keys in the server's order), one after the other on lines of their own; other text
/// as printed.
pub fn as_documented(language: &str, printed: &str) -> String {
    if language != "json" || json_values(printed).is_err() {
        return printed.trim_end().to_owned();
    }
    let mut values = serde_json::Deserializer::from_str(printed).into_iter::<Value>();
    let mut pieces = Vec::new();
    let mut start = 0;
    while let Some(Ok(_)) = values.next() {
        let end = values.byte_offset();
        pieces.push(printed[start..end].trim());
        start = end;
    }
    pieces.join("\n")
}

fn compare_json_stream(expected: &str, actual: &str) -> Result<(), String> {
    let expected = json_values(expected).map_err(|err| format!("the documented output is not JSON: {err}"))?;
    let actual = json_values(actual).map_err(|err| format!("the command did not print JSON: {err}"))?;
    let (expected, actual) = (merge_token_chunks(expected), merge_token_chunks(actual));
    if expected.len() != actual.len() {
        return Err(format!("{} JSON values documented, {} printed", expected.len(), actual.len()));
    }
    for (index, (expected, actual)) in expected.iter().zip(&actual).enumerate() {
        same(expected, actual, &format!("value {index}"))?;
    }
    Ok(())
}

/// The token arrays a stream chunk carries, merged when chunks are.
const CHUNK_ARRAYS: &[&str] = &["tokenIds", "logprobs", "topLogprobs"];

/// `values` with every run of token chunks (objects with `tokenIds` and no `finishReason`) of the same request,
/// sequence and version merged into one: their arrays concatenated, their other fields equal.
fn merge_token_chunks(values: Vec<Value>) -> Vec<Value> {
    let is_chunk =
        |value: &Value| value.get("tokenIds").is_some_and(Value::is_array) && value.get("finishReason").is_none();
    let rest = |value: &Value| {
        let mut value = value.clone();
        if let Some(object) = value.as_object_mut() {
            for key in CHUNK_ARRAYS {
                object.remove(*key);
            }
        }
        value
    };
    let mut merged: Vec<Value> = Vec::with_capacity(values.len());
    for value in values {
        if let Some(last) = merged.last_mut()
            && is_chunk(last)
            && is_chunk(&value)
            && rest(last) == rest(&value)
        {
            for key in CHUNK_ARRAYS {
                if let (Some(Value::Array(into)), Some(Value::Array(more))) = (last.get_mut(*key), value.get(*key)) {
                    into.extend(more.iter().cloned());
                }
            }
            continue;
        }
        merged.push(value);
    }
    merged
}

fn json_values(text: &str) -> Result<Vec<Value>, serde_json::Error> {
    serde_json::Deserializer::from_str(text).into_iter::<Value>().collect()
}

/// Server-sent events' completion chunks of one choice that has not finished (one choice, `finish_reason` null):
/// the fields merged by concatenation, which must be all that differs between two chunks that merge.
fn event_chunk(value: &Value) -> Option<&serde_json::Map<String, Value>> {
    let choices = value.get("choices")?.as_array()?;
    let [choice] = choices.as_slice() else { return None };
    let choice = choice.as_object()?;
    let unfinished = choice.get("finish_reason").is_none_or(Value::is_null);
    let has_tokens = choice.contains_key("text") || choice.contains_key("delta") || choice.contains_key("token_ids");
    (unfinished && has_tokens).then_some(choice)
}

/// `value` without what merging concatenates (and without the times in [`VARYING_KEYS`]).
fn event_chunk_rest(value: &Value) -> Value {
    let mut value = value.clone();
    if let Some(object) = value.as_object_mut() {
        for key in VARYING_KEYS {
            object.remove(*key);
        }
    }
    if let Some(Value::Object(choice)) = value.get_mut("choices").and_then(|c| c.get_mut(0)) {
        for key in ["text", "token_ids"] {
            choice.remove(key);
        }
        if let Some(Value::Object(delta)) = choice.get_mut("delta") {
            delta.remove("content");
        }
    }
    value
}

/// Appends `more`'s string or array at `key` of `into` (both present and of the same kind), or fails.
fn concatenate(into: &mut serde_json::Map<String, Value>, more: &serde_json::Map<String, Value>, key: &str) -> bool {
    match (into.get_mut(key), more.get(key)) {
        (None, None) => true,
        (Some(Value::String(into)), Some(Value::String(more))) => {
            into.push_str(more);
            true
        }
        (Some(Value::Array(into)), Some(Value::Array(more))) => {
            into.extend(more.iter().cloned());
            true
        }
        _ => false,
    }
}

/// The lines of a server-sent events output with every run of completion chunks of one unfinished choice merged
/// into one event, and the blank separator lines left out; other text unchanged.
fn merge_event_chunks(lines: Vec<String>) -> Vec<String> {
    if !lines.iter().any(|line| line.starts_with("data: ")) {
        return lines;
    }
    let mut merged: Vec<(String, Option<Value>)> = Vec::with_capacity(lines.len());
    for line in lines.into_iter().filter(|line| !line.is_empty()) {
        let value = line_json(&line).filter(|(prefix, _)| *prefix == "data: ").map(|(_, value)| value);
        if let (Some(value), Some((_, Some(last)))) = (&value, merged.last_mut())
            && event_chunk(value).is_some()
            && event_chunk(last).is_some()
            && event_chunk_rest(last) == event_chunk_rest(value)
        {
            let more = event_chunk(value).cloned().unwrap_or_default();
            let into = last.get_mut("choices").and_then(|c| c.get_mut(0)).and_then(Value::as_object_mut);
            if let Some(into) = into {
                let delta_ok = match (into.get_mut("delta"), more.get("delta")) {
                    (Some(Value::Object(into)), Some(Value::Object(more))) => concatenate(into, more, "content"),
                    (None, None) => true,
                    _ => false,
                };
                if delta_ok && concatenate(into, &more, "text") && concatenate(into, &more, "token_ids") {
                    continue;
                }
            }
        }
        merged.push((line, value));
    }
    merged
        .into_iter()
        .map(|(line, value)| match value {
            Some(value) if event_chunk(&value).is_some() => format!("data: {value}"),
            _ => line,
        })
        .collect()
}

fn compare_lines(expected: &str, actual: &str) -> Result<(), String> {
    let lines = |text: &str| -> Vec<String> {
        merge_event_chunks(text.lines().map(|line| line.trim_end().to_owned()).collect())
    };
    let (expected, actual) = (lines(expected.trim_end()), lines(actual.trim_end()));
    if expected.len() != actual.len() {
        return Err(format!("{} lines documented, {} printed", expected.len(), actual.len()));
    }
    for (number, (expected, actual)) in expected.iter().zip(&actual).enumerate() {
        let place = format!("line {}", number + 1);
        match (line_json(expected), line_json(actual)) {
            (Some((prefix, expected)), Some((actual_prefix, actual))) if prefix == actual_prefix => {
                same(&expected, &actual, &place)?
            }
            _ if normalise_ids(expected) == normalise_ids(actual) => {}
            _ => return Err(format!("{place} differs:\n  documented: {expected}\n  printed:    {actual}")),
        }
    }
    Ok(())
}

/// A line's JSON object or array, after an optional `data: ` prefix.
fn line_json(line: &str) -> Option<(&str, Value)> {
    let (prefix, rest) = line.strip_prefix("data: ").map_or(("", line), |rest| ("data: ", rest));
    if !(rest.starts_with('{') || rest.starts_with('[')) {
        return None;
    }
    serde_json::from_str(rest).ok().map(|value| (prefix, value))
}

fn same(expected: &Value, actual: &Value, path: &str) -> Result<(), String> {
    let differs = || format!("{path}: documented {expected}, printed {actual}");
    match (expected, actual) {
        (Value::Object(expected), Value::Object(actual)) => {
            let mut keys: Vec<&String> = expected.keys().chain(actual.keys()).collect();
            keys.sort();
            keys.dedup();
            for key in keys {
                let here = format!("{path}.{key}");
                match (expected.get(key), actual.get(key)) {
                    (Some(_), Some(_)) if VARYING_KEYS.contains(&key.as_str()) => {}
                    (Some(expected), Some(actual)) => same(expected, actual, &here)?,
                    (Some(_), None) => return Err(format!("{here}: documented but not printed")),
                    (None, Some(actual)) => return Err(format!("{here}: printed ({actual}) but not documented")),
                    (None, None) => unreachable!("a key of one of the two objects"),
                }
            }
            Ok(())
        }
        (Value::Array(expected), Value::Array(actual)) => {
            if expected.len() != actual.len() {
                return Err(format!("{path}: {} items documented, {} printed", expected.len(), actual.len()));
            }
            for (index, (expected, actual)) in expected.iter().zip(actual).enumerate() {
                same(expected, actual, &format!("{path}[{index}]"))?;
            }
            Ok(())
        }
        (Value::Number(expected), Value::Number(actual)) => {
            let exact = expected.as_i64().zip(actual.as_i64()).map(|(a, b)| a == b);
            let close = || {
                let (a, b) = (expected.as_f64().unwrap_or(f64::NAN), actual.as_f64().unwrap_or(f64::NAN));
                (a - b).abs() <= 1e-5 + 1e-3 * a.abs().max(b.abs())
            };
            if exact.unwrap_or_else(close) { Ok(()) } else { Err(differs()) }
        }
        (Value::String(expected), Value::String(actual)) => {
            if normalise_ids(expected) == normalise_ids(actual) {
                Ok(())
            } else {
                Err(differs())
            }
        }
        _ if expected == actual => Ok(()),
        _ => Err(differs()),
    }
}

/// `text` with every id the server generates (`lg-` + 8 hex digits + `-` + digits) replaced by `lg-…`.
pub fn normalise_ids(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("lg-") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 3..];
        let hex = after.bytes().take(8).filter(u8::is_ascii_hexdigit).count();
        let digits = after.get(9..).map_or(0, |tail| tail.bytes().take_while(u8::is_ascii_digit).count());
        if hex == 8 && after.as_bytes().get(8) == Some(&b'-') && digits > 0 {
            out.push_str("lg-…");
            rest = &after[9 + digits..];
        } else {
            out.push_str("lg-");
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_ids_and_times_vary_and_the_rest_must_match() {
        let documented = "{\"id\": \"cmpl-lg-8579f297-2\", \"created\": 1,\n \"logprob\": -0.001147327, \"n\": 3}";
        assert!(
            compare(
                "json",
                documented,
                "{\"id\":\"cmpl-lg-0000abcd-17\",\"created\":9,\"logprob\":-0.0011474,\"n\":3}\n"
            )
            .is_ok()
        );
        assert!(
            compare("json", documented, "{\"id\":\"cmpl-demo\",\"created\":9,\"logprob\":-0.001147327,\"n\":3}")
                .is_err()
        );
        assert!(
            compare("json", documented, "{\"id\":\"cmpl-lg-0000abcd-1\",\"created\":9,\"logprob\":-0.002,\"n\":3}")
                .is_err()
        );
        assert!(
            compare(
                "json",
                documented,
                "{\"id\":\"cmpl-lg-0000abcd-1\",\"created\":9,\"logprob\":-0.001147327,\"n\":4}"
            )
            .is_err()
        );
        assert!(
            compare("json", documented, "{\"id\":\"cmpl-lg-0000abcd-1\",\"logprob\":-0.001147327,\"n\":3}").is_err(),
            "a missing key"
        );
        assert!(compare("json", "{}\n{}", "{}").is_err(), "two values documented, one printed");
    }

    #[test]
    fn text_outputs_compare_line_by_line_with_events_as_json() {
        let documented = "data: {\"id\":\"cmpl-lg-bf933ab2-6\",\"created\":5,\"text\":\"w\"}\n\ndata: [DONE]\n";
        assert!(
            compare(
                "text",
                documented,
                "data: {\"text\":\"w\",\"id\":\"cmpl-lg-00000000-0\",\"created\":6}\n\ndata: [DONE]\n\n"
            )
            .is_ok()
        );
        assert!(
            compare(
                "text",
                documented,
                "data: {\"text\":\"o\",\"id\":\"cmpl-lg-00000000-0\",\"created\":6}\n\ndata: [DONE]\n"
            )
            .is_err()
        );
        assert!(compare("text", "a\nb\n", "a\n").is_err());
        assert_eq!(normalise_ids("x lg-12345678-9 lg-zz lg-1234567-1"), "x lg-… lg-zz lg-1234567-1");
    }

    #[test]
    fn a_streams_token_chunks_compare_merged_whatever_their_split() {
        let one_by_one = r#"{"requestId":"lg-00000000-1","tokenIds":[1],"logprobs":[-0.1],"loraVersion":"1"}
{"requestId":"lg-00000000-1","tokenIds":[2],"logprobs":[-0.2],"loraVersion":"1"}
{"requestId":"lg-00000000-1","loraVersion":"1","finishReason":"FINISH_REASON_LENGTH"}"#;
        let together = r#"{"requestId":"lg-00000000-1","tokenIds":[1,2],"logprobs":[-0.1,-0.2],"loraVersion":"1"}
{"requestId":"lg-00000000-1","loraVersion":"1","finishReason":"FINISH_REASON_LENGTH"}"#;
        assert!(compare("json", one_by_one, together).is_ok());
        let other_tokens = together.replace("[1,2]", "[1,3]");
        assert!(compare("json", one_by_one, &other_tokens).is_err(), "merged tokens still compare exactly");
        let other_version = one_by_one.replacen(r#""loraVersion":"1"}"#, r#""loraVersion":"2"}"#, 1);
        assert!(compare("json", &other_version, together).is_err(), "chunks of another version are not merged");
    }

    #[test]
    fn server_sent_completion_chunks_compare_merged_whatever_their_split() {
        let event = |created: u32, choice: &str| {
            format!(r#"data: {{"id":"cmpl-lg-00000000-1","created":{created},"model":"woof","choices":[{choice}]}}"#)
        };
        let chunk = |text: &str, token: u32| {
            format!(r#"{{"index":0,"text":"{text}","finish_reason":null,"token_ids":[{token}]}}"#)
        };
        let end = r#"{"index":0,"text":"","finish_reason":"length","token_ids":[]}"#;
        let one_by_one = [event(1, &chunk(" ", 32)), event(1, &chunk("w", 119)), event(2, &chunk("o", 111))]
            .into_iter()
            .chain([event(2, end), "data: [DONE]".to_owned()])
            .collect::<Vec<_>>()
            .join("\n\n");
        let together = [
            event(3, &chunk(" ", 32)),
            event(3, r#"{"index":0,"text":"wo","finish_reason":null,"token_ids":[119,111]}"#),
        ]
        .into_iter()
        .chain([event(3, end), "data: [DONE]".to_owned()])
        .collect::<Vec<_>>()
        .join("\n\n");
        assert!(compare("text", &one_by_one, &together).is_ok(), "{one_by_one}\n{together}");
        assert!(compare("text", &one_by_one, &together.replace("111]", "112]")).is_err(), "tokens still compared");
        assert!(compare("text", &one_by_one, &together.replace("\"wo\"", "\"wx\"")).is_err(), "text still compared");
        let chat = |content: &str| {
            format!(
                r#"data: {{"id":"chatcmpl-lg-00000000-1","created":1,"choices":[{{"index":0,"delta":{{"content":"{content}"}},"finish_reason":null}}]}}"#
            )
        };
        assert!(compare("text", &[chat("a"), chat("b")].join("\n\n"), &chat("ab")).is_ok(), "chat deltas merge");
        let other_model = one_by_one.replacen(r#""model":"woof""#, r#""model":"meow""#, 1);
        assert!(compare("text", &other_model, &together).is_err(), "chunks that differ otherwise are not merged");
    }
}
