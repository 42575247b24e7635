//! Writing a received version into the agent's directory as `DIR/NAME@V/`: assembled in a temporary directory of the
//! store (hard links to the stored files, a copy where links are impossible), synced, then renamed into place in one
//! step. A directory already there under that name (a version number the fleet reuses after a failed install) is
//! moved aside and removed once the new one is in place. A version the fleet released is removed the same way: moved
//! into the store's temporary directory in one step, then deleted (an agent stopped midway removes the rest at its
//! next start, with the store's `tmp/`).

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use loragate_core::{AdapterStore, CONFIG_FILE, CoreError, StateError, WEIGHTS_FILE};

/// Makes temporary names unique within the process (with its id, across processes).
static NEXT_TEMP: AtomicU64 = AtomicU64::new(0);

/// An I/O failure of the agent as the core's error (a 500 naming what failed).
pub(super) fn store_failed(doing: &str, err: &io::Error) -> CoreError {
    CoreError::State(StateError::Failed(format!("agent: {doing} the version: {err}")))
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

/// Removes `dir/NAME@V/` and answers whether it was there. The name is one the caller validated (no separator, no
/// `@`, no `..`): the path stays in `dir`. A link under that name is removed, never followed. Blocking.
pub(super) fn remove_version(dir: &Path, store: &AdapterStore, name: &str, version: u64) -> io::Result<bool> {
    let target = dir.join(format!("{name}@{version}"));
    match std::fs::symlink_metadata(&target) {
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(err) => return Err(err),
        Ok(_) => {}
    }
    let aside = TempDir(temp_dir(store, "removed"));
    std::fs::rename(&target, &aside.0)?;
    std::fs::File::open(dir)?.sync_all()?;
    if std::fs::symlink_metadata(&aside.0)?.is_dir() {
        std::fs::remove_dir_all(&aside.0)?;
    } else {
        std::fs::remove_file(&aside.0)?;
    }
    Ok(true)
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

    #[test]
    fn a_removed_version_is_gone_whole_and_others_stay() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = AdapterStore::open(dir.path().join(".store"), 1 << 20).expect("store");
        for _ in 0..3 {
            write_version(dir.path(), &store, "meow", None, &blob(dir.path(), b"w")).expect("written");
        }
        assert!(remove_version(dir.path(), &store, "meow", 2).expect("removed"));
        assert!(!remove_version(dir.path(), &store, "meow", 2).expect("idempotent"), "already gone");
        assert!(!remove_version(dir.path(), &store, "woof", 1).expect("never written"));
        assert!(dir.path().join("meow@1").is_dir() && dir.path().join("meow@3").is_dir());
        assert!(!dir.path().join("meow@2").exists());
        assert_eq!(store.pending_uploads().expect("tmp"), 0, "nothing left aside");
        // The next version is still numbered after the highest left.
        let next = write_version(dir.path(), &store, "meow", None, &blob(dir.path(), b"w")).expect("written");
        assert_eq!(next, dir.path().join("meow@4"));
    }

    #[cfg(unix)]
    #[test]
    fn a_link_under_a_versions_name_is_removed_not_followed() {
        let dir = tempfile::tempdir().expect("temp dir");
        let outside = tempfile::tempdir().expect("outside");
        std::fs::write(outside.path().join("keep"), b"keep").expect("write");
        let store = AdapterStore::open(dir.path().join(".store"), 1 << 20).expect("store");
        std::os::unix::fs::symlink(outside.path(), dir.path().join("meow@1")).expect("link");
        assert!(remove_version(dir.path(), &store, "meow", 1).expect("removed"));
        assert!(std::fs::symlink_metadata(dir.path().join("meow@1")).is_err());
        assert!(outside.path().join("keep").exists(), "what the link pointed at is untouched");
    }
}
