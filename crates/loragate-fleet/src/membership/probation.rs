//! How a worker's failures decide when it is probed and when it may get traffic again (SMG-registry style):
//!
//! - every failure (a failed health check, a failed catch-up; a failed stream triggers a check at once) takes the
//!   worker out of traffic at once and counts one consecutive failure;
//! - below the threshold it is probed every health interval and rejoins on the first healthy answer;
//! - at the threshold and beyond, its probes back off exponentially (2, 4, 8… health intervals, capped), and it must
//!   pass `threshold` health checks in a row (its probation) before it rejoins: a flapping worker gets no traffic
//!   between its failures;
//! - the count resets once the worker, serving again, passed `threshold` checks in a row.

use std::time::{Duration, SystemTime};

use tokio::time::Instant;

/// The fleet's failure policy.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FailurePolicy {
    /// Failures in a row that start the back-off and the probation.
    pub(crate) threshold: u32,
    /// The regular health-check interval.
    pub(crate) interval: Duration,
    /// The longest back-off between two probes.
    pub(crate) max_backoff: Duration,
}

/// What a healthy answer means for a worker that is not serving.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// It may catch up and rejoin.
    Rejoin,
    /// It stays out: its probation is not over.
    Probation,
}

/// One worker's failure record.
#[derive(Clone, Debug, Default)]
pub(crate) struct FailureRecord {
    consecutive_failures: u32,
    consecutive_successes: u32,
    next_probe: Option<(Instant, SystemTime)>,
}

impl FailureRecord {
    /// Failures in a row.
    pub(crate) fn consecutive_failures(&self) -> u32 {
        self.consecutive_failures
    }

    /// When a back-off delays the next probe, if one does.
    pub(crate) fn next_probe(&self) -> Option<SystemTime> {
        self.next_probe.map(|(_, wall)| wall)
    }

    /// Whether a regular round may probe it now.
    pub(crate) fn due(&self, now: Instant) -> bool {
        self.next_probe.is_none_or(|(at, _)| now >= at)
    }

    /// Counts a failure at `now`; past the threshold the next probe backs off.
    pub(crate) fn failed(&mut self, policy: &FailurePolicy, now: Instant) {
        self.consecutive_failures = self.consecutive_failures.saturating_add(1);
        self.consecutive_successes = 0;
        self.next_probe = (self.consecutive_failures >= policy.threshold).then(|| {
            let doublings = (self.consecutive_failures - policy.threshold + 1).min(20);
            let delay = policy.interval.saturating_mul(1 << doublings).min(policy.max_backoff.max(policy.interval));
            (now + delay, SystemTime::now() + delay)
        });
    }

    /// Counts a healthy answer of a worker that is serving (READY or DRAINING): enough in a row clear its record.
    pub(crate) fn serving_check_passed(&mut self, policy: &FailurePolicy) {
        self.consecutive_successes = self.consecutive_successes.saturating_add(1);
        self.next_probe = None;
        if self.consecutive_successes >= policy.threshold {
            self.consecutive_failures = 0;
        }
    }

    /// Counts a healthy answer of a worker that is not serving, and says whether it may rejoin (its checks while
    /// serving are counted afresh from then on).
    pub(crate) fn idle_check_passed(&mut self, policy: &FailurePolicy) -> Verdict {
        self.consecutive_successes = self.consecutive_successes.saturating_add(1);
        self.next_probe = None;
        if self.consecutive_failures < policy.threshold || self.consecutive_successes >= policy.threshold {
            self.consecutive_successes = 0;
            Verdict::Rejoin
        } else {
            Verdict::Probation
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> FailurePolicy {
        FailurePolicy { threshold: 3, interval: Duration::from_secs(1), max_backoff: Duration::from_secs(10) }
    }

    #[test]
    fn below_the_threshold_a_worker_is_probed_every_interval_and_rejoins_at_once() {
        let (policy, now) = (policy(), Instant::now());
        let mut record = FailureRecord::default();
        record.failed(&policy, now);
        record.failed(&policy, now);
        assert_eq!((record.consecutive_failures(), record.next_probe()), (2, None));
        assert!(record.due(now));
        assert_eq!(record.idle_check_passed(&policy), Verdict::Rejoin);
    }

    #[test]
    fn at_the_threshold_probes_back_off_exponentially_up_to_the_cap() {
        let (policy, now) = (policy(), Instant::now());
        let mut record = FailureRecord::default();
        let mut delays = Vec::new();
        for _ in 0..7 {
            record.failed(&policy, now);
            delays.push(record.next_probe.map(|(at, _)| at - now));
        }
        let secs = |s| Some(Duration::from_secs(s));
        assert_eq!(delays, [None, None, secs(2), secs(4), secs(8), secs(10), secs(10)]);
        assert!(!record.due(now) && record.due(now + Duration::from_secs(10)));
        assert!(record.next_probe().is_some(), "ListWorkers shows when");
    }

    #[test]
    fn a_flapping_worker_serves_again_only_after_its_probation() {
        let (policy, now) = (policy(), Instant::now());
        let mut record = FailureRecord::default();
        for _ in 0..3 {
            record.failed(&policy, now);
        }
        assert_eq!(record.idle_check_passed(&policy), Verdict::Probation);
        assert_eq!(record.idle_check_passed(&policy), Verdict::Probation);
        record.failed(&policy, now);
        assert_eq!(record.consecutive_failures(), 4, "a failure during probation starts it over");
        for _ in 0..2 {
            assert_eq!(record.idle_check_passed(&policy), Verdict::Probation);
        }
        assert_eq!(record.idle_check_passed(&policy), Verdict::Rejoin, "three checks in a row");
        assert_eq!(record.consecutive_failures(), 4, "rejoining does not clear the record");
        record.serving_check_passed(&policy);
        record.serving_check_passed(&policy);
        assert_eq!(record.consecutive_failures(), 4);
        record.serving_check_passed(&policy);
        assert_eq!(record.consecutive_failures(), 0, "three checks in a row while serving clear it");
    }
}
