//! The settings, and the cap they share.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::Semaphore;

/// The default of [`ConnectionLimits::max_connections`] (`--max-connections`).
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;
/// The default of [`ConnectionLimits::header_read_timeout`] (`--header-read-timeout`).
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// The default of [`ConnectionLimits::idle_timeout`] (`--idle-timeout`).
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// The default of [`ConnectionLimits::keepalive_interval`].
pub const DEFAULT_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);

/// The HTTP/2 flow-control window of each stream a gRPC server receives (`initial_stream_window_size`): how many
/// bytes a peer may send on one call before the server has read them. hyper's default (1 MiB, for the connection as
/// well) makes a pushed adapter's 1 MiB messages travel nearly one at a time, each waiting for the server's window
/// update, which on a loaded machine is most of a push's time; 4 MiB keeps a few messages in flight.
pub const HTTP2_STREAM_WINDOW_BYTES: u32 = 4 << 20;
/// The HTTP/2 flow-control window of each connection a gRPC server receives (`initial_connection_window_size`):
/// every stream's unread bytes together, at most (two streams of [`HTTP2_STREAM_WINDOW_BYTES`]).
pub const HTTP2_CONNECTION_WINDOW_BYTES: u32 = 8 << 20;
/// The largest HTTP/2 frame a gRPC server accepts (`max_frame_size`; HTTP/2's default is 16 KiB): a pushed adapter's
/// megabyte messages arrive in a few frames rather than 64.
pub const HTTP2_MAX_FRAME_BYTES: u32 = 256 << 10;
/// How many requests a gRPC connection may have reset by their client before the server took them up, at once
/// (`max_pending_accept_reset_streams`): as many as the streams a client may open (hyper's 200). HTTP/2's default,
/// 20, drops the whole connection (GOAWAY ENHANCE_YOUR_CALM) when more are pending, which a busy server's clients
/// reach by merely cancelling (a burst of samplers' timeouts), and every other call sharing the connection then
/// fails with a broken pipe. The bound still caps what a client resetting streams on purpose can queue (the rapid
/// reset attack, CVE-2023-44487).
pub const HTTP2_MAX_PENDING_ACCEPT_RESETS: usize = 200;

/// How many connections may be open and how long they may stay without a request. Cheap to clone; clones share
/// one cap, so listeners given clones of the same limits share [`ConnectionLimits::max_connections`].
#[derive(Clone, Debug)]
pub struct ConnectionLimits {
    /// The most connections open at once, over every listener sharing these limits.
    pub max_connections: usize,
    /// How long a new connection may take to send its first complete request head.
    pub header_read_timeout: Duration,
    /// How long a connection may stay without a request in progress.
    pub idle_timeout: Duration,
    /// How often an HTTP/2 (gRPC) connection is pinged to detect dead peers; one that does not answer within the
    /// same time is closed.
    pub keepalive_interval: Duration,
    /// One permit per connection that may be accepted (an accept waits for one before it accepts).
    slots: Arc<Semaphore>,
    open: Arc<AtomicUsize>,
}

impl ConnectionLimits {
    /// Limits with these values (one shared cap of `max_connections`).
    pub fn new(max_connections: usize, header_read_timeout: Duration, idle_timeout: Duration) -> Self {
        Self {
            max_connections,
            header_read_timeout,
            idle_timeout,
            keepalive_interval: DEFAULT_KEEPALIVE_INTERVAL,
            slots: Arc::new(Semaphore::new(max_connections.min(Semaphore::MAX_PERMITS))),
            open: Arc::default(),
        }
    }

    /// How many connections are open now, over every listener sharing these limits.
    pub fn open_connections(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }

    pub(crate) fn slots(&self) -> &Arc<Semaphore> {
        &self.slots
    }

    pub(crate) fn open(&self) -> &Arc<AtomicUsize> {
        &self.open
    }
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_CONNECTIONS, DEFAULT_HEADER_READ_TIMEOUT, DEFAULT_IDLE_TIMEOUT)
    }
}
