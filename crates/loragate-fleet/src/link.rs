//! One worker's connection, shared by the membership and by the sequences running on it: its protocol's client, the
//! count of sequences in flight (entered through an RAII guard, so a drain can wait for it to reach zero), the
//! batched aborts, and its metrics.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use loragate_core::Key;
use tokio::sync::{Notify, Semaphore, mpsc};

use crate::address::WorkerAddress;
use crate::delivery::Delivery;
use crate::metrics::{FleetMetrics, WorkerCounters};
use crate::worker::{self, ClientSettings, WorkerClient, WorkerError};

/// How long a connection attempt to a worker may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long one batched abort call may take (the streams' own bound decides what happens after).
const ABORT_CALL_TIMEOUT: Duration = Duration::from_secs(2);
/// How many abort calls to one worker may be in flight at once.
const ABORT_CALLS_IN_FLIGHT: usize = 8;

/// A worker's client and counters. Lives as long as the worker is in the fleet (and as long as sequences hold it);
/// several incarnations of the same address get separate links.
pub(crate) struct WorkerLink {
    address: WorkerAddress,
    client: Arc<dyn WorkerClient>,
    in_flight: AtomicU32,
    idle: Notify,
    aborts: mpsc::UnboundedSender<String>,
    counters: WorkerCounters,
}

impl WorkerLink {
    /// A link to `address` over its protocol (connected lazily, reconnected on demand), with its abort batcher
    /// running.
    pub(crate) fn new(
        address: WorkerAddress,
        key: Option<Key>,
        metrics: &FleetMetrics,
    ) -> Result<Arc<Self>, WorkerError> {
        let client = worker::connect(&address, ClientSettings { connect_timeout: CONNECT_TIMEOUT, key })?;
        Ok(Self::over(address, client, metrics))
    }

    /// A link to `address` over `client`, with its abort batcher running.
    fn over(address: WorkerAddress, client: Arc<dyn WorkerClient>, metrics: &FleetMetrics) -> Arc<Self> {
        let counters = metrics.worker(&address);
        let (aborts, batches) = mpsc::unbounded_channel();
        tokio::spawn(send_abort_batches(client.clone(), batches, counters.clone()));
        Arc::new(Self { address, client, in_flight: AtomicU32::new(0), idle: Notify::new(), aborts, counters })
    }

    /// The worker's address.
    pub(crate) fn address(&self) -> &WorkerAddress {
        &self.address
    }

    /// The worker's protocol client.
    pub(crate) fn client(&self) -> &dyn WorkerClient {
        &*self.client
    }

    /// The worker's metrics.
    pub(crate) fn counters(&self) -> &WorkerCounters {
        &self.counters
    }

    /// Counts one more sequence on this worker until the guard is dropped.
    pub(crate) fn enter(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight(self.clone())
    }

    /// Sequences running on this worker now.
    pub(crate) fn in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::Acquire)
    }

    /// Returns once no sequence runs on this worker.
    pub(crate) async fn idle(&self) {
        loop {
            let idle = self.idle.notified();
            if self.in_flight() == 0 {
                return;
            }
            idle.await;
        }
    }

    /// Asks the worker to abort the sequence with id `abort_id`, batched with every other abort of this worker
    /// queued meanwhile. The sequence's abort finish is the acknowledgement.
    pub(crate) fn abort(&self, abort_id: String) {
        let _ = self.aborts.send(abort_id);
    }

    /// Loads `engine_name` even if the worker holds a copy already: that copy is a leftover of an earlier staging
    /// of the same version number that failed and was rolled back where the worker could not be reached (the core
    /// reuses the number of a failed load), so it is replaced.
    pub(crate) async fn replace_adapter(
        &self,
        engine_name: &str,
        delivery: &Delivery,
        timeout: Duration,
    ) -> Result<(), WorkerError> {
        match self.client.load_adapter(engine_name, delivery, timeout).await {
            Err(WorkerError::AlreadyExists(_)) => {
                tracing::info!(worker = %self.address, %engine_name, "replacing a leftover copy");
                self.unload_adapter(engine_name, timeout).await?;
                self.client.load_adapter(engine_name, delivery, timeout).await
            }
            outcome => outcome,
        }
    }

    /// Unloads `engine_name`, bounded by `timeout`; a name the worker does not hold counts as unloaded.
    pub(crate) async fn unload_adapter(&self, engine_name: &str, timeout: Duration) -> Result<(), WorkerError> {
        match self.client.unload_adapter(engine_name, timeout).await {
            Err(WorkerError::NotFound(_)) => Ok(()),
            outcome => outcome,
        }
    }
}

/// One sequence running on a worker (see [`WorkerLink::enter`]).
pub(crate) struct InFlight(Arc<WorkerLink>);

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.0.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

/// Sends queued aborts in calls, at most [`ABORT_CALLS_IN_FLIGHT`] at once: each call takes every abort queued
/// until it could start, so a burst becomes a few calls, and no abort waits for an earlier call's answer while a
/// place is free (a server such as `loragate serve` answers only once the aborted requests were handed back). Ends
/// when the link (the only sender) is dropped; calls in flight then finish on their own, bounded by their timeout.
async fn send_abort_batches(
    client: Arc<dyn WorkerClient>,
    mut queued: mpsc::UnboundedReceiver<String>,
    counters: WorkerCounters,
) {
    let places = Arc::new(Semaphore::new(ABORT_CALLS_IN_FLIGHT));
    while let Some(first) = queued.recv().await {
        // The semaphore is never closed. Aborts queued while every place is taken go in this call.
        let Ok(place) = places.clone().acquire_owned().await else { return };
        let mut ids = vec![first];
        while let Ok(next) = queued.try_recv() {
            ids.push(next);
        }
        let batch = ids.len();
        counters.record_abort_call(batch);
        let (client, counters) = (client.clone(), counters.clone());
        tokio::spawn(async move {
            if let Err(err) = client.abort(ids, ABORT_CALL_TIMEOUT).await {
                // The streams' acknowledgement bound hands those sequences back anyway.
                tracing::warn!(worker = %counters.worker(), batch, %err, "an abort call failed");
            }
            drop(place);
        });
    }
}
