//! An adapter's staleness bound as the actor applies it: the policy, the version it was set at, and how many
//! sequences it admitted since (see [`StalenessPolicy`]).

use crate::contract::{AdapterVersion, StalenessPolicy};

/// A staleness policy in force on one adapter. Written by the adapter's actor (admissions) and by aborted requests
/// giving their places back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct StalenessBound {
    policy: StalenessPolicy,
    /// The adapter's version when the policy was set.
    since: AdapterVersion,
    /// Sequences admitted since (minus those given back).
    started: u64,
    /// Tells this setting of the policy from earlier ones, so a place is given back only to the setting that took it.
    generation: u64,
}

impl StalenessBound {
    /// The bound of `policy`, set now, at the adapter's version `current`.
    pub(crate) fn new(policy: StalenessPolicy, current: AdapterVersion, generation: u64) -> Self {
        Self { policy, since: current, started: 0, generation }
    }

    /// The policy.
    pub(crate) fn policy(&self) -> StalenessPolicy {
        self.policy
    }

    /// This setting's generation.
    pub(crate) fn generation(&self) -> u64 {
        self.generation
    }

    /// Sequences admitted since the policy was set.
    pub(crate) fn started(&self) -> u64 {
        self.started
    }

    /// How many sequences may have started at version `current`.
    pub(crate) fn capacity(&self, current: AdapterVersion) -> u64 {
        self.policy.capacity(current.0.saturating_sub(self.since.0))
    }

    /// Admits `sequences` more at version `current` if they fit: `started + sequences ≤ capacity`.
    pub(crate) fn try_start(&mut self, sequences: u32, current: AdapterVersion) -> bool {
        let started = self.started.saturating_add(u64::from(sequences));
        let fits = started <= self.capacity(current);
        if fits {
            self.started = started;
        }
        fits
    }

    /// Gives `sequences` places back (they ended aborted; their continuations, if any, start again).
    pub(crate) fn give_back(&mut self, sequences: u32) {
        self.started = self.started.saturating_sub(u64::from(sequences));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The boundary is exact: with max_staleness 1 and batch_size 4 set at version 3, eight sequences start at
    /// version 3 (in any split of `num_samples`), the ninth waits for version 4, which lets four more in.
    #[test]
    fn the_capacity_is_exact_at_the_boundary() {
        let policy = StalenessPolicy { max_staleness: 1, batch_size: 4 };
        let mut bound = StalenessBound::new(policy, AdapterVersion(3), 1);
        assert!(bound.try_start(3, AdapterVersion(3)));
        assert!(bound.try_start(5, AdapterVersion(3)));
        assert!(!bound.try_start(1, AdapterVersion(3)), "the ninth sequence waits");
        assert!(!bound.try_start(5, AdapterVersion(4)), "a request never fits in part");
        assert!(bound.try_start(4, AdapterVersion(4)));
        assert_eq!((bound.started(), bound.capacity(AdapterVersion(4))), (12, 12));
        bound.give_back(2);
        assert!(bound.try_start(2, AdapterVersion(4)), "aborted sequences' places are taken again");
        assert!(bound.try_start(0, AdapterVersion(4)), "nothing new always fits");
    }
}
