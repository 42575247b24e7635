//! Assembles the HTTP server: the routes, the request guard in front of all of them, request metrics on every
//! route, and graceful shutdown.

use std::convert::Infallible;
use std::future::{Future, IntoFuture};
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{ConnectInfo, Request};
use axum::middleware::{Next, from_fn, from_fn_with_state};
use axum::response::Response;
use axum::routing::{get, post};
use http::Uri;
use loragate_core::{Coordinator, MetricsSource};
use loragate_net::{ActiveBody, Connection, ConnectionLimits, GuardedListener};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::chat::create_chat_completion;
use crate::chat_template::ChatTemplate;
use crate::codec::TextCodec;
use crate::completions::create_completion;
use crate::control::{
    abort_lora_requests, flush_cache, load_lora_adapter, resume_lora_requests, server_info, skyrl_load_lora_adapter,
    unload_lora_adapter, wait_lora_unpaused,
};
use crate::error::HttpError;
use crate::global_pause::{
    areal_continue_generation, areal_pause_generation, continue_generation, is_paused, pause, pause_generation, resume,
};
use crate::guard::guard;
use crate::models::list_models;
use crate::observability::{HttpMetrics, health, metrics, track_requests};
use crate::tokenize::{detokenize, tokenize};

/// The largest request body accepted unless [`HttpFront::with_body_limit`] says otherwise: 4 MiB.
pub const DEFAULT_BODY_LIMIT: usize = 4 * 1024 * 1024;

/// What the HTTP front serves: the coordinator, the base model's served name, the text codec, the chat template
/// (if the model has one), the body limit, the connection limits, and routes of other fronts that share the listener
/// (the Tinker API).
#[derive(Clone)]
pub struct HttpFront {
    coordinator: Coordinator,
    served_model_name: Arc<str>,
    codec: Arc<dyn TextCodec>,
    chat_template: Option<Arc<ChatTemplate>>,
    body_limit: usize,
    connections: ConnectionLimits,
    metrics_sources: Vec<Arc<dyn MetricsSource>>,
    extra_routes: Option<Router>,
}

impl HttpFront {
    /// A front over `coordinator`. `served_model_name` is what `model` and `/v1/models` call the base model;
    /// `codec` encodes text prompts and decodes generated tokens. The body limit is [`DEFAULT_BODY_LIMIT`], the
    /// connection limits are [`ConnectionLimits::default`].
    pub fn new(coordinator: Coordinator, served_model_name: impl Into<String>, codec: Arc<dyn TextCodec>) -> Self {
        let served_model_name: String = served_model_name.into();
        Self {
            coordinator,
            served_model_name: served_model_name.into(),
            codec,
            chat_template: None,
            body_limit: DEFAULT_BODY_LIMIT,
            connections: ConnectionLimits::default(),
            metrics_sources: Vec::new(),
            extra_routes: None,
        }
    }

    /// Serves `POST /v1/chat/completions` (and chat `messages` on `/tokenize`) with `template`. Without one, chat
    /// requests get 400 saying the model has no chat template.
    pub fn with_chat_template(mut self, template: ChatTemplate) -> Self {
        self.chat_template = Some(Arc::new(template));
        self
    }

    /// Sets the connection cap and timeouts (clones of one [`ConnectionLimits`] share its cap with other fronts).
    pub fn with_connection_limits(mut self, connections: ConnectionLimits) -> Self {
        self.connections = connections;
        self
    }

    /// Adds `source`'s metrics to `/metrics` (a fleet's per-worker metrics).
    pub fn with_metrics_source(mut self, source: Arc<dyn MetricsSource>) -> Self {
        self.metrics_sources.push(source);
        self
    }

    pub(crate) fn metrics_sources(&self) -> &[Arc<dyn MetricsSource>] {
        &self.metrics_sources
    }

