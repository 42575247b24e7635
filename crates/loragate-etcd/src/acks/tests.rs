//! The wait for a pause's acknowledgements, fed as the watch would feed it (no etcd): who must acknowledge is fixed
//! by the registrations at the write's revision; acknowledgements and ends of registrations may come before or after
//! the waiter starts; a broken watch or a silent replica fails the wait, naming why.

use std::sync::Arc;

use loragate_core::RequestId;

use super::*;

const SELF: &str = "aaaa";
/// Long enough never to run out on a loaded machine in the tests that expect an answer.
const PATIENT: Duration = Duration::from_secs(60);

fn pause(raw: &str) -> PauseId {
    PauseId::parse(raw).expect("valid").expect("an id")
}

fn ack(revision: i64, aborted: &[&str]) -> StoredAck {
    let report = AbortReport {
        aborted: aborted.iter().map(|id| RequestId::parse_or_generate(id).expect("id")).collect(),
        ..AbortReport::default()
    };
    StoredAck::of(revision, &report)
}

fn aborted(report: &AbortReport) -> Vec<String> {
    let mut ids: Vec<String> = report.aborted.iter().map(ToString::to_string).collect();
    ids.sort();
    ids
}

/// Acks for a replica `SELF` whose state was read at revision 10 with `registered` (and itself) registered.
fn acks_with(registered: &[&str], ack_timeout: Duration) -> Arc<Acks> {
    let acks = Acks::new(SELF.into(), ack_timeout);
    let replicas = registered.iter().chain([&SELF]).map(|id| (*id).to_owned()).collect();
    acks.read_at(10, replicas);
    Arc::new(acks)
}

fn spawn_wait(
    acks: &Arc<Acks>,
    id: &PauseId,
    revision: i64,
) -> tokio::task::JoinHandle<Result<AbortReport, StateError>> {
    let (acks, id) = (acks.clone(), id.clone());
    tokio::spawn(async move { acks.wait(&id, revision).await })
}

async fn answer(wait: tokio::task::JoinHandle<Result<AbortReport, StateError>>) -> Result<AbortReport, StateError> {
    tokio::time::timeout(PATIENT, wait).await.expect("answered in time").expect("did not panic")
}

#[tokio::test]
async fn every_other_replica_registered_at_the_write_acknowledges_and_the_answer_sums_them() {
    let acks = acks_with(&["bbbb", "cccc"], PATIENT);
    let id = pause("pause-aaaa-1");
    // Acknowledgements may come before the waiter starts (the write's answer can be slower than the watch).
    acks.pause_written(id.clone(), 11);
    acks.acknowledged(&id, "bbbb", &ack(11, &["b-1", "b-2"]));
    acks.applied(12);
    let wait = spawn_wait(&acks, &id, 11);
    // A replica registered after the write is not waited for; an acknowledgement of an older write of the same id,
    // or of another pause, does not count.
    acks.registered("dddd".into());
    acks.acknowledged(&id, "cccc", &ack(9, &["stale"]));
    acks.acknowledged(&pause("pause-aaaa-2"), "cccc", &ack(11, &["other"]));
    acks.applied(13);
    tokio::task::yield_now().await;
    assert!(!wait.is_finished(), "cccc has not acknowledged this write yet");
    acks.acknowledged(&id, "cccc", &ack(11, &["c-1"]));
    acks.applied(14);
    let report = answer(wait).await.expect("acknowledged by all");
    assert_eq!(aborted(&report), ["b-1", "b-2", "c-1"]);
    assert!(acks.seen.lock().awaited.is_empty(), "the ended wait took its entry");
}

#[tokio::test]
async fn the_waiter_may_start_before_the_watch_delivers_the_write() {
    let acks = acks_with(&["bbbb"], PATIENT);
    let id = pause("pause-aaaa-1");
    let wait = spawn_wait(&acks, &id, 11);
    acks.applied(10);
    tokio::task::yield_now().await;
    assert!(!wait.is_finished());
    acks.pause_written(id.clone(), 11);
    acks.applied(11);
    acks.acknowledged(&id, "bbbb", &ack(11, &["b-1"]));
    acks.applied(12);
    assert_eq!(aborted(&answer(wait).await.expect("acknowledged")), ["b-1"]);
}

