//! The keys under `/PREFIX/` and their JSON values. Names and ids are one key segment each (`%` and `/` escaped).
//!
//! | key | value |
//! | --- | --- |
//! | `adapters/NAME` | `{"version", "path", "confined", "sha256", "bytes", "pushed", "holder", "retained": [{"version", "path", "confined", "sha256", "bytes", "pushed", "holder"}], "by"}`; an unloaded adapter is `{"unloaded": true, "by"}`; `holder`: the replica whose adapter store holds pushed weights |
//! | `staleness/NAME` | `{"max_staleness", "batch_size", "by"}`: the adapter's staleness bound (no key: none) |
//! | `declared/NAME` | the path its `--adapter` flag last named (JSON string) |
//! | `issued/NAME` | the highest version ever issued for the name (decimal; kept after an unload) |
//! | `pauses/NAME/PAUSE_ID` | `{"owner", "mode", "lease_expires_at_ms", "by"}`, under an etcd lease when it has one |
//! | `acks/PAUSE_ID/REPLICA` | `{"revision", "aborted", "kept", "unacknowledged"}`: a replica applied that pause's write |
//! | `replicas/REPLICA` | `{"grpc_addr", "http_addr"}`, under the replica's etcd lease |
//! | `records/TABLE/KEY` | `{"value", "by"}`: a front's record (its own document in `value`), owned by replica `by` |
//!
//! `by` is the writing replica's id: a replica does not apply its own changes again.

use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use loragate_core::state::{AdapterRecord, PauseRecord, RecordedSource, StateError, VersionRecord};
use loragate_core::{
    AbortReport, AdapterName, AdapterVersion, Field, PauseId, PauseMode, RequestId, Sha256, StalenessPolicy,
};
use serde::{Deserialize, Serialize};

/// The keys of one state (one `/PREFIX/`).
#[derive(Clone, Debug)]
pub(crate) struct Keys {
    prefix: String,
}

/// What a key under the prefix is.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Key {
    Adapter(AdapterName),
    Declared(AdapterName),
    /// An adapter's staleness bound.
    Staleness(AdapterName),
    Pause(AdapterName, PauseId),
    /// A replica's acknowledgement of a pause: the pause and the replica.
    Ack(PauseId, String),
    /// A front's record: its table and key.
    Record(String, String),
    /// A live replica's registration.
    Replica(String),
    Other,
}

impl Keys {
    pub(crate) fn new(prefix: String) -> Self {
        Self { prefix }
    }

    /// The whole state's prefix.
    pub(crate) fn all(&self) -> &str {
        &self.prefix
    }

    pub(crate) fn adapter(&self, name: &AdapterName) -> String {
        format!("{}adapters/{}", self.prefix, segment(name.as_str()))
    }

    pub(crate) fn declared(&self, name: &AdapterName) -> String {
        format!("{}declared/{}", self.prefix, segment(name.as_str()))
    }

    pub(crate) fn staleness(&self, name: &AdapterName) -> String {
        format!("{}staleness/{}", self.prefix, segment(name.as_str()))
    }

    pub(crate) fn issued(&self, name: &AdapterName) -> String {
        format!("{}issued/{}", self.prefix, segment(name.as_str()))
    }

    /// Every pause of `name` (a prefix).
    pub(crate) fn pauses_of(&self, name: &AdapterName) -> String {
        format!("{}pauses/{}/", self.prefix, segment(name.as_str()))
    }

    pub(crate) fn pause(&self, name: &AdapterName, pause_id: &PauseId) -> String {
        format!("{}{}", self.pauses_of(name), segment(pause_id.as_str()))
    }

    /// Every acknowledgement of a pause (a prefix).
    pub(crate) fn acks_of(&self, pause_id: &PauseId) -> String {
        format!("{}acks/{}/", self.prefix, segment(pause_id.as_str()))
    }

    pub(crate) fn ack(&self, pause_id: &PauseId, replica: &str) -> String {
        format!("{}{}", self.acks_of(pause_id), segment(replica))
    }