    /// Serves `routes` on the same listener, beside this front's own (another API over the same coordinator, such as
    /// the Tinker front). They must have their state applied, at least one route, and no fallback (unknown paths keep
    /// this front's 404); their paths must not overlap this front's. They pass the same guard (cross-origin, JSON
    /// bodies, keys) and are counted in the request metrics like every route.
    pub fn with_routes(mut self, routes: Router) -> Self {
        self.extra_routes = Some(match self.extra_routes.take() {
            Some(earlier) => earlier.merge(routes),
            None => routes,
        });
        self
    }

    /// Sets the largest request body accepted, in bytes (larger ones get 413).
    pub fn with_body_limit(mut self, bytes: usize) -> Self {
        self.body_limit = bytes;
        self
    }

    pub(crate) fn coordinator(&self) -> &Coordinator {
        &self.coordinator
    }

    pub(crate) fn served_model_name(&self) -> &str {
        &self.served_model_name
    }

    pub(crate) fn codec(&self) -> &Arc<dyn TextCodec> {
        &self.codec
    }

    pub(crate) fn chat_template(&self) -> Option<&ChatTemplate> {
        self.chat_template.as_deref()
    }

    /// The core's `lora_name` for a completion's `model`: empty (the base model) for the served name, else the
    /// model itself (an adapter's name; the core checks it).
    pub(crate) fn lora_name_for<'a>(&self, model: &'a str) -> &'a str {
        if model == &*self.served_model_name { "" } else { model }
    }

    /// A request's `model`: the served name when it names none (as vLLM does); an empty name is refused.
    pub(crate) fn model_or_base(&self, model: Option<String>) -> Result<String, HttpError> {
        match model {
            None => Ok(self.served_model_name.to_string()),
            Some(model) if model.is_empty() => Err(HttpError::invalid(
                "model",
                format!("must name the base model ({:?}) or a loaded adapter", self.served_model_name),
            )),
            Some(model) => Ok(model),
        }
    }
}

/// Everything the handlers share, for one server instance.
#[derive(Clone)]
pub(crate) struct AppState(Arc<Shared>);

struct Shared {
    front: HttpFront,
    metrics: HttpMetrics,
    registry: Registry,
    draining: CancellationToken,
}

impl AppState {
    fn new(front: HttpFront) -> Self {
        let mut registry = Registry::with_prefix("loragate");
        front.coordinator.metrics().register(&mut registry);
        for source in &front.metrics_sources {
            source.register(&mut registry);
        }
        let metrics = HttpMetrics::default();
        metrics.register(registry.sub_registry_with_prefix("http"));
        Self(Arc::new(Shared { front, metrics, registry, draining: CancellationToken::new() }))
    }

    pub(crate) fn front(&self) -> &HttpFront {
        &self.0.front
    }

    pub(crate) fn body_limit(&self) -> usize {
        self.0.front.body_limit
    }

    pub(crate) fn metrics(&self) -> &HttpMetrics {
        &self.0.metrics
    }

    pub(crate) fn registry(&self) -> &Registry {
        &self.0.registry
    }

    pub(crate) fn is_draining(&self) -> bool {
        self.0.draining.is_cancelled()
    }
}

