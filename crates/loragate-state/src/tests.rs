//! The store's guarantees, each tested so that it fails when the guarantee breaks: changes survive a reopen, a
//! batch is atomic, versions never repeat (across unloads, failed loads, reopens and kills), pause ids are never
//! given out twice, and a process killed (SIGKILL) between any two writes leaves a file the next open accepts.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use loragate_core::state::{FrontRecord, PauseRecord, RecordedSource, StateChange, StateStore, VersionRecord};
use loragate_core::{AdapterName, AdapterVersion, PauseMode, Sha256, StalenessPolicy};
use rand::Rng;

use super::*;

fn name(raw: &str) -> AdapterName {
    AdapterName::parse(raw).expect("name")
}

fn installed(adapter: &str, version: u64) -> StateChange {
    let source = RecordedSource {
        path: PathBuf::from(format!("/a/{adapter}/{version}")),
        confined: version.is_multiple_of(2),
        ..Default::default()
    };
    StateChange::Installed { name: name(adapter), version: AdapterVersion(version), source, retained: Vec::new() }
}

fn pause(store: &EmbeddedStore, adapter: &str, owner: &str, lease: Option<Duration>) -> PauseRecord {
    PauseRecord {
        adapter: name(adapter),
        pause_id: store.new_pause_id(),
        owner: owner.into(),
        mode: PauseMode::Keep,
        lease_expires_at: lease.map(|lease| SystemTime::now() + lease),
    }
}

/// A version's identity, its retained predecessors and the staleness bound survive a reopen; an install keeps the
/// bound, an unload drops everything.
#[tokio::test]
async fn identities_retained_versions_and_the_staleness_bound_are_read_back() {
    let dir = tempfile::tempdir().expect("temp dir");
    let pushed = RecordedSource {
        path: PathBuf::from("/state/adapters/ab"),
        confined: false,
        sha256: Some(Sha256([0xab; 32])),
        bytes: Some(4096),
        pushed: true,
        holder: None,
    };
    let policy = StalenessPolicy { max_staleness: 2, batch_size: 16 };
    {
        let store = EmbeddedStore::open(dir.path()).expect("opens");
        store.record(vec![installed("meow", 1)]).await.expect("recorded");
        store.record(vec![StateChange::Staleness { name: name("meow"), policy: Some(policy) }]).await.expect("ok");
        let older = VersionRecord { version: AdapterVersion(1), source: RecordedSource::default() };
        let change = StateChange::Installed {
            name: name("meow"),
            version: AdapterVersion(2),
            source: pushed.clone(),
            retained: vec![older.clone()],
        };
        store.record(vec![change]).await.expect("recorded");
    }
    let store = EmbeddedStore::open(dir.path()).expect("reopens");
    let recorded = store.recorded().await.expect("reads");
    let meow = &recorded.adapters[0];
    assert_eq!((meow.version, &meow.source), (AdapterVersion(2), &pushed));
    assert_eq!(meow.retained, vec![VersionRecord { version: AdapterVersion(1), source: RecordedSource::default() }]);
    assert_eq!(meow.staleness, Some(policy), "an install keeps the bound");
    store.record(vec![StateChange::Staleness { name: name("meow"), policy: None }]).await.expect("cleared");
    assert_eq!(store.recorded().await.expect("reads").adapters[0].staleness, None);
}

