//! The versions of one adapter that requests may be served by: the current one and up to `--retain-versions − 1`
//! older ones kept loaded for exact pins (`NAME@V`), with the pins running requests hold on them.
//!
//! Installing a version beyond the count drops the oldest from the servable set: the engine releases it at once if
//! no request is pinned to it, else when its last pin goes — so a pinned request never loses its weights. Only the
//! adapter's actor installs; pins are taken by the actor at admission and dropped by whoever ends the request.

use std::collections::{BTreeSet, HashMap};

use crate::contract::{AdapterVersion, VersionInfo};
use crate::state::RecordedSource;

/// One servable version: what listings show, and where its weights are (for the record a restart reads).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Servable {
    /// The version, its identity and origin.
    pub(crate) info: VersionInfo,
    /// Its weights' source, as recorded.
    pub(crate) source: RecordedSource,
}

/// Why a version cannot be pinned now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum PinRefused {
    /// It is newer than the current version: wait for it.
    NotYet,
    /// It is older than the current version and no longer servable; these are.
    Released(Vec<AdapterVersion>),
}

/// The servable versions of one adapter and the pins on them.
#[derive(Debug)]
pub(crate) struct RetainedVersions {
    /// How many versions are kept servable (at least 1: the current one).
    retain: usize,
    /// The servable versions, oldest first; the last one is current.
    servable: Vec<Servable>,
    /// Pins held per version.
    pins: HashMap<AdapterVersion, u32>,
    /// Versions no longer servable whose release waits for their last pin.
    draining: BTreeSet<AdapterVersion>,
}

impl RetainedVersions {
    /// An empty set that keeps `retain` versions servable (at least one).
    pub(crate) fn new(retain: usize) -> Self {
        Self { retain: retain.max(1), servable: Vec::new(), pins: HashMap::new(), draining: BTreeSet::new() }
    }

    /// Makes `info` the current version (unless a newer one is current: then it is kept servable only if the count
    /// allows). Returns the versions the engine may release now; those still pinned are released at their last unpin.
    pub(crate) fn install(&mut self, servable: Servable) -> Vec<AdapterVersion> {
        let version = servable.info.version;
        let position = self.servable.partition_point(|held| held.info.version < version);
        match self.servable.get(position) {
            Some(held) if held.info.version == version => self.servable[position] = servable,
            _ => self.servable.insert(position, servable),
        }
        let excess = self.servable.len().saturating_sub(self.retain);
        let dropped: Vec<AdapterVersion> = self.servable.drain(..excess).map(|held| held.info.version).collect();
        let mut release_now = Vec::new();
        for version in dropped {
            if self.pins.contains_key(&version) {
                self.draining.insert(version);
            } else {
                release_now.push(version);
            }
        }
        release_now
    }

    /// Pins `version` for one request: it stays loaded until the pin goes.
    pub(crate) fn pin(&mut self, version: AdapterVersion) -> Result<(), PinRefused> {
        if self.servable.iter().any(|held| held.info.version == version) {
            *self.pins.entry(version).or_default() += 1;
            return Ok(());
        }
        match self.current() {
            Some(current) if current.info.version >= version => Err(PinRefused::Released(self.versions())),
            _ => Err(PinRefused::NotYet),
        }
    }

    /// Drops one pin of `version`; answers the version if it may be released now (its last pin went and it is no
    /// longer servable).
    pub(crate) fn unpin(&mut self, version: AdapterVersion) -> Option<AdapterVersion> {
        let pins = self.pins.get_mut(&version)?;
        *pins -= 1;
        if *pins > 0 {
            return None;
        }
        self.pins.remove(&version);
        self.draining.remove(&version).then_some(version)
    }

    /// The current version, if any was installed.
    pub(crate) fn current(&self) -> Option<&Servable> {
        self.servable.last()
    }

    /// The servable versions, oldest first.
    pub(crate) fn servable(&self) -> &[Servable] {
        &self.servable
    }

    /// The numbers of the servable versions, oldest first.
    pub(crate) fn versions(&self) -> Vec<AdapterVersion> {
        self.servable.iter().map(|held| held.info.version).collect()
    }

    /// Every version the engine may still hold weights of: the servable ones and those draining.
    #[cfg(test)]
    pub(crate) fn held(&self) -> BTreeSet<AdapterVersion> {
        self.servable.iter().map(|held| held.info.version).chain(self.draining.iter().copied()).collect()
    }
}

#[cfg(test)]
mod tests {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;
    use crate::contract::VersionOrigin;

    fn info(version: u64) -> Servable {
        let info =
            VersionInfo { version: AdapterVersion(version), sha256: None, bytes: None, origin: VersionOrigin::Push };
        Servable { info, source: RecordedSource::default() }
    }

    #[test]
    fn the_oldest_beyond_the_count_is_released_at_once_unless_pinned() {
        let mut versions = RetainedVersions::new(2);
        assert_eq!(versions.install(info(1)), vec![]);
        assert_eq!(versions.install(info(2)), vec![]);
        versions.pin(AdapterVersion(1)).expect("servable");
        assert_eq!(versions.install(info(3)), vec![], "pinned: released at its last unpin");
        assert_eq!(
            versions.pin(AdapterVersion(1)),
            Err(PinRefused::Released(vec![AdapterVersion(2), AdapterVersion(3)]))
        );
        assert_eq!(versions.unpin(AdapterVersion(1)), Some(AdapterVersion(1)));
        assert_eq!(versions.install(info(4)), vec![AdapterVersion(2)]);
        assert_eq!(versions.pin(AdapterVersion(5)), Err(PinRefused::NotYet));
        assert_eq!(versions.current().map(|held| held.info.version), Some(AdapterVersion(4)));
    }

    #[test]
    fn a_late_older_install_is_servable_only_within_the_count() {
        let mut versions = RetainedVersions::new(1);
        assert_eq!(versions.install(info(3)), vec![]);
        assert_eq!(versions.install(info(2)), vec![AdapterVersion(2)], "older than current, beyond the count");
        assert_eq!(versions.versions(), vec![AdapterVersion(3)]);
    }

    /// Over random installs, pins and unpins: every version the engine was told to release is held by no pin, is
    /// released once, and every installed version is either held or released — nothing leaks.
    #[test]
    fn random_interleavings_release_each_version_once_and_never_while_pinned() {
        for seed in 0..200 {
            let mut rng = StdRng::seed_from_u64(seed);
            let mut versions = RetainedVersions::new(rng.random_range(1..4));
            let (mut next, mut pins, mut released) = (1u64, Vec::new(), BTreeSet::new());
            for _ in 0..60 {
                let mut now = match rng.random_range(0..3) {
                    0 => {
                        next += 1;
                        versions.install(info(next - 1))
                    }
                    1 => {
                        let wanted = AdapterVersion(rng.random_range(1..=next));
                        if versions.pin(wanted).is_ok() {
                            pins.push(wanted);
                        }
                        Vec::new()
                    }
                    _ if !pins.is_empty() => {
                        let pin = pins.swap_remove(rng.random_range(0..pins.len()));
                        versions.unpin(pin).into_iter().collect()
                    }
                    _ => Vec::new(),
                };
                for version in now.drain(..) {
                    assert!(!pins.contains(&version), "seed {seed}: {version} released while pinned");
                    assert!(released.insert(version), "seed {seed}: {version} released twice");
                }
            }
            for pin in pins.drain(..) {
                released.extend(versions.unpin(pin));
            }
            let held = versions.held();
            for version in (1..next).map(AdapterVersion) {
                assert!(held.contains(&version) ^ released.contains(&version), "seed {seed}: {version} leaked");
            }
        }
    }
}
