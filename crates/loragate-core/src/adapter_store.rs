//! The adapter store: a content-addressed directory of pushed adapter weights (`PushLoraAdapter`,
//! `PUT /v1/lora_adapters/{name}`), under the state directory (`STATE_DIR/adapters/`), or a temporary directory the
//! server owns and removes when it stops when the state is not kept on disk.
//!
//! A push is received by a [`Receiver`]: the bytes of `adapter_model.safetensors` are written to a temporary file
//! under `tmp/` as they arrive, hashed (SHA-256) and counted; `--max-adapter-bytes` is enforced as they arrive; the
//! safetensors header is parsed and checked as soon as it is complete (see [`safetensors`]), and the model's own
//! layout check ([`AdapterLayout`], given by the engine) runs on it before the rest is read. At the end the size and
//! the declared SHA-256 are checked, and the directory (the weights and `adapter_config.json`) is renamed into
//! `blobs/<sha256>-<config>/` in one step: a crash leaves no half version, and a receiver dropped midway (a client
//! gone) removes its temporary directory. A store in a state directory syncs each version to disk before the rename;
//! a temporary store (removed when the server stops, never reopened) skips the syncs.
//!
//! A version's directory is named by content (the weights' SHA-256 and a digest of the configuration), never by the
//! adapter's name. Directories no recorded version refers to are deleted by a [`Collection`] (the coordinator runs one
//! at start, and in the background after each push, fetch and unload); a directory a push is installing holds a
//! [`BlobLease`] and is never collected meanwhile, nor by a collection that began before its install ended (that
//! collection read a record older than the install).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::adapter_source::{AdapterSource, CONFIG_FILE, PreparedLoad, WEIGHTS_FILE};
use crate::contract::{CoreError, Field, Sha256};

mod growing;
mod receiver;
pub mod safetensors;
mod temporary;

pub use growing::GrowingFile;
pub use receiver::{PreparedGuard, Receiver, StoredAdapter};
pub use safetensors::{AdapterLayout, TensorDtype, TensorLayout};

/// The largest `adapter_config.json` a push may carry.
pub const MAX_CONFIG_BYTES: usize = 1 << 20;

/// Refuses names that could be read as a path or a pin: a pushed version is stored by its content, never under its
/// name, but the name travels to workers and agents (an agent writes `DIR/NAME@V/`). `raw` is an adapter name
/// (whitespace and control characters are refused by its parsing already; they are refused here too).
pub fn check_push_name(raw: &str) -> Result<(), CoreError> {
    if raw.is_empty()
        || raw.contains(['/', '\\', '@'])
        || raw == "."
        || raw.contains("..")
        || raw.chars().any(|c| c.is_control() || c.is_whitespace())
    {
        return Err(CoreError::invalid(
            Field::LoraName,
            format!(
                "{raw:?} cannot take a push: a pushed adapter's name has no `/`, `\\`, `@`, `..`, whitespace or control character"
            ),
        ));
    }
    Ok(())
}

/// The model's check of a pushed adapter's layout (tensor names, dtypes and shapes against the base model), run on
/// the safetensors header before the tensors are received.
pub type LayoutCheck = Arc<dyn Fn(&AdapterLayout) -> Result<(), CoreError> + Send + Sync>;

/// The engine's reading of a push's weights while they arrive, begun once its header is checked (given the layout and
/// the file being written): what it prepared goes with the stored version to the install
/// ([`crate::Engine::prepare_pushed_adapter`]).
pub type Preparation = Arc<dyn Fn(&AdapterLayout, GrowingFile) -> Option<PreparedLoad> + Send + Sync>;

/// What a push declares before its bytes: validated at the edge.
#[derive(Clone, Debug)]
pub struct PushHeader {
    config: serde_json::Map<String, serde_json::Value>,
    config_bytes: Vec<u8>,
    sha256: Option<Sha256>,
    total_bytes: Option<u64>,
}

impl PushHeader {
    /// Parses a push's declarations: `adapter_config_json` (a JSON object, at most [`MAX_CONFIG_BYTES`]), the
    /// optional `sha256` of the weights file (empty: not declared) and its optional size (`None` or 0: not
    /// declared). Errors name the field.
    pub fn parse(config_json: Vec<u8>, sha256: &str, total_bytes: Option<u64>) -> Result<Self, CoreError> {
        if config_json.len() > MAX_CONFIG_BYTES {
            return Err(CoreError::invalid(
                Field::AdapterConfig,
                format!("is {} bytes, the limit is {MAX_CONFIG_BYTES}", config_json.len()),
            ));
        }
        if config_json.is_empty() {
            return Err(CoreError::invalid(Field::AdapterConfig, "must not be empty (the adapter_config.json file)"));
        }
        let config = match serde_json::from_slice::<serde_json::Value>(&config_json) {
            Ok(serde_json::Value::Object(config)) => config,
            Ok(_) => return Err(CoreError::invalid(Field::AdapterConfig, "must be a JSON object")),
            Err(err) => return Err(CoreError::invalid(Field::AdapterConfig, format!("is not valid JSON: {err}"))),
        };
        let sha256 = if sha256.is_empty() { None } else { Some(Sha256::parse_hex(sha256, Field::Sha256)?) };
        Ok(Self { config, config_bytes: config_json, sha256, total_bytes: total_bytes.filter(|&bytes| bytes > 0) })
    }

