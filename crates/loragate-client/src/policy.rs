//! How persistent the client is: an overall deadline, backoff with jitter on transport errors, and a cap on
//! attempts that make no progress.

use std::time::Duration;

use rand::Rng;

/// Bounds on retrying one sample.
#[derive(Clone, Debug, PartialEq)]
pub struct RetryPolicy {
    /// The most a `sample` call may take, waits and retries included.
    pub deadline: Duration,
    /// Attempts in a row that were aborted without a single new token before giving up
    /// ([`crate::ClientError::NoProgress`]).
    pub max_attempts_without_progress: u32,
    /// The first backoff after a transport error; it doubles each time, up to `max_backoff`.
    pub initial_backoff: Duration,
    /// The longest backoff.
    pub max_backoff: Duration,
    /// Each backoff is scaled by a random factor in `1 ± jitter`.
    pub jitter: f64,
    /// The longest single `WaitLoraUnpaused` long-poll (it is repeated while the adapter stays paused).
    pub wait_poll: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            deadline: Duration::from_secs(600),
            max_attempts_without_progress: 8,
            initial_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_secs(5),
            jitter: 0.25,
            wait_poll: Duration::from_secs(30),
        }
    }
}

impl RetryPolicy {
    /// The backoff before retry number `retry` (0-based) after a transport error.
    pub fn backoff(&self, retry: u32) -> Duration {
        let exponential = self.initial_backoff.saturating_mul(2u32.saturating_pow(retry.min(30)));
        let capped = exponential.min(self.max_backoff);
        let jitter = self.jitter.clamp(0.0, 1.0);
        let factor = if jitter > 0.0 { rand::rng().random_range(1.0 - jitter..=1.0 + jitter) } else { 1.0 };
        capped.mul_f64(factor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap_within_the_jitter() {
        let policy = RetryPolicy {
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(1),
            jitter: 0.25,
            ..RetryPolicy::default()
        };
        for (retry, nominal_ms) in [(0, 100.0), (1, 200.0), (2, 400.0), (3, 800.0), (4, 1000.0), (20, 1000.0)] {
            for _ in 0..50 {
                let ms = policy.backoff(retry).as_secs_f64() * 1000.0;
                assert!(ms >= nominal_ms * 0.75 - 1e-6 && ms <= nominal_ms * 1.25 + 1e-6, "retry {retry}: {ms} ms");
            }
        }
        let exact = RetryPolicy { jitter: 0.0, ..policy };
        assert_eq!(exact.backoff(1), Duration::from_millis(200));
    }
}