#[tokio::test]
async fn everything_recorded_is_read_back_after_a_reopen() {
    let dir = tempfile::tempdir().expect("temp dir");
    let lease_end;
    let (kept, ended);
    {
        let store = EmbeddedStore::open(dir.path()).expect("opens");
        assert_eq!(store.recorded().await, Ok(RecordedState::default()), "a new store is empty");
        assert_eq!(store.issue_version(&name("meow")).await, Ok(AdapterVersion(1)));
        store.record(vec![installed("meow", 1)]).await.expect("recorded");
        assert_eq!(store.issue_version(&name("meow")).await, Ok(AdapterVersion(2)));
        store.record(vec![installed("meow", 2)]).await.expect("recorded");
        store
            .record(vec![StateChange::Declared { name: name("meow"), path: PathBuf::from("/flags/meow") }])
            .await
            .expect("recorded");
        kept = pause(&store, "meow", "trainer", Some(Duration::from_secs(600)));
        lease_end = kept.lease_expires_at;
        ended = pause(&store, "meow", "", None);
        store.record(vec![StateChange::Paused(kept.clone()), StateChange::Paused(ended.clone())]).await.expect("ok");
        let pause_id = ended.pause_id.clone();
        store.record(vec![StateChange::PauseEnded { adapter: name("meow"), pause_id }]).await.expect("recorded");
        store.record(vec![StateChange::GlobalPause(Some(PauseMode::Wait))]).await.expect("recorded");
        let front = |key: &str, value: &str| {
            StateChange::FrontRecordPut(FrontRecord {
                table: "tinker/samples".into(),
                key: key.into(),
                value: value.into(),
            })
        };
        store.record(vec![front("tk-1", "{\"pending\":1}"), front("tk-2", "{}")]).await.expect("recorded");
        let removed = StateChange::FrontRecordRemoved { table: "tinker/samples".into(), key: "tk-2".into() };
        store.record(vec![front("tk-1", "{\"finished\":1}"), removed]).await.expect("recorded");
    }
    let store = EmbeddedStore::open(dir.path()).expect("reopens");
    let recorded = store.recorded().await.expect("reads");
    assert_eq!(recorded.adapters.len(), 1);
    let meow = &recorded.adapters[0];
    assert_eq!((meow.version, meow.source.path.clone()), (AdapterVersion(2), PathBuf::from("/a/meow/2")));
    assert!(meow.source.confined);
    assert_eq!(meow.declared_path, Some(PathBuf::from("/flags/meow")), "an install keeps the declared path");
    assert_eq!(recorded.pauses.len(), 1, "the ended pause is gone");
    let read = &recorded.pauses[0];
    assert_eq!((&read.pause_id, read.owner.as_str(), read.mode), (&kept.pause_id, "trainer", PauseMode::Keep));
    let millis = |at: Option<SystemTime>| at.and_then(|at| at.duration_since(SystemTime::UNIX_EPOCH).ok());
    let (written, read_back) = (millis(lease_end).expect("lease"), millis(read.lease_expires_at).expect("lease"));
    assert!(written.abs_diff(read_back) < Duration::from_millis(1), "the lease's wall-clock end, to the millisecond");
    assert_eq!(recorded.global_pause, Some(PauseMode::Wait));
    let front = FrontRecord { table: "tinker/samples".into(), key: "tk-1".into(), value: "{\"finished\":1}".into() };
    assert_eq!(recorded.front_records, vec![front], "a front's record replaced, another removed");
    assert_eq!(store.issue_version(&name("meow")).await, Ok(AdapterVersion(3)), "versions continue after a reopen");
    assert_eq!(store.new_pause_id().as_str(), "pause-3", "pause ids continue after a reopen");
}

#[tokio::test]
async fn versions_never_repeat_across_unloads_and_failed_loads_leave_no_gap() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = EmbeddedStore::open(dir.path()).expect("opens");
    let meow = name("meow");
    assert_eq!(store.issue_version(&meow).await, Ok(AdapterVersion(1)));
    store.record(vec![installed("meow", 1)]).await.expect("recorded");
    assert_eq!(store.issue_version(&meow).await, Ok(AdapterVersion(2)));
    store.record(vec![StateChange::VersionReturned { name: meow.clone(), version: AdapterVersion(2) }]).await.ok();
    assert_eq!(store.issue_version(&meow).await, Ok(AdapterVersion(2)), "a failed load's version is given back");
    store.record(vec![StateChange::VersionReturned { name: meow.clone(), version: AdapterVersion(1) }]).await.ok();
    let paused = pause(&store, "meow", "trainer", None);
    store.record(vec![StateChange::Paused(paused), StateChange::Unloaded { name: meow.clone() }]).await.ok();
    let recorded = store.recorded().await.expect("reads");
    assert!(recorded.adapters.is_empty() && recorded.pauses.is_empty(), "an unload takes the pauses too");
    assert_eq!(store.issue_version(&meow).await, Ok(AdapterVersion(3)), "a reload continues the count");
    let orphan = pause(&store, "meow", "late", None);
    store.record(vec![StateChange::Paused(orphan)]).await.ok();
    assert!(store.recorded().await.expect("reads").pauses.is_empty(), "no pause without its adapter");
}

#[tokio::test]
async fn a_directory_in_use_is_refused_with_a_message_naming_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let _first = EmbeddedStore::open(dir.path()).expect("opens");
    let err = EmbeddedStore::open(dir.path()).expect_err("a second store on the same directory");
    let message = err.to_string();
    assert!(message.contains(&dir.path().display().to_string()) && message.contains("another"), "{message}");

    let file = dir.path().join("not-a-dir");
    std::fs::write(&file, "x").expect("write");
    let err = EmbeddedStore::open(&file).expect_err("a file is no state directory");
    assert!(err.to_string().contains("not-a-dir"), "{err}");
}

