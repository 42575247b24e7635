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
