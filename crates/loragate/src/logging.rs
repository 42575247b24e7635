//! Where logs go and how they look: on stderr (stdout carries only the ready line), filtered by `RUST_LOG` (default
//! `info`), as human-readable lines or, with `--log-format json`, one JSON object per line with the keys of
//! `tracing-subscriber`'s JSON format (`fields` with `message`, `level`, `target`, `timestamp`), for log pipelines.

use std::fmt;
use std::io::IsTerminal;

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::{FormatEvent, FormatFields, Writer};
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, MakeWriter};
use tracing_subscriber::registry::LookupSpan;

/// How log lines look (`--log-format`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines (coloured on a terminal).
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// Installs the process's logger, writing to stderr; `access_log` turns the access-log lines on (`--access-log`).
/// Call once, before anything logs.
pub fn init_logging(format: LogFormat, access_log: bool) {
    install(format, access_log, std::io::stderr, std::io::stderr().is_terminal());
}

/// The filter: `RUST_LOG` (`info` when unset), with the access log on or off whatever `RUST_LOG` says of it.
fn filter(access_log: bool) -> EnvFilter {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let level = if access_log { "info" } else { "off" };
    match format!("{}={level}", loragate_net::ACCESS_LOG_TARGET).parse() {
        Ok(directive) => filter.add_directive(directive),
        Err(_) => filter,
    }
}

fn install<W>(format: LogFormat, access_log: bool, writer: W, ansi: bool)
where
    W: for<'writer> MakeWriter<'writer> + Send + Sync + 'static,
{
    let filter = filter(access_log);
    // A log line that cannot be written (stderr closed: a log collector gone, a reader that stopped reading) is
    // dropped. The default reports it with `eprintln!` to the same closed stderr, which panics: the server would die
    // of its logs.
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(writer).log_internal_errors(false);
    match format {
        LogFormat::Text => builder.with_ansi(ansi).init(),
        LogFormat::Json => builder.with_ansi(false).event_format(JsonLines).init(),
    }
}

/// Formats each event as one JSON object on one line.
struct JsonLines;

impl<S, N> FormatEvent<S, N> for JsonLines
where
    S: Subscriber + for<'lookup> LookupSpan<'lookup>,
    N: for<'writer> FormatFields<'writer> + 'static,
{
    fn format_event(&self, _ctx: &FmtContext<'_, S, N>, mut writer: Writer<'_>, event: &Event<'_>) -> fmt::Result {
        writeln!(writer, "{}", json_line(event)?)
    }
}

/// The JSON object of one event.
fn json_line(event: &Event<'_>) -> Result<Value, fmt::Error> {
    let mut timestamp = String::new();
    SystemTime.format_time(&mut Writer::new(&mut timestamp))?;
    let mut fields = JsonFields(Map::new());
    event.record(&mut fields);
    let metadata = event.metadata();
    let mut line = Map::new();
    line.insert("timestamp".into(), Value::String(timestamp));
    line.insert("level".into(), Value::String(metadata.level().to_string()));
    line.insert("fields".into(), Value::Object(fields.0));
    line.insert("target".into(), Value::String(metadata.target().to_owned()));
    Ok(Value::Object(line))
}

/// Gathers an event's fields: numbers and booleans as JSON numbers and booleans, the rest as text.
struct JsonFields(Map<String, Value>);

impl Visit for JsonFields {
    fn record_f64(&mut self, field: &Field, value: f64) {
        let number =
            serde_json::Number::from_f64(value).map_or_else(|| Value::String(value.to_string()), Value::Number);
        self.0.insert(field.name().to_owned(), number);
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().to_owned(), Value::from(value));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().to_owned(), Value::from(value));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().to_owned(), Value::Bool(value));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), Value::String(value.to_owned()));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0.insert(field.name().to_owned(), Value::String(format!("{value:?}")));
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tracing_subscriber::layer::SubscriberExt;

    use super::*;

    /// Collects what the formatter writes.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("lock").extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn json_lines_are_one_object_per_event_with_typed_fields() {
        let captured = Captured::default();
        let sink = captured.clone();
        let layer = tracing_subscriber::fmt::layer().with_writer(move || sink.clone()).event_format(JsonLines);
        let subscriber = tracing_subscriber::registry().with(layer);
        tracing::subscriber::with_default(subscriber, || {
            let name = "meow";
            tracing::info!(adapter = %name, aborted = 3_usize, lease_s = 2.5, still_paused = false, "adapter paused");
            tracing::warn!("second \"line\"\nwith a newline");
        });
        let text = String::from_utf8(captured.0.lock().expect("lock").clone()).expect("utf-8");
        let lines: Vec<Value> =
            text.lines().map(|line| serde_json::from_str(line).expect("each line is one JSON object")).collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert_eq!(lines[0]["level"], "INFO");
        assert_eq!(lines[0]["target"], module_path!());
        let fields = &lines[0]["fields"];
        assert_eq!(fields["message"], "adapter paused");
        assert_eq!((fields["adapter"].as_str(), fields["aborted"].as_u64()), (Some("meow"), Some(3)));
        assert_eq!((fields["lease_s"].as_f64(), fields["still_paused"].as_bool()), (Some(2.5), Some(false)));
        assert!(lines[0]["timestamp"].as_str().is_some_and(|at| at.contains('T')), "{text}");
        assert_eq!(lines[1]["fields"]["message"], "second \"line\"\nwith a newline");
    }

    #[test]
    fn access_log_lines_are_written_only_with_the_flag() {
        for access_log in [false, true] {
            let captured = Captured::default();
            let sink = captured.clone();
            let layer = tracing_subscriber::fmt::layer().with_writer(move || sink.clone()).with_ansi(false);
            let subscriber = tracing_subscriber::registry().with(filter(access_log)).with(layer);
            tracing::subscriber::with_default(subscriber, || {
                tracing::info!(target: loragate_net::ACCESS_LOG_TARGET, path = "/v1/models", status = 200, "request");
            });
            let text = String::from_utf8(captured.0.lock().expect("lock").clone()).expect("utf-8");
            assert_eq!(text.contains("/v1/models"), access_log, "--access-log {access_log}: {text:?}");
        }
    }
}
