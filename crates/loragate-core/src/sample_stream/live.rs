//! The count of live sampling requests, so shutdown can wait for them: each request holds a [`LiveRequest`] from its
//! arrival until its stream ends.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::Notify;

/// Counts sampling requests between arrival and their stream's end, so shutdown can wait for them.
#[derive(Default)]
pub(crate) struct LiveRequests {
    count: AtomicUsize,
    idle: Notify,
}

impl LiveRequests {
    pub(crate) fn enter(this: &Arc<Self>) -> LiveRequest {
        this.count.fetch_add(1, Ordering::AcqRel);
        LiveRequest(this.clone())
    }

    pub(crate) async fn all_done(&self) {
        loop {
            let idle = self.idle.notified();
            if self.count.load(Ordering::Acquire) == 0 {
                return;
            }
            idle.await;
        }
    }
}

/// One live sampling request (see [`LiveRequests`]).
pub(crate) struct LiveRequest(Arc<LiveRequests>);

impl Drop for LiveRequest {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}
