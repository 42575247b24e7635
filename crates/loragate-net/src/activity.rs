//! Which connections have a request in progress: a request counts from its head until its response body is
//! finished or dropped, so a connection is idle only when none does.
//!
//! This is on every request's path, so it allocates nothing per request and wakes the connection's reader only when
//! it must: when the last request in progress ends and the reader's idle timer can no longer wake it by itself (see
//! [`Connection::wake_reader_when_idle`]).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::task::{Context, Poll, Waker, ready};
use std::time::Duration;

use futures::task::AtomicWaker;
use http_body::{Body, Frame, SizeHint};
use parking_lot::Mutex;
use tokio::time::Instant;
use tower::{Layer, Service};

struct State {
    active: AtomicU32,
    served: AtomicBool,
    idle_since: Mutex<Instant>,
    /// Set by the reader when its timer has fired while a request was in progress: the end of the last request must
    /// then wake it, so that it arms the idle timeout. Otherwise its timer wakes it, and a wake per request would
    /// cost an extra poll of the whole connection (for HTTP/1, whose requests end inside the reader's own task).
    wake_when_idle: AtomicBool,
    reader: AtomicWaker,
}

/// One accepted connection's activity. Cheap to clone (every clone is the same connection).
#[derive(Clone)]
pub struct Connection(Arc<State>);

impl fmt::Debug for Connection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connection").field("active_requests", &self.active_requests()).finish()
    }
}

impl Connection {
    /// A connection accepted now, with no request yet.
    pub(crate) fn accepted() -> Self {
        Self(Arc::new(State {
            active: AtomicU32::new(0),
            served: AtomicBool::new(false),
            idle_since: Mutex::new(Instant::now()),
            wake_when_idle: AtomicBool::new(false),
            reader: AtomicWaker::new(),
        }))
    }

    /// Marks a request in progress on this connection until the returned guard is dropped.
    pub fn begin(&self) -> ActiveRequest {
        self.0.served.store(true, Ordering::Release);
        self.0.active.fetch_add(1, Ordering::SeqCst);
        ActiveRequest(self.clone())
    }

    /// Requests in progress now.
    pub fn active_requests(&self) -> u32 {
        self.0.active.load(Ordering::SeqCst)
    }

    /// When the connection must be closed unless a request begins first: `header_read_timeout` after it was
    /// accepted if it never had a request, `idle_timeout` after its last request ended; `None` while a request is
    /// in progress.
    pub(crate) fn close_at(&self, header_read_timeout: Duration, idle_timeout: Duration) -> Option<Instant> {
        if self.active_requests() > 0 {
            return None;
        }
        let since = *self.0.idle_since.lock();
        let timeout = if self.0.served.load(Ordering::Acquire) { idle_timeout } else { header_read_timeout };
        Some(since + timeout)
    }

    /// Has `waker` (the connection's reader, whose timer cannot wake it any more) woken when the last request in
    /// progress ends, so that it arms the idle timeout then. Returns whether a request is still in progress: if
    /// not, the last one ended meanwhile and nothing will wake the reader (it must look at the connection again).
    pub(crate) fn wake_reader_when_idle(&self, waker: &Waker) -> bool {
        self.0.reader.register(waker);
        // Pairs with `ActiveRequest::drop`, which counts down, then takes the flag: either that drop sees the flag
        // and wakes the reader, or this load sees the count at zero.
        self.0.wake_when_idle.store(true, Ordering::SeqCst);
        self.active_requests() > 0
    }
}

/// A request in progress on a [`Connection`]; it ends when this is dropped.
#[derive(Debug)]
pub struct ActiveRequest(Connection);

impl Drop for ActiveRequest {
    fn drop(&mut self) {
        let state = &self.0.0;
        if state.active.fetch_sub(1, Ordering::SeqCst) == 1 {
            *state.idle_since.lock() = Instant::now();
            if state.wake_when_idle.swap(false, Ordering::SeqCst) {
                state.reader.wake();
            }
        }
    }
}

