//! Connection hygiene shared by loragate's network fronts (gRPC and HTTP): what keeps idle, slow or too many
//! connections from exhausting the server's file descriptors and memory.
//!
//! - A **connection cap** ([`ConnectionLimits::max_connections`], `--max-connections`): a [`GuardedListener`]
//!   accepts a connection only while fewer are open (over every listener sharing the same [`ConnectionLimits`]);
//!   past the cap, new connections wait in the kernel's backlog until one closes.
//! - A **header-read timeout** (`--header-read-timeout`): a new connection must send a complete request head within
//!   it, or it is closed.
//! - An **idle timeout** (`--idle-timeout`): a connection with no request in progress for that long is closed. A
//!   request is in progress from its head until its response body is finished or dropped, so long-polls, requests
//!   held at a paused gate and long streams are never idle, whatever bytes flow.
//! - **TCP_NODELAY** on every accepted socket, so small gRPC frames and SSE events are not delayed.
//!
//! The fronts wire it in two places: their listener ([`GuardedListener`], which hands out [`GuardedStream`]s that
//! close themselves when idle) and one middleware that marks requests in progress on their [`Connection`]
//! ([`Connection::begin`] and [`ActiveBody`]; [`ActivityLayer`] for tower stacks such as tonic's). With the `axum`
//! feature [`GuardedListener`] is an `axum::serve::Listener`; with `tonic`, [`GuardedStream`] is a tonic
//! `Connected` IO whose connect info is its [`Connection`].
//!
//! [`AccessLogLayer`] writes one access-log line per request (turned on by `--access-log`; without it the fronts
//! leave the layer out: [`AccessLogLayer::when_enabled`]).
//!
//! Two more things every front shares live here, so that no front depends on another: [`json_body`] reads and parses
//! JSON request bodies (within a size limit and by the gate deadline, strictly, naming the offending field) for the
//! HTTP and Tinker fronts, and [`status`] is the one table from an error's class to its HTTP status and gRPC code,
//! which every front answers with.
//!
//! HTTP/2 keepalive pings (for gRPC) are configured by the gRPC front from [`ConnectionLimits::keepalive_interval`].

mod access_log;
mod activity;
pub mod json_body;
mod limits;
mod listener;
pub mod status;

pub use access_log::{ACCESS_LOG_TARGET, AccessLog, AccessLogLayer};
pub use activity::{ActiveBody, ActiveRequest, ActivityFuture, ActivityLayer, ActivityService, Connection};
pub use limits::{
    ConnectionLimits, DEFAULT_HEADER_READ_TIMEOUT, DEFAULT_IDLE_TIMEOUT, DEFAULT_KEEPALIVE_INTERVAL,
    DEFAULT_MAX_CONNECTIONS, HTTP2_CONNECTION_WINDOW_BYTES, HTTP2_MAX_FRAME_BYTES, HTTP2_MAX_PENDING_ACCEPT_RESETS,
    HTTP2_STREAM_WINDOW_BYTES,
};
pub use listener::{GuardedListener, GuardedStream};
