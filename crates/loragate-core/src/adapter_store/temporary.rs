//! Temporary stores (a server without a state directory): a directory under the system's temporary directory,
//! removed when the store is dropped — and, when its process ended without dropping it (killed, crashed), by the
//! next temporary store made there.
//!
//! Each temporary store holds an exclusive lock on its `.owner` file for as long as it lives; the kernel releases the
//! lock when the process ends, however it ends. A new temporary store removes every other whose `.owner` it can lock.
//! A store is made under another name and renamed into place only once locked, so none is ever found unlocked while
//! it is being made. Where the file system has no locks the store keeps no `.owner`, and nothing removes it but its
//! own drop.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

/// The start of every temporary store's directory name.
const PREFIX: &str = "loragate-adapters-";
/// The file whose lock says the store's process is alive.
const OWNER_FILE: &str = ".owner";

/// A new temporary store's directory in `parent`, with the open `.owner` file holding its lock (`None` where the file
/// system has no locks). Removes the stores in `parent` whose process is gone first.
pub(super) fn create(parent: &Path) -> io::Result<(PathBuf, Option<File>)> {
    remove_orphans(parent);
    let unique = format!("{}-{:016x}", std::process::id(), rand::random::<u64>());
    let making = parent.join(format!(".{PREFIX}{unique}"));
    std::fs::create_dir_all(&making)?;
    let owner_path = making.join(OWNER_FILE);
    let owner = File::options().create(true).truncate(false).write(true).open(&owner_path)?;
    let owner = match owner.lock() {
        Ok(()) => Some(owner),
        Err(_) => {
            drop(owner);
            std::fs::remove_file(&owner_path)?;
            None
        }
    };
    let dir = parent.join(format!("{PREFIX}{unique}"));
    std::fs::rename(&making, &dir)?;
    Ok((dir, owner))
}

/// Removes the temporary stores in `parent` whose `.owner` nobody holds: their process ended without removing them.
fn remove_orphans(parent: &Path) {
    let Ok(entries) = std::fs::read_dir(parent) else { return };
    for entry in entries.flatten() {
        if !entry.file_name().to_str().is_some_and(|name| name.starts_with(PREFIX)) {
            continue;
        }
        let Ok(owner) = File::options().write(true).open(entry.path().join(OWNER_FILE)) else { continue };
        if owner.try_lock().is_ok() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(parent: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(parent)
            .expect("a directory")
            .map(|entry| entry.expect("an entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn a_new_store_removes_the_stores_nobody_holds_and_only_those() {
        let parent = tempfile::tempdir().expect("a temporary directory");
        let (live, _held) = create(parent.path()).expect("a store");
        // What a killed process leaves: a store whose `.owner` nobody holds.
        let orphan = parent.path().join(format!("{PREFIX}1-0"));
        std::fs::create_dir_all(orphan.join("blobs")).expect("an orphan");
        std::fs::write(orphan.join(OWNER_FILE), b"").expect("its owner file");
        // A store without an owner file (made where there are no locks) and a directory of another name stay.
        let unlocked = parent.path().join(format!("{PREFIX}2-0"));
        std::fs::create_dir_all(&unlocked).expect("a store without locks");
        std::fs::create_dir_all(parent.path().join("something-else")).expect("another directory");

        let (second, _second_held) = create(parent.path()).expect("a second store");
        assert!(live.is_dir() && second.is_dir() && unlocked.is_dir(), "{:?}", names(parent.path()));
        assert!(!orphan.exists(), "the orphan is removed");
        assert_eq!(names(parent.path()).len(), 4, "{:?}", names(parent.path()));
    }

    #[test]
    fn a_store_whose_lock_is_released_is_removed_by_the_next() {
        let parent = tempfile::tempdir().expect("a temporary directory");
        let (first, held) = create(parent.path()).expect("a store");
        assert!(held.is_some(), "this file system has locks");
        assert!(first.join(OWNER_FILE).is_file());
        drop(held);
        let (second, _held) = create(parent.path()).expect("a second store");
        assert!(!first.exists() && second.is_dir(), "{:?}", names(parent.path()));
    }
}
