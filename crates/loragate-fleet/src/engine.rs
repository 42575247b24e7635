//! [`FleetEngine`]: the core's [`Engine`] over a fleet of workers.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use loragate_core::{
    AdapterName, AdapterSource, AdapterVersion, Engine, EngineError, EngineStream, ModelInfo, SampleRequest,
};
use loragate_grpc::WorkerState;
use tokio_util::sync::CancellationToken;

use crate::address::{WorkerAddress, versioned_name};
use crate::error::FleetError;
use crate::generate;
use crate::membership::{Membership, MembershipSettings};
use crate::metrics::FleetMetrics;
use crate::staging::stage;
use crate::versions::{Installed, Versions};

/// How a fleet runs.
#[derive(Clone, Debug)]
pub struct FleetConfig {
    /// How often every worker's `grpc.health.v1` is checked (`--worker-health-interval`).
    pub health_interval: Duration,
    /// How long one health check may take before it counts as failed.
    pub health_timeout: Duration,
    /// How long one worker may take to load or unload one adapter version (staging, catch-up, retirement).
    pub adapter_timeout: Duration,
    /// How long an aborted sequence waits for its worker's `ABORTED` before it is handed back with what it has.
    pub abort_ack_timeout: Duration,
    /// How long [`FleetEngine::wait_ready`] waits for a first worker to become READY.
    pub join_timeout: Duration,
    /// The coordinator's adapter root (canonical). Adapter paths inside it go to the workers relative to it, so each
    /// worker resolves them against its own adapter root (the same tree, wherever it is mounted there); other paths
    /// go as given.
    pub adapter_root: Option<PathBuf>,
}

impl Default for FleetConfig {
    fn default() -> Self {
        Self {
            health_interval: Duration::from_secs(2),
            health_timeout: Duration::from_secs(2),
            adapter_timeout: Duration::from_secs(60),
            abort_ack_timeout: Duration::from_secs(2),
            join_timeout: Duration::from_secs(60),
            adapter_root: None,
        }
    }
}

/// The core's engine over N workers speaking vLLM's gRPC protocol. See the crate documentation.
pub struct FleetEngine {
    info: ModelInfo,
    config: FleetConfig,
    membership: Membership,
    versions: Arc<Versions>,
    metrics: FleetMetrics,
}

impl FleetEngine {
    /// Starts a fleet serving `model` (the coordinator validates requests against it; workers must serve at least
    /// its context) over `workers`, which join in the background (see [`FleetEngine::wait_ready`]).
    pub async fn start(model: ModelInfo, workers: Vec<WorkerAddress>, config: FleetConfig) -> Result<Self, FleetError> {
        let metrics = FleetMetrics::default();
        let settings = MembershipSettings {
            health_interval: config.health_interval,
            health_timeout: config.health_timeout,
            adapter_timeout: config.adapter_timeout,
            context_length: model.context_length,
        };
        let membership = Membership::start(workers, settings, metrics.clone()).await?;
        let unloads = membership.clone();
        let versions = Versions::new(Box::new(move |engine_name| unloads.retire_later(engine_name)));
        Ok(Self { info: model, config, membership, versions, metrics })
    }

    /// Waits until some worker is READY and every other one added at start has caught up or failed (unreachable
    /// workers are retried every health interval, for at most the join timeout); fails if none is READY then.
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

    /// An adapter directory as the workers see it: relative to the adapter root if inside it, else as given.
    fn path_for_workers(&self, dir: &Path) -> String {
        let relative = self.config.adapter_root.as_deref().and_then(|root| dir.strip_prefix(root).ok());
        relative.unwrap_or(dir).to_string_lossy().into_owned()
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
        let pin = self.versions.pin(request.adapter())?;
        generate::start(request, cancel, pin, self.membership.clone(), self.config.abort_ack_timeout)
    }

    /// Stages `NAME@version` on every READY worker and installs it only if all succeeded (else rolls back and
    /// fails with a per-worker report; the previous version keeps serving). The previous version is unloaded from
    /// the workers once no running request is pinned to it.
    async fn load_adapter(
        &self,
        name: &AdapterName,
        version: AdapterVersion,
        source: &AdapterSource,
    ) -> Result<(), EngineError> {
        let engine_name = versioned_name(name, version);
        let source_path = self.path_for_workers(source.dir());
        let staged = stage(&self.membership, &engine_name, &source_path, self.config.adapter_timeout).await;
        self.metrics.record_stage(staged.is_ok());
        staged?;
        let unavailable = |err: FleetError| EngineError::Unavailable(err.to_string());
        match self.versions.install(name, version) {
            Installed::Replaced { retire_now } => {
                self.membership.install(engine_name.clone(), source_path).await.map_err(unavailable)?;
                if let Some(replaced) = retire_now {
                    self.membership.retire_later(replaced);
                }
                tracing::info!(adapter = %engine_name, "adapter version staged on every ready worker and installed");
            }
            // A newer version was installed meanwhile: the copies just staged serve nothing.
            Installed::Superseded => self.membership.retire(engine_name).await.map_err(unavailable)?,
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

#[cfg(test)]
mod tests;
