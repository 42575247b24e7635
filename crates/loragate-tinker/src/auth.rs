//! Who is calling: the front's own authentication, a route layer over every `/api/v1/` route. The Tinker SDK sends its
//! key as `X-API-Key: tml-KEY` (it insists on the `tml-` prefix, so a configured key `K` is accepted as `K` or
//! `tml-K`); `Authorization: Bearer KEY` is read too, and wins when both are sent. The key → permission logic is the
//! core's ([`loragate_core::Keyring`]): every route needs a key that may sample, and the handlers check the adapter
//! (and, for a future, that the caller is the one who created it). The caller's [`Principal`] goes to the handlers
//! in a request extension.

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http::HeaderMap;
use http::header::AUTHORIZATION;
use loragate_core::{Action, Principal, bearer_token};

use crate::error::TinkerError;
use crate::state::TinkerState;

/// `X-API-Key`, the Tinker SDK's header.
const API_KEY_HEADER: &str = "x-api-key";
/// The prefix the Tinker SDK requires of its keys.
const TINKER_KEY_PREFIX: &str = "tml-";

/// The middleware (apply it with `Router::route_layer`).
pub(crate) async fn authenticate(State(state): State<TinkerState>, mut request: Request, next: Next) -> Response {
    match caller(&state, request.headers()) {
        Ok(principal) => {
            request.extensions_mut().insert(principal);
            next.run(request).await
        }
        Err(err) => err.into_response(),
    }
}

/// The caller behind `headers`, who must be allowed to sample.
fn caller(state: &TinkerState, headers: &HeaderMap) -> Result<Principal, TinkerError> {
    let keyring = state.coordinator().auth();
    let header = |name: &str| headers.get(name).and_then(|value| value.to_str().ok());
    let principal = match (header(AUTHORIZATION.as_str()), header(API_KEY_HEADER)) {
        (None, Some(key)) => {
            let key = key.trim();
            keyring.authenticate(Some(key)).or_else(|err| {
                key.strip_prefix(TINKER_KEY_PREFIX).map_or(Err(err), |bare| keyring.authenticate(Some(bare)))
            })
        }
        (authorization, _) => keyring.authenticate(authorization.and_then(bearer_token)),
    }
    .map_err(TinkerError::Core)?;
    principal.may(Action::Sample).map_err(TinkerError::Core)?;
    Ok(principal)
}
