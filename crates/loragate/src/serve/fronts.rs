//! `serve`'s fronts on their listeners, under one connection cap: gRPC (with the `Fleet` service when the engine is
//! a fleet) and HTTP (with the Tinker API's routes and the fleet's metrics), each on a task of its own.

use std::net::SocketAddr;
use std::sync::Arc;

use loragate_core::{Coordinator, FleetControl, MetricsSource};
use loragate_engine::Tokenizer;
use loragate_fleet::FleetEngine;
use loragate_http::{ChatTemplate, HttpFront};
use loragate_net::ConnectionLimits;
use loragate_text::TextCodec;
use loragate_tinker::{TinkerConfig, TinkerFront};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::error::ServeError;
use crate::startup::{bind, join_error};
use crate::text_codec::TokenizerCodec;

/// Both fronts' listeners, bound before anything else starts so that a port clash fails before the model loads.
pub(super) struct Listeners {
    /// The gRPC listener.
    pub(super) grpc: TcpListener,
    /// The HTTP listener.
    pub(super) http: TcpListener,
    /// Where gRPC was bound.
    pub(super) grpc_addr: SocketAddr,
    /// Where HTTP was bound.
    pub(super) http_addr: SocketAddr,
}

impl Listeners {
    /// Binds both addresses (port 0 picks a free port).
    pub(super) async fn bind(grpc_addr: SocketAddr, http_addr: SocketAddr) -> Result<Self, ServeError> {
        let (grpc, grpc_addr) = bind(grpc_addr).await?;
        let (http, http_addr) = bind(http_addr).await?;
        Ok(Self { grpc, http, grpc_addr, http_addr })
    }
}

/// What the fronts serve with, besides the coordinator.
pub(super) struct FrontSettings {
    /// What HTTP calls the base model.
    pub(super) served_model_name: String,
    /// One cap over both fronts: it protects the process's file descriptors.
    pub(super) connections: ConnectionLimits,
    /// The model's tokenizer, for text in and out of HTTP and Tinker.
    pub(super) tokenizer: Option<Tokenizer>,
    /// The model's chat template, or why it is unusable (chat then answers 400).
    pub(super) chat_template: Result<Option<ChatTemplate>, String>,
    /// The fleet, when the engine is one.
    pub(super) fleet: Option<Arc<FleetEngine>>,
    /// The in-process engine's metrics (its KV cache's), when the engine is one.
    pub(super) engine_metrics: Option<Arc<dyn MetricsSource>>,
    /// The Tinker API front's settings.
    pub(super) tinker: TinkerConfig,
}

/// The running fronts and the two tokens that stop them.
pub(super) struct Fronts {
    /// Cancelled first: health turns NOT_SERVING / 503 while running requests finish.
    pub(super) draining: CancellationToken,
    /// Cancelled last: the servers close.
    pub(super) stop: CancellationToken,
    /// One task per front, ending with its server.
    pub(super) tasks: Vec<JoinHandle<Result<(), ServeError>>>,
}

impl Fronts {
    /// Starts the Tinker API front, then serves gRPC and HTTP on `listeners`, each on a task of its own.
    pub(super) async fn spawn(
        listeners: Listeners,
        coordinator: &Coordinator,
        settings: FrontSettings,
    ) -> Result<Self, ServeError> {
        let (draining, stop) = (CancellationToken::new(), CancellationToken::new());
        let fleet_control = settings.fleet.clone().map(|fleet| fleet as Arc<dyn FleetControl>);
        let connections = settings.connections.clone();
        let http_front = http_front(coordinator, settings).await?;
        let grpc = tokio::spawn(loragate_grpc::serve_grpc_with(
            listeners.grpc,
            coordinator.clone(),
            connections,
            fleet_control,
            draining.clone().cancelled_owned(),
            stop.clone().cancelled_owned(),
        ));
        let http = tokio::spawn(loragate_http::serve_http(
            listeners.http,
            http_front,
            draining.clone().cancelled_owned(),
            stop.clone().cancelled_owned(),
        ));
        let tasks = vec![
            tokio::spawn(async move { grpc.await.map_err(join_error)?.map_err(ServeError::from) }),
            tokio::spawn(async move { http.await.map_err(join_error)?.map_err(ServeError::from) }),
        ];
        Ok(Self { draining, stop, tasks })
    }
}

/// The HTTP front: the OpenAI, vLLM, SGLang and SkyRL routes, the Tinker API's, the chat template and, with a
/// fleet, the workers' metrics.
async fn http_front(coordinator: &Coordinator, settings: FrontSettings) -> Result<HttpFront, ServeError> {
    let FrontSettings { served_model_name, connections, tokenizer, chat_template, fleet, engine_metrics, tinker } =
        settings;
    let codec: Arc<dyn TextCodec> = Arc::new(TokenizerCodec::new(tokenizer));
    let tinker = TinkerFront::start(coordinator.clone(), served_model_name.clone(), codec.clone(), tinker)
        .await
        .map_err(ServeError::Tinker)?;
    let mut front = HttpFront::new(coordinator.clone(), served_model_name, codec)
        .with_connection_limits(connections)
        .with_routes(tinker.routes());
    match chat_template {
        Ok(Some(template)) => front = front.with_chat_template(template),
        Ok(None) => {}
        Err(err) => tracing::warn!(%err, "the model's chat template is unusable; /v1/chat/completions answers 400"),
    }
    if let Some(fleet) = fleet {
        front = front.with_metrics_source(fleet);
    }
    if let Some(engine) = engine_metrics {
        front = front.with_metrics_source(engine);
    }
    Ok(front)
}
