//! The pauses that hold an adapter's gate closed. Several may hold one adapter at once (two controllers, a global
//! pause and a swap); the gate is closed while any is live and reopens when the last is released. A pause has an
//! owner (the same owner pausing again renews its pause instead of adding one), the mode it was made in, and an
//! optional lease after which it ends by itself.
//!
//! The book lives in the adapter's durable cell, so a restarted actor keeps every pause; only the actor writes it.
//! A lease's timer is owned by its pause record: releasing or renewing the pause drops (aborts) the old timer, so
//! nothing is left to remember.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::task::AbortOnDropHandle;

use crate::error::{CoreError, Field};

/// The longest lease accepted; a longer one is refused.
pub const MAX_LEASE: Duration = Duration::from_secs(24 * 60 * 60);

/// The longest pause owner accepted, in bytes.
pub const MAX_OWNER_LEN: usize = 128;

/// What a pause does to the requests already admitted when it closes the gate.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum PauseMode {
    /// Aborts them: each is handed back with `FINISH_REASON_ABORT` and the tokens it produced.
    #[default]
    Abort,
    /// Lets them run to their end on the current weights; the pause answers once nothing is in flight.
    Wait,
    /// Stops them in the engine and keeps them in the core with their tokens; each continues by itself, as
    /// `prompt + its tokens` with the remaining budget, on the weights current when the adapter reopens. Their
    /// callers see only a delay.
    Keep,
}

impl PauseMode {
    /// The lowercase name used on HTTP and in listings.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Abort => "abort",
            Self::Wait => "wait",
            Self::Keep => "keep",
        }
    }

    /// Parses the HTTP spelling (`abort`, `wait`, `keep`; SGLang's `retract` and `in_place` keep).
    pub fn parse(raw: &str) -> Result<Self, CoreError> {
        match raw {
            "abort" => Ok(Self::Abort),
            "wait" => Ok(Self::Wait),
            "keep" | "retract" | "in_place" => Ok(Self::Keep),
            other => Err(CoreError::invalid(
                Field::Mode,
                format!("must be one of abort, wait, keep (or SGLang's retract, in_place), got {other:?}"),
            )),
        }
    }
}

impl fmt::Display for PauseMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a keep-mode pause does with the keys and values (the KV cache) of the sequences it keeps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum KvPolicy {
    /// Drops them: each kept sequence is prefilled again as `prompt + its tokens` under the weights current when
    /// the adapter reopens (today's behaviour, and what every mode other than keep applies).
    #[default]
    Recompute,
    /// Parks each kept sequence in the engine with its keys and values; on resume it decodes on under the new
    /// weights from its next token, with no prefill. Its later tokens attend to keys and values of the older
    /// version ([`crate::Segment::kv_version`]). Applied only by an engine that can park
    /// ([`crate::Engine::can_park`]).
    Reuse,
}

impl KvPolicy {
    /// The lowercase name used on HTTP.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Recompute => "recompute",
            Self::Reuse => "reuse",
        }
    }

    /// Parses the HTTP spelling (`recompute`, `reuse`).
    pub fn parse(raw: &str) -> Result<Self, CoreError> {
        match raw {
            "recompute" => Ok(Self::Recompute),
            "reuse" => Ok(Self::Reuse),
            other => {
                Err(CoreError::invalid(Field::KvPolicy, format!("must be one of recompute, reuse, got {other:?}")))
            }
        }
    }

    /// The policy a pause in `mode` applies when `self` was asked for, on an engine that can park or not: REUSE
    /// only for keep mode on an engine that can park, RECOMPUTE otherwise.
    pub fn applied(self, mode: PauseMode, engine_can_park: bool) -> Self {
        match (self, mode, engine_can_park) {
            (Self::Reuse, PauseMode::Keep, true) => Self::Reuse,
            _ => Self::Recompute,
        }
    }
}

impl fmt::Display for KvPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Who holds a pause. The same owner pausing again renews its pause rather than adding a second one.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PauseOwner {
    /// A named controller (`owner` on the wire); the empty name is the anonymous controller, so repeated pauses
    /// without an owner stay one pause, as before owners existed.
    Named(Arc<str>),
    /// The global pause of vLLM's `/pause` and SGLang's `/pause_generation`, applied to every adapter.
    Global,
    /// One `SwapLoraAdapter` call (each swap holds its own pause).
    Swap(u64),
}

impl PauseOwner {
    /// Parses a wire `owner`: at most [`MAX_OWNER_LEN`] bytes, no control characters; empty is the anonymous owner.
    pub fn named(raw: &str) -> Result<Self, CoreError> {
        if raw.len() > MAX_OWNER_LEN {
            return Err(CoreError::invalid(
                Field::Owner,
                format!("is {} bytes long, the limit is {MAX_OWNER_LEN}", raw.len()),
            ));
        }
        if raw.chars().any(char::is_control) {
            return Err(CoreError::invalid(Field::Owner, "must not contain control characters"));
        }
        Ok(Self::Named(raw.into()))
    }

    /// A fresh owner for one swap.
    pub(crate) fn new_swap() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        Self::Swap(NEXT.fetch_add(1, Ordering::Relaxed))
    }
}