    /// Every replica (a prefix).
    pub(crate) fn replicas(&self) -> String {
        format!("{}replicas/", self.prefix)
    }

    pub(crate) fn replica(&self, id: &str) -> String {
        format!("{}{}", self.replicas(), segment(id))
    }

    /// A front's record.
    pub(crate) fn record(&self, table: &str, key: &str) -> String {
        format!("{}records/{}/{}", self.prefix, segment(table), segment(key))
    }

    /// What `key` is (keys this crate does not read come back as [`Key::Other`]).
    pub(crate) fn parse(&self, key: &[u8]) -> Key {
        let Some(rest) = std::str::from_utf8(key).ok().and_then(|key| key.strip_prefix(self.prefix.as_str())) else {
            return Key::Other;
        };
        let name = |raw: &str| unsegment(raw).and_then(|raw| AdapterName::parse(&raw).ok());
        let parsed = if let Some(raw) = rest.strip_prefix("adapters/") {
            name(raw).map(Key::Adapter)
        } else if let Some(raw) = rest.strip_prefix("declared/") {
            name(raw).map(Key::Declared)
        } else if let Some(raw) = rest.strip_prefix("staleness/") {
            name(raw).map(Key::Staleness)
        } else if let Some(raw) = rest.strip_prefix("pauses/") {
            raw.split_once('/').and_then(|(adapter, id)| {
                let id = unsegment(id).and_then(|id| PauseId::parse(&id).ok().flatten())?;
                Some(Key::Pause(name(adapter)?, id))
            })
        } else if let Some(raw) = rest.strip_prefix("acks/") {
            raw.split_once('/').and_then(|(id, replica)| {
                let id = unsegment(id).and_then(|id| PauseId::parse(&id).ok().flatten())?;
                Some(Key::Ack(id, unsegment(replica)?))
            })
        } else if let Some(raw) = rest.strip_prefix("records/") {
            raw.split_once('/').and_then(|(table, key)| Some(Key::Record(unsegment(table)?, unsegment(key)?)))
        } else if let Some(raw) = rest.strip_prefix("replicas/") {
            unsegment(raw).map(Key::Replica)
        } else {
            None
        };
        parsed.unwrap_or(Key::Other)
    }

    /// The replica id of a key under [`Keys::replicas`] or [`Keys::acks_of`]`(pause_id)`.
    pub(crate) fn last_segment(key: &[u8]) -> Option<String> {
        let key = std::str::from_utf8(key).ok()?;
        unsegment(key.rsplit_once('/')?.1)
    }
}

/// One key segment: `%` and `/` escaped.
fn segment(raw: &str) -> String {
    raw.replace('%', "%25").replace('/', "%2F")
}

fn unsegment(raw: &str) -> Option<String> {
    if raw.is_empty() {
        return None;
    }
    Some(raw.replace("%2F", "/").replace("%25", "%"))
}

fn failed(what: &str, err: impl std::fmt::Display) -> StateError {
    StateError::Failed(format!("etcd holds an unreadable {what}: {err}"))
}

/// `adapters/NAME`.
#[derive(Serialize, Deserialize)]
pub(crate) struct StoredAdapter {
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) unloaded: bool,
    #[serde(default)]
    pub(crate) version: u64,
    #[serde(flatten)]
    pub(crate) source: StoredSource,
    /// Older versions still servable to exact pins.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) retained: Vec<StoredVersion>,
    pub(crate) by: String,
}

/// Where a version's weights came from (the fields after `confined` are absent in records of older replicas).
#[derive(Default, Serialize, Deserialize)]
pub(crate) struct StoredSource {
    #[serde(default)]
    path: PathBuf,
    #[serde(default)]
    confined: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    sha256: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pushed: bool,
    /// For pushed weights: the replica whose adapter store holds them (the others fetch them from it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    holder: Option<String>,
}

