//! Assembles the worker's servers: the coordinator over the engine, and `vllm.Inference`, `vllm.Control` and
//! `grpc.health.v1` in front of it, behind keys, on a listener with a connection cap and timeouts; and, if the
//! worker has an HTTP listener, its `/metrics` there (under the same cap and timeouts).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use loragate_core::{Action, AdapterRoot, Coordinator, CoordinatorConfig, Engine, Keyring, Limits, StartError};
use loragate_net::{AccessLogLayer, ActivityLayer, ConnectionLimits, GuardedListener};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::server::NamedService;
use tonic::transport::Server;
use tonic_health::ServingStatus;
use vllm_proto::control_server::ControlServer;
use vllm_proto::inference_server::InferenceServer;

use crate::auth::RequireKey;
use crate::control::{ControlService, ServerFacts};
use crate::inference::InferenceService;
use crate::loras::LoraTable;
use crate::metrics::serve_metrics;

/// How a worker serves.
#[derive(Clone, Debug)]
pub struct WorkerConfig {
    /// The base model's name: what `GenerateRequest.model` may name (empty works too) and `GetModelInfo` reports.
    /// No adapter may be loaded under it.
    pub served_model_name: String,
    /// The only directory `LoadLora` may read adapters from (relative paths are taken from it); `None` refuses
    /// every load with `FAILED_PRECONDITION`, as vLLM does when LoRA is disabled.
    pub adapter_root: Option<AdapterRoot>,
    /// What `GetServerInfo.max_running_requests` reports (the engine's batch size).
    pub max_running_requests: u64,
    /// The longest a request waits while generation is paused before `UNAVAILABLE` (`--gate-max-wait`).
    pub gate_max_wait: Duration,
    /// Caps on admitted and held requests (`--max-in-flight`, `--max-held`): more are `RESOURCE_EXHAUSTED`.
    pub limits: Limits,
    /// The connection cap and timeouts (`--max-connections`, `--header-read-timeout`, `--idle-timeout`).
    pub connections: ConnectionLimits,
    /// Who may call what: the API key `vllm.Inference`, the admin key everything (off with [`Keyring::open`]).
    pub keys: Keyring,
    /// The most adapters loaded (or loading) at once (`--max-loras`); `None`: no cap.
    pub max_loras: Option<usize>,
    /// Whether the `Shutdown` RPC may stop the worker (`--enable-shutdown-rpc`); refused otherwise.
    pub shutdown_rpc: bool,
    /// Cancelled to stop the worker: by its owner (a signal), or by the `Shutdown` RPC.
    pub shutdown: CancellationToken,
}

impl WorkerConfig {
    /// A worker serving `served_model_name` with `serve`'s default limits, connection limits and timeouts, no keys,
    /// no adapter root, no `--max-loras` and the `Shutdown` RPC disabled.
    pub fn new(served_model_name: impl Into<String>) -> Self {
        let defaults = CoordinatorConfig::default();
        Self {
            served_model_name: served_model_name.into(),
            adapter_root: None,
            max_running_requests: 64,
            gate_max_wait: defaults.max_gate_hold,
            limits: defaults.limits,
            connections: ConnectionLimits::default(),
            keys: Keyring::open(),
            max_loras: None,
            shutdown_rpc: false,
            shutdown: CancellationToken::new(),
        }
    }
}

/// Where a worker listens: its gRPC server, and optionally an HTTP listener serving `GET /metrics`
/// (`--http-addr`). A bare listener is gRPC only.
#[derive(Debug)]
pub struct WorkerListeners {
    /// `vllm.Inference`, `vllm.Control`, `grpc.health.v1`.
    pub grpc: TcpListener,
    /// `GET /metrics` (the coordinator's metrics, as `loragate serve` serves them), if given.
    pub http: Option<TcpListener>,
}

impl From<TcpListener> for WorkerListeners {
    fn from(grpc: TcpListener) -> Self {
        Self { grpc, http: None }
    }
}