#[tokio::test]
async fn many_writers_at_once_get_distinct_versions_in_order_of_their_calls() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = Arc::new(EmbeddedStore::open(dir.path()).expect("opens"));
    let meow = name("meow");
    // Queued in this order (the calls are made here, one after the other), committed in whatever batches.
    let issues: Vec<_> = (0..200).map(|_| store.issue_version(&meow)).collect();
    let mut versions = Vec::new();
    for issue in issues {
        versions.push(issue.await.expect("issued").0);
    }
    assert_eq!(versions, (1..=200).collect::<Vec<u64>>());
}

/// The environment variable that makes [`child_process_writing_until_killed`] run: the state directory.
const CRASH_CHILD_DIR: &str = "LORAGATE_STATE_CRASH_CHILD_DIR";

/// Not a test on its own: the child process of [`a_kill_between_any_two_writes_leaves_a_state_the_next_open_accepts`].
/// It issues `meow`'s versions one after the other; each is installed together with a pause numbered after it (the
/// previous one ending in the same batch), and printed once durable.
#[tokio::test]
#[ignore = "the child process of the crash test: it runs until killed"]
async fn child_process_writing_until_killed() {
    let Some(dir) = std::env::var_os(CRASH_CHILD_DIR) else { return };
    let store = EmbeddedStore::open(PathBuf::from(dir)).expect("the child opens the store");
    let meow = name("meow");
    // The pause the last child left, and then each pause this one makes, ends in the batch that makes the next.
    let recorded = store.recorded().await.expect("the child reads the store");
    let mut previous: Vec<PauseId> = recorded.pauses.into_iter().map(|pause| pause.pause_id).collect();
    loop {
        let version = store.issue_version(&meow).await.expect("issued");
        let mut record = pause(&store, "meow", &format!("owner-{}", version.0), None);
        record.pause_id = PauseId::numbered(version.0);
        let mut changes = vec![installed("meow", version.0), StateChange::Paused(record.clone())];
        for pause_id in std::mem::replace(&mut previous, vec![record.pause_id]) {
            changes.push(StateChange::PauseEnded { adapter: meow.clone(), pause_id });
        }
        store.record(changes).await.expect("recorded");
        println!("{}", version.0);
    }
}

#[test]
fn a_kill_between_any_two_writes_leaves_a_state_the_next_open_accepts() {
    let dir = tempfile::tempdir().expect("temp dir");
    let runtime = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
    let mut rng = rand::rng();
    let mut highest_acknowledged = 0;
    for round in 0..6 {
        let mut child = Command::new(std::env::current_exe().expect("the test binary"))
            .args(["--ignored", "--exact", "tests::child_process_writing_until_killed", "--nocapture", "--quiet"])
            .env(CRASH_CHILD_DIR, dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("the child starts");
        let lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        // Kill it after a random number of acknowledged writes (the kill lands anywhere in the next ones).
        let writes_before_kill = rng.random_range(1..40);
        let mut first = None;
        let deadline = Instant::now() + Duration::from_secs(60);
        for line in lines {
            let Ok(version) = line.expect("a line").trim().parse::<u64>() else { continue };
            assert!(Instant::now() < deadline, "the child writes");
            first.get_or_insert(version);
            assert!(version > highest_acknowledged, "round {round}: version {version} was issued twice");
            highest_acknowledged = version;
            if version - first.unwrap_or(version) + 1 >= writes_before_kill {
                break;
            }
        }
        std::thread::sleep(Duration::from_micros(rng.random_range(0..3000)));
        child.kill().expect("SIGKILL");
        let _ = child.wait();
        assert!(first.is_some(), "round {round}: the child acknowledged nothing");

        let store = EmbeddedStore::open(dir.path()).expect("the next open accepts the file");
        let recorded = runtime.block_on(store.recorded()).expect("the records read");
        let meow = &recorded.adapters[0];
        assert!(meow.version.0 >= highest_acknowledged, "round {round}: an acknowledged install was lost");
        assert_eq!(meow.source.path, PathBuf::from(format!("/a/meow/{}", meow.version.0)), "install and path atomic");
        let pauses: Vec<u64> = recorded.pauses.iter().filter_map(|pause| pause.pause_id.number()).collect();
        assert_eq!(pauses, [meow.version.0], "round {round}: a batch was applied in part");
        drop(store);
        let db = Database::create(dir.path().join(STATE_FILE)).expect("the file opens");
        let txn = db.begin_read().expect("read");
        let issued = tables::issued(&txn, "meow").expect("issued");
        assert!(issued >= meow.version.0, "round {round}: the installed version {} was never issued", meow.version.0);
        highest_acknowledged = issued;
    }
}

mod heal;
