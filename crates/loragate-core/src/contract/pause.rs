//! The words of a pause: what a pause does (its mode, its KV policy), who holds it, its id, and a validated pause
//! request. The pauses themselves (the book that holds an adapter's gate closed) live with the adapter actor.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::error::{CoreError, Field};

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
    /// One version another replica pushed, held at this replica's gate while its files are fetched (each fetch holds
    /// its own pause; never recorded).
    Fetch(u64),
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

    /// A fresh owner for one fetch of another replica's pushed version.
    pub(crate) fn new_fetch() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        Self::Fetch(NEXT.fetch_add(1, Ordering::Relaxed))
    }
}

impl fmt::Display for PauseOwner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Named(name) => f.write_str(name),
            Self::Global => f.write_str("(global)"),
            Self::Swap(n) => write!(f, "(swap {n})"),
            Self::Fetch(n) => write!(f, "(fetch {n})"),
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
            return Err(CoreError::invalid(Field::LeaseS, format!("must be finite and >= 0, got {lease_s:?}")));
        }
        if lease_s > MAX_LEASE.as_secs_f64() {
            return Err(CoreError::invalid(
                Field::LeaseS,
                format!("is {lease_s:?} s, the longest lease is {} s (24 h)", MAX_LEASE.as_secs()),
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

/// The longest `WaitLoraUnpaused` timeout honoured; longer ones are shortened to it.
pub const MAX_WAIT_TIMEOUT: Duration = Duration::from_secs(24 * 60 * 60);

/// Parses a `timeout_s`: finite and non-negative; values over [`MAX_WAIT_TIMEOUT`] are shortened to it.
pub fn parse_timeout_s(raw: f64) -> Result<Duration, CoreError> {
    if !raw.is_finite() || raw < 0.0 {
        return Err(CoreError::invalid(Field::TimeoutS, format!("must be finite and >= 0, got {raw:?}")));
    }
    Ok(Duration::from_secs_f64(raw.min(MAX_WAIT_TIMEOUT.as_secs_f64())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refused_numbers_are_printed_readably() {
        let err = PauseRequest::parse(PauseMode::Abort, "x", 1e300).expect_err("too long");
        assert!(err.to_string().contains("is 1e300 s"), "{err}");
        let err = parse_timeout_s(-1e300).expect_err("negative");
        assert!(err.to_string().ends_with("got -1e300"), "{err}");
        let err = PauseRequest::parse(PauseMode::Abort, "x", -2.5).expect_err("negative");
        assert!(err.to_string().ends_with("got -2.5"), "{err}");
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
