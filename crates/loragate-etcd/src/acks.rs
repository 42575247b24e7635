//! Waiting, on the pausing replica, until every other live replica applied its pause: each acknowledges under
//! `acks/PAUSE_ID/REPLICA` with the revision of the pause write it applied and what it handed back. A replica whose
//! lease expires meanwhile (it died) stops counting. The answer sums what they handed back; a live replica that did
//! not acknowledge within the store's acknowledgement timeout fails the pause (the caller withdraws it).
//!
//! No etcd call is made for the wait: the replica's one watch over the prefix ([`crate::follower`]), open before the
//! pause is written, delivers the pause's own write, every acknowledgement and every registration that ends, in
//! revision order. [`Acks`] keeps what that watch showed: the registered replicas as of the revision applied so far
//! and, for each pause this replica wrote, who must still acknowledge it. The replicas that must acknowledge a pause
//! are the ones registered at its write's revision (read from the watch as it applies that write, so exactly those),
//! this one excepted.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use loragate_core::state::StateError;
use loragate_core::{AbortReport, PauseId};
use parking_lot::Mutex;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::keys::StoredAck;

/// What the watch showed about registrations and the acknowledgements of this replica's pauses.
pub(crate) struct Acks {
    replica_id: String,
    ack_timeout: Duration,
    seen: Mutex<Seen>,
    /// Bumped after every change of `seen` a waiter may care about.
    changed: watch::Sender<u64>,
}

struct Seen {
    /// The last revision the watch applied.
    applied: i64,
    /// The registered replicas as of `applied` (this one included).
    registered: BTreeSet<String>,
    /// Each pause this replica wrote (by id and the revision of the write) whose wait has not ended.
    awaited: HashMap<(PauseId, i64), Awaited>,
    /// How often the watch broke, or lost history (every wait then fails), and why it last did.
    breaks: u64,
    last_break: Option<StateError>,
}

/// One pause written by this replica, as its acknowledgements come in.
struct Awaited {
    /// Registered when the pause was written, not acknowledged yet, still registered.
    waiting: BTreeSet<String>,
    /// What those that acknowledged handed back.
    report: AbortReport,
    /// When the watch applied the write (an entry whose waiter never came is dropped after a while).
    seen_at: Instant,
}

impl Acks {
    /// Nothing seen yet (see [`Acks::read_at`]).
    pub(crate) fn new(replica_id: String, ack_timeout: Duration) -> Self {
        let seen =
            Seen { applied: 0, registered: BTreeSet::new(), awaited: HashMap::new(), breaks: 0, last_break: None };
        Self { replica_id, ack_timeout, seen: Mutex::new(seen), changed: watch::Sender::new(0) }
    }

    /// The state was read at `revision` (the watch follows from the next one): `registered` were the registered
    /// replicas then.
    pub(crate) fn read_at(&self, revision: i64, registered: BTreeSet<String>) {
        let mut seen = self.seen.lock();
        seen.applied = revision;
        seen.registered = registered;
    }

    /// The watch applied a registration (new, renewed under a new lease, or announced again).
    pub(crate) fn registered(&self, replica: String) {
        self.seen.lock().registered.insert(replica);
    }

    /// The watch applied the end of a registration (a lease ran out or was revoked): the replica stops counting.
    pub(crate) fn deregistered(&self, replica: &str) {
        let mut guard = self.seen.lock();
        let seen = &mut *guard;
        seen.registered.remove(replica);
        for ((pause_id, _), awaited) in &mut seen.awaited {
            if awaited.waiting.remove(replica) {
                tracing::warn!(%pause_id, %replica, "a replica's lease expired before it applied the pause");
            }
        }
    }

    /// The watch applied this replica's own write of `pause_id` at `revision`: every other replica registered now
    /// must acknowledge it.
    pub(crate) fn pause_written(&self, pause_id: PauseId, revision: i64) {
        let mut seen = self.seen.lock();
        // A waiter that went away (its caller was cancelled) never takes its entry: dropped once long past its wait.
        let forgotten = self.ack_timeout * 2;
        seen.awaited.retain(|_, awaited| awaited.seen_at.elapsed() < forgotten);
        let waiting = seen.registered.iter().filter(|replica| **replica != self.replica_id).cloned().collect();
        let awaited = Awaited { waiting, report: AbortReport::default(), seen_at: Instant::now() };
        seen.awaited.insert((pause_id, revision), awaited);
    }