/// Why the HTTP server could not run.
#[derive(Debug, thiserror::Error)]
pub enum HttpServeError {
    /// Accepting or serving connections failed.
    #[error("HTTP transport: {0}")]
    Io(#[from] std::io::Error),
}

/// Serves the HTTP front on `listener` until `stop` resolves, then lets open requests finish.
///
/// At most the front's `max_connections` connections are open at once; a connection without a request in progress
/// past the header-read or idle timeout is closed (see [`ConnectionLimits`]).
///
/// `/health` answers 200 until `draining` resolves (the server is about to stop), then 503, so load balancers stop
/// sending work while running requests finish.
pub async fn serve_http(
    listener: TcpListener,
    front: HttpFront,
    draining: impl Future<Output = ()> + Send + 'static,
    stop: impl Future<Output = ()> + Send,
) -> Result<(), HttpServeError> {
    let listener = GuardedListener::new(listener, front.connections.clone());
    let state = AppState::new(front);
    let shutdown = CancellationToken::new();
    // Outermost: a request counts as in progress on its connection from its head to the end of its response.
    let app = router(state.clone()).layer(from_fn(mark_in_progress));
    let server = axum::serve(listener, app.into_make_service_with_connect_info::<Connection>())
        .with_graceful_shutdown(shutdown.clone().cancelled_owned());
    let server = server.into_future();
    let mark_draining = async move {
        draining.await;
        state.0.draining.cancel();
        std::future::pending::<Infallible>().await
    };
    tokio::pin!(server, stop, mark_draining);
    let mut stopping = false;
    loop {
        tokio::select! {
            result = &mut server => return Ok(result?),
            () = &mut stop, if !stopping => {
                stopping = true;
                shutdown.cancel();
            }
            never = &mut mark_draining => match never {},
        }
    }
}

/// The routes, and those of [`HttpFront::with_routes`]. The guard (cross-origin, content type, authentication) is
/// applied last, so that it covers every route, the extra ones and the fallback: keep it the last layer when adding
/// routes. Sampling requests for a paused adapter are held by the core's gate inside `Coordinator::sample`; control,
/// health, metrics and models answer while an adapter is paused.
fn router(state: AppState) -> Router {
    let extra_routes = state
        .front()
        .extra_routes
        .clone()
        .map(|routes| routes.route_layer(from_fn_with_state(state.clone(), track_requests)));
    let own = Router::new()
        .route("/v1/completions", post(create_completion))
        .route("/v1/chat/completions", post(create_chat_completion))
        .route("/inference/v1/generate", post(crate::generate::generate))
        .route("/inference/v1/abort_requests", post(crate::generate::abort_requests))
        .route("/generate", post(crate::sglang::generate))
        .route("/abort_request", post(crate::sglang::abort_request))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route("/v1/models", get(list_models))
        .route("/v1/load_lora_adapter", post(load_lora_adapter))
        .route("/v1/unload_lora_adapter", post(unload_lora_adapter))
        .route("/load_lora_adapter", post(load_lora_adapter))
        .route("/unload_lora_adapter", post(unload_lora_adapter))
        .route("/reset_prefix_cache", post(flush_cache))
        .route("/flush_cache", get(flush_cache).post(flush_cache))
        .route("/get_server_info", get(server_info))
        .route("/server_info", get(server_info))
        .route("/skyrl/v1/abort_lora_requests", post(abort_lora_requests))
        .route("/skyrl/v1/resume_lora_requests", post(resume_lora_requests))
        .route("/skyrl/v1/wait_lora_unpaused", post(wait_lora_unpaused))
        .route("/skyrl/v1/load_lora_adapter", post(skyrl_load_lora_adapter))
        .route("/pause", post(pause))
        .route("/resume", post(resume))
        .route("/is_paused", get(is_paused))
        .route("/pause_generation", post(pause_generation))
        .route("/continue_generation", post(continue_generation))
        .route("/areal_pause_generation", post(areal_pause_generation))
        .route("/areal_continue_generation", post(areal_continue_generation))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route_layer(from_fn_with_state(state.clone(), track_requests))
        .fallback(|uri: Uri| async move { HttpError::NoSuchEndpoint(uri.path().to_owned()) })
        .with_state(state.clone());
    let all = match extra_routes {
        Some(routes) => own.merge(routes),
        None => own,
    };
    all.layer(from_fn_with_state(state, guard))
}

/// Marks the request in progress on its connection until its response body is sent or dropped, so the
/// connection is never closed as idle under a long-poll, a held request or a stream.
async fn mark_in_progress(request: Request, next: Next) -> Response {
    let active =
        request.extensions().get::<ConnectInfo<Connection>>().map(|ConnectInfo(connection)| connection.begin());
    let response = next.run(request).await;
    response.map(|body| Body::new(ActiveBody::new(body, active)))
}

#[cfg(test)]
mod tests;
