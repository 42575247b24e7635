//! [`FleetEngine`]: the core's [`Engine`] over a fleet of workers.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use loragate_core::{
    AdapterName, AdapterSource, AdapterVersion, Engine, EngineError, EngineStream, Key, ModelInfo, SampleRequest,
    WorkerState,
};
use tokio_util::sync::CancellationToken;

use crate::address::{WorkerAddress, versioned_name};
use crate::delivery::Delivery;
use crate::error::FleetError;
use crate::generate;
use crate::membership::{FailurePolicy, Membership, MembershipSettings};
use crate::metrics::FleetMetrics;
use crate::staging::stage;
use crate::versions::Versions;

/// The default [`FleetConfig::first_byte_timeout`]: a worker queueing a request behind a full batch still answers
/// its head at once and its first token within a prefill, so a minute of silence is a hung worker.
pub const DEFAULT_FIRST_BYTE_TIMEOUT: Duration = Duration::from_secs(60);
/// The default [`FleetConfig::inter_chunk_timeout`]: decode steps take milliseconds; half a minute between two
/// chunks is a hung worker (or one trickling a line it never finishes).
pub const DEFAULT_INTER_CHUNK_TIMEOUT: Duration = Duration::from_secs(30);

/// How a fleet runs.
#[derive(Clone, Debug)]
pub struct FleetConfig {
    /// How often every worker's health is checked (`--worker-health-interval`).
    pub health_interval: Duration,
    /// How long one health check may take before it counts as failed (SGLang's are given at least 25 s: it
    /// generates a token to answer).
    pub health_timeout: Duration,
    /// Failures in a row after which a worker's probes back off exponentially and it must pass this many checks in
    /// a row before it gets traffic again (`--worker-failure-threshold`).
    pub failure_threshold: u32,
    /// The longest back-off between two probes of a failing worker.
    pub max_probe_backoff: Duration,
    /// The most workers the fleet holds (`--max-workers`); more are refused.
    pub max_workers: usize,
    /// How long one worker may take to load or unload one adapter version (staging, catch-up, retirement).
    pub adapter_timeout: Duration,
    /// How long an aborted sequence waits for its worker's `ABORTED` before it is handed back with what it has.
    pub abort_ack_timeout: Duration,
    /// How long a worker may take from a sequence's request to its first streamed event (the response head and the
    /// first chunk; `--worker-first-byte-timeout`). Past it the sequence is handed back `Abort` (tried on another
    /// worker if it has no token yet) and the worker counts a failure.
    pub first_byte_timeout: Duration,
    /// How long a worker may stay silent between two events of a sequence's stream (`--worker-inter-chunk-timeout`);
    /// past it, as for the first-byte timeout.
    pub inter_chunk_timeout: Duration,
    /// How long [`FleetEngine::wait_ready`] waits for a first worker to become READY (`--worker-wait`).
    pub join_timeout: Duration,
    /// The coordinator's adapter root, as the coordinator names it (`--adapter-root`).
    pub adapter_root: Option<PathBuf>,
    /// Where the workers mount the coordinator's adapter root (`--worker-adapter-root`): adapter paths inside the
    /// adapter root go to the workers under this directory instead. Without it, every path goes as given (absolute).
    pub worker_adapter_root: Option<PathBuf>,
    /// The key presented to every worker as `authorization: Bearer KEY` (`--worker-key`): a `loragate worker`'s
    /// admin key, or a vLLM or SGLang server's `--api-key`.
    pub worker_key: Option<Key>,
}

impl Default for FleetConfig {
    fn default() -> Self {
        Self {
            health_interval: Duration::from_secs(2),
            health_timeout: Duration::from_secs(2),
            failure_threshold: 3,
            max_probe_backoff: Duration::from_secs(30),
            max_workers: 256,
            adapter_timeout: Duration::from_secs(60),
            abort_ack_timeout: Duration::from_secs(2),
            first_byte_timeout: DEFAULT_FIRST_BYTE_TIMEOUT,
            inter_chunk_timeout: DEFAULT_INTER_CHUNK_TIMEOUT,
            join_timeout: Duration::from_secs(60),
            adapter_root: None,
            worker_adapter_root: None,
            worker_key: None,
        }
    }
}

/// The core's engine over N workers speaking vLLM's gRPC, vLLM's HTTP or SGLang's HTTP protocol. See the crate
/// documentation.
pub struct FleetEngine {
    info: ModelInfo,
    config: FleetConfig,
    membership: Membership,
    versions: Arc<Versions>,
    metrics: FleetMetrics,
}

impl FleetEngine {
    /// Starts a fleet serving `model` (the coordinator validates requests against it; workers must serve at least
    /// its context) over `workers`, which join in the background (see [`FleetEngine::wait_ready`]). Fails if two of
    /// them are one worker (the same process under two spellings), or if they are more than the limit.
    pub async fn start(model: ModelInfo, workers: Vec<WorkerAddress>, config: FleetConfig) -> Result<Self, FleetError> {
        let metrics = FleetMetrics::default();
        let settings = MembershipSettings {
            failures: FailurePolicy {
                threshold: config.failure_threshold.max(1),
                interval: config.health_interval,
                max_backoff: config.max_probe_backoff,
            },
            max_workers: config.max_workers,
            health_timeout: config.health_timeout,
            adapter_timeout: config.adapter_timeout,
            context_length: model.context_length,
            worker_key: config.worker_key.clone(),
        };
        let membership = Membership::start(workers, settings, metrics.clone()).await?;
        let unloads = membership.clone();
        let versions = Versions::new(Box::new(move |engine_name| unloads.retire_later(engine_name)));
        Ok(Self { info: model, config, membership, versions, metrics })
    }

