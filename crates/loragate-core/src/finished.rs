//! A bounded window of recently finished sampling requests: each one's sequences with their finish reasons and
//! version segments, and who sent it. It answers `GET /v1/requests/{request_id}`, which is how a caller whose client
//! drops loragate's extra fields (an OpenAI SDK, a Tinker SDK) recovers which adapter version produced which tokens.
//!
//! The window keeps the newest [`FINISHED_REQUESTS_KEPT`] requests, whatever their age; an older one is forgotten.
//! A request is recorded when its last sequence ends (finished or aborted); a request that failed is not. Only the
//! key that sent a request may read it back (or the admin key, or anyone when authentication is off).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::SystemTime;

use parking_lot::Mutex;

use crate::auth::Principal;
use crate::contract::{AdapterKey, FinishReason, RequestId, Segment};

/// How many finished requests the window keeps (the newest ones).
pub const FINISHED_REQUESTS_KEPT: usize = 4096;

/// A recently finished sampling request, as [`crate::Coordinator::finished_request`] answers it.
#[derive(Clone, Debug, PartialEq)]
pub struct FinishedRequest {
    /// The request's id (a caller's own, or the one the server made).
    pub request_id: RequestId,
    /// What it sampled from.
    pub adapter: AdapterKey,
    /// Who sent it, if its front said ([`crate::SampleRequest::owned_by`]); `None`: only the admin may read it.
    pub owner: Option<Principal>,
    /// When its last sequence ended.
    pub finished_at: SystemTime,
    /// Its sequences, in order.
    pub sequences: Vec<FinishedSequence>,
}

/// One sequence of a [`FinishedRequest`].
#[derive(Clone, Debug, PartialEq)]
pub struct FinishedSequence {
    /// Why it ended.
    pub finish_reason: FinishReason,
    /// How many tokens it produced (over every attempt, continuations included).
    pub token_count: u32,
    /// Which adapter version produced which of its tokens.
    pub segments: Vec<Segment>,
}

impl FinishedRequest {
    /// Whether `caller` may read this request: the admin, anyone when authentication is off, or the key that sent it.
    pub fn readable_by(&self, caller: &Principal) -> bool {
        match caller {
            Principal::Anyone | Principal::Admin => true,
            other => self.owner.as_ref().is_some_and(|owner| owner.is_same_key(other)),
        }
    }
}

/// The window itself (one per coordinator).
#[derive(Debug)]
pub(crate) struct FinishedRequests {
    capacity: usize,
    newest_last: Mutex<VecDeque<Arc<FinishedRequest>>>,
}

impl Default for FinishedRequests {
    fn default() -> Self {
        Self::with_capacity(FINISHED_REQUESTS_KEPT)
    }
}

impl FinishedRequests {
    /// A window of the newest `capacity` requests.
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        Self { capacity, newest_last: Mutex::new(VecDeque::with_capacity(capacity.min(FINISHED_REQUESTS_KEPT))) }
    }

    /// Records `request`, forgetting the oldest one if the window is full.
    pub(crate) fn record(&self, request: FinishedRequest) {
        if self.capacity == 0 {
            return;
        }
        let mut entries = self.newest_last.lock();
        if entries.len() == self.capacity {
            entries.pop_front();
        }
        entries.push_back(Arc::new(request));
    }

    /// The newest recorded request with id `id` (a caller may reuse an id; the latest one answers).
    pub(crate) fn find(&self, id: &RequestId) -> Option<Arc<FinishedRequest>> {
        self.newest_last.lock().iter().rev().find(|request| &request.request_id == id).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::{Keyring, TenantKeys};

    /// Two tenants with the same grant under different keys.
    fn two_tenants() -> (Principal, Principal) {
        let tenants = TenantKeys::parse(r#"{"k-a": {"adapters": ["meow"]}, "k-b": {"adapters": ["meow"]}}"#);
        let keyring = Keyring::new(None, None, tenants.expect("valid tenants")).expect("keys");
        let principal = |key| keyring.authenticate(Some(key)).expect("a tenant key");
        (principal("k-a"), principal("k-b"))
    }

    fn request(id: &str, owner: Option<Principal>) -> FinishedRequest {
        FinishedRequest {
            request_id: RequestId::parse_or_generate(id).expect("valid id"),
            adapter: AdapterKey::Base,
            owner,
            finished_at: SystemTime::now(),
            sequences: Vec::new(),
        }
    }

    fn id(raw: &str) -> RequestId {
        RequestId::parse_or_generate(raw).expect("valid id")
    }

    #[test]
    fn the_window_keeps_the_newest_and_answers_the_latest_of_a_reused_id() {
        let window = FinishedRequests::with_capacity(3);
        for raw in ["a", "b", "c", "d"] {
            window.record(request(raw, None));
        }
        assert!(window.find(&id("a")).is_none(), "the oldest is forgotten past the capacity");
        assert!(["b", "c", "d"].iter().all(|raw| window.find(&id(raw)).is_some()));
        let mut again = request("c", None);
        again.adapter = AdapterKey::Lora(crate::AdapterName::parse("meow").expect("valid name"));
        window.record(again.clone());
        assert_eq!(window.find(&id("c")).as_deref(), Some(&again));
        assert!(window.find(&id("b")).is_none(), "recording a reused id still counts against the capacity");
    }

    #[test]
    fn only_the_sender_the_admin_or_anyone_without_auth_may_read() {
        let (tenant, other) = two_tenants();
        let sent = request("r", Some(tenant.clone()));
        assert!(sent.readable_by(&tenant) && sent.readable_by(&Principal::Admin));
        assert!(sent.readable_by(&Principal::Anyone), "authentication off: everyone is Anyone");
        assert!(!sent.readable_by(&other), "an equal grant under another key is another tenant");
        assert!(!sent.readable_by(&Principal::Sampler));
        let unowned = request("r", None);
        assert!(!unowned.readable_by(&Principal::Sampler) && unowned.readable_by(&Principal::Admin));
    }
}
