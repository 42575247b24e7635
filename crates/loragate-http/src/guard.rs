//! The request guard: one router-wide middleware that every request passes before routing, so that endpoints added
//! later are covered without doing anything.
//!
//! In order, it refuses:
//! 1. **cross-origin browser requests** (403): any request carrying `Origin`, or `Sec-Fetch-Site` other than
//!    `none` (a URL typed into the browser). loragate serves no web pages, so such a request can only come from a
//!    page the operator happened to visit (CSRF) or a DNS-rebinding attack; programs (SDKs, curl, Prometheus) send
//!    neither header;
//! 2. **POST bodies that are not JSON** (415): a `POST` with a body must say `Content-Type: application/json`
//!    (a browser form can send `text/plain` without a preflight; it cannot send JSON cross-origin). A `POST` without
//!    a body needs no content type;
//! 3. **callers without a valid key**, when authentication is on (401, with `WWW-Authenticate: Bearer`), and callers
//!    whose key may not make this kind of request at all (403). The key → permission logic is the core's
//!    ([`loragate_core::Keyring`]); this module only reads `Authorization: Bearer KEY` (or, as the Tinker SDK sends
//!    it, `X-API-Key: KEY`, where `tml-KEY` also stands for `KEY`: the SDK insists on that prefix) and classifies endpoints
//!    ([`required_action`]). The caller's [`loragate_core::Principal`] goes to the handlers in a request
//!    extension; they check it against the adapter each request names.
//!
//! `/health` and `/metrics` are open (no key), but still refuse cross-origin browser requests.

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http::header::{AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE, ORIGIN, TRANSFER_ENCODING};
use http::{HeaderMap, Method};
use loragate_core::{Action, bearer_token};

use crate::error::HttpError;
use crate::server::AppState;

/// `Sec-Fetch-Site`, sent by browsers with every request.
const SEC_FETCH_SITE: &str = "sec-fetch-site";

/// What an endpoint needs from its caller: `None` for open endpoints. Endpoints not listed here need the admin
/// key, so a new endpoint is closed until it is classified.
pub(crate) fn required_action(path: &str) -> Option<Action> {
    match path {
        "/health" | "/metrics" => None,
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
        // The Tinker API (mounted with `HttpFront::with_routes`): sampling only; its handlers check the adapter.
        tinker if tinker.starts_with("/api/v1/") => Some(Action::Sample),
        "/skyrl/v1/abort_lora_requests"
        | "/skyrl/v1/resume_lora_requests"
        | "/skyrl/v1/load_lora_adapter"
        | "/v1/load_lora_adapter"
        | "/v1/unload_lora_adapter"
        | "/load_lora_adapter"
        | "/unload_lora_adapter"
        | "/reset_prefix_cache"
        | "/flush_cache" => Some(Action::Control),
        // The engine-wide pause (/pause, /resume, /pause_generation, ...), SGLang's /abort_request and vLLM's
        // /inference/v1/abort_requests (they abort by request id across every adapter) and anything not classified
        // yet.
        _ => Some(Action::Admin),
    }
}

/// The middleware (apply it with `Router::layer` after every route, so that it covers all of them).
pub(crate) async fn guard(State(state): State<AppState>, mut request: Request, next: Next) -> Response {
    let headers = request.headers();
    if let Err(err) = refuse_cross_origin(headers).and_then(|()| require_json_body(request.method(), headers)) {
        return err.into_response();
    }
    if let Some(action) = required_action(request.uri().path()) {
        let keyring = state.front().coordinator().auth();
        let authenticated = match presented_key(headers) {
            Presented::Bearer(key) => keyring.authenticate(key),
            // The SDK's `tml-` prefix is optional on the server's side: `tml-KEY` also presents `KEY`.
            Presented::ApiKey(key) => keyring.authenticate(Some(key)).or_else(|err| {
                key.strip_prefix(TINKER_KEY_PREFIX).map_or(Err(err), |bare| keyring.authenticate(Some(bare)))
            }),
        };
        match authenticated.and_then(|principal| principal.may(action).map(|()| principal)) {
            Ok(principal) => {
                request.extensions_mut().insert(principal);
            }
            Err(err) => return HttpError::access(err).into_response(),
        }
    }
    next.run(request).await
}

