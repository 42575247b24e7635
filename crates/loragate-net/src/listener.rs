//! The listener with a connection cap, and the connections it accepts, which close themselves when idle.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Sleep;

use crate::activity::Connection;
use crate::limits::ConnectionLimits;

/// How long to wait before accepting again after an error that is not about one connection (out of file
/// descriptors, say), so a full table does not spin the accept loop.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);

/// A TCP listener that accepts at most [`ConnectionLimits::max_connections`] connections at once.
#[derive(Debug)]
pub struct GuardedListener {
    listener: TcpListener,
    limits: ConnectionLimits,
}

impl GuardedListener {
    /// Guards `listener` with `limits` (clones of the same limits share one cap).
    pub fn new(listener: TcpListener, limits: ConnectionLimits) -> Self {
        Self { listener, limits }
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Waits for room under the cap, then for a connection. Accept errors are logged and retried.
    pub async fn accept(&mut self) -> (GuardedStream, SocketAddr) {
        // The semaphore is never closed.
        let slot = match self.limits.slots().clone().acquire_owned().await {
            Ok(slot) => slot,
            Err(_closed) => unreachable!("the connection cap's semaphore is never closed"),
        };
        loop {
            match self.listener.accept().await {
                Ok((io, remote)) => {
                    if let Err(err) = io.set_nodelay(true) {
                        tracing::debug!(%err, "could not set TCP_NODELAY");
                    }
                    let slot = OpenSlot::taken(slot, &self.limits);
                    return (GuardedStream::new(io, slot, &self.limits), remote);
                }
                Err(err) if is_connection_error(&err) => {}
                Err(err) => {
                    tracing::warn!(%err, "accepting a connection failed; retrying shortly");
                    tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                }
            }
        }
    }
}

/// Errors about one connection (it went away before being accepted): accept the next at once.
fn is_connection_error(err: &io::Error) -> bool {
    matches!(
        err.kind(),
        io::ErrorKind::ConnectionRefused | io::ErrorKind::ConnectionAborted | io::ErrorKind::ConnectionReset
    )
}

/// An accepted connection. It holds one place under the cap until dropped, and reads as closed (end of stream) once
/// it has gone without a request in progress past its header-read or idle timeout, which makes the server close it.
#[derive(Debug)]
pub struct GuardedStream {
    io: TcpStream,
    connection: Connection,
    header_read_timeout: Duration,
    idle_timeout: Duration,
    timer: Pin<Box<Sleep>>,
    expired: bool,
    _slot: OpenSlot,
}

/// One connection's place under the cap, and its count among the open ones.
#[derive(Debug)]
struct OpenSlot {
    _permit: OwnedSemaphorePermit,
    open: Arc<AtomicUsize>,
}

impl OpenSlot {
    fn taken(permit: OwnedSemaphorePermit, limits: &ConnectionLimits) -> Self {
        let open = limits.open().clone();
        open.fetch_add(1, Ordering::AcqRel);
        Self { _permit: permit, open }
    }
}

impl Drop for OpenSlot {
    fn drop(&mut self) {
        self.open.fetch_sub(1, Ordering::AcqRel);
    }
}

impl GuardedStream {
    fn new(io: TcpStream, slot: OpenSlot, limits: &ConnectionLimits) -> Self {
        Self {
            io,
            connection: Connection::accepted(),
            header_read_timeout: limits.header_read_timeout,
            idle_timeout: limits.idle_timeout,
            timer: Box::pin(tokio::time::sleep(limits.header_read_timeout)),
            expired: false,
            _slot: slot,
        }
    }

    /// The connection's activity (mark requests in progress with [`Connection::begin`]).
    pub fn connection(&self) -> &Connection {
        &self.connection
    }

    /// Whether the connection has gone too long without a request; arms the timer (or, while a request is in
    /// progress and the timer has fired, the wake-up when the last request ends) otherwise.
    ///
    /// The deadline only ever moves later (the idle timeout counts from the end of the last request, and is never
    /// shorter than the header-read timeout it replaces), so a timer armed for an earlier deadline is left running:
    /// when it fires, this looks again and re-arms it. Ending a request therefore wakes nothing unless the timer has
    /// already fired.
    fn poll_expired(&mut self, cx: &mut Context<'_>) -> bool {
        if self.expired {
            return true;
        }
        let close_at = loop {
            if let Some(close_at) = self.connection.close_at(self.header_read_timeout, self.idle_timeout) {
                break close_at;
            }
            // A request is in progress. A timer still running wakes this reader (and it looks again); one that has
            // fired cannot, so the end of the last request must.
            if !self.timer.is_elapsed() || self.connection.wake_reader_when_idle(cx.waker()) {
                return false;
            }
        };
        if self.timer.deadline() != close_at {
            self.timer.as_mut().reset(close_at);
        }
        if self.timer.as_mut().poll(cx).is_pending() {
            return false;
        }
        tracing::debug!("closing a connection that went too long without a request in progress");
        self.expired = true;
        true
    }
}

impl AsyncRead for GuardedStream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.poll_expired(cx) {
            // End of stream: the server sees the peer gone and closes the connection.
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for GuardedStream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

#[cfg(feature = "axum")]
mod axum_listener {
    use axum::extract::connect_info::Connected;
    use axum::serve::{IncomingStream, Listener};

