//! The pauses that hold an adapter's gate closed. Several may hold one adapter at once (two controllers, a global
//! pause and a swap); the gate is closed while any is live and reopens when the last is released. A pause has an
//! owner (the same owner pausing again renews its pause instead of adding one), the mode it was made in, and an
//! optional lease after which it ends by itself.
//!
//! The book lives in the adapter's durable cell, so a restarted actor keeps every pause; only the actor writes it.
//! A lease's timer is owned by its pause record: releasing or renewing the pause drops (aborts) the old timer, so
//! nothing is left to remember.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::contract::{PauseId, PauseInfo, PauseMode, PauseOwner, PauseRequest};
use tokio::time::Instant;
use tokio_util::task::AbortOnDropHandle;

/// One live pause.
struct Pause {
    id: PauseId,
    mode: PauseMode,
    lease: Option<Lease>,
}

/// A pause's lease: when it ends, and the timer that ends it (aborted when the lease is dropped).
struct Lease {
    expires_at: Instant,
    _timer: AbortOnDropHandle<()>,
}

/// What [`PauseBook::pause`] did.
pub(crate) struct Paused {
    /// The pause that now holds the gate.
    pub(crate) pause_id: PauseId,
    /// Whether this call created it (rather than renewing the owner's pause).
    pub(crate) created: bool,
}

/// The live pauses of one adapter, by owner.
#[derive(Default)]
pub(crate) struct PauseBook {
    by_owner: BTreeMap<PauseOwner, Pause>,
}

impl PauseBook {
    /// Whether any pause holds the gate.
    pub(crate) fn is_paused(&self) -> bool {
        !self.by_owner.is_empty()
    }

    /// Adds `request`'s pause, or renews its owner's (new mode, new lease). A new pause's id comes from `new_id`;
    /// `arm` starts the timer of a lease that expires at the given instant for the given pause.
    pub(crate) fn pause(
        &mut self,
        request: &PauseRequest,
        new_id: impl FnOnce() -> PauseId,
        arm: impl FnOnce(PauseId, Instant) -> AbortOnDropHandle<()>,
    ) -> Paused {
        self.hold(request.owner.clone(), new_id, request.mode, request.lease, arm)
    }

    /// Puts back a pause made earlier (recorded before a restart, or made by another coordinator): under its own id,
    /// replacing its owner's pause if there is one, with `lease_left` of its lease.
    pub(crate) fn adopt(
        &mut self,
        owner: PauseOwner,
        id: PauseId,
        mode: PauseMode,
        lease_left: Option<Duration>,
        arm: impl FnOnce(PauseId, Instant) -> AbortOnDropHandle<()>,
    ) -> Paused {
        if self.by_owner.get(&owner).is_some_and(|pause| pause.id != id) {
            self.by_owner.remove(&owner);
        }
        self.hold(owner, || id, mode, lease_left, arm)
    }

    fn hold(
        &mut self,
        owner: PauseOwner,
        new_id: impl FnOnce() -> PauseId,
        mode: PauseMode,
        lease: Option<Duration>,
        arm: impl FnOnce(PauseId, Instant) -> AbortOnDropHandle<()>,
    ) -> Paused {
        let created = !self.by_owner.contains_key(&owner);
        let pause = self.by_owner.entry(owner).or_insert_with(|| Pause { id: new_id(), mode, lease: None });
        pause.mode = mode;
        pause.lease = lease.map(|lease| {
            let expires_at = Instant::now() + lease;
            Lease { expires_at, _timer: arm(pause.id.clone(), expires_at) }
        });
        Paused { pause_id: pause.id.clone(), created }
    }

    /// Releases the pause `id` (or every pause for `None`); returns the owners and ids of the pauses released.
    pub(crate) fn release(&mut self, id: Option<&PauseId>) -> Vec<(PauseOwner, PauseId)> {
        let released = std::mem::take(&mut self.by_owner);
        let (gone, kept) = released.into_iter().partition(|(_, pause)| id.is_none_or(|id| &pause.id == id));
        self.by_owner = kept;
        gone.into_iter().map(|(owner, pause): (PauseOwner, Pause)| (owner, pause.id)).collect()
    }

    /// The live pause `owner` holds, if any.
    pub(crate) fn of_owner(&self, owner: &PauseOwner) -> Option<PauseId> {
        self.by_owner.get(owner).map(|pause| pause.id.clone())
    }

    /// Releases the pause `id` if its lease (the one that expires at `expires_at`, not a renewal) has run out.
    /// Returns its owner when it did.
    pub(crate) fn expire(&mut self, id: &PauseId, expires_at: Instant) -> Option<PauseOwner> {
        let owner = self.by_owner.iter().find_map(|(owner, pause)| {
            let lease = pause.lease.as_ref()?;
            (&pause.id == id && lease.expires_at == expires_at && Instant::now() >= expires_at).then(|| owner.clone())
        })?;
        self.by_owner.remove(&owner);
        Some(owner)
    }