    /// Waits until some worker is READY and no other one added at start is still catching up, for at most the join
    /// timeout (`--worker-wait`: unreachable workers keep being probed meanwhile, so workers started after the
    /// coordinator are waited for); fails if none is READY then.
    pub async fn wait_ready(&self) -> Result<(), FleetError> {
        let roster = self.membership.settled(self.config.join_timeout).await;
        if roster.workers.iter().any(|worker| worker.state == WorkerState::Ready) {
            return Ok(());
        }
        let states: Vec<String> = roster
            .workers
            .iter()
            .map(|worker| format!("{} {} {}", worker.link.address(), worker.state.as_str(), worker.last_error))
            .collect();
        Err(FleetError::NoReadyWorker(states.join("; ")))
    }

    /// The fleet's metrics.
    pub fn metrics(&self) -> &FleetMetrics {
        &self.metrics
    }

    pub(crate) fn membership(&self) -> &Membership {
        &self.membership
    }

    /// An adapter directory as the workers see it: under the workers' mount of the adapter root if it lies in the
    /// adapter root and they mount it elsewhere, else as given (absolute: the coordinator resolved it).
    fn path_for_workers(&self, dir: &Path) -> String {
        path_for_workers(dir, self.config.adapter_root.as_deref(), self.config.worker_adapter_root.as_deref())
    }
}

impl Drop for FleetEngine {
    fn drop(&mut self) {
        self.membership.stop();
    }
}

#[async_trait]
impl Engine for FleetEngine {
    fn model_info(&self) -> &ModelInfo {
        &self.info
    }

    async fn generate(&self, request: SampleRequest, cancel: CancellationToken) -> Result<EngineStream, EngineError> {
        let pin = self.versions.pin(request.adapter(), request.pinned_version())?;
        let bounds = generate::StreamBounds {
            abort_ack_timeout: self.config.abort_ack_timeout,
            first_byte_timeout: self.config.first_byte_timeout,
            inter_chunk_timeout: self.config.inter_chunk_timeout,
            vocab_size: self.info.vocab_size,
        };
        generate::start(request, cancel, pin, self.membership.clone(), bounds)
    }

    /// Stages `NAME@version` on every READY worker and installs it only if all succeeded (else rolls back and
    /// fails with a per-worker report; the previous version keeps serving). Older versions stay staged, serving exact
    /// pins, until the coordinator releases them ([`Engine::release_version`]).
    async fn load_adapter(
        &self,
        name: &AdapterName,
        version: AdapterVersion,
        source: &AdapterSource,
    ) -> Result<(), EngineError> {
        let engine_name = versioned_name(name, version);
        let delivery = Delivery::of(source, self.path_for_workers(source.dir()));
        let staged = stage(&self.membership, &engine_name, &delivery, self.config.adapter_timeout).await;
        self.metrics.record_stage(staged.is_ok());
        staged?;
        let unavailable = |err: FleetError| EngineError::Unavailable(err.to_string());
        self.membership.install(engine_name.clone(), delivery).await.map_err(unavailable)?;
        self.versions.install(name, version);
        tracing::info!(adapter = %engine_name, "adapter version staged on every ready worker and installed");
        Ok(())
    }

    /// `version` of `name` stops serving exact pins; it is unloaded from the workers as soon as nothing runs on it.
    async fn release_version(&self, name: &AdapterName, version: AdapterVersion) -> Result<(), EngineError> {
        if let Some(engine_name) = self.versions.release(name, version) {
            self.membership.retire_later(engine_name);
        }
        Ok(())
    }

    /// Versions `version` and older of `name` stop serving (new requests of `name` fail at once unless a newer
    /// version is installed); each is unloaded from the workers as soon as nothing runs on it (those drained already
    /// before this returns).
    async fn unload_adapter(&self, name: &AdapterName, version: AdapterVersion) -> Result<(), EngineError> {
        for engine_name in self.versions.remove(name, version) {
            self.membership.retire(engine_name).await.map_err(|err| EngineError::Unavailable(err.to_string()))?;
        }
        Ok(())
    }
}

/// `dir` with the prefix `root` replaced by `worker_root`, when both are given and `dir` lies in `root`.
fn path_for_workers(dir: &Path, root: Option<&Path>, worker_root: Option<&Path>) -> String {
    let mapped = root.zip(worker_root).and_then(|(root, worker_root)| {
        let relative = dir.strip_prefix(root).ok()?;
        Some(if relative.as_os_str().is_empty() { worker_root.to_owned() } else { worker_root.join(relative) })
    });
    mapped.as_deref().unwrap_or(dir).to_string_lossy().into_owned()
}

#[cfg(test)]
mod tests;
