//! The request guard, in two parts.
//!
//! **Router-wide** ([`GuardLayer`], applied before routing, so that routes added later, other fronts' routes and the
//! fallback are covered without doing anything), it refuses:
//! 1. **cross-origin browser requests** (403): any request carrying `Origin`, or `Sec-Fetch-Site` other than
//!    `none` (a URL typed into the browser). loragate serves no web pages, so such a request can only come from a
//!    page the operator happened to visit (CSRF) or a DNS-rebinding attack; programs (SDKs, curl, Prometheus) send
//!    neither header;
//! 2. **POST bodies that are not JSON** (415): a `POST` with a body must say `Content-Type: application/json`
//!    (a browser form can send `text/plain` without a preflight; it cannot send JSON cross-origin). A `POST` without
//!    a body needs no content type.
//!
//! It also keeps keep-alive connections honest: a response that leaves its request's body unread (a refusal before
//! the body was looked at, a body over the limit or too slow) says `Connection: close`, because the server then
//! closes the connection rather than read the rest; a client that reuses it would otherwise find a broken pipe.
//!
//! **Per route** ([`AuthenticateLayer`], a route layer on this front's own routes), when authentication is on: callers
//! without a valid key get 401 (with `WWW-Authenticate: Bearer`), callers whose key may not make this kind of
//! request at all 403. The key → permission logic is the core's ([`loragate_core::Keyring`]); this module only reads
//! `Authorization: Bearer KEY` and classifies endpoints ([`required_action`]). The caller's
//! [`loragate_core::Principal`] goes to the handlers in a request extension; they check it against the adapter each
//! request names. Other fronts mounted on the listener (the Tinker API) bring their own authentication, with their
//! own way of presenting keys; this module knows nothing of them.
//!
//! `/health` and `/metrics` are open (no key), but still refuse cross-origin browser requests.
//!
//! Both are plain tower layers, not `axum::middleware::from_fn`: every request passes them, and `from_fn` boxes the
//! rest of the stack and the response future for each request.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, ready};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::header::{AUTHORIZATION, CONNECTION, CONTENT_LENGTH, CONTENT_TYPE, ORIGIN, TRANSFER_ENCODING};
use http::{HeaderMap, HeaderValue, Method, Uri};
use http_body::Frame;
use loragate_core::{Action, Principal, bearer_token};
use tower::{Layer, Service};

use crate::error::HttpError;
use crate::state::AppState;

/// `Sec-Fetch-Site`, sent by browsers with every request.
const SEC_FETCH_SITE: &str = "sec-fetch-site";

/// What an endpoint of this front needs from its caller: `None` for open endpoints. Endpoints not listed here need
/// the admin key, so a new endpoint is closed until it is classified.
pub(crate) fn required_action(path: &str) -> Option<Action> {
    match path {
        "/health" | "/ready" | "/metrics" => None,
        "/v1/completions"
        | "/v1/chat/completions"
        | "/inference/v1/generate"
        | "/generate"
        | "/tokenize"
        | "/detokenize"
        | "/v1/models"
        | "/get_server_info"
        | "/server_info"
        | "/skyrl/v1/wait_lora_unpaused"
        | "/is_paused" => Some(Action::Sample),
        "/skyrl/v1/abort_lora_requests"
        | "/skyrl/v1/resume_lora_requests"
        | "/skyrl/v1/load_lora_adapter"
        | "/v1/load_lora_adapter"
        | "/v1/unload_lora_adapter"
        | "/load_lora_adapter"
        | "/unload_lora_adapter" => Some(Action::Control),
        path if crate::versions::is_staleness_path(path) => Some(Action::Control),
        path if crate::versions::is_finished_request_path(path) => Some(Action::Sample),
        // A key that may sample may read an adapter's state; pushing a version and reading its files need control of
        // the adapter, which the handlers check against the adapter the path names.
        path if path.starts_with("/v1/lora_adapters/") => Some(Action::Sample),
        // The engine-wide pause (/pause, /resume, /pause_generation, ...), the engine-wide caches
        // (/reset_prefix_cache, /flush_cache), SGLang's /abort_request and vLLM's /inference/v1/abort_requests (they
        // abort by request id across every adapter) and anything not classified yet.
        _ => Some(Action::Admin),
    }
}

/// The router-wide middleware (apply it with `Router::layer` after every route, so that it covers all of them).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct GuardLayer;

impl<S> Layer<S> for GuardLayer {
    type Service = Guarded<S>;

    fn layer(&self, inner: S) -> Guarded<S> {
        Guarded { inner }
    }
}

/// The router behind [`GuardLayer`].
#[derive(Clone, Debug)]
pub(crate) struct Guarded<S> {
    inner: S,
}