/// Why the worker could not serve.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WorkerServeError {
    /// The coordinator could not start.
    #[error("starting the worker's coordinator: {0}")]
    Coordinator(#[from] StartError),
    /// The transport failed.
    #[error("gRPC transport: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// The metrics listener failed.
    #[error("HTTP (metrics) server: {0}")]
    Metrics(#[source] std::io::Error),
}

/// Serves `engine` over vLLM's gRPC protocol on `listeners.grpc` (and its metrics on `listeners.http`, if given)
/// until `config.shutdown` is cancelled. Stopping turns health to `NOT_SERVING`, admits nothing new, aborts the
/// running requests (each ends with `ABORTED` after its tokens) and fails the held ones, then closes.
pub async fn serve_worker(
    listeners: impl Into<WorkerListeners>,
    engine: Arc<dyn Engine>,
    config: WorkerConfig,
) -> Result<(), WorkerServeError> {
    let WorkerListeners { grpc: listener, http } = listeners.into();
    if let Ok(address) = listener.local_addr()
        && exposed_without_keys(address, &config.keys)
    {
        tracing::warn!(
            %address,
            "this worker listens beyond loopback without keys: anyone who reaches the port can sample, load and \
             unload adapters and abort requests; start it with --api-key and --admin-key (see docs/security.md)"
        );
    }
    let coordinator_config = CoordinatorConfig {
        max_gate_hold: config.gate_max_wait,
        adapter_root: config.adapter_root.clone(),
        limits: config.limits,
        auth: config.keys.clone(),
        reserved_names: vec![config.served_model_name.clone()],
        ..CoordinatorConfig::default()
    };
    let coordinator = Coordinator::start(engine, coordinator_config).await?;
    let served_model_name: Arc<str> = config.served_model_name.into();
    let facts = ServerFacts {
        served_model_name: served_model_name.clone(),
        instance_id: format!("loragate-{:016x}", rand_id()),
        max_running_requests: config.max_running_requests,
        supports_lora: config.adapter_root.is_some(),
        shutdown_rpc: config.shutdown_rpc,
    };
    let loras = LoraTable::new(config.max_loras);
    // Both listeners share one connection cap.
    let metrics = http.map(|http| {
        let stop = config.shutdown.clone().cancelled_owned();
        let listener = GuardedListener::new(http, config.connections.clone());
        let (coordinator, served_model_name) = (coordinator.clone(), served_model_name.clone());
        async move {
            serve_metrics(listener, coordinator, &served_model_name, stop).await.map_err(WorkerServeError::Metrics)
        }
    });
    let inference = InferenceServer::with_interceptor(
        InferenceService::new(coordinator.clone(), served_model_name),
        RequireKey::new(config.keys.clone(), Action::Sample),
    );
    let control = ControlServer::with_interceptor(
        ControlService::new(coordinator.clone(), loras, facts, config.shutdown.clone()),
        RequireKey::new(config.keys, Action::Admin),
    );

    let (health, health_service) = tonic_health::server::health_reporter();
    let services = [InferenceServer::<InferenceService>::NAME, ControlServer::<ControlService>::NAME, ""];
    for service in services {
        health.set_service_status(service, ServingStatus::Serving).await;
    }
    let stop = {
        let (shutdown, coordinator) = (config.shutdown.clone(), coordinator.clone());
        async move {
            shutdown.cancelled().await;
            for service in services {
                health.set_service_status(service, ServingStatus::NotServing).await;
            }
            // No grace: running requests are aborted and handed back with their tokens, held ones fail.
            coordinator.shutdown(Duration::ZERO).await;
        }
    };
    let keepalive = Some(config.connections.keepalive_interval);
    let incoming =
        futures::stream::unfold(GuardedListener::new(listener, config.connections), |mut listener| async move {
            let (connection, _remote) = listener.accept().await;
            Some((Ok::<_, std::io::Error>(connection), listener))
        });
    let grpc = Server::builder()
        .http2_keepalive_interval(keepalive)
        .http2_keepalive_timeout(keepalive)
        // Outermost: a call counts as in progress on its connection from the start, refused ones included.
        .layer(ActivityLayer)
        .layer(AccessLogLayer)
        .add_service(health_service)
        .add_service(inference)
        .add_service(control)
        .serve_with_incoming_shutdown(incoming, stop);
    let grpc = async move { grpc.await.map_err(WorkerServeError::from) };
    match metrics {
        Some(metrics) => tokio::try_join!(grpc, metrics).map(drop),
        None => grpc.await,
    }
}

/// Whether a worker on `address` with `keys` can be reached beyond this machine by anyone (no key configured).
fn exposed_without_keys(address: SocketAddr, keys: &Keyring) -> bool {
    !address.ip().is_loopback() && !keys.is_enabled()
}

fn rand_id() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(std::time::SystemTime::now())
}

#[cfg(test)]
mod tests;