impl fmt::Display for PauseOwner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Named(name) => f.write_str(name),
            Self::Global => f.write_str("(global)"),
            Self::Swap(n) => write!(f, "(swap {n})"),
        }
    }
}

/// A validated pause request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PauseRequest {
    /// What happens to admitted requests.
    pub mode: PauseMode,
    /// Who pauses.
    pub owner: PauseOwner,
    /// After how long the pause ends by itself; `None` holds it until released.
    pub lease: Option<Duration>,
    /// What a keep-mode pause does with the kept sequences' keys and values (the coordinator replaces what was
    /// asked for with what it applies, see [`KvPolicy::applied`]).
    pub kv_policy: KvPolicy,
}

impl PauseRequest {
    /// An anonymous pause in `mode` without a lease (what `AbortLoraRequests` did before modes existed, in abort).
    pub fn new(mode: PauseMode) -> Self {
        Self { mode, owner: PauseOwner::Named("".into()), lease: None, kv_policy: KvPolicy::Recompute }
    }

    /// The same request with the KV policy `kv_policy`.
    pub fn with_kv_policy(self, kv_policy: KvPolicy) -> Self {
        Self { kv_policy, ..self }
    }

    /// Parses the wire fields: `owner` (see [`PauseOwner::named`]) and `lease_s` (finite, from 0 to [`MAX_LEASE`];
    /// 0 means no lease; a longer one is refused, naming `lease_s`, rather than silently shortened).
    pub fn parse(mode: PauseMode, owner: &str, lease_s: f64) -> Result<Self, CoreError> {
        let owner = PauseOwner::named(owner)?;
        if !lease_s.is_finite() || lease_s < 0.0 {
            return Err(CoreError::invalid(Field::LeaseS, format!("must be finite and >= 0, got {lease_s}")));
        }
        if lease_s > MAX_LEASE.as_secs_f64() {
            return Err(CoreError::invalid(
                Field::LeaseS,
                format!("is {lease_s} s, the longest lease is {} s (24 h)", MAX_LEASE.as_secs()),
            ));
        }
        let lease = (lease_s > 0.0).then(|| Duration::from_secs_f64(lease_s));
        Ok(Self { mode, owner, lease, kv_policy: KvPolicy::Recompute })
    }
}

/// A pause's id, unique within the server: what `ResumeLoraRequests.pause_id` releases.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PauseId(Arc<str>);

impl PauseId {
    /// The id `pause-N`: what stores give out (see [`crate::StateStore::new_pause_id`]).
    pub fn numbered(n: u64) -> Self {
        Self(format!("pause-{n}").into())
    }

    /// `N` of an id `pause-N`; `None` for ids of another shape.
    pub fn number(&self) -> Option<u64> {
        self.0.strip_prefix("pause-")?.parse().ok()
    }

    /// Parses a wire `pause_id`; the empty id means "every pause" and parses to `None`.
    pub fn parse(raw: &str) -> Result<Option<Self>, CoreError> {
        if raw.is_empty() {
            return Ok(None);
        }
        if raw.len() > MAX_OWNER_LEN || raw.chars().any(char::is_control) {
            return Err(CoreError::invalid(Field::PauseId, "is not a pause id this server gave out"));
        }
        Ok(Some(Self(raw.into())))
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for PauseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for PauseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

/// A live pause, as listings report it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PauseInfo {
    /// Its id.
    pub pause_id: PauseId,
    /// Who holds it.
    pub owner: PauseOwner,
    /// The mode of its latest pause call.
    pub mode: PauseMode,
    /// Time left on its lease; `None` without a lease.
    pub lease_left: Option<Duration>,
}

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

    #[test]
    fn bad_owners_leases_and_modes_name_their_field() {
        for (result, field) in [
            (PauseRequest::parse(PauseMode::Abort, "x", -1.0).map(|_| ()), Field::LeaseS),
            (PauseRequest::parse(PauseMode::Abort, "x", f64::NAN).map(|_| ()), Field::LeaseS),
            (PauseRequest::parse(PauseMode::Abort, "x", 1e300).map(|_| ()), Field::LeaseS),
            (PauseRequest::parse(PauseMode::Abort, "x", MAX_LEASE.as_secs_f64() + 1.0).map(|_| ()), Field::LeaseS),
            (PauseRequest::parse(PauseMode::Abort, "bad\n", 0.0).map(|_| ()), Field::Owner),
            (PauseRequest::parse(PauseMode::Abort, &"o".repeat(MAX_OWNER_LEN + 1), 0.0).map(|_| ()), Field::Owner),
            (PauseMode::parse("freeze").map(|_| ()), Field::Mode),
        ] {
            match result {
                Err(CoreError::InvalidArgument { field: got, .. }) => assert_eq!(got, field),
                other => panic!("expected an error on {field}, got {other:?}"),
            }
        }
        assert_eq!(PauseMode::parse("retract").ok(), Some(PauseMode::Keep));
        assert_eq!(PauseMode::parse("in_place").ok(), Some(PauseMode::Keep));
        let longest = PauseRequest::parse(PauseMode::Abort, "", MAX_LEASE.as_secs_f64()).expect("valid");
        assert_eq!(longest.lease, Some(MAX_LEASE), "the maximum itself is accepted");
    }
}
