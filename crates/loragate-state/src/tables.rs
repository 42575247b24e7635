//! The database's tables and how each [`StateChange`] is applied to them inside one write transaction. Values are
//! JSON (readable with any redb tool; unknown fields are ignored, so a later version may add some).
//!
//! | table | key | value |
//! | --- | --- | --- |
//! | `adapters` | name | `{"path", "confined", "version", "declared_path", "sha256", "bytes", "pushed", "retained": [{"version", "path", "confined", "sha256", "bytes", "pushed"}], "staleness": {"max_staleness", "batch_size"}}` |
//! | `issued_versions` | name | the highest version ever issued for the name (kept after an unload) |
//! | `pauses` | (adapter, pause id) | `{"owner", "mode", "lease_expires_at_ms"}` (wall clock, ms since the epoch) |
//! | `meta` | `schema`, `last_pause_number`, `global_pause` | numbers (`global_pause`: 0 none, 1 abort, 2 wait, 3 keep) |
//! | `front_records` | (table, key) | a front's own document ([`FrontRecord`]; opaque here) |

use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use loragate_core::state::{
    AdapterRecord, FrontRecord, PauseRecord, RecordedSource, RecordedState, StateChange, StateError, VersionRecord,
};
use loragate_core::{AdapterName, AdapterVersion, Field, PauseId, PauseMode, Sha256, StalenessPolicy};
use redb::{ReadTransaction, ReadableTable, TableDefinition, WriteTransaction};
use serde::{Deserialize, Serialize};

pub(crate) const ADAPTERS: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("adapters");
pub(crate) const ISSUED: TableDefinition<'_, &str, u64> = TableDefinition::new("issued_versions");
pub(crate) const PAUSES: TableDefinition<'_, (&str, &str), &[u8]> = TableDefinition::new("pauses");
pub(crate) const META: TableDefinition<'_, &str, u64> = TableDefinition::new("meta");
pub(crate) const FRONT_RECORDS: TableDefinition<'_, (&str, &str), &str> = TableDefinition::new("front_records");

/// The layout this code writes; a file with another is refused rather than misread.
pub(crate) const SCHEMA: u64 = 1;
const SCHEMA_KEY: &str = "schema";
const LAST_PAUSE_KEY: &str = "last_pause_number";
const GLOBAL_PAUSE_KEY: &str = "global_pause";

#[derive(Serialize, Deserialize)]
struct StoredAdapter {
    #[serde(flatten)]
    source: StoredSource,
    version: u64,
    declared_path: Option<PathBuf>,
    /// Older versions still servable to exact pins (absent in files written before versions were retained).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    retained: Vec<StoredVersion>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    staleness: Option<StoredStaleness>,
}

/// Where a version's weights came from (the fields after `confined` are absent in older files).
#[derive(Serialize, Deserialize)]
struct StoredSource {
    path: PathBuf,
    confined: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    sha256: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pushed: bool,
}

#[derive(Serialize, Deserialize)]
struct StoredVersion {
    version: u64,
    #[serde(flatten)]
    source: StoredSource,
}

#[derive(Clone, Copy, Serialize, Deserialize)]
struct StoredStaleness {
    max_staleness: u32,
    batch_size: u32,
}

impl StoredSource {
    fn of(source: &RecordedSource) -> Self {
        Self {
            path: source.path.clone(),
            confined: source.confined,
            sha256: source.sha256.map(|sha| sha.to_hex()),
            bytes: source.bytes,
            pushed: source.pushed,
        }
    }

    fn recorded(self, what: &str) -> Result<RecordedSource, StateError> {
        let sha256 = self
            .sha256
            .map(|hex| Sha256::parse_hex(&hex, Field::Sha256).map_err(|err| damaged(what, err)))
            .transpose()?;
        Ok(RecordedSource {
            path: self.path,
            confined: self.confined,
            sha256,
            bytes: self.bytes,
            pushed: self.pushed,
            holder: None,
        })
    }
}