    /// The declared SHA-256 of the weights file, if any.
    pub fn sha256(&self) -> Option<Sha256> {
        self.sha256
    }

    /// The declared size of the weights file, if any.
    pub fn total_bytes(&self) -> Option<u64> {
        self.total_bytes
    }
}

/// The content-addressed store of pushed adapter versions. Cheap to clone.
#[derive(Clone)]
pub struct AdapterStore {
    inner: Arc<StoreInner>,
}

impl std::fmt::Debug for AdapterStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdapterStore").field("dir", &self.inner.dir).field("max_bytes", &self.inner.max_bytes).finish()
    }
}

struct StoreInner {
    /// The store's directory: `blobs/` and `tmp/` below it.
    dir: PathBuf,
    /// The largest weights file accepted (`--max-adapter-bytes`).
    max_bytes: u64,
    /// Which blob directories are held against collection.
    holds: Mutex<Holds>,
    /// Whether the store owns `dir` and removes it when dropped (a store without a state directory).
    owned: bool,
    /// A temporary store's `.owner` file, locked while the store lives (see `temporary`).
    _owner: Option<std::fs::File>,
}

/// Which blob directories no collection may delete.
#[derive(Default)]
struct Holds {
    /// Blob directories being installed, with how many pushes install each: never collected.
    leases: HashMap<PathBuf, usize>,
    /// How many times a directory's last lease ended so far: a collection's mark.
    releases: u64,
    /// When each directory's last lease ended (`releases` then), kept while a collection that began before may run.
    released: HashMap<PathBuf, u64>,
    /// The marks of the collections begun and not dropped, with how many have each.
    collections: BTreeMap<u64, usize>,
}

impl Holds {
    /// Forgets the releases no running collection began before.
    fn prune(&mut self) {
        match self.collections.keys().next().copied() {
            Some(oldest) => self.released.retain(|_, &mut released| released > oldest),
            None => self.released.clear(),
        }
    }
}

