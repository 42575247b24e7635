//! One worker's connection, shared by the membership and by the sequences running on it: the gRPC channel, the
//! count of sequences in flight (entered through an RAII guard, so a drain can wait for it to reach zero), the
//! batched aborts, and its metrics.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use tokio::sync::{Notify, mpsc};
use tonic::Status;
use tonic::transport::{Channel, Endpoint};
use tonic_health::pb::health_client::HealthClient;
use vllm_proto as pb;
use vllm_proto::control_client::ControlClient;
use vllm_proto::inference_client::InferenceClient;

use crate::address::WorkerAddress;
use crate::error::FleetError;
use crate::metrics::{FleetMetrics, WorkerCounters};

/// How long a connection attempt to a worker may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long one batched `Abort` call may take (the streams' own bound decides what happens after).
const ABORT_CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// A worker's connection and counters. Lives as long as the worker is in the fleet (and as long as sequences hold
/// it); several incarnations of the same address get separate links.
pub(crate) struct WorkerLink {
    address: WorkerAddress,
    channel: Channel,
    in_flight: AtomicU32,
    idle: Notify,
    aborts: mpsc::UnboundedSender<String>,
    counters: WorkerCounters,
}

impl WorkerLink {
    /// A link to `address` (connected lazily, reconnected on demand), with its abort batcher running.
    pub(crate) fn new(address: WorkerAddress, metrics: &FleetMetrics) -> Result<Arc<Self>, FleetError> {
        let endpoint = Endpoint::from_shared(address.as_str().to_owned())
            .map_err(|err| FleetError::InvalidAddress { address: address.to_string(), reason: err.to_string() })?
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(10))
            .keep_alive_timeout(Duration::from_secs(5))
            .keep_alive_while_idle(true);
        let channel = endpoint.connect_lazy();
        let counters = metrics.worker(&address);
        let (aborts, batches) = mpsc::unbounded_channel();
        tokio::spawn(send_abort_batches(ControlClient::new(channel.clone()), batches, counters.clone()));
        Ok(Arc::new(Self { address, channel, in_flight: AtomicU32::new(0), idle: Notify::new(), aborts, counters }))
    }

    /// The worker's address.
    pub(crate) fn address(&self) -> &WorkerAddress {
        &self.address
    }

    /// A `vllm.Inference` client.
    pub(crate) fn inference(&self) -> InferenceClient<Channel> {
        InferenceClient::new(self.channel.clone())
    }

    /// A `vllm.Control` client.
    pub(crate) fn control(&self) -> ControlClient<Channel> {
        ControlClient::new(self.channel.clone())
    }

    /// A `grpc.health.v1` client.
    pub(crate) fn health(&self) -> HealthClient<Channel> {
        HealthClient::new(self.channel.clone())
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

    /// Asks the worker to abort `request_id`, batched with every other abort of this worker queued meanwhile. The
    /// sequence's `ABORTED` finish is the acknowledgement.
    pub(crate) fn abort(&self, request_id: String) {
        let _ = self.aborts.send(request_id);
    }

    /// `LoadLora(engine_name, source_path)`, bounded by `timeout`.
    pub(crate) async fn load_lora(
        &self,
        engine_name: &str,
        source_path: &str,
        timeout: Duration,
    ) -> Result<(), Status> {
        let request = pb::LoadLoraRequest { lora_name: engine_name.to_owned(), source_path: source_path.to_owned() };
        bounded(timeout, self.control().load_lora(request)).await.map(drop)
    }

    /// Loads `engine_name` even if the worker holds a copy already: that copy is a leftover of an earlier staging
    /// of the same version number that failed and was rolled back where the worker could not be reached (the core
    /// reuses the number of a failed load), so it is replaced.
    pub(crate) async fn replace_lora(
        &self,
        engine_name: &str,
        source_path: &str,
        timeout: Duration,
    ) -> Result<(), Status> {
        match self.load_lora(engine_name, source_path, timeout).await {
            Err(status) if status.code() == tonic::Code::AlreadyExists => {
                tracing::info!(worker = %self.address, %engine_name, "replacing a leftover copy");
                self.unload_lora(engine_name, timeout).await?;
                self.load_lora(engine_name, source_path, timeout).await
            }
            outcome => outcome,
        }
    }

    /// `UnloadLora(engine_name)`, bounded by `timeout`; a name the worker does not hold counts as unloaded.
    pub(crate) async fn unload_lora(&self, engine_name: &str, timeout: Duration) -> Result<(), Status> {
        let request = pb::UnloadLoraRequest { lora_name: engine_name.to_owned() };
        match bounded(timeout, self.control().unload_lora(request)).await {
            Ok(_) => Ok(()),
            Err(status) if status.code() == tonic::Code::NotFound => Ok(()),
            Err(status) => Err(status),
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

/// Runs `call` for at most `timeout`; running out is `DEADLINE_EXCEEDED`.
pub(crate) async fn bounded<T>(
    timeout: Duration,
    call: impl Future<Output = Result<tonic::Response<T>, Status>>,
) -> Result<T, Status> {
    match tokio::time::timeout(timeout, call).await {
        Ok(result) => result.map(tonic::Response::into_inner),
        Err(_) => Err(Status::deadline_exceeded(format!("no answer within {timeout:?}"))),
    }
}

/// Sends queued aborts as one `Abort` call per batch: whatever queued while the previous call ran goes together.
/// Ends when the link (the only sender) is dropped.
async fn send_abort_batches(
    mut control: ControlClient<Channel>,
    mut queued: mpsc::UnboundedReceiver<String>,
    counters: WorkerCounters,
) {
    while let Some(first) = queued.recv().await {
        let mut request_ids = vec![first];
        while let Ok(next) = queued.try_recv() {
            request_ids.push(next);
        }
        counters.record_abort_call(request_ids.len());
        let batch = request_ids.len();
        if let Err(status) = bounded(ABORT_CALL_TIMEOUT, control.abort(pb::AbortRequest { request_ids })).await {
            // The streams' acknowledgement bound hands those sequences back anyway.
            tracing::warn!(worker = %counters.worker(), batch, %status, "an Abort call failed");
        }
    }
}