impl StoredStaleness {
    fn of(policy: StalenessPolicy) -> Self {
        Self { max_staleness: policy.max_staleness, batch_size: policy.batch_size }
    }

    fn policy(self) -> StalenessPolicy {
        StalenessPolicy { max_staleness: self.max_staleness, batch_size: self.batch_size }
    }
}

#[derive(Serialize, Deserialize)]
struct StoredPause {
    owner: String,
    mode: String,
    lease_expires_at_ms: Option<u64>,
}

fn failed(what: impl std::fmt::Display) -> StateError {
    StateError::Failed(what.to_string())
}

/// Creates the tables of a new file and checks the schema of an existing one.
pub(crate) fn prepare(txn: &WriteTransaction) -> Result<(), StateError> {
    txn.open_table(ADAPTERS).map_err(failed)?;
    txn.open_table(ISSUED).map_err(failed)?;
    txn.open_table(PAUSES).map_err(failed)?;
    txn.open_table(FRONT_RECORDS).map_err(failed)?;
    let mut meta = txn.open_table(META).map_err(failed)?;
    let schema = meta.get(SCHEMA_KEY).map_err(failed)?.map(|value| value.value());
    match schema {
        None => {
            meta.insert(SCHEMA_KEY, SCHEMA).map_err(failed)?;
        }
        Some(SCHEMA) => {}
        Some(other) => {
            return Err(failed(format!("the file has layout {other}; this loragate reads layout {SCHEMA}")));
        }
    }
    Ok(())
}

/// Applies one change.
pub(crate) fn apply(txn: &WriteTransaction, change: &StateChange) -> Result<(), StateError> {
    match change {
        StateChange::Installed { name, version, source, retained } => {
            let mut adapters = txn.open_table(ADAPTERS).map_err(failed)?;
            let (declared_path, staleness) = match adapters.get(name.as_str()).map_err(failed)? {
                Some(old) => {
                    let old = parse_adapter(name.as_str(), old.value())?;
                    (old.declared_path, old.staleness)
                }
                None => (None, None),
            };
            let retained = retained
                .iter()
                .map(|older| StoredVersion { version: older.version.0, source: StoredSource::of(&older.source) })
                .collect();
            let stored = StoredAdapter {
                source: StoredSource::of(source),
                version: version.0,
                declared_path,
                retained,
                staleness,
            };
            adapters.insert(name.as_str(), json(&stored)?.as_slice()).map_err(failed)?;
        }
        StateChange::Staleness { name, policy } => {
            update_adapter(txn, name, |stored| stored.staleness = policy.map(StoredStaleness::of))?;
        }
        StateChange::Declared { name, path } => {
            update_adapter(txn, name, |stored| stored.declared_path = Some(path.clone()))?;
        }
        StateChange::Unloaded { name } => remove_adapter(txn, name)?,
        StateChange::VersionReturned { name, version } => {
            let mut issued = txn.open_table(ISSUED).map_err(failed)?;
            let current = issued.get(name.as_str()).map_err(failed)?.map(|value| value.value());
            if current == Some(version.0) {
                issued.insert(name.as_str(), version.0.saturating_sub(1)).map_err(failed)?;
            }
        }
        StateChange::Paused(record) => {
            let recorded =
                txn.open_table(ADAPTERS).map_err(failed)?.get(record.adapter.as_str()).map_err(failed)?.is_some();
            // A pause of an adapter that is not recorded (unloaded meanwhile) is not kept.
            if recorded {
                let stored = StoredPause {
                    owner: record.owner.clone(),
                    mode: record.mode.as_str().to_owned(),
                    lease_expires_at_ms: record.lease_expires_at.map(unix_ms),
                };
                let key = (record.adapter.as_str(), record.pause_id.as_str());
                txn.open_table(PAUSES).map_err(failed)?.insert(key, json(&stored)?.as_slice()).map_err(failed)?;
            }
            if let Some(number) = record.pause_id.number() {
                let mut meta = txn.open_table(META).map_err(failed)?;
                let last = meta.get(LAST_PAUSE_KEY).map_err(failed)?.map_or(0, |value| value.value());
                meta.insert(LAST_PAUSE_KEY, last.max(number)).map_err(failed)?;
            }
        }
        StateChange::PauseEnded { adapter, pause_id } => {
            let key = (adapter.as_str(), pause_id.as_str());
            txn.open_table(PAUSES).map_err(failed)?.remove(key).map_err(failed)?;
        }
        StateChange::GlobalPause(mode) => {
            let code = match mode {
                None => 0,
                Some(PauseMode::Abort) => 1,
                Some(PauseMode::Wait) => 2,
                Some(PauseMode::Keep) => 3,
            };
            txn.open_table(META).map_err(failed)?.insert(GLOBAL_PAUSE_KEY, code).map_err(failed)?;
        }
        StateChange::FrontRecordPut(record) => {
            let key = (record.table.as_str(), record.key.as_str());
            txn.open_table(FRONT_RECORDS).map_err(failed)?.insert(key, record.value.as_str()).map_err(failed)?;
        }
        StateChange::FrontRecordRemoved { table, key } => {
            txn.open_table(FRONT_RECORDS).map_err(failed)?.remove((table.as_str(), key.as_str())).map_err(failed)?;
        }
    }
    Ok(())
}