impl Drop for StoreInner {
    fn drop(&mut self) {
        if self.owned {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

impl AdapterStore {
    /// Opens (creating it) the store in `dir`, accepting weights files of at most `max_bytes`. What an earlier
    /// process left in `tmp/` (a push it never finished) is removed. Blocking.
    pub fn open(dir: impl Into<PathBuf>, max_bytes: u64) -> io::Result<Self> {
        Self::create(dir.into(), max_bytes, None)
    }

    /// A store in a new temporary directory that is removed when the last clone of the store is dropped: for a
    /// server that keeps no state on disk (pushed versions then last as long as the process). The temporary stores
    /// of processes that ended without removing theirs (killed, crashed) are removed first. Blocking.
    pub fn temporary(max_bytes: u64) -> io::Result<Self> {
        let (dir, owner) = temporary::create(&std::env::temp_dir())?;
        Self::create(dir, max_bytes, Some(owner))
    }

    /// `owner`: a temporary store's locked `.owner` file (`Some(None)` where the file system has no locks), `None`
    /// for a store in a state directory.
    fn create(dir: PathBuf, max_bytes: u64, owner: Option<Option<std::fs::File>>) -> io::Result<Self> {
        let owned = owner.is_some();
        std::fs::create_dir_all(dir.join("blobs"))?;
        let tmp = dir.join("tmp");
        if tmp.exists() {
            std::fs::remove_dir_all(&tmp)?;
        }
        std::fs::create_dir_all(&tmp)?;
        let inner = StoreInner { dir, max_bytes, holds: Mutex::default(), owned, _owner: owner.flatten() };
        Ok(Self { inner: Arc::new(inner) })
    }

    /// The store's directory.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// The directory of the installed versions.
    pub fn blobs_dir(&self) -> PathBuf {
        self.inner.dir.join("blobs")
    }

    /// The largest weights file accepted.
    pub fn max_bytes(&self) -> u64 {
        self.inner.max_bytes
    }

    /// Whether what is stored must survive a crash: a store in a state directory syncs each version to disk before
    /// it is renamed into place; a temporary store ([`AdapterStore::temporary`]) does not, since nothing ever reopens
    /// it (it is removed when the server stops, and a server that crashed starts a new one), so its versions need to
    /// be complete and in place, never durable.
    pub fn is_durable(&self) -> bool {
        !self.inner.owned
    }

    /// Starts receiving a push declared by `header`, whose header will be checked by `check`. Refuses at once a
    /// declared size over the limit.
    pub async fn receive(&self, header: PushHeader, check: LayoutCheck) -> Result<Receiver, CoreError> {
        if let Some(size) = header.total_bytes.filter(|&size| size > self.inner.max_bytes) {
            return Err(CoreError::AdapterTooLarge { size, limit: self.inner.max_bytes });
        }
        Receiver::start(self.clone(), header, check).await
    }

    /// The version stored under `dir_name` (a directory name under `blobs/`, as a record names it), if this store
    /// holds it complete, held against collection; its weights have `sha256` and `bytes` (the name is their content).
    /// Blocking.
    pub fn stored(&self, dir_name: &std::ffi::OsStr, sha256: Sha256, bytes: u64) -> Option<StoredAdapter> {
        let dir = self.blobs_dir().join(dir_name);
        let lease = self.lease(dir.clone());
        let complete = dir.join(WEIGHTS_FILE).is_file() && dir.join(CONFIG_FILE).is_file();
        let named_by_digest = dir_name.to_str().is_some_and(|name| name.starts_with(&sha256.to_hex()));
        (complete && named_by_digest).then(|| StoredAdapter {
            source: AdapterSource::pushed(&dir, sha256, bytes),
            sha256,
            bytes,
            lease,
            prepared: PreparedGuard::default(),
        })
    }

    /// Holds `dir` (a blob directory) against collection until the lease is dropped.
    fn lease(&self, dir: PathBuf) -> BlobLease {
        *self.inner.holds.lock().leases.entry(dir.clone()).or_default() += 1;
        BlobLease { store: self.inner.clone(), dir }
    }

    /// Begins a collection: call it *before* reading the record whose directories [`Collection::collect`] is given.
    pub fn begin_collection(&self) -> Collection {
        let mut holds = self.inner.holds.lock();
        let mark = holds.releases;
        *holds.collections.entry(mark).or_default() += 1;
        Collection { store: self.clone(), mark }
    }

    /// Deletes every blob directory that no push is installing, now: for a store no record refers into (an agent's,
    /// whose versions link to their files). Blocking: call it off the async runtime.
    pub fn collect_garbage(&self, referenced: &HashSet<PathBuf>) -> io::Result<usize> {
        self.begin_collection().collect(referenced)
    }

    /// The blob directories present now (for tests and diagnostics). Blocking.
    pub fn blob_dirs(&self) -> io::Result<Vec<PathBuf>> {
        let mut dirs: Vec<PathBuf> = std::fs::read_dir(self.blobs_dir())?
            .map(|entry| entry.map(|entry| entry.path()))
            .collect::<Result<_, _>>()?;
        dirs.sort();
        Ok(dirs)
    }

    /// The entries of `tmp/` now: pushes being received (for tests and diagnostics). Blocking.
    pub fn pending_uploads(&self) -> io::Result<usize> {
        Ok(std::fs::read_dir(self.inner.dir.join("tmp"))?.count())
    }
}

/// Keeps a blob directory from being collected while a push installs it.
pub struct BlobLease {
    store: Arc<StoreInner>,
    dir: PathBuf,
}

impl std::fmt::Debug for BlobLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("BlobLease").field(&self.dir).finish()
    }
}

impl Drop for BlobLease {
    fn drop(&mut self) {
        let mut holds = self.store.holds.lock();
        let Some(count) = holds.leases.get_mut(&self.dir) else { return };
        *count -= 1;
        if *count == 0 {
            holds.leases.remove(&self.dir);
            holds.releases += 1;
            if !holds.collections.is_empty() {
                let released = holds.releases;
                holds.released.insert(self.dir.clone(), released);
            }
        }
    }
}

/// A collection of the store's unreferenced directories ([`AdapterStore::begin_collection`]), begun before its caller
/// read which directories are referenced: a directory whose install ended after that may be referenced by a record
/// newer than the one read, so this collection keeps it (the next one decides).
pub struct Collection {
    store: AdapterStore,
    /// `Holds::releases` when it began.
    mark: u64,
}

impl std::fmt::Debug for Collection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Collection").field("mark", &self.mark).finish()
    }
}

impl Collection {
    /// Deletes every blob directory that is not in `referenced` (the directories recorded versions name), that no push
    /// is installing and whose install did not end since the collection began; returns how many were deleted.
    /// Blocking: call it off the async runtime.
    pub fn collect(self, referenced: &HashSet<PathBuf>) -> io::Result<usize> {
        let holds = self.store.inner.holds.lock();
        let mut deleted = 0;
        for entry in std::fs::read_dir(self.store.blobs_dir())? {
            let path = entry?.path();
            let installed_since = holds.released.get(&path).is_some_and(|&released| released > self.mark);
            if referenced.contains(&path) || holds.leases.contains_key(&path) || installed_since {
                continue;
            }
            std::fs::remove_dir_all(&path)?;
            deleted += 1;
        }
        Ok(deleted)
    }
}

impl Drop for Collection {
    fn drop(&mut self) {
        let mut holds = self.store.inner.holds.lock();
        if let Some(count) = holds.collections.get_mut(&self.mark) {
            *count -= 1;
            if *count == 0 {
                holds.collections.remove(&self.mark);
            }
        }
        holds.prune();
    }
}

#[cfg(test)]
mod tests;