/// `X-API-Key`, the Tinker SDK's header.
const API_KEY_HEADER: &str = "x-api-key";
/// The prefix the Tinker SDK requires of its keys.
const TINKER_KEY_PREFIX: &str = "tml-";

/// The key a request presents.
enum Presented<'a> {
    /// `Authorization: Bearer KEY` (or no key at all).
    Bearer(Option<&'a str>),
    /// `X-API-Key: KEY`, without an `Authorization` header.
    ApiKey(&'a str),
}

fn presented_key(headers: &HeaderMap) -> Presented<'_> {
    let header = |name| headers.get(name).and_then(|value: &http::HeaderValue| value.to_str().ok());
    match (header(AUTHORIZATION.as_str()), header(API_KEY_HEADER)) {
        (None, Some(key)) => Presented::ApiKey(key.trim()),
        (authorization, _) => Presented::Bearer(authorization.and_then(bearer_token)),
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

fn require_json_body(method: &Method, headers: &HeaderMap) -> Result<(), HttpError> {
    if method != Method::POST {
        return Ok(());
    }
    // HTTP/1.1 (the only protocol this front speaks): a request has a body iff it is chunked or declares a length.
    let declared_length = headers.get(CONTENT_LENGTH).map(|value| value.as_bytes().trim_ascii());
    let has_body = headers.contains_key(TRANSFER_ENCODING) || declared_length.is_some_and(|length| length != b"0");
    if !has_body {
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
        for allowed in [
            headers(&[("content-length", "2"), ("content-type", "application/json")]),
            headers(&[("content-length", "2"), ("content-type", "Application/JSON; charset=utf-8")]),
            headers(&[("transfer-encoding", "chunked"), ("content-type", "application/json")]),
            headers(&[("content-length", "0")]),
            headers(&[]),
        ] {
            assert!(require_json_body(&post, &allowed).is_ok(), "{allowed:?}");
        }
        for refused in [
            headers(&[("content-length", "2")]),
            headers(&[("content-length", "2"), ("content-type", "text/plain")]),
            headers(&[("content-length", "2"), ("content-type", "application/x-www-form-urlencoded")]),
            headers(&[("content-length", "2"), ("content-type", "multipart/form-data; boundary=x")]),
            headers(&[("transfer-encoding", "chunked"), ("content-type", "application/jsonp")]),
        ] {
            assert!(require_json_body(&post, &refused).is_err(), "{refused:?}");
        }
        assert!(require_json_body(&Method::GET, &headers(&[("content-length", "2")])).is_ok());
    }

    #[test]
    fn every_endpoint_is_classified_and_new_ones_need_the_admin_key() {
        assert_eq!(required_action("/health"), None);
        assert_eq!(required_action("/metrics"), None);
        assert_eq!(required_action("/v1/completions"), Some(Action::Sample));
        assert_eq!(required_action("/skyrl/v1/wait_lora_unpaused"), Some(Action::Sample));
        assert_eq!(required_action("/v1/load_lora_adapter"), Some(Action::Control));
        assert_eq!(required_action("/skyrl/v1/load_lora_adapter"), Some(Action::Control));
        assert_eq!(required_action("/is_paused"), Some(Action::Sample));
        for engine_wide in ["/pause", "/resume", "/pause_generation", "/continue_generation", "/areal_pause_generation"]
        {
            assert_eq!(required_action(engine_wide), Some(Action::Admin), "{engine_wide}");
        }
        assert_eq!(required_action("/v1/completions/"), Some(Action::Admin));
    }
}
