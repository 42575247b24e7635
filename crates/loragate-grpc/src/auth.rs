//! Authentication on the gRPC front. The key → permission logic is the core's ([`loragate_core::Keyring`]); this
//! module only reads the credential (metadata `authorization: Bearer KEY`), classifies each RPC, and turns refusals
//! into statuses.
//!
//! [`AuthLayer`] sits in front of every service. Health is open; every other call must present a known key when
//! authentication is on (`UNAUTHENTICATED` otherwise) whose principal may do the RPC's kind of action at all
//! (`PERMISSION_DENIED` otherwise): sampling, `WaitLoraUnpaused`, `ListLoraAdapters` and reflection need a key that
//! may sample; the other `LoraControl` RPCs one that may control; anything else (services added later, such as the
//! fleet's) the admin key. The principal travels to the handlers in a request extension; handlers check it against
//! the adapter each request names.

use std::task::{Context, Poll};

use futures::future::BoxFuture;
use loragate_core::{Action, CoreError, Keyring, Principal, bearer_token};
use tonic::Status;
use tower::{Layer, Service};

use crate::status::status_from_core;

/// What an RPC path needs: `None` for open services.
fn required_action(path: &str) -> Option<Action> {
    let (service, method) = path.trim_start_matches('/').split_once('/').unwrap_or((path, ""));
    match service {
        "grpc.health.v1.Health" => None,
        "loragate.v1.Sampler" | "grpc.reflection.v1.ServerReflection" | "grpc.reflection.v1alpha.ServerReflection" => {
            Some(Action::Sample)
        }
        "loragate.v1.LoraControl" => match method {
            "WaitLoraUnpaused" | "ListLoraAdapters" => Some(Action::Sample),
            _ => Some(Action::Control),
        },
        _ => Some(Action::Admin),
    }
}

/// The caller of a request: the principal [`AuthLayer`] put in its extensions, or (for a service used without the
/// layer) the one its metadata authenticates as.
pub(crate) fn caller(
    headers: &http::HeaderMap,
    extensions: &http::Extensions,
    keyring: &Keyring,
) -> Result<Principal, CoreError> {
    if let Some(principal) = extensions.get::<Principal>() {
        return Ok(principal.clone());
    }
    let presented =
        headers.get(http::header::AUTHORIZATION).and_then(|value| value.to_str().ok()).and_then(bearer_token);
    keyring.authenticate(presented)
}

/// The caller of a tonic request (see [`caller`]).
pub(crate) fn caller_of<T>(request: &tonic::Request<T>, keyring: &Keyring) -> Result<Principal, Status> {
    caller(request.metadata().as_ref(), request.extensions(), keyring).map_err(status_from_core)
}

/// Authenticates every call and checks that its caller may make that kind of call (see the module documentation).
#[derive(Clone, Debug)]
pub struct AuthLayer {
    keyring: Keyring,
}

impl AuthLayer {
    /// A layer checking callers against `keyring`.
    pub fn new(keyring: Keyring) -> Self {
        Self { keyring }
    }
}

impl<S> Layer<S> for AuthLayer {
    type Service = Authenticated<S>;

    fn layer(&self, inner: S) -> Authenticated<S> {
        Authenticated { inner, keyring: self.keyring.clone() }
    }
}

/// A service behind [`AuthLayer`].
#[derive(Clone, Debug)]
pub struct Authenticated<S> {
    inner: S,
    keyring: Keyring,
}

impl<S, B, ResBody> Service<http::Request<B>> for Authenticated<S>
where
    S: Service<http::Request<B>, Response = http::Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
    ResBody: Default + Send + 'static,
{
    type Response = http::Response<ResBody>;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        if let Some(action) = required_action(request.uri().path()) {
            let checked = caller(request.headers(), request.extensions(), &self.keyring)
                .and_then(|principal| principal.may(action).map(|()| principal));
            match checked {
                Ok(principal) => {
                    request.extensions_mut().insert(principal);
                }
                Err(err) => {
                    let status = status_from_core(err);
                    return Box::pin(async move { Ok(status.into_http()) });
                }
            }
        }
        // Keep the service that was driven ready; leave a fresh clone for the next call.
        let fresh = self.inner.clone();
        let mut ready = std::mem::replace(&mut self.inner, fresh);
        Box::pin(async move { ready.call(request).await })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rpc_is_classified_and_unknown_services_need_the_admin_key() {
        let cases = [
            ("/grpc.health.v1.Health/Check", None),
            ("/loragate.v1.Sampler/Sample", Some(Action::Sample)),
            ("/loragate.v1.Sampler/SampleStream", Some(Action::Sample)),
            ("/loragate.v1.LoraControl/WaitLoraUnpaused", Some(Action::Sample)),
            ("/loragate.v1.LoraControl/ListLoraAdapters", Some(Action::Sample)),
            ("/loragate.v1.LoraControl/AbortLoraRequests", Some(Action::Control)),
            ("/loragate.v1.LoraControl/LoadLoraAdapter", Some(Action::Control)),
            ("/loragate.v1.LoraControl/SwapLoraAdapter", Some(Action::Control)),
            ("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", Some(Action::Sample)),
            ("/loragate.v1.Fleet/AddWorker", Some(Action::Admin)),
            ("/", Some(Action::Admin)),
        ];
        for (path, action) in cases {
            assert_eq!(required_action(path), action, "{path}");
        }
    }
}