impl<S> Service<Request> for Guarded<S>
where
    S: Service<Request, Response = Response, Error = Infallible>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = GuardedResponse<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let headers = request.headers();
        let has_body = declares_body(headers);
        if let Err(err) =
            refuse_cross_origin(headers).and_then(|()| require_json_body(request.method(), headers, has_body))
        {
            return GuardedResponse::Refused { answer: Some(close_if(has_body, err.into_response())) };
        }
        if !has_body {
            return GuardedResponse::Passed { inner: self.inner.call(request), body_read: None };
        }
        let finished = Arc::new(AtomicBool::new(false));
        let request = request.map(|body| Body::new(TrackedBody { inner: body, finished: finished.clone() }));
        GuardedResponse::Passed { inner: self.inner.call(request), body_read: Some(finished) }
    }
}

pin_project_lite::pin_project! {
    /// The response future of [`Guarded`].
    #[project = GuardedResponseProjection]
    pub(crate) enum GuardedResponse<F> {
        /// Refused before routing: this answer, at once.
        Refused { answer: Option<Response> },
        /// Let through; `body_read` says whether the request's body was read to its end (`None`: it had none).
        Passed {
            #[pin]
            inner: F,
            body_read: Option<Arc<AtomicBool>>,
        },
    }
}

impl<F> Future for GuardedResponse<F>
where
    F: Future<Output = Result<Response, Infallible>>,
{
    type Output = Result<Response, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            GuardedResponseProjection::Refused { answer } => Poll::Ready(Ok(take_answer(answer))),
            GuardedResponseProjection::Passed { inner, body_read } => {
                let response = ready!(inner.poll(cx))?;
                let unread = body_read.as_ref().is_some_and(|finished| !finished.load(Ordering::Acquire));
                Poll::Ready(Ok(close_if(unread, response)))
            }
        }
    }
}

/// The answer of a refusal future, which is polled once.
fn take_answer(answer: &mut Option<Response>) -> Response {
    match answer.take() {
        Some(answer) => answer,
        None => panic!("a refusal was polled after it completed"),
    }
}

/// The per-route authentication of this front's endpoints (apply it with `Router::route_layer`).
#[derive(Clone)]
pub(crate) struct AuthenticateLayer {
    state: AppState,
}

impl AuthenticateLayer {
    pub(crate) fn new(state: AppState) -> Self {
        Self { state }
    }
}

impl<S> Layer<S> for AuthenticateLayer {
    type Service = Authenticate<S>;

    fn layer(&self, inner: S) -> Authenticate<S> {
        Authenticate { inner, state: self.state.clone() }
    }
}

/// A route behind [`AuthenticateLayer`].
#[derive(Clone)]
pub(crate) struct Authenticate<S> {
    inner: S,
    state: AppState,
}

impl<S> Service<Request> for Authenticate<S>
where
    S: Service<Request, Response = Response, Error = Infallible>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = GuardedResponse<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request) -> Self::Future {
        if let Some(action) = required_action(request.uri().path()) {
            match authorized(&self.state, request.headers(), Some(action)) {
                Ok(principal) => {
                    request.extensions_mut().insert(principal);
                }
                Err(err) => return GuardedResponse::Refused { answer: Some(err.into_response()) },
            }
        }
        GuardedResponse::Passed { inner: self.inner.call(request), body_read: None }
    }
}

/// The caller behind `headers`' bearer key, checked for `action` (any valid key for `None`).
fn authorized(state: &AppState, headers: &HeaderMap, action: Option<Action>) -> Result<Principal, HttpError> {
    let presented = headers.get(AUTHORIZATION).and_then(|value| value.to_str().ok()).and_then(bearer_token);
    let principal = state.front().coordinator().auth().authenticate(presented).map_err(HttpError::access)?;
    if let Some(action) = action {
        principal.may(action).map_err(HttpError::access)?;
    }
    Ok(principal)
}

/// The fallback: 404 for a path nothing serves, once the caller presented a valid key (any key: clients probe
/// optional endpoints with the key they have, and a 404 is what tells them "not supported").
pub(crate) async fn no_such_endpoint(State(state): State<AppState>, headers: HeaderMap, uri: Uri) -> HttpError {
    match authorized(&state, &headers, None) {
        Ok(_) => HttpError::NoSuchEndpoint(uri.path().to_owned()),
        Err(err) => err,
    }
}

/// HTTP/1.1 (the only protocol this front speaks): a request has a body iff it is chunked or declares a length.
fn declares_body(headers: &HeaderMap) -> bool {
    let declared_length = headers.get(CONTENT_LENGTH).map(|value| value.as_bytes().trim_ascii());
    headers.contains_key(TRANSFER_ENCODING) || declared_length.is_some_and(|length| length != b"0")
}

