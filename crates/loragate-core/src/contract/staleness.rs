//! The words of a staleness bound: the policy a trainer sets on an adapter (`SetLoraStaleness`) and where it stands.

use super::error::{CoreError, Field};

/// The largest `max_staleness` or `batch_size` accepted: far beyond any real training setup, small enough that the
/// bound's arithmetic never overflows.
pub const MAX_STALENESS_VALUE: u32 = 1_000_000;

/// A staleness bound (AReaL's admission rule, per adapter, on the server): with the policy set at version `v0` and
/// the adapter now at version `v`, a request of `n` sequences is admitted only while
/// `started + n ≤ (max_staleness + (v − v0) + 1) × batch_size`, where `started` counts the sequences admitted since
/// the policy was set. A trainer that consumes `batch_size` sequences per version never receives one more than
/// `max_staleness` versions old.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StalenessPolicy {
    /// How many versions older than the newest a consumed sequence may be.
    pub max_staleness: u32,
    /// How many sequences the trainer consumes per version (at least 1).
    pub batch_size: u32,
}

impl StalenessPolicy {
    /// Parses the wire fields; `batch_size` 0 means "no bound" (`None`). Values over [`MAX_STALENESS_VALUE`] are
    /// refused naming their field.
    pub fn parse(max_staleness: u32, batch_size: u32) -> Result<Option<Self>, CoreError> {
        for (value, field) in [(max_staleness, Field::MaxStaleness), (batch_size, Field::BatchSize)] {
            if value > MAX_STALENESS_VALUE {
                return Err(CoreError::invalid(field, format!("is {value}, the limit is {MAX_STALENESS_VALUE}")));
            }
        }
        Ok((batch_size > 0).then_some(Self { max_staleness, batch_size }))
    }

    /// How many sequences may have started, `versions_since` versions after the policy was set.
    pub fn capacity(&self, versions_since: u64) -> u64 {
        let steps = u64::from(self.max_staleness).saturating_add(versions_since).saturating_add(1);
        steps.saturating_mul(u64::from(self.batch_size))
    }
}

/// Where an adapter's staleness bound stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StalenessStatus {
    /// The policy.
    pub policy: StalenessPolicy,
    /// Sequences admitted since the policy was set (minus those that ended aborted: their continuations count again).
    pub started: u64,
    /// How many may have started by now.
    pub capacity: u64,
    /// Sampling requests held at the bound.
    pub held: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_size_zero_clears_and_huge_values_name_their_field() {
        assert_eq!(StalenessPolicy::parse(2, 0).ok(), Some(None));
        let policy = StalenessPolicy::parse(2, 4).expect("valid").expect("set");
        assert_eq!((policy.capacity(0), policy.capacity(3)), (12, 24));
        for (max, batch, field) in [(MAX_STALENESS_VALUE + 1, 1, Field::MaxStaleness), (0, u32::MAX, Field::BatchSize)]
        {
            match StalenessPolicy::parse(max, batch) {
                Err(CoreError::InvalidArgument { field: got, .. }) => assert_eq!(got, field),
                other => panic!("expected {field} to be refused, got {other:?}"),
            }
        }
        let widest = StalenessPolicy { max_staleness: MAX_STALENESS_VALUE, batch_size: MAX_STALENESS_VALUE };
        assert!(widest.capacity(u64::MAX) > 0, "saturates rather than overflowing");
    }
}
