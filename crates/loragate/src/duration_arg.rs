//! Durations on the command line: `120s`, `2m`, `500ms`, `1h`, or a bare number of seconds (`1.5`).

use std::time::Duration;

/// Parses a command-line duration.
pub fn parse_duration(raw: &str) -> Result<Duration, String> {
    let raw = raw.trim();
    let split = raw.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(raw.len());
    let (number, unit) = raw.split_at(split);
    let value: f64 = number.parse().map_err(|_| format!("{raw:?} is not a duration (try 30s, 2m, 500ms)"))?;
    let seconds = match unit.trim() {
        "" | "s" => value,
        "ms" => value / 1000.0,
        "m" | "min" => value * 60.0,
        "h" => value * 3600.0,
        other => return Err(format!("unknown unit {other:?} in {raw:?} (use ms, s, m or h)")),
    };
    Duration::try_from_secs_f64(seconds).map_err(|err| format!("{raw:?}: {err}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_and_bare_seconds_parse() {
        assert_eq!(parse_duration("120s"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
        for bad in ["", "s", "fast", "5 fortnights", "-1s"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }
}