/// `response`, saying `Connection: close` if `close`.
fn close_if(close: bool, mut response: Response) -> Response {
    if close {
        response.headers_mut().insert(CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// A request body that records whether it was read to its end.
struct TrackedBody {
    inner: Body,
    finished: Arc<AtomicBool>,
}

impl http_body::Body for TrackedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None)) {
            self.finished.store(true, Ordering::Release);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

fn refuse_cross_origin(headers: &HeaderMap) -> Result<(), HttpError> {
    if headers.contains_key(ORIGIN) {
        return Err(HttpError::CrossOrigin("Origin"));
    }
    match headers.get(SEC_FETCH_SITE).map(|value| value.as_bytes()) {
        None | Some(b"none") => Ok(()),
        Some(_) => Err(HttpError::CrossOrigin("Sec-Fetch-Site")),
    }
}

fn require_json_body(method: &Method, headers: &HeaderMap, has_body: bool) -> Result<(), HttpError> {
    if method != Method::POST || !has_body {
        return Ok(());
    }
    let media_type = headers
        .get(CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .map(|value| value.split(';').next().unwrap_or_default().trim().to_ascii_lowercase());
    match media_type.as_deref() {
        Some("application/json") => Ok(()),
        other => Err(HttpError::UnsupportedMediaType(other.map(str::to_owned))),
    }
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        pairs
            .iter()
            .map(|(name, value)| (http::HeaderName::from_static(name), HeaderValue::from_static(value)))
            .collect()
    }

    #[test]
    fn browser_markers_of_another_origin_are_refused() {
        for refused in [
            headers(&[("origin", "https://evil.example")]),
            headers(&[("origin", "null")]),
            headers(&[("sec-fetch-site", "cross-site")]),
            headers(&[("sec-fetch-site", "same-site")]),
            headers(&[("sec-fetch-site", "same-origin")]),
        ] {
            assert!(refuse_cross_origin(&refused).is_err(), "{refused:?}");
        }
        for allowed in [headers(&[]), headers(&[("sec-fetch-site", "none")])] {
            assert!(refuse_cross_origin(&allowed).is_ok(), "{allowed:?}");
        }
    }

    #[test]
    fn post_bodies_must_be_json_and_bodiless_posts_need_no_type() {
        let post = Method::POST;
        let json_body = |headers: &HeaderMap| require_json_body(&post, headers, declares_body(headers));
        for allowed in [
            headers(&[("content-length", "2"), ("content-type", "application/json")]),
            headers(&[("content-length", "2"), ("content-type", "Application/JSON; charset=utf-8")]),
            headers(&[("transfer-encoding", "chunked"), ("content-type", "application/json")]),
            headers(&[("content-length", "0")]),
            headers(&[]),
        ] {
            assert!(json_body(&allowed).is_ok(), "{allowed:?}");
        }
        for refused in [
            headers(&[("content-length", "2")]),
            headers(&[("content-length", "2"), ("content-type", "text/plain")]),
            headers(&[("content-length", "2"), ("content-type", "application/x-www-form-urlencoded")]),
            headers(&[("content-length", "2"), ("content-type", "multipart/form-data; boundary=x")]),
            headers(&[("transfer-encoding", "chunked"), ("content-type", "application/jsonp")]),
        ] {
            assert!(json_body(&refused).is_err(), "{refused:?}");
        }
        let with_length = headers(&[("content-length", "2")]);
        assert!(require_json_body(&Method::GET, &with_length, declares_body(&with_length)).is_ok());
    }

    #[test]
    fn every_endpoint_is_classified_and_new_ones_need_the_admin_key() {
        assert_eq!(required_action("/health"), None);
        assert_eq!(required_action("/ready"), None);
        assert_eq!(required_action("/metrics"), None);
        assert_eq!(required_action("/v1/completions"), Some(Action::Sample));
        assert_eq!(required_action("/skyrl/v1/wait_lora_unpaused"), Some(Action::Sample));
        assert_eq!(required_action("/v1/load_lora_adapter"), Some(Action::Control));
        assert_eq!(required_action("/skyrl/v1/load_lora_adapter"), Some(Action::Control));
        assert_eq!(required_action("/is_paused"), Some(Action::Sample));
        for engine_wide in [
            "/pause",
            "/resume",
            "/pause_generation",
            "/continue_generation",
            "/areal_pause_generation",
            "/reset_prefix_cache",
            "/flush_cache",
        ] {
            assert_eq!(required_action(engine_wide), Some(Action::Admin), "{engine_wide}");
        }
        assert_eq!(required_action("/v1/completions/"), Some(Action::Admin));
        assert_eq!(required_action("/api/v1/asample"), Some(Action::Admin), "this front knows no Tinker route");
    }
}
