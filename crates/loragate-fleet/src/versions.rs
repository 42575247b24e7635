//! Which version of each adapter new requests get, and how many running requests are pinned to each version.
//!
//! A request pins the version it runs on when it starts ([`Versions::pin`]: its exact pin `NAME@V`, or the newest
//! installed) and holds the [`Pin`] until its last sequence ended. Installed versions stay servable until the
//! coordinator releases them (`--retain-versions`, [`Versions::release`]); a released version is unloaded from the
//! workers as soon as its pin count reaches zero (a count, not a timer): at once if nothing runs on it, else when the
//! last pinned request ends. Reading the installed versions and pinning happen under one lock with releasing, so a
//! request can never pin a version whose unload has begun.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use loragate_core::{AdapterKey, AdapterName, AdapterVersion, EngineError};
use parking_lot::Mutex;

use crate::address::versioned_name;

#[derive(Default)]
struct Table {
    /// The servable versions of each adapter: the newest serves unpinned requests, older ones serve exact pins.
    installed: HashMap<AdapterName, BTreeSet<AdapterVersion>>,
    pinned: HashMap<(AdapterName, AdapterVersion), Pinned>,
}

struct Pinned {
    count: usize,
    retired: bool,
}

/// Called with the engine-side name of a retired version whose last pin went.
pub(crate) type OnDrained = Box<dyn Fn(String) + Send + Sync>;

/// The installed versions and the pins on them.
pub(crate) struct Versions {
    table: Mutex<Table>,
    on_drained: OnDrained,
}

impl Versions {
    /// A table that hands every retired version whose last pin went to `on_drained` (which unloads it).
    pub(crate) fn new(on_drained: OnDrained) -> Arc<Self> {
        Arc::new(Self { table: Mutex::default(), on_drained })
    }

    /// Pins the version of `key` a request runs on: `exact` if it asked for one (`NAME@V`), else the newest
    /// installed (the base model needs no pin).
    pub(crate) fn pin(self: &Arc<Self>, key: &AdapterKey, exact: Option<AdapterVersion>) -> Result<Pin, EngineError> {
        let AdapterKey::Lora(name) = key else {
            return Ok(Pin {
                versions: self.clone(),
                pinned: None,
                engine_name: String::new(),
                version: AdapterVersion::BASE,
            });
        };
        let mut table = self.table.lock();
        let installed = table.installed.get(name);
        let version = match exact {
            Some(exact) => installed.and_then(|held| held.get(&exact)),
            None => installed.and_then(|held| held.last()),
        };
        let version = *version.ok_or_else(|| EngineError::AdapterNotLoaded(name.clone()))?;
        table.pinned.entry((name.clone(), version)).or_insert(Pinned { count: 0, retired: false }).count += 1;
        Ok(Pin {
            versions: self.clone(),
            engine_name: versioned_name(name, version),
            pinned: Some((name.clone(), version)),
            version,
        })
    }

    /// Makes `version` of `name` servable: the one new unpinned requests get unless a newer one is installed, and
    /// one exact pins may ask for until it is released ([`Versions::release`]).
    pub(crate) fn install(&self, name: &AdapterName, version: AdapterVersion) {
        self.table.lock().installed.entry(name.clone()).or_default().insert(version);
    }

    /// Stops serving exactly `version` of `name` unless it is the newest installed. Returns its engine-side name if
    /// nothing is pinned to it (retire it now); a pinned one is retired when its last pin goes.
    pub(crate) fn release(&self, name: &AdapterName, version: AdapterVersion) -> Option<String> {
        let mut table = self.table.lock();
        let held = table.installed.get_mut(name)?;
        if held.last() == Some(&version) || !held.remove(&version) {
            return None;
        }
        retire(&mut table, name, version)
    }

    /// Stops serving versions `up_to` and older of `name` (if the newest is among them, new requests get
    /// `AdapterNotLoaded`). Returns the engine-side names of those versions nothing is pinned to (retire them now);
    /// pinned ones are retired when their last pin goes. Newer versions stay.
    pub(crate) fn remove(&self, name: &AdapterName, up_to: AdapterVersion) -> Vec<String> {
        let mut table = self.table.lock();
        let mut versions: Vec<AdapterVersion> = table
            .pinned
            .keys()
            .filter(|(pinned, version)| pinned == name && *version <= up_to)
            .map(|(_, version)| *version)
            .collect();
        if let Some(held) = table.installed.get_mut(name) {
            let kept = held.split_off(&up_to.next());
            versions.extend(std::mem::replace(held, kept));
            if held.is_empty() {
                table.installed.remove(name);
            }
        }
        versions.sort_unstable();
        versions.dedup();
        versions.into_iter().filter_map(|version| retire(&mut table, name, version)).collect()
    }

    fn unpin(&self, name: AdapterName, version: AdapterVersion, engine_name: String) {
        let mut table = self.table.lock();
        let key = (name, version);
        let Some(pinned) = table.pinned.get_mut(&key) else { return };
        pinned.count -= 1;
        if pinned.count == 0 {
            let retired = pinned.retired;
            table.pinned.remove(&key);
            drop(table);
            if retired {
                (self.on_drained)(engine_name);
            }
        }
    }
}

/// Marks `version` of `name` retired; answers its engine-side name if it can be unloaded now.
fn retire(table: &mut Table, name: &AdapterName, version: AdapterVersion) -> Option<String> {
    match table.pinned.get_mut(&(name.clone(), version)) {
        Some(pinned) => {
            pinned.retired = true;
            None
        }
        None => Some(versioned_name(name, version)),
    }
}