    /// The watch applied `replica`'s acknowledgement of `pause_id`.
    pub(crate) fn acknowledged(&self, pause_id: &PauseId, replica: &str, ack: &StoredAck) {
        let mut seen = self.seen.lock();
        for ((awaited_id, written_at), awaited) in &mut seen.awaited {
            if awaited_id == pause_id && ack.revision >= *written_at && awaited.waiting.remove(replica) {
                ack.add_to(&mut awaited.report);
            }
        }
    }

    /// The watch applied everything up to `revision`: wakes the waiters.
    pub(crate) fn applied(&self, revision: i64) {
        let mut seen = self.seen.lock();
        seen.applied = seen.applied.max(revision);
        drop(seen);
        self.changed.send_modify(|n| *n += 1);
    }

    /// The watch broke (etcd unreachable): every wait now in progress fails with `err`, as it could not see the
    /// acknowledgements come.
    pub(crate) fn broke(&self, err: &StateError) {
        let mut seen = self.seen.lock();
        seen.breaks += 1;
        seen.last_break = Some(err.clone());
        drop(seen);
        self.changed.send_modify(|n| *n += 1);
    }

    /// The watch lost history (etcd compacted it) and the state was read again at `revision`: every wait now in
    /// progress fails, and registrations start again from `registered`.
    pub(crate) fn resynced(&self, revision: i64, registered: BTreeSet<String>) {
        self.read_at(revision, registered);
        let mut seen = self.seen.lock();
        seen.awaited.clear();
        seen.breaks += 1;
        seen.last_break = Some(StateError::Failed("etcd compacted the acknowledgements of pauses away".into()));
        drop(seen);
        self.changed.send_modify(|n| *n += 1);
    }

    /// Waits for the acknowledgements of this replica's pause `pause_id`, written at `revision`.
    pub(crate) async fn wait(&self, pause_id: &PauseId, revision: i64) -> Result<AbortReport, StateError> {
        let deadline = Instant::now() + self.ack_timeout;
        let key = (pause_id.clone(), revision);
        let _taken = Taken { acks: self, key: &key };
        // Read before subscribing: a break after this point is either counted here or wakes the loop below.
        let breaks_before = self.seen.lock().breaks;
        let mut changes = self.changed.subscribe();
        loop {
            {
                let mut guard = self.seen.lock();
                let seen = &mut *guard;
                if seen.breaks != breaks_before {
                    let err = seen.last_break.clone();
                    return Err(err.unwrap_or_else(|| StateError::Unavailable("etcd: the watch broke".into())));
                }
                match seen.awaited.get_mut(&key) {
                    Some(awaited) if awaited.waiting.is_empty() => return Ok(std::mem::take(&mut awaited.report)),
                    Some(_) => {}
                    None if seen.applied >= revision => {
                        return Err(StateError::Failed(format!(
                            "etcd: this replica's watch passed pause {pause_id}'s write without seeing it"
                        )));
                    }
                    None => {}
                }
            }
            if tokio::time::timeout_at(deadline, changes.changed()).await.is_err() {
                return Err(self.timed_out(pause_id, &key));
            }
        }
    }

    fn timed_out(&self, pause_id: &PauseId, key: &(PauseId, i64)) -> StateError {
        let seen = self.seen.lock();
        let Some(awaited) = seen.awaited.get(key) else {
            return StateError::Unavailable(format!(
                "etcd: this replica's watch did not deliver pause {pause_id}'s write within {:?}",
                self.ack_timeout
            ));
        };
        StateError::Unavailable(format!(
            "etcd: replicas {} did not apply pause {pause_id} within {:?}",
            awaited.waiting.iter().cloned().collect::<Vec<_>>().join(", "),
            self.ack_timeout
        ))
    }
}

/// Drops a wait's entry when the wait ends, however it ends.
struct Taken<'a> {
    acks: &'a Acks,
    key: &'a (PauseId, i64),
}

impl Drop for Taken<'_> {
    fn drop(&mut self) {
        self.acks.seen.lock().awaited.remove(self.key);
    }
}

#[cfg(test)]
mod tests;