    /// The live pauses, ordered by owner.
    pub(crate) fn snapshot(&self) -> Vec<PauseInfo> {
        let now = Instant::now();
        self.by_owner
            .iter()
            .map(|(owner, pause)| PauseInfo {
                pause_id: pause.id.clone(),
                owner: owner.clone(),
                mode: pause.mode,
                lease_left: pause.lease.as_ref().map(|lease| lease.expires_at.saturating_duration_since(now)),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_timer(_: PauseId, _: Instant) -> AbortOnDropHandle<()> {
        AbortOnDropHandle::new(tokio::spawn(async {}))
    }

    /// Ids `pause-1`, `pause-2`, … (what a store gives out).
    fn ids() -> impl FnMut() -> PauseId {
        let mut last = 0;
        move || {
            last += 1;
            PauseId::numbered(last)
        }
    }

    fn by(owner: &str, mode: PauseMode, lease_s: f64) -> PauseRequest {
        PauseRequest::parse(mode, owner, lease_s).expect("valid pause")
    }

    #[tokio::test]
    async fn the_same_owner_renews_and_the_gate_reopens_with_the_last_release() {
        let (mut book, mut next_id) = (PauseBook::default(), ids());
        let first = book.pause(&by("trainer", PauseMode::Abort, 0.0), &mut next_id, no_timer);
        let again = book.pause(&by("trainer", PauseMode::Keep, 0.0), &mut next_id, no_timer);
        assert!(first.created && !again.created);
        assert_eq!(first.pause_id, again.pause_id, "a renewal keeps the pause's id");
        assert_eq!(book.snapshot()[0].mode, PauseMode::Keep, "the latest call's mode is listed");

        let other = book.pause(&by("evaluator", PauseMode::Wait, 0.0), &mut next_id, no_timer);
        assert_ne!(other.pause_id, first.pause_id);
        assert_eq!(
            book.release(Some(&first.pause_id)),
            [(PauseOwner::Named("trainer".into()), first.pause_id.clone())]
        );
        assert!(book.is_paused(), "the evaluator still holds the gate");
        assert!(book.release(Some(&first.pause_id)).is_empty(), "releasing twice releases nothing");
        assert_eq!(book.release(Some(&other.pause_id)).len(), 1);
        assert!(!book.is_paused());
    }

    #[tokio::test]
    async fn anonymous_pauses_are_one_pause_and_release_all_clears_every_owner() {
        let (mut book, mut next_id) = (PauseBook::default(), ids());
        book.pause(&PauseRequest::new(PauseMode::Abort), &mut next_id, no_timer);
        book.pause(&PauseRequest::new(PauseMode::Abort), &mut next_id, no_timer);
        book.pause(&by("a", PauseMode::Wait, 0.0), &mut next_id, no_timer);
        assert_eq!(book.snapshot().len(), 2);
        assert_eq!(book.release(None).len(), 2);
        assert!(!book.is_paused());
    }

    #[tokio::test(start_paused = true)]
    async fn only_the_current_lease_expires() {
        let (mut book, mut next_id) = (PauseBook::default(), ids());
        let mut armed = Vec::new();
        let paused = book.pause(&by("t", PauseMode::Abort, 5.0), &mut next_id, |id, at| {
            armed.push((id.clone(), at));
            no_timer(id, at)
        });
        let (id, first_expiry) = armed.pop().expect("a lease arms a timer");
        assert_eq!(id, paused.pause_id);
        tokio::time::advance(Duration::from_secs(3)).await;
        book.pause(&by("t", PauseMode::Abort, 5.0), &mut next_id, |id, at| {
            armed.push((id.clone(), at));
            no_timer(id, at)
        });
        tokio::time::advance(Duration::from_secs(3)).await;
        assert_eq!(book.expire(&id, first_expiry), None, "the renewed lease has not run out");
        let (_, renewed_expiry) = armed.pop().expect("the renewal arms a timer");
        assert_eq!(book.expire(&id, renewed_expiry), None, "not yet");
        tokio::time::advance(Duration::from_secs(3)).await;
        assert_eq!(book.expire(&id, renewed_expiry), Some(PauseOwner::Named("t".into())));
        assert!(!book.is_paused());
        assert!(book.snapshot().is_empty());
    }

    #[tokio::test]
    async fn an_adopted_pause_keeps_its_id_and_replaces_its_owners_pause() {
        let (mut book, mut next_id) = (PauseBook::default(), ids());
        let trainer = PauseOwner::Named("trainer".into());
        let adopted = book.adopt(trainer.clone(), PauseId::numbered(41), PauseMode::Keep, None, no_timer);
        assert!(adopted.created);
        assert_eq!(adopted.pause_id.as_str(), "pause-41");
        let renewed = book.pause(&by("trainer", PauseMode::Abort, 0.0), &mut next_id, no_timer);
        assert_eq!(renewed.pause_id, adopted.pause_id, "the owner renews the adopted pause");
        let replaced =
            book.adopt(trainer, PauseId::numbered(42), PauseMode::Wait, Some(Duration::from_secs(9)), no_timer);
        assert_eq!(replaced.pause_id.as_str(), "pause-42");
        let listed = book.snapshot();
        assert_eq!(listed.len(), 1, "one pause per owner");
        assert_eq!((listed[0].mode, listed[0].lease_left.is_some()), (PauseMode::Wait, true));
        assert_eq!(PauseId::numbered(42).number(), Some(42));
        assert_eq!(PauseId::parse("mine").ok().flatten().and_then(|id| id.number()), None);
    }
}