/// A running request's hold on its adapter version. Dropping the last pin of a retired version unloads it.
pub(crate) struct Pin {
    versions: Arc<Versions>,
    pinned: Option<(AdapterName, AdapterVersion)>,
    engine_name: String,
    version: AdapterVersion,
}

impl Pin {
    /// The name the workers hold this version under (`NAME@V`; empty for the base model).
    pub(crate) fn engine_name(&self) -> &str {
        &self.engine_name
    }

    /// The version every token of the request is stamped with.
    pub(crate) fn version(&self) -> AdapterVersion {
        self.version
    }
}

impl Drop for Pin {
    fn drop(&mut self) {
        if let Some((name, version)) = self.pinned.take() {
            self.versions.unpin(name, version, std::mem::take(&mut self.engine_name));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> (Arc<Versions>, Arc<Mutex<Vec<String>>>) {
        let drained = Arc::new(Mutex::new(Vec::new()));
        let seen = drained.clone();
        (Versions::new(Box::new(move |name| seen.lock().push(name))), drained)
    }

    fn meow() -> AdapterKey {
        AdapterKey::Lora(AdapterName::parse("meow").expect("name"))
    }

    #[test]
    fn a_released_version_is_retired_when_its_last_pin_goes_and_not_before() {
        let (versions, drained) = table();
        let name = AdapterName::parse("meow").expect("name");
        assert!(matches!(versions.pin(&meow(), None), Err(EngineError::AdapterNotLoaded(_))));
        versions.install(&name, AdapterVersion(1));
        let first = versions.pin(&meow(), None).expect("pin v1");
        let second = versions.pin(&meow(), Some(AdapterVersion(1))).expect("pin v1 exactly");
        assert_eq!((first.engine_name(), first.version()), ("meow@1", AdapterVersion(1)));

        versions.install(&name, AdapterVersion(2));
        let newer = versions.pin(&meow(), None).expect("pin v2");
        assert_eq!(newer.engine_name(), "meow@2", "new requests get the new version");
        let older = versions.pin(&meow(), Some(AdapterVersion(1))).expect("v1 serves pins until released");
        drop(older);
        assert_eq!(versions.release(&name, AdapterVersion(1)), None, "v1 is pinned");
        assert!(matches!(versions.pin(&meow(), Some(AdapterVersion(1))), Err(EngineError::AdapterNotLoaded(_))));
        drop(first);
        assert!(drained.lock().is_empty(), "one request still runs on v1");
        drop(second);
        assert_eq!(*drained.lock(), vec!["meow@1".to_owned()], "the last pin unloads v1");

        drop(newer);
        assert_eq!(drained.lock().len(), 1, "v2 is installed: its pins going retires nothing");
        assert_eq!(versions.release(&name, AdapterVersion(2)), None, "the newest is never released");
        versions.install(&name, AdapterVersion(3));
        assert_eq!(versions.release(&name, AdapterVersion(2)), Some("meow@2".to_owned()), "unpinned: retired now");
        assert_eq!(versions.pin(&meow(), None).expect("pin").engine_name(), "meow@3");
    }

    #[test]
    fn removing_an_adapter_retires_every_version_as_it_drains() {
        let (versions, drained) = table();
        let name = AdapterName::parse("meow").expect("name");
        versions.install(&name, AdapterVersion(1));
        let old = versions.pin(&meow(), None).expect("pin v1");
        versions.install(&name, AdapterVersion(2));
        let current = versions.pin(&meow(), None).expect("pin v2");
        assert!(versions.remove(&name, AdapterVersion(2)).is_empty(), "both versions are pinned");
        assert!(matches!(versions.pin(&meow(), None), Err(EngineError::AdapterNotLoaded(_))));
        drop(current);
        drop(old);
        let mut names = drained.lock().clone();
        names.sort();
        assert_eq!(names, vec!["meow@1".to_owned(), "meow@2".to_owned()]);

        versions.install(&name, AdapterVersion(3));
        versions.install(&name, AdapterVersion(4));
        assert_eq!(versions.remove(&name, AdapterVersion(3)), vec!["meow@3".to_owned()], "v4 is newer: it stays");
        assert_eq!(versions.pin(&meow(), None).expect("pin").engine_name(), "meow@4");
        assert_eq!(versions.remove(&name, AdapterVersion(4)), vec!["meow@4".to_owned()], "unpinned: retired at once");
    }

    #[test]
    fn the_base_model_needs_no_pin() {
        let (versions, _) = table();
        let pin = versions.pin(&AdapterKey::Base, None).expect("base");
        assert_eq!((pin.engine_name(), pin.version()), ("", AdapterVersion::BASE));
    }

    #[test]
    fn pins_and_releases_race_without_losing_a_retirement() {
        let (versions, drained) = table();
        let name = AdapterName::parse("meow").expect("name");
        versions.install(&name, AdapterVersion(1));
        let mut retired_now = Vec::new();
        std::thread::scope(|scope| {
            let pinners: Vec<_> = (0..4)
                .map(|_| {
                    let versions = versions.clone();
                    scope.spawn(move || {
                        for _ in 0..2_000 {
                            drop(versions.pin(&meow(), None).expect("some version is installed"));
                        }
                    })
                })
                .collect();
            for version in 2..=200 {
                versions.install(&name, AdapterVersion(version));
                retired_now.extend(versions.release(&name, AdapterVersion(version - 1)));
            }
            for pinner in pinners {
                pinner.join().expect("pinner");
            }
        });
        let mut every = drained.lock().clone();
        every.extend(retired_now);
        let retirements = every.len();
        every.sort();
        every.dedup();
        assert_eq!((every.len(), retirements), (199, 199), "each of v1..v199 retired exactly once");
    }
}