impl StoredSource {
    /// The stored form of `source`, recorded by replica `by`: pushed weights without a holder are in `by`'s adapter
    /// store.
    pub(crate) fn of(source: &RecordedSource, by: &str) -> Self {
        let holder = source.pushed.then(|| source.holder.clone().unwrap_or_else(|| by.to_owned()));
        Self {
            path: source.path.clone(),
            confined: source.confined,
            sha256: source.sha256.map(|sha| sha.to_hex()),
            bytes: source.bytes,
            pushed: source.pushed,
            holder,
        }
    }

    fn recorded(self) -> RecordedSource {
        // An unreadable digest is dropped (the version's identity is then unknown), not fatal.
        let sha256 = self.sha256.and_then(|hex| Sha256::parse_hex(&hex, Field::Sha256).ok());
        RecordedSource {
            path: self.path,
            confined: self.confined,
            sha256,
            bytes: self.bytes,
            pushed: self.pushed,
            holder: self.holder,
        }
    }
}

/// One retained version in `adapters/NAME`.
#[derive(Serialize, Deserialize)]
pub(crate) struct StoredVersion {
    version: u64,
    #[serde(flatten)]
    source: StoredSource,
}

impl StoredVersion {
    pub(crate) fn of(record: &VersionRecord, by: &str) -> Self {
        Self { version: record.version.0, source: StoredSource::of(&record.source, by) }
    }
}

/// `staleness/NAME`.
#[derive(Serialize, Deserialize)]
pub(crate) struct StoredStaleness {
    max_staleness: u32,
    batch_size: u32,
    pub(crate) by: String,
}

impl StoredStaleness {
    pub(crate) fn of(policy: StalenessPolicy, by: &str) -> Self {
        Self { max_staleness: policy.max_staleness, batch_size: policy.batch_size, by: by.to_owned() }
    }

    pub(crate) fn decode(value: &[u8]) -> Result<Self, StateError> {
        serde_json::from_slice(value).map_err(|err| failed("staleness bound", err))
    }

    pub(crate) fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    pub(crate) fn policy(&self) -> StalenessPolicy {
        StalenessPolicy { max_staleness: self.max_staleness, batch_size: self.batch_size }
    }
}

impl StoredAdapter {
    pub(crate) fn decode(value: &[u8]) -> Result<Self, StateError> {
        serde_json::from_slice(value).map_err(|err| failed("adapter", err))
    }

    pub(crate) fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// The record, unless the adapter is unloaded.
    pub(crate) fn record(
        self,
        name: AdapterName,
        declared_path: Option<PathBuf>,
        staleness: Option<StalenessPolicy>,
    ) -> Option<AdapterRecord> {
        let retained = self
            .retained
            .into_iter()
            .map(|older| VersionRecord { version: AdapterVersion(older.version), source: older.source.recorded() })
            .collect();
        (!self.unloaded).then_some(AdapterRecord {
            name,
            source: self.source.recorded(),
            version: AdapterVersion(self.version),
            declared_path,
            retained,
            staleness,
        })
    }
}

/// `pauses/NAME/PAUSE_ID`.
#[derive(Serialize, Deserialize)]
pub(crate) struct StoredPause {
    owner: String,
    mode: String,
    lease_expires_at_ms: Option<u64>,
    pub(crate) by: String,
}

impl StoredPause {
    pub(crate) fn of(record: &PauseRecord, by: &str) -> Self {
        Self {
            owner: record.owner.clone(),
            mode: record.mode.as_str().to_owned(),
            lease_expires_at_ms: record.lease_expires_at.map(|at| {
                u64::try_from(at.duration_since(UNIX_EPOCH).unwrap_or_default().as_millis()).unwrap_or(u64::MAX)
            }),
            by: by.to_owned(),
        }
    }

    pub(crate) fn decode(value: &[u8]) -> Result<Self, StateError> {
        serde_json::from_slice(value).map_err(|err| failed("pause", err))
    }

    pub(crate) fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    pub(crate) fn record(self, adapter: AdapterName, pause_id: PauseId) -> Result<PauseRecord, StateError> {
        let mode = PauseMode::parse(&self.mode).map_err(|err| failed("pause mode", err))?;
        Ok(PauseRecord {
            adapter,
            pause_id,
            owner: self.owner,
            mode,
            lease_expires_at: self.lease_expires_at_ms.map(|ms| UNIX_EPOCH + Duration::from_millis(ms)),
        })
    }
}

