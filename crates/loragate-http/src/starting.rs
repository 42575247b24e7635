//! What the HTTP listener answers while the server starts (the model loading, the state being restored, a first
//! worker awaited): `/health` and `/ready` answer 503 `{"status": "starting", "step"}` at once, every other route 503
//! with the same step in an OpenAI-shaped error, each response closing its connection, so that probes and clients
//! learn the server is coming rather than hanging on a listener nobody accepts on. Once the server is ready the
//! listener is handed back to [`serve_http`](crate::serve_http).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use http::header::{CONNECTION, CONTENT_TYPE, RETRY_AFTER};
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use serde_json::json;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// At most this many connections are served at once while starting; more are closed at once.
const MAX_STARTING_CONNECTIONS: usize = 64;

/// How long a connection may take to send its request head while starting.
const HEAD_TIMEOUT: Duration = Duration::from_secs(10);

/// Answers on the HTTP listener while the server starts (see the module's documentation). Dropping it stops the
/// answering and closes the listener (a start that failed); [`StartingResponder::finish`] hands the listener back.
pub struct StartingResponder {
    stop: CancellationToken,
    task: Option<JoinHandle<TcpListener>>,
}

impl StartingResponder {
    /// Starts answering on `listener`; `step` says what the start is doing (it is quoted in every answer).
    pub fn spawn(listener: TcpListener, step: watch::Receiver<String>) -> Self {
        let stop = CancellationToken::new();
        let task = tokio::spawn(answer_while_starting(listener, step, stop.clone()));
        Self { stop, task: Some(task) }
    }

    /// Stops answering and hands the listener back, to be served by [`serve_http`](crate::serve_http). Connections
    /// accepted meanwhile finish their answer and close.
    pub async fn finish(mut self) -> std::io::Result<TcpListener> {
        self.stop.cancel();
        let task = self.task.take().expect("the task is taken only here");
        task.await.map_err(std::io::Error::other)
    }
}

impl Drop for StartingResponder {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Accepts and answers until `stop`, then gives the listener back.
async fn answer_while_starting(
    listener: TcpListener,
    step: watch::Receiver<String>,
    stop: CancellationToken,
) -> TcpListener {
    let slots = Arc::new(Semaphore::new(MAX_STARTING_CONNECTIONS));
    let open = GracefulShutdown::new();
    let mut http1 = http1::Builder::new();
    http1.timer(TokioTimer::new()).header_read_timeout(HEAD_TIMEOUT).keep_alive(false);
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            accepted = listener.accept() => {
                let Ok((stream, _peer)) = accepted else { continue };
                // Over the cap the connection is dropped (closed) at once.
                let Ok(slot) = slots.clone().try_acquire_owned() else { continue };
                let step = step.clone();
                let service = service_fn(move |request: Request<Incoming>| {
                    let step = step.borrow().clone();
                    async move { Ok::<_, Infallible>(starting_answer(request.uri().path(), &step)) }
                });
                let served = open.watch(http1.serve_connection(TokioIo::new(stream), service));
                tokio::spawn(async move {
                    let _slot = slot;
                    if let Err(err) = served.await {
                        tracing::debug!(%err, "an HTTP connection ended with an error while starting");
                    }
                });
            }
        }
    }
    // The connections accepted meanwhile finish their one answer on their own.
    tokio::spawn(open.shutdown());
    listener
}

/// The answer to `path` while the start is at `step`: 503, `Retry-After: 1`, and the connection closed after it.
fn starting_answer(path: &str, step: &str) -> Response<Body> {
    let body = match path {
        "/health" | "/ready" => json!({"status": "starting", "step": step}),
        _ => json!({"error": {
            "message": format!("loragate is starting ({step}); retry once GET /ready answers 200"),
            "type": "starting",
            "code": 503,
        }}),
    };
    Response::builder()
        .status(StatusCode::SERVICE_UNAVAILABLE)
        .header(CONTENT_TYPE, "application/json")
        .header(RETRY_AFTER, "1")
        .header(CONNECTION, "close")
        .body(Body::from(body.to_string()))
        .expect("a response of fixed valid parts")
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn get(addr: std::net::SocketAddr, path: &str) -> (u16, serde_json::Value) {
        let response = reqwest::get(format!("http://{addr}{path}")).await.expect("an answer while starting");
        let status = response.status().as_u16();
        (status, response.json().await.expect("a JSON body"))
    }

    #[tokio::test]
    async fn health_and_ready_say_starting_with_the_step_then_the_listener_is_handed_back() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("a listener");
        let addr = listener.local_addr().expect("its address");
        let (step, steps) = watch::channel("loading the model".to_owned());
        let responder = StartingResponder::spawn(listener, steps);
        for path in ["/health", "/ready"] {
            let (status, body) = get(addr, path).await;
            assert_eq!(status, 503, "{path}");
            assert_eq!(body, json!({"status": "starting", "step": "loading the model"}), "{path}");
        }
        step.send_replace("restoring the state".to_owned());
        let (status, body) = get(addr, "/v1/completions").await;
        assert_eq!(status, 503);
        assert_eq!(body["error"]["type"], "starting");
        let message = body["error"]["message"].as_str().expect("a message");
        assert!(message.contains("restoring the state"), "{message}");

        let listener = responder.finish().await.expect("the listener back");
        assert_eq!(listener.local_addr().expect("its address"), addr);
        // Nobody answers on it now until it is served again: a connection is accepted by the kernel only.
        let accepting = tokio::spawn(async move { listener.accept().await.map(|(_, peer)| peer) });
        let client = tokio::net::TcpStream::connect(addr).await.expect("a connection");
        let peer = accepting.await.expect("the accept task").expect("an accepted connection");
        assert_eq!(peer, client.local_addr().expect("the client's address"));
    }

    #[tokio::test]
    async fn dropping_it_closes_the_listener() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("a listener");
        let addr = listener.local_addr().expect("its address");
        let responder = StartingResponder::spawn(listener, watch::channel(String::new()).1);
        assert_eq!(get(addr, "/health").await.0, 503);
        drop(responder);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while tokio::net::TcpStream::connect(addr).await.is_ok() {
            assert!(tokio::time::Instant::now() < deadline, "the listener is still open");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
