//! Assembles the HTTP server: the routes, the request guard in front of all of them, request metrics on every
//! route, and graceful shutdown.

use std::convert::Infallible;
use std::future::Future;

use axum::Router;
use axum::body::Body;
use axum::routing::{get, post, put};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use loragate_net::{AccessLogLayer, ActiveBody, Connection, GuardedListener};
use tokio::net::TcpListener;
use tower::{ServiceBuilder, ServiceExt};

use crate::chat::create_chat_completion;
use crate::completions::create_completion;
use crate::control::{
    abort_lora_requests, flush_cache, load_lora_adapter, resume_lora_requests, server_info, skyrl_load_lora_adapter,
    unload_lora_adapter, wait_lora_unpaused,
};
use crate::front::HttpFront;
use crate::global_pause::{
    areal_continue_generation, areal_pause_generation, continue_generation, is_paused, pause, pause_generation, resume,
};
use crate::guard::{AuthenticateLayer, GuardLayer, no_such_endpoint};
use crate::models::list_models;
use crate::observability::{TrackRequestsLayer, health, metrics, ready};
use crate::state::AppState;
use crate::tokenize::{detokenize, tokenize};

/// Why the HTTP server could not run.
#[derive(Debug, thiserror::Error)]
pub enum HttpServeError {
    /// Accepting or serving connections failed.
    #[error("HTTP transport: {0}")]
    Io(#[from] std::io::Error),
}

/// The most a connection buffers of what its client sent: request heads must fit (a longer one gets 431), and bodies
/// are read in pieces of at most this size. hyper's own default (about 400 KiB) would let every connection that
/// carried one large body keep that much for as long as it stays open, a held request included.
const MAX_READ_BUFFER: usize = 32 * 1024;

/// Serves the HTTP front on `listener` until `stop` resolves, then lets open requests finish.
///
/// At most the front's `max_connections` connections are open at once; a connection without a request in progress
/// past the header-read or idle timeout is closed (see [`ConnectionLimits`](loragate_net::ConnectionLimits)).
///
/// `/health` answers 200 until `draining` resolves (the server is about to stop), then 503, so load balancers stop
/// sending work while running requests finish.
pub async fn serve_http(
    listener: TcpListener,
    front: HttpFront,
    draining: impl Future<Output = ()> + Send + 'static,
    stop: impl Future<Output = ()> + Send,
) -> Result<(), HttpServeError> {
    let mut listener = GuardedListener::new(listener, front.connections.clone());
    let state = AppState::new(front);
    let app = router(state.clone());
    let mut http1 = http1::Builder::new();
    // The guarded listener closes connections that are slow to send a head or idle (it needs no timer of hyper's).
    http1.max_buf_size(MAX_READ_BUFFER).header_read_timeout(None);
    let open = GracefulShutdown::new();
    let mark_draining = async move {
        draining.await;
        state.mark_draining();
        std::future::pending::<Infallible>().await
    };
    tokio::pin!(stop, mark_draining);
    loop {
        tokio::select! {
            (stream, _peer) = listener.accept() => {
                let service = connection_service(app.clone(), stream.connection().clone());
                let served = open.watch(http1.serve_connection(TokioIo::new(stream), service));
                tokio::spawn(async move {
                    if let Err(err) = served.await {
                        tracing::debug!(%err, "an HTTP connection ended with an error");
                    }
                });
            }
            () = &mut stop => break,
            never = &mut mark_draining => match never {},
        }
    }
    // Accept nothing more; each open connection finishes its request in progress, then closes.
    drop(listener);
    open.shutdown().await;
    Ok(())
}

/// The response of one connection's service: the router's, whose body keeps its request in progress.
type ConnectionResponse = http::Response<ActiveBody<Body>>;

/// The service of one connection: the router, each request marked in progress on its connection from its head until
/// its response body is sent or dropped, so the connection is never closed as idle under a long-poll, a held
/// request or a stream.
fn connection_service(
    app: Router,
    connection: Connection,
) -> impl hyper::service::Service<
    http::Request<Incoming>,
    Response = ConnectionResponse,
    Error = Infallible,
    Future = impl Future<Output = Result<ConnectionResponse, Infallible>> + Send,
> + Send {
    service_fn(move |request: http::Request<Incoming>| {
        let active = connection.begin();
        let app = app.clone();
        async move {
            let response = app.oneshot(request).await?;
            Ok(response.map(|body| ActiveBody::new(body, Some(active))))
        }
    })
}

/// The routes, and those of [`HttpFront::with_routes`]. The guard (cross-origin, content type, keep-alive) is
/// applied last, so that it covers every route, the extra ones and the fallback: keep it the last layer when adding
/// routes. This front's own routes authenticate their callers ([`AuthenticateLayer`]); the extra ones bring their own
/// authentication. Sampling requests for a paused adapter are held by the core's gate inside `Coordinator::sample`;
/// control, health, metrics and models answer while an adapter is paused.
fn router(state: AppState) -> Router {
    let extra_routes =
        state.front().extra_routes.clone().map(|routes| routes.route_layer(TrackRequestsLayer::new(state.clone())));
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
        .route("/v1/lora_adapters/{name}", put(crate::adapters::push_adapter).get(crate::adapters::adapter_state))
        .route("/v1/lora_adapters/{name}/versions/{version}/{file}", get(crate::adapters::version_file))
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
        .route("/ready", get(ready))
        .route("/metrics", get(metrics))
        .merge(crate::versions::routes())
        // One route layer (each wraps every route once more): authentication first, so refusals are not timed.
        .route_layer(
            ServiceBuilder::new()
                .layer(AuthenticateLayer::new(state.clone()))
                .layer(TrackRequestsLayer::new(state.clone())),
        )
        .fallback(no_such_endpoint)
        .with_state(state);
    let all = match extra_routes {
        Some(routes) => own.merge(routes),
        None => own,
    };
    let guarded = all.layer(GuardLayer);
    // Outermost: refusals of the guard are logged too. Without `--access-log` there is no such layer.
    match AccessLogLayer::when_enabled() {
        Some(access_log) => guarded.layer(access_log),
        None => guarded,
    }
}

#[cfg(test)]
mod tests;
