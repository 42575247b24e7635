//! The `grpc-timeout` request header: the client's deadline, which bounds how long a request may wait at the gate.

use std::time::Duration;

use tokio::time::Instant;

/// The header's name.
pub(crate) const GRPC_TIMEOUT_HEADER: &str = "grpc-timeout";

/// Parses a `grpc-timeout` value (`<up to 8 digits><unit>`, unit one of `H M S m u n`). Malformed values give
/// `None`, as if the client had set no deadline.
pub(crate) fn parse_grpc_timeout(value: &str) -> Option<Duration> {
    let split = value.len().checked_sub(1)?;
    let (digits, unit) = value.split_at(split);
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let amount: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(amount * 3600),
        "M" => Duration::from_secs(amount * 60),
        "S" => Duration::from_secs(amount),
        "m" => Duration::from_millis(amount),
        "u" => Duration::from_micros(amount),
        "n" => Duration::from_nanos(amount),
        _ => return None,
    })
}

/// When a request held at a gate must give up, given the client's `grpc-timeout`: a little before the client's
/// own deadline (10% of it, at most 100 ms), so that the gate's `UNAVAILABLE` naming the adapter reaches the client
/// instead of a bare deadline error.
pub(crate) fn gate_deadline_for(timeout: Duration) -> Option<Instant> {
    let margin = (timeout / 10).min(Duration::from_millis(100));
    Instant::now().checked_add(timeout - margin)
}

/// The gate deadline (see [`gate_deadline_for`]) from a request's headers, if the client set a timeout.
pub(crate) fn client_deadline(headers: &http::HeaderMap) -> Option<Instant> {
    let timeout = headers.get(GRPC_TIMEOUT_HEADER)?.to_str().ok().and_then(parse_grpc_timeout)?;
    gate_deadline_for(timeout)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_unit_parses_and_garbage_is_ignored() {
        assert_eq!(parse_grpc_timeout("2H"), Some(Duration::from_secs(7200)));
        assert_eq!(parse_grpc_timeout("3M"), Some(Duration::from_secs(180)));
        assert_eq!(parse_grpc_timeout("5S"), Some(Duration::from_secs(5)));
        assert_eq!(parse_grpc_timeout("250m"), Some(Duration::from_millis(250)));
        assert_eq!(parse_grpc_timeout("7u"), Some(Duration::from_micros(7)));
        assert_eq!(parse_grpc_timeout("9n"), Some(Duration::from_nanos(9)));
        for bad in ["", "S", "5", "5s", "123456789S", "-1S", "1.5S"] {
            assert_eq!(parse_grpc_timeout(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_gate_gives_up_shortly_before_the_client_does() {
        let now = Instant::now();
        let short = gate_deadline_for(Duration::from_millis(200)).expect("deadline") - now;
        assert!(short >= Duration::from_millis(175) && short <= Duration::from_millis(185), "{short:?}");
        let long = gate_deadline_for(Duration::from_secs(60)).expect("deadline") - now;
        assert!(long >= Duration::from_millis(59_895) && long <= Duration::from_millis(59_905), "{long:?}");
    }
}