#[tokio::test]
async fn a_replica_whose_registration_ends_stops_counting() {
    let acks = acks_with(&["bbbb", "cccc"], PATIENT);
    let id = pause("pause-aaaa-1");
    acks.pause_written(id.clone(), 11);
    acks.applied(11);
    let wait = spawn_wait(&acks, &id, 11);
    acks.acknowledged(&id, "bbbb", &ack(11, &["b-1"]));
    acks.deregistered("cccc");
    acks.applied(13);
    assert_eq!(aborted(&answer(wait).await.expect("cccc is gone")), ["b-1"]);
    // Gone replicas are not waited for by the next pause either.
    let next = pause("pause-aaaa-2");
    acks.pause_written(next.clone(), 14);
    acks.applied(14);
    let wait = spawn_wait(&acks, &next, 14);
    acks.acknowledged(&next, "bbbb", &ack(14, &[]));
    acks.applied(15);
    assert_eq!(answer(wait).await.expect("bbbb acknowledged"), AbortReport::default());
}

#[tokio::test]
async fn alone_a_pause_answers_at_once() {
    let acks = acks_with(&[], PATIENT);
    let id = pause("pause-aaaa-1");
    acks.pause_written(id.clone(), 11);
    acks.applied(11);
    assert_eq!(answer(spawn_wait(&acks, &id, 11)).await.expect("nobody to wait for"), AbortReport::default());
}

#[tokio::test]
async fn a_broken_watch_fails_the_waits_in_progress_naming_etcd() {
    let acks = acks_with(&["bbbb"], PATIENT);
    let id = pause("pause-aaaa-1");
    acks.pause_written(id.clone(), 11);
    acks.applied(11);
    let wait = spawn_wait(&acks, &id, 11);
    tokio::task::yield_now().await;
    // Whether or not the waiter had looked yet, a break after it started fails it.
    while acks.changed.receiver_count() == 0 {
        tokio::task::yield_now().await;
    }
    acks.broke(&StateError::Unavailable("etcd (127.0.0.1:1) watch: connection refused".into()));
    let err = answer(wait).await.expect_err("the watch broke");
    assert!(matches!(&err, StateError::Unavailable(reason) if reason.contains("etcd")), "{err}");
}

#[tokio::test]
async fn a_compaction_fails_the_waits_in_progress_and_registrations_start_again_from_the_read() {
    let acks = acks_with(&["bbbb"], PATIENT);
    let id = pause("pause-aaaa-1");
    acks.pause_written(id.clone(), 11);
    acks.applied(11);
    let wait = spawn_wait(&acks, &id, 11);
    while acks.changed.receiver_count() == 0 {
        tokio::task::yield_now().await;
    }
    acks.resynced(20, [SELF.to_owned(), "cccc".to_owned()].into());
    let err = answer(wait).await.expect_err("history lost");
    assert!(err.to_string().contains("compacted"), "{err}");
    let next = pause("pause-aaaa-2");
    acks.pause_written(next.clone(), 21);
    acks.applied(21);
    let wait = spawn_wait(&acks, &next, 21);
    acks.acknowledged(&next, "cccc", &ack(21, &["c-1"]));
    acks.applied(22);
    assert_eq!(aborted(&answer(wait).await.expect("cccc acknowledged")), ["c-1"]);
}

#[tokio::test]
async fn a_replica_that_never_acknowledges_fails_the_pause_naming_it() {
    let acks = acks_with(&["bbbb", "cccc"], Duration::from_millis(50));
    let id = pause("pause-aaaa-1");
    acks.pause_written(id.clone(), 11);
    acks.acknowledged(&id, "bbbb", &ack(11, &[]));
    acks.applied(12);
    let err = answer(spawn_wait(&acks, &id, 11)).await.expect_err("cccc is silent");
    let reason = err.to_string();
    assert!(matches!(err, StateError::Unavailable(_)), "{reason}");
    assert!(reason.contains("cccc") && !reason.contains("bbbb") && reason.contains("pause-aaaa-1"), "{reason}");
    assert!(acks.seen.lock().awaited.is_empty(), "the failed wait took its entry");
}

#[tokio::test]
async fn a_write_the_watch_passed_without_seeing_fails_at_once() {
    let acks = acks_with(&["bbbb"], PATIENT);
    acks.applied(30);
    let err = answer(spawn_wait(&acks, &pause("pause-aaaa-1"), 25)).await.expect_err("never seen");
    assert!(err.to_string().contains("without seeing it"), "{err}");
}
