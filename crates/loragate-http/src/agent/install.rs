//! Writing a received version into the agent's directory as `DIR/NAME@V/`: assembled in a temporary directory of the
//! store (hard links to the stored files, a copy where links are impossible), synced, then renamed into place in one
//! step. A directory already there under that name (a version number the fleet reuses after a failed install) is
//! moved aside and removed once the new one is in place.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use loragate_core::{AdapterStore, CONFIG_FILE, CoreError, StateError, WEIGHTS_FILE};

/// Makes temporary names unique within the process (with its id, across processes).
static NEXT_TEMP: AtomicU64 = AtomicU64::new(0);

/// An I/O failure of the agent as the core's error (a 500 naming what failed).
pub(super) fn store_failed(err: &io::Error) -> CoreError {
    CoreError::State(StateError::Failed(format!("agent: writing the version: {err}")))
}

/// A temporary directory removed when dropped (unless it was renamed away).
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        if self.0.exists() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

fn temp_dir(store: &AdapterStore, what: &str) -> PathBuf {
    let unique = NEXT_TEMP.fetch_add(1, Ordering::Relaxed);
    store.dir().join("tmp").join(format!("{what}-{}-{unique}", std::process::id()))
}

/// Writes the stored version in `blob` as `dir/NAME@V/` (`version`, or the next after the highest `NAME@V` in `dir`)
/// and answers that path. Blocking.
pub(super) fn write_version(
    dir: &Path,
    store: &AdapterStore,
    name: &str,
    version: Option<u64>,
    blob: &Path,
) -> io::Result<PathBuf> {
    let version = match version {
        Some(version) => version,
        None => highest_version(dir, name)? + 1,
    };
    let target = dir.join(format!("{name}@{version}"));
    let staging = TempDir(temp_dir(store, "version"));
    std::fs::create_dir(&staging.0)?;
    for file in [CONFIG_FILE, WEIGHTS_FILE] {
        let (from, to) = (blob.join(file), staging.0.join(file));
        if std::fs::hard_link(&from, &to).is_err() {
            std::fs::copy(&from, &to)?;
            std::fs::File::open(&to)?.sync_all()?;
        }
    }
    std::fs::File::open(&staging.0)?.sync_all()?;
    let _replaced = if target.exists() {
        let aside = TempDir(temp_dir(store, "replaced"));
        std::fs::rename(&target, &aside.0)?;
        Some(aside)
    } else {
        None
    };
    std::fs::rename(&staging.0, &target)?;
    std::fs::File::open(dir)?.sync_all()?;
    Ok(target)
}

/// The highest `V` of the `NAME@V` directories in `dir` (0 if none).
fn highest_version(dir: &Path, name: &str) -> io::Result<u64> {
    let prefix = format!("{name}@");
    let mut highest = 0;
    for entry in std::fs::read_dir(dir)? {
        let file_name = entry?.file_name();
        let version = file_name.to_str().and_then(|file| file.strip_prefix(&prefix)).and_then(|v| v.parse().ok());
        highest = highest.max(version.unwrap_or(0));
    }
    Ok(highest)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blob(dir: &Path, weights: &[u8]) -> PathBuf {
        let blob = dir.join("blob");
        std::fs::create_dir_all(&blob).expect("blob dir");
        std::fs::write(blob.join(CONFIG_FILE), b"{}").expect("config");
        std::fs::write(blob.join(WEIGHTS_FILE), weights).expect("weights");
        blob
    }

    #[test]
    fn versions_are_written_complete_under_name_at_v_and_a_reused_number_is_replaced() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = AdapterStore::open(dir.path().join(".store"), 1 << 20).expect("store");
        let first = write_version(dir.path(), &store, "meow", None, &blob(dir.path(), b"one")).expect("written");
        assert_eq!(first, dir.path().join("meow@1"));
        let second = write_version(dir.path(), &store, "meow", None, &blob(dir.path(), b"two")).expect("written");
        assert_eq!(second, dir.path().join("meow@2"), "the next after the highest");
        let named = write_version(dir.path(), &store, "meow", Some(7), &blob(dir.path(), b"seven")).expect("written");
        assert_eq!(std::fs::read(named.join(WEIGHTS_FILE)).expect("read"), b"seven");
        let again = write_version(dir.path(), &store, "meow", Some(7), &blob(dir.path(), b"SEVEN")).expect("written");
        assert_eq!(std::fs::read(again.join(WEIGHTS_FILE)).expect("read"), b"SEVEN", "a reused number is replaced");
        assert_eq!(std::fs::read(again.join(CONFIG_FILE)).expect("read"), b"{}");
        assert_eq!(store.pending_uploads().expect("tmp"), 0, "no temporary directory is left");
    }
}