/// `acks/PAUSE_ID/REPLICA`: what a replica handed back when it applied the pause written at `revision`.
#[derive(Serialize, Deserialize, Default)]
pub(crate) struct StoredAck {
    pub(crate) revision: i64,
    aborted: Vec<String>,
    kept: Vec<String>,
    unacknowledged: Vec<String>,
}

impl StoredAck {
    pub(crate) fn of(revision: i64, report: &AbortReport) -> Self {
        let ids = |ids: &[RequestId]| ids.iter().map(|id| id.as_str().to_owned()).collect();
        Self {
            revision,
            aborted: ids(&report.aborted),
            kept: ids(&report.kept),
            unacknowledged: ids(&report.unacknowledged),
        }
    }

    pub(crate) fn decode(value: &[u8]) -> Result<Self, StateError> {
        serde_json::from_slice(value).map_err(|err| failed("acknowledgement", err))
    }

    pub(crate) fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Adds what this replica handed back to `report`.
    pub(crate) fn add_to(&self, report: &mut AbortReport) {
        let ids =
            |ids: &[String]| ids.iter().filter_map(|id| RequestId::parse_or_generate(id).ok()).collect::<Vec<_>>();
        report.aborted.extend(ids(&self.aborted));
        report.kept.extend(ids(&self.kept));
        report.unacknowledged.extend(ids(&self.unacknowledged));
    }
}

/// `replicas/REPLICA`.
#[derive(Serialize, Deserialize, Default, Clone)]
pub(crate) struct StoredReplica {
    pub(crate) grpc_addr: String,
    pub(crate) http_addr: String,
}

impl StoredReplica {
    pub(crate) fn decode(value: &[u8]) -> Self {
        serde_json::from_slice(value).unwrap_or_default()
    }

    pub(crate) fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// `records/TABLE/KEY`: a front's document and the replica that owns it (whose front wrote it, or took it over when
/// its writer was gone).
#[derive(Serialize, Deserialize)]
pub(crate) struct StoredRecord {
    pub(crate) value: String,
    pub(crate) by: String,
}

impl StoredRecord {
    pub(crate) fn decode(value: &[u8]) -> Result<Self, StateError> {
        serde_json::from_slice(value).map_err(|err| failed("front record", err))
    }

    pub(crate) fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// How long a recorded pause's lease has left (leases are wall-clock times in the record); `None` without one.
pub(crate) fn lease_left(record: &PauseRecord) -> Option<Duration> {
    record.lease_expires_at.map(|at| at.duration_since(SystemTime::now()).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_names_with_slashes_and_percents() {
        let keys = Keys::new("/lg/".into());
        let name = AdapterName::parse("org/meow%2F").expect("name");
        let id = PauseId::parse("pause-ab-1").expect("id").expect("some");
        assert_eq!(keys.parse(keys.adapter(&name).as_bytes()), Key::Adapter(name.clone()));
        assert_eq!(keys.parse(keys.declared(&name).as_bytes()), Key::Declared(name.clone()));
        assert_eq!(keys.parse(keys.pause(&name, &id).as_bytes()), Key::Pause(name.clone(), id.clone()));
        assert_eq!(keys.parse(keys.issued(&name).as_bytes()), Key::Other);
        let record = keys.record("tinker/samples", "tk-1/2%");
        assert_eq!(keys.parse(record.as_bytes()), Key::Record("tinker/samples".into(), "tk-1/2%".into()));
        assert_eq!(keys.parse(keys.replica("r/1").as_bytes()), Key::Replica("r/1".into()));
        assert_eq!(keys.parse(b"/other/adapters/meow"), Key::Other);
        assert_eq!(Keys::last_segment(keys.ack(&id, "r/1").as_bytes()).as_deref(), Some("r/1"));
        assert_eq!(keys.parse(keys.ack(&id, "r/1").as_bytes()), Key::Ack(id.clone(), "r/1".into()));
    }
}
