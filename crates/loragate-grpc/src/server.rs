//! Assembles the gRPC server: `LoraControl`, `Sampler` behind the submission gate, health and reflection, behind
//! authentication, on a listener with a connection cap and idle timeouts, with HTTP/2 keepalive.

use std::future::Future;
use std::sync::Arc;

use loragate_core::{Coordinator, FleetControl};
use loragate_net::{
    AccessLogLayer, ActivityLayer, ConnectionLimits, GuardedListener, HTTP2_CONNECTION_WINDOW_BYTES,
    HTTP2_MAX_FRAME_BYTES, HTTP2_MAX_PENDING_ACCEPT_RESETS, HTTP2_STREAM_WINDOW_BYTES,
};
use loragate_proto::FILE_DESCRIPTOR_SET;
use loragate_proto::v1::fleet_server::FleetServer;
use loragate_proto::v1::lora_control_server::LoraControlServer;
use loragate_proto::v1::sampler_server::SamplerServer;
use tokio::net::TcpListener;
use tonic::service::{LayerExt, Routes};
use tonic::transport::Server;

use crate::auth::AuthLayer;
use crate::control_service::LoraControlService;
use crate::fleet_service::FleetService;
use crate::sampler_service::SamplerService;
use crate::submission_gate::SubmissionGateLayer;

/// Why the gRPC server could not run.
#[derive(Debug, thiserror::Error)]
pub enum GrpcServeError {
    /// The reflection service could not read the descriptor set.
    #[error("building the reflection service: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    /// The transport failed.
    #[error("gRPC transport: {0}")]
    Transport(#[from] tonic::transport::Error),
}

/// Serves the gRPC front on `listener` until `stop` resolves, then drains open calls, with the default
/// [`ConnectionLimits`]; see [`serve_grpc_with`].
pub async fn serve_grpc(
    listener: TcpListener,
    coordinator: Coordinator,
    draining: impl Future<Output = ()> + Send + 'static,
    stop: impl Future<Output = ()> + Send,
) -> Result<(), GrpcServeError> {
    serve_grpc_with(listener, coordinator, ConnectionLimits::default(), None, draining, stop).await
}

/// How often the state store's health is read for the health service.
const STATE_HEALTH_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

/// Until `draining` resolves: `LoraControl` and the server as a whole (`""`) report `NOT_SERVING` while the state
/// store cannot record (control calls would fail), and `SERVING` again once it can.
async fn watch_state_health(
    health: &tonic_health::server::HealthReporter,
    coordinator: &Coordinator,
    draining: impl Future<Output = ()>,
) {
    use tonic_health::ServingStatus;
    tokio::pin!(draining);
    let mut recording = true;
    let mut ticks = tokio::time::interval(STATE_HEALTH_INTERVAL);
    loop {
        tokio::select! {
            () = &mut draining => return,
            _ = ticks.tick() => {
                let now = coordinator.state_health().is_ok();
                if now != recording {
                    recording = now;
                    let status = if now { ServingStatus::Serving } else { ServingStatus::NotServing };
                    health.set_service_status("", status).await;
                    health.set_service_status(
                        <LoraControlServer<LoraControlService> as tonic::server::NamedService>::NAME,
                        status,
                    )
                    .await;
                }
            }
        }
    }
}

/// Serves the gRPC front on `listener` until `stop` resolves, then drains open calls; `Fleet` drives `fleet` when the
/// coordinator runs in front of a fleet of workers, and answers `FAILED_PRECONDITION` otherwise.
///
/// Health reports `SERVING` for the services until `draining` resolves (the server is about to stop), then
/// `NOT_SERVING`, so load balancers stop sending work while running requests finish; `LoraControl` and the server
/// as a whole also report `NOT_SERVING` while the state store cannot record. At most
/// `connections.max_connections` connections are open at once (shared with every listener given the same limits);
/// a connection without a call in progress past the header-read or idle timeout is closed, and HTTP/2 pings every
/// `connections.keepalive_interval` close connections whose peer is gone.
pub async fn serve_grpc_with(
    listener: TcpListener,
    coordinator: Coordinator,
    connections: ConnectionLimits,
    fleet: Option<Arc<dyn FleetControl>>,
    draining: impl Future<Output = ()> + Send + 'static,
    stop: impl Future<Output = ()> + Send,
) -> Result<(), GrpcServeError> {
    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<LoraControlServer<LoraControlService>>().await;
    health.set_serving::<SamplerServer<SamplerService>>().await;
    let serves_fleet = fleet.is_some();
    if serves_fleet {
        health.set_serving::<FleetServer<FleetService>>().await;
    } else {
        health.set_not_serving::<FleetServer<FleetService>>().await;
    }
    let watched = coordinator.clone();
    tokio::spawn(async move {
        watch_state_health(&health, &watched, draining).await;
        health.set_not_serving::<LoraControlServer<LoraControlService>>().await;
        health.set_not_serving::<SamplerServer<SamplerService>>().await;
        if serves_fleet {
            health.set_not_serving::<FleetServer<FleetService>>().await;
        }
    });

    let reflection_v1 = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    let reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()?;

    let control = LoraControlServer::new(LoraControlService::new(coordinator.clone()));
    let sampler = SubmissionGateLayer::new(coordinator.clone())
        .named_layer(SamplerServer::new(SamplerService::new(coordinator.clone())));

    let mut routes = Routes::builder();
    routes
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(control)
        .add_service(sampler)
        .add_service(FleetServer::new(FleetService::new(fleet)));
    let routes = routes.routes();
    let auth = AuthLayer::new(coordinator.auth().clone());
    let keepalive = Some(connections.keepalive_interval);
    let incoming = futures::stream::unfold(GuardedListener::new(listener, connections), |mut listener| async move {
        let (connection, _remote) = listener.accept().await;
        Some((Ok::<_, std::io::Error>(connection), listener))
    });
    let server = Server::builder()
        .http2_keepalive_interval(keepalive)
        .http2_keepalive_timeout(keepalive)
        // Pushed adapters arrive at the network's pace, not one window update at a time.
        .initial_stream_window_size(HTTP2_STREAM_WINDOW_BYTES)
        .initial_connection_window_size(HTTP2_CONNECTION_WINDOW_BYTES)
        .max_frame_size(HTTP2_MAX_FRAME_BYTES)
        // Clients that cancel many calls at once lose those calls, not their connection.
        .http2_max_pending_accept_reset_streams(Some(HTTP2_MAX_PENDING_ACCEPT_RESETS))
        // Outermost: a call counts as in progress on its connection from the start, refused ones included.
        .layer(ActivityLayer);
    // The access log (`--access-log`) sees refusals of the authentication too. Without it there is no such layer.
    match AccessLogLayer::when_enabled() {
        Some(access_log) => {
            let mut server = server.layer(access_log).layer(auth);
            server.add_routes(routes).serve_with_incoming_shutdown(incoming, stop).await?;
        }
        None => {
            let mut server = server.layer(auth);
            server.add_routes(routes).serve_with_incoming_shutdown(incoming, stop).await?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