/// A response body that keeps its request in progress until it is finished or dropped.
#[derive(Debug)]
pub struct ActiveBody<B> {
    inner: B,
    request: Option<ActiveRequest>,
}

impl<B> ActiveBody<B> {
    /// `inner`, keeping `request` in progress while it is being sent.
    pub fn new(inner: B, request: Option<ActiveRequest>) -> Self {
        Self { inner, request }
    }
}

impl<B: Body + Unpin> Body for ActiveBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(None) = polled {
            self.request = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Marks every request in progress on its [`Connection`], found in the request's extensions (where tonic puts a
/// [`GuardedStream`](crate::GuardedStream)'s connect info). Requests without one pass through unmarked.
#[derive(Clone, Copy, Debug, Default)]
pub struct ActivityLayer;

impl<S> Layer<S> for ActivityLayer {
    type Service = ActivityService<S>;

    fn layer(&self, inner: S) -> ActivityService<S> {
        ActivityService { inner }
    }
}

/// A service behind [`ActivityLayer`].
#[derive(Clone, Debug)]
pub struct ActivityService<S> {
    inner: S,
}

impl<S, ReqBody, ResBody> Service<http::Request<ReqBody>> for ActivityService<S>
where
    S: Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
{
    type Response = http::Response<ActiveBody<ResBody>>;
    type Error = S::Error;
    type Future = ActivityFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<ReqBody>) -> Self::Future {
        let active = request.extensions().get::<Connection>().map(Connection::begin);
        ActivityFuture { inner: self.inner.call(request), active }
    }
}

pin_project_lite::pin_project! {
    /// The response future of [`ActivityService`]: the inner one, keeping the request in progress.
    #[derive(Debug)]
    pub struct ActivityFuture<F> {
        #[pin]
        inner: F,
        active: Option<ActiveRequest>,
    }
}

impl<F, ResBody, E> Future for ActivityFuture<F>
where
    F: Future<Output = Result<http::Response<ResBody>, E>>,
{
    type Output = Result<http::Response<ActiveBody<ResBody>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let response = ready!(this.inner.poll(cx))?;
        let active = this.active.take();
        Poll::Ready(Ok(response.map(|body| ActiveBody::new(body, active))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_connection_is_idle_only_without_requests_in_progress() {
        let (header, idle) = (Duration::from_secs(10), Duration::from_secs(60));
        let connection = Connection::accepted();
        let accepted = Instant::now();
        assert_eq!(connection.close_at(header, idle), Some(accepted + header), "the first request has 10 s");

        let first = connection.begin();
        let second = connection.begin();
        assert_eq!(connection.close_at(header, idle), None);
        tokio::time::advance(Duration::from_secs(100)).await;
        drop(first);
        assert_eq!(connection.close_at(header, idle), None, "one request is still in progress");
        drop(second);
        let ended = Instant::now();
        assert_eq!(connection.close_at(header, idle), Some(ended + idle), "later requests get the idle timeout");
    }

    #[tokio::test]
    async fn a_response_body_keeps_its_request_in_progress_until_it_ends() {
        use http_body_util::BodyExt;

        let connection = Connection::accepted();
        let body =
            ActiveBody::new(http_body_util::Full::new(bytes::Bytes::from_static(b"hi")), Some(connection.begin()));
        assert_eq!(connection.active_requests(), 1);
        let collected = body.collect().await.expect("infallible").to_bytes();
        assert_eq!(collected.as_ref(), b"hi");
        assert_eq!(connection.active_requests(), 0, "a finished body ends its request");

        let dropped = ActiveBody::new(http_body_util::Empty::<bytes::Bytes>::new(), Some(connection.begin()));
        drop(dropped);
        assert_eq!(connection.active_requests(), 0, "a dropped body ends its request");
    }
}
