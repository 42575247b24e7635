//! Assembles the worker's servers: `vllm.Inference`, `vllm.Control` and `grpc.health.v1` in front of a coordinator
//! its owner started, behind the coordinator's keys, on a listener with a connection cap and timeouts; and, if the
//! worker has an HTTP listener, its `/metrics` there (under the same cap and timeouts).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use loragate_core::{Action, Coordinator, Keyring};
use loragate_net::{
    AccessLogLayer, ActivityLayer, ConnectionLimits, GuardedListener, HTTP2_CONNECTION_WINDOW_BYTES,
    HTTP2_MAX_FRAME_BYTES, HTTP2_STREAM_WINDOW_BYTES,
};
use loragate_proto::v1::lora_control_server::LoraControlServer;
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
use crate::push::PushService;

/// How a worker's front serves. What the coordinator decides (the adapter root, the gate deadline, the admission
/// limits, the keys) is the coordinator's configuration, made by whoever starts it.
#[derive(Clone, Debug)]
pub struct WorkerConfig {
    /// The base model's name: what `GenerateRequest.model` may name (empty works too) and `GetModelInfo` reports.
    /// The coordinator should reserve it (`CoordinatorConfig::reserved_names`), so that no adapter is loaded under
    /// it.
    pub served_model_name: String,
    /// What `GetServerInfo.max_running_requests` reports (the engine's batch size).
    pub max_running_requests: u64,
    /// The connection cap and timeouts (`--max-connections`, `--header-read-timeout`, `--idle-timeout`).
    pub connections: ConnectionLimits,
    /// The most adapters loaded (or loading) at once (`--max-loras`); `None`: no cap.
    pub max_loras: Option<usize>,
    /// Whether the `Shutdown` RPC may stop the worker (`--enable-shutdown-rpc`); refused otherwise.
    pub shutdown_rpc: bool,
    /// Cancelled to stop the worker: by its owner (a signal), or by the `Shutdown` RPC.
    pub shutdown: CancellationToken,
}

impl WorkerConfig {
    /// A worker front serving `served_model_name` with `serve`'s default connection limits and timeouts, no
    /// `--max-loras` and the `Shutdown` RPC disabled.
    pub fn new(served_model_name: impl Into<String>) -> Self {
        Self {
            served_model_name: served_model_name.into(),
            max_running_requests: 64,
            connections: ConnectionLimits::default(),
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
    /// The transport failed.
    #[error("gRPC transport: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// The metrics listener failed.
    #[error("HTTP (metrics) server: {0}")]
    Metrics(#[source] std::io::Error),
}

/// Serves `coordinator` over vLLM's gRPC protocol on `listeners.grpc` (and its metrics on `listeners.http`, if
/// given) until `config.shutdown` is cancelled, with the coordinator's keys: the API key may call `vllm.Inference`,
/// the admin key everything; loads are refused (`FAILED_PRECONDITION`) when the coordinator has no adapter root.
/// Stopping turns health to `NOT_SERVING`, admits nothing new, aborts the running requests (each ends with `ABORTED`
/// after its tokens) and fails the held ones, then closes.
pub async fn serve_worker(
    listeners: impl Into<WorkerListeners>,
    coordinator: Coordinator,
    config: WorkerConfig,
) -> Result<(), WorkerServeError> {
    let WorkerListeners { grpc: listener, http } = listeners.into();
    let keys = coordinator.auth().clone();
    if let Ok(address) = listener.local_addr()
        && exposed_without_keys(address, &keys)
    {
        tracing::warn!(
            %address,
            "this worker listens beyond loopback without keys: anyone who reaches the port can sample, load and \
             unload adapters and abort requests; start it with --api-key and --admin-key (see docs/security.md)"
        );
    }
    let served_model_name: Arc<str> = config.served_model_name.into();
    let facts = ServerFacts {
        served_model_name: served_model_name.clone(),
        instance_id: format!("loragate-{:016x}", rand_id()),
        max_running_requests: config.max_running_requests,
        supports_lora: coordinator.config().adapter_root.is_some(),
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
        RequireKey::new(keys.clone(), Action::Sample),
    );
    // Pushed adapter versions arrive on the same port, behind the same admin key as `vllm.Control`.
    let push = LoraControlServer::with_interceptor(
        PushService::new(coordinator.clone(), loras.clone()),
        RequireKey::new(keys.clone(), Action::Admin),
    );
    let control = ControlServer::with_interceptor(
        ControlService::new(coordinator.clone(), loras, facts, config.shutdown.clone()),
        RequireKey::new(keys, Action::Admin),
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
        // Pushed adapters arrive at the network's pace, not one window update at a time.
        .initial_stream_window_size(HTTP2_STREAM_WINDOW_BYTES)
        .initial_connection_window_size(HTTP2_CONNECTION_WINDOW_BYTES)
        .max_frame_size(HTTP2_MAX_FRAME_BYTES)
        // Outermost: a call counts as in progress on its connection from the start, refused ones included.
        .layer(ActivityLayer)
        .layer(AccessLogLayer)
        .add_service(health_service)
        .add_service(inference)
        .add_service(control)
        .add_service(push)
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
