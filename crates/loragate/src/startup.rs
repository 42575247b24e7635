//! What `serve` and `worker` both do to start and stop: bind a listener, run blocking work off the runtime, load
//! the in-process engine, listen for the shutdown signals.

use std::net::SocketAddr;
use std::path::Path;

use futures::future::select_all;
use loragate_engine::{CandleEngine, EngineConfig};
use tokio::net::TcpListener;

use crate::error::ServeError;

/// Binds `address`, and says where it was bound (port 0 picks a free port).
pub(crate) async fn bind(address: SocketAddr) -> Result<(TcpListener, SocketAddr), ServeError> {
    let listener = TcpListener::bind(address).await.map_err(|source| ServeError::Bind { address, source })?;
    let bound = listener.local_addr().map_err(|source| ServeError::Bind { address, source })?;
    Ok((listener, bound))
}

/// Runs `work` on the blocking pool.
pub(crate) async fn blocking<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> Result<T, ServeError> {
    tokio::task::spawn_blocking(work).await.map_err(join_error)
}

/// A task that panicked or was cancelled, as the binary's error.
pub(crate) fn join_error(err: tokio::task::JoinError) -> ServeError {
    ServeError::Startup(err.to_string())
}

/// The candle engine over the model at `path` (loaded off the runtime).
pub(crate) async fn load_engine(path: &Path, config: EngineConfig) -> Result<CandleEngine, ServeError> {
    let path = path.to_owned();
    Ok(blocking(move || CandleEngine::load(&path, config)).await??)
}

/// SIGINT and SIGTERM, listened for from the moment this is made: made before the ready line is printed, so a signal
/// sent right after it is never left to the default disposition (which would kill the process without a graceful
/// shutdown).
pub(crate) struct ShutdownSignals {
    #[cfg(unix)]
    signals: Vec<tokio::signal::unix::Signal>,
}

impl ShutdownSignals {
    /// Starts listening (needs a running Tokio runtime).
    pub(crate) fn listen() -> Self {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            let signals = [SignalKind::interrupt(), SignalKind::terminate()]
                .into_iter()
                .filter_map(|kind| {
                    signal(kind).inspect_err(|err| tracing::warn!(%err, "cannot listen for a shutdown signal")).ok()
                })
                .collect();
            Self { signals }
        }
        #[cfg(not(unix))]
        Self {}
    }

    /// Resolves at the first SIGINT or SIGTERM.
    pub(crate) async fn received(&mut self) {
        #[cfg(unix)]
        {
            if self.signals.is_empty() {
                return std::future::pending().await;
            }
            let received = self.signals.iter_mut().map(|signal| Box::pin(signal.recv()));
            let _ = select_all(received).await;
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