    use super::*;

    impl Listener for GuardedListener {
        type Io = GuardedStream;
        type Addr = SocketAddr;

        async fn accept(&mut self) -> (GuardedStream, SocketAddr) {
            GuardedListener::accept(self).await
        }

        fn local_addr(&self) -> io::Result<SocketAddr> {
            GuardedListener::local_addr(self)
        }
    }

    /// With `Router::into_make_service_with_connect_info::<Connection>()`, each request's extensions hold
    /// `ConnectInfo<Connection>`.
    impl Connected<IncomingStream<'_, GuardedListener>> for Connection {
        fn connect_info(stream: IncomingStream<'_, GuardedListener>) -> Self {
            stream.io().connection().clone()
        }
    }
}

#[cfg(feature = "tonic")]
mod tonic_connected {
    use super::*;

    /// tonic puts the [`Connection`] in every request's extensions, where [`crate::ActivityLayer`] finds it.
    impl tonic::transport::server::Connected for GuardedStream {
        type ConnectInfo = Connection;

        fn connect_info(&self) -> Connection {
            self.connection.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::time::Instant;

    use super::*;

    async fn listener(limits: ConnectionLimits) -> (GuardedListener, SocketAddr) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address");
        (GuardedListener::new(listener, limits), address)
    }

    #[tokio::test]
    async fn past_the_cap_a_connection_waits_until_another_closes() {
        let limits = ConnectionLimits::new(2, Duration::from_secs(10), Duration::from_secs(60));
        let (mut listener, address) = listener(limits.clone()).await;
        let _clients: Vec<TcpStream> = futures::future::join_all((0..3).map(|_| TcpStream::connect(address)))
            .await
            .into_iter()
            .map(|c| c.expect("connect"))
            .collect();
        let first = listener.accept().await.0;
        let _second = listener.accept().await.0;
        assert_eq!(limits.open_connections(), 2);
        let third = tokio::time::timeout(Duration::from_millis(100), listener.accept()).await;
        assert!(third.is_err(), "a third connection is not accepted while two are open");
        drop(first);
        let third = tokio::time::timeout(Duration::from_secs(5), listener.accept()).await;
        assert!(third.is_ok(), "it is accepted once one closes");
        assert_eq!(limits.open_connections(), 2);
    }

    #[tokio::test]
    async fn a_connection_without_requests_reads_as_closed_after_its_timeout_but_not_while_one_is_in_progress() {
        let limits = ConnectionLimits::new(8, Duration::from_millis(100), Duration::from_millis(300));
        let (mut listener, address) = listener(limits).await;
        let mut client = TcpStream::connect(address).await.expect("connect");
        let (mut server, _) = listener.accept().await;
        client.write_all(b"partial head").await.expect("write");
        let mut buf = [0u8; 64];
        assert_eq!(server.read(&mut buf).await.expect("read"), 12, "bytes flow before the deadline");

        let request = server.connection().begin();
        let started = Instant::now();
        let wait = tokio::time::timeout(Duration::from_millis(500), server.read(&mut buf)).await;
        assert!(wait.is_err(), "a request in progress keeps the connection open past both timeouts");
        drop(request);
        let read = tokio::time::timeout(Duration::from_secs(5), server.read(&mut buf)).await;
        assert_eq!(read.expect("the idle timeout ends the wait").expect("no error"), 0, "end of stream");
        assert!(started.elapsed() >= Duration::from_millis(800), "{:?}", started.elapsed());

        let _silent = TcpStream::connect(address).await.expect("connect");
        let (mut silent, _) = listener.accept().await;
        let started = Instant::now();
        assert_eq!(silent.read(&mut buf).await.expect("read"), 0, "no request within the header-read timeout");
        let waited = started.elapsed();
        assert!(waited >= Duration::from_millis(90) && waited < Duration::from_millis(300), "{waited:?}");
    }

    #[tokio::test]
    async fn a_request_ending_before_the_timer_fires_moves_the_deadline_to_its_end_plus_the_idle_timeout() {
        // Ending the request wakes nothing: the timer, still armed for the header-read deadline, wakes the reader,
        // which then waits for the idle deadline counted from the end of the request.
        let limits = ConnectionLimits::new(8, Duration::from_millis(200), Duration::from_millis(400));
        let (mut listener, address) = listener(limits).await;
        let mut client = TcpStream::connect(address).await.expect("connect");
        let (mut server, _) = listener.accept().await;
        client.write_all(b"head").await.expect("write");
        let mut buf = [0u8; 64];
        assert_eq!(server.read(&mut buf).await.expect("read"), 4);

        let request = server.connection().begin();
        let ended = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            drop(request);
            Instant::now()
        });
        let read = tokio::time::timeout(Duration::from_secs(10), server.read(&mut buf)).await;
        let closed_at = Instant::now();
        assert_eq!(read.expect("the idle timeout closes the connection").expect("no error"), 0, "end of stream");
        let ended = ended.await.expect("task");
        assert!(
            closed_at >= ended + Duration::from_millis(390),
            "closed {:?} after the request ended",
            closed_at - ended
        );
    }
}