/// Changes `name`'s stored record with `change`, if it is recorded.
fn update_adapter(
    txn: &WriteTransaction,
    name: &AdapterName,
    change: impl FnOnce(&mut StoredAdapter),
) -> Result<(), StateError> {
    let mut adapters = txn.open_table(ADAPTERS).map_err(failed)?;
    let old = adapters.get(name.as_str()).map_err(failed)?.map(|old| old.value().to_vec());
    if let Some(old) = old {
        let mut stored = parse_adapter(name.as_str(), &old)?;
        change(&mut stored);
        adapters.insert(name.as_str(), json(&stored)?.as_slice()).map_err(failed)?;
    }
    Ok(())
}

/// Removes `name`'s record and every pause of it.
fn remove_adapter(txn: &WriteTransaction, name: &AdapterName) -> Result<(), StateError> {
    txn.open_table(ADAPTERS).map_err(failed)?.remove(name.as_str()).map_err(failed)?;
    let mut pauses = txn.open_table(PAUSES).map_err(failed)?;
    let ids: Vec<String> = pauses
        .range((name.as_str(), "")..)
        .map_err(failed)?
        .map_while(|entry| {
            let (key, _) = entry.ok()?;
            let (adapter, id) = key.value();
            (adapter == name.as_str()).then(|| id.to_owned())
        })
        .collect();
    for id in ids {
        pauses.remove((name.as_str(), id.as_str())).map_err(failed)?;
    }
    Ok(())
}

/// Issues `name`'s next version: one above the highest ever issued for it.
pub(crate) fn issue(txn: &WriteTransaction, name: &AdapterName) -> Result<AdapterVersion, StateError> {
    let mut issued = txn.open_table(ISSUED).map_err(failed)?;
    let last = issued.get(name.as_str()).map_err(failed)?.map_or(0, |value| value.value());
    let next = last.checked_add(1).ok_or_else(|| failed(format!("{name}'s versions are exhausted")))?;
    issued.insert(name.as_str(), next).map_err(failed)?;
    Ok(AdapterVersion(next))
}

