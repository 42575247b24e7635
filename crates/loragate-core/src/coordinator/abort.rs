//! Aborts by request id, without pausing anything (SGLang's `/abort_request`, vLLM's
//! `/inference/v1/abort_requests`, the worker's `Abort`), in two steps: the cancel, which returns once every
//! adapter's actor cancelled the matching requests ([`Coordinator::request_aborts`]), and the wait for their
//! hand-backs ([`AbortsRequested::handed_back`]). A front that answers once the cancel was requested (as SGLang does)
//! stops after the first; one that answers once the requests were handed back takes both
//! ([`Coordinator::abort_requests`]).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;

use super::Coordinator;
use crate::adapter::{AdapterHandle, PendingHandBacks};
use crate::contract::{AbortReport, RequestId};

/// Aborts whose cancel was requested: what to wait on for their hand-backs. Dropping it waits for nothing; the
/// cancelled requests still end aborted.
#[must_use = "dropping it does not wait for the hand-backs (nor warn about those that never come)"]
pub struct AbortsRequested {
    pending: Vec<(AdapterHandle, PendingHandBacks)>,
    ack_timeout: Duration,
}

impl AbortsRequested {
    /// Waits until every cancelled request was handed back, or the coordinator's acknowledgement timeout passes
    /// (those are then listed as unacknowledged, and logged once per adapter).
    pub async fn handed_back(self) -> AbortReport {
        let ack_timeout = self.ack_timeout;
        let reports = join_all(self.pending.into_iter().map(|(adapter, pending)| async move {
            let report = pending.wait(ack_timeout).await;
            report.warn_if_unacknowledged(adapter.key(), "abort by request id");
            report
        }))
        .await;
        let mut total = AbortReport::default();
        reports.into_iter().for_each(|report| total.absorb(report));
        total
    }
}

impl Coordinator {
    /// Aborts the admitted requests with these ids, whatever their adapter, without pausing anything; returns when
    /// each was handed back. Requests a pause keeps are not reached.
    pub async fn abort_requests(&self, ids: &[RequestId]) -> AbortReport {
        self.request_aborts(ids).await.handed_back().await
    }

    /// Aborts every admitted request of every adapter without pausing anything (SGLang's `abort_all`); returns when
    /// each was handed back.
    pub async fn abort_all_requests(&self) -> AbortReport {
        self.request_abort_all().await.handed_back().await
    }

    /// Cancels the admitted requests with these ids, whatever their adapter, without pausing anything; returns once
    /// every adapter cancelled its matching requests, before they are handed back. An id no adapter holds cancels
    /// nothing.
    pub async fn request_aborts(&self, ids: &[RequestId]) -> AbortsRequested {
        let ids: Arc<HashSet<RequestId>> = Arc::new(ids.iter().cloned().collect());
        self.cancel_each(Some(ids)).await
    }

    /// Cancels every admitted request of every adapter without pausing anything; returns once every adapter
    /// cancelled them, before they are handed back.
    pub async fn request_abort_all(&self) -> AbortsRequested {
        self.cancel_each(None).await
    }

    async fn cancel_each(&self, ids: Option<Arc<HashSet<RequestId>>>) -> AbortsRequested {
        let handles: Vec<AdapterHandle> = self.inner.published.iter().map(|entry| entry.value().clone()).collect();
        let cancelled = join_all(handles.into_iter().map(|handle| {
            let ids = ids.clone();
            async move {
                let pending = handle.cancel_requests(ids).await;
                pending.ok().map(|pending| (handle, pending))
            }
        }))
        .await;
        AbortsRequested {
            pending: cancelled.into_iter().flatten().collect(),
            ack_timeout: self.inner.config.abort_ack_timeout,
        }
    }
}
