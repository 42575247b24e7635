//! The store heals and never forgets silently: a failing disk (a storage backend whose writes fail while a switch
//! is on: test code only) fails the calls made meanwhile, is reported, and once the disk works again the next call
//! succeeds without a restart; an empty or truncated file is refused at open, naming it and what to do.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use redb::StorageBackend;
use redb::backends::FileBackend;

use super::*;

/// A file backend whose writes, resizes and syncs fail while `failing` is set, as a full disk's do.
#[derive(Debug)]
struct FlakyDisk {
    file: FileBackend,
    failing: Arc<AtomicBool>,
}

impl FlakyDisk {
    fn check(&self) -> std::io::Result<()> {
        match self.failing.load(Ordering::SeqCst) {
            true => Err(std::io::Error::other("injected: no space left on device")),
            false => Ok(()),
        }
    }
}

impl StorageBackend for FlakyDisk {
    fn len(&self) -> std::io::Result<u64> {
        self.file.len()
    }

    fn read(&self, offset: u64, len: usize) -> std::io::Result<Vec<u8>> {
        self.file.read(offset, len)
    }

    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.check()?;
        self.file.set_len(len)
    }

    fn sync_data(&self, eventual: bool) -> std::io::Result<()> {
        self.check()?;
        self.file.sync_data(eventual)
    }

    fn write(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        self.check()?;
        self.file.write(offset, data)
    }
}

fn flaky_store(dir: &std::path::Path, failing: Arc<AtomicBool>) -> EmbeddedStore {
    let open: Opener = Box::new(move |path| {
        let file = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path)?;
        let disk = FlakyDisk { file: FileBackend::new(file)?, failing: failing.clone() };
        redb::Builder::new().create_with_backend(disk)
    });
    EmbeddedStore::open_with(dir, open).expect("opens")
}

#[tokio::test]
async fn after_a_failing_disk_the_store_records_again_without_a_restart() {
    let dir = tempfile::tempdir().expect("temp dir");
    let failing = Arc::new(AtomicBool::new(false));
    let store = flaky_store(dir.path(), failing.clone());
    assert_eq!(store.issue_version(&name("meow")).await.expect("v1"), AdapterVersion(1));
    store.record(vec![installed("meow", 1)]).await.expect("recorded");
    assert_eq!(store.problem(), None);

    failing.store(true, Ordering::SeqCst);
    store.record(vec![installed("meow", 2)]).await.expect_err("the disk fails");
    assert!(store.problem().is_some_and(|why| why.contains("injected")), "{:?}", store.problem());
    assert!(store.health().is_err_and(|err| err.to_string().contains("cannot record")), "health checks say so");
    store.issue_version(&name("meow")).await.expect_err("still failing: no version is issued");
    assert!(store.problem().is_some(), "reported while it fails");

    failing.store(false, Ordering::SeqCst);
    assert_eq!(store.issue_version(&name("meow")).await.expect("the disk is back"), AdapterVersion(2));
    store.record(vec![installed("meow", 2)]).await.expect("recorded again");
    assert_eq!(store.problem(), None, "healthy again");
    assert!(store.health().is_ok());
    drop(store);

    let reopened = EmbeddedStore::open(dir.path()).expect("reopens");
    let recorded = reopened.recorded().await.expect("read");
    let adapters: Vec<_> = recorded.adapters.iter().map(|a| (a.name.clone(), a.version)).collect();
    assert_eq!(adapters, [(name("meow"), AdapterVersion(2))]);
    assert_eq!(reopened.issue_version(&name("meow")).await.expect("v3"), AdapterVersion(3), "no version repeats");
}

#[tokio::test]
async fn an_idle_store_heals_on_its_own_once_the_disk_is_back() {
    let dir = tempfile::tempdir().expect("temp dir");
    let failing = Arc::new(AtomicBool::new(false));
    let store = flaky_store(dir.path(), failing.clone());
    failing.store(true, Ordering::SeqCst);
    store.record(vec![installed("meow", 1)]).await.expect_err("the disk fails");
    failing.store(false, Ordering::SeqCst);
    let deadline = Instant::now() + Duration::from_secs(60);
    while store.problem().is_some() {
        assert!(Instant::now() < deadline, "the store never healed: {:?}", store.problem());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn an_empty_or_truncated_state_file_is_refused_naming_it_and_what_to_do() {
    let dir = tempfile::tempdir().expect("temp dir");
    {
        let store = EmbeddedStore::open(dir.path()).expect("opens");
        for version in 1..40 {
            store.issue_version(&name("meow")).await.expect("issued");
            store.record(vec![installed("meow", version)]).await.expect("recorded");
        }
    }
    let file = dir.path().join(STATE_FILE);
    let whole = std::fs::read(&file).expect("read");
    let page = 4096;
    let cuts = [0, 100, 512, page, whole.len() / 2, whole.len() / page / 2 * page, whole.len() - page, whole.len() - 1];
    for cut in cuts {
        std::fs::write(&file, &whole[..cut]).expect("truncate");
        let err = EmbeddedStore::open(dir.path()).expect_err("refused").to_string();
        let named = err.contains(&file.display().to_string());
        assert!(named && err.contains("restore") && err.contains("--state-dir"), "cut at {cut}: {err}");
        assert_eq!(std::fs::metadata(&file).expect("still there").len(), cut as u64, "the file is left as it was");
    }
    std::fs::write(&file, &whole).expect("restore");
    let restored = EmbeddedStore::open(dir.path()).expect("a restored file opens");
    assert_eq!(restored.issue_version(&name("meow")).await.expect("issued"), AdapterVersion(40));
}