/// Everything recorded, and the highest pause number ever recorded.
pub(crate) fn read_all(txn: &ReadTransaction) -> Result<(RecordedState, u64), StateError> {
    let mut state = RecordedState::default();
    for entry in txn.open_table(ADAPTERS).map_err(failed)?.iter().map_err(failed)? {
        let (name, value) = entry.map_err(failed)?;
        let stored = parse_adapter(name.value(), value.value())?;
        let what = format!("adapter {:?}", name.value());
        let retained = stored
            .retained
            .into_iter()
            .map(|older| {
                Ok(VersionRecord { version: AdapterVersion(older.version), source: older.source.recorded(&what)? })
            })
            .collect::<Result<_, StateError>>()?;
        state.adapters.push(AdapterRecord {
            name: parse_name(name.value())?,
            source: stored.source.recorded(&what)?,
            version: AdapterVersion(stored.version),
            declared_path: stored.declared_path,
            retained,
            staleness: stored.staleness.map(StoredStaleness::policy),
        });
    }
    let mut last_pause = 0;
    for entry in txn.open_table(PAUSES).map_err(failed)?.iter().map_err(failed)? {
        let (key, value) = entry.map_err(failed)?;
        let (adapter, id) = key.value();
        let stored: StoredPause =
            serde_json::from_slice(value.value()).map_err(|err| damaged(&format!("pause {id} of {adapter}"), err))?;
        let pause_id = PauseId::parse(id)
            .ok()
            .flatten()
            .ok_or_else(|| damaged(&format!("pause {id:?} of {adapter}"), "not a pause id"))?;
        last_pause = last_pause.max(pause_id.number().unwrap_or(0));
        state.pauses.push(PauseRecord {
            adapter: parse_name(adapter)?,
            pause_id,
            mode: PauseMode::parse(&stored.mode).map_err(|err| damaged(&format!("pause {id} of {adapter}"), err))?,
            owner: stored.owner,
            lease_expires_at: stored.lease_expires_at_ms.map(|ms| UNIX_EPOCH + Duration::from_millis(ms)),
        });
    }
    for entry in txn.open_table(FRONT_RECORDS).map_err(failed)?.iter().map_err(failed)? {
        let (key, value) = entry.map_err(failed)?;
        let (table, key) = key.value();
        state.front_records.push(FrontRecord {
            table: table.to_owned(),
            key: key.to_owned(),
            value: value.value().to_owned(),
        });
    }
    let meta = txn.open_table(META).map_err(failed)?;
    let number = |key: &str| meta.get(key).map(|value| value.map_or(0, |value| value.value())).map_err(failed);
    state.global_pause = match number(GLOBAL_PAUSE_KEY)? {
        0 => None,
        1 => Some(PauseMode::Abort),
        2 => Some(PauseMode::Wait),
        3 => Some(PauseMode::Keep),
        other => return Err(damaged("the global pause", format!("unknown mode {other}"))),
    };
    Ok((state, last_pause.max(number(LAST_PAUSE_KEY)?)))
}

/// The highest version ever issued for `name` (0 if none).
#[cfg(test)]
pub(crate) fn issued(txn: &ReadTransaction, name: &str) -> Result<u64, StateError> {
    let issued = txn.open_table(ISSUED).map_err(failed)?;
    Ok(issued.get(name).map_err(failed)?.map_or(0, |value| value.value()))
}

fn parse_adapter(name: &str, value: &[u8]) -> Result<StoredAdapter, StateError> {
    serde_json::from_slice(value).map_err(|err| damaged(&format!("adapter {name:?}"), err))
}

fn parse_name(raw: &str) -> Result<AdapterName, StateError> {
    AdapterName::parse(raw).map_err(|err| damaged(&format!("adapter {raw:?}"), err))
}

fn damaged(what: &str, why: impl std::fmt::Display) -> StateError {
    failed(format!("the record of {what} is damaged: {why}"))
}

fn json(value: &impl Serialize) -> Result<Vec<u8>, StateError> {
    serde_json::to_vec(value).map_err(|err| failed(format!("cannot encode a record: {err}")))
}

fn unix_ms(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH).map_or(0, |since| u64::try_from(since.as_millis()).unwrap_or(u64::MAX))
}
