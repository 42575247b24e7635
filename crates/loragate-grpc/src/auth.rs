//! Authentication on the gRPC front. The key → permission logic is the core's ([`loragate_core::Keyring`]); this
//! module only reads the credential (metadata `authorization: Bearer KEY`), classifies each RPC, and turns refusals
//! into statuses.
//!
//! [`AuthLayer`] sits in front of every service. Health is open; every other call must present a known key when
//! authentication is on (`UNAUTHENTICATED` otherwise) whose principal may do the RPC's kind of action at all
//! (`PERMISSION_DENIED` otherwise): sampling, `WaitLoraUnpaused`, `ListLoraAdapters` and reflection need a key that
//! may sample; `ListReplicas` the admin key; the other `LoraControl` RPCs one that may control; anything else (services added later, such as the
//! fleet's) the admin key. The principal travels to the handlers in a request extension; handlers check it against
//! the adapter each request names. With authentication off the layer passes every call straight through.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

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
            // The replicas' addresses describe the deployment, not an adapter a tenant controls.
            "ListReplicas" => Some(Action::Admin),
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
    type Future = AuthFuture<S::Future, ResBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        // With authentication off there is nothing to check, and handlers find every caller to be
        // `Principal::Anyone` without an extension.
        if self.keyring.is_enabled()
            && let Some(action) = required_action(request.uri().path())
        {
            let checked = caller(request.headers(), request.extensions(), &self.keyring)
                .and_then(|principal| principal.may(action).map(|()| principal));
            match checked {
                Ok(principal) => {
                    request.extensions_mut().insert(principal);
                }
                Err(err) => return AuthFuture::refused(status_from_core(err).into_http()),
            }
        }
        // Keep the service that was driven ready; leave a fresh clone for the next call.
        let fresh = self.inner.clone();
        let mut ready = std::mem::replace(&mut self.inner, fresh);
        AuthFuture::passed(ready.call(request))
    }
}

pin_project_lite::pin_project! {
    /// The response future of [`Authenticated`]: the refusal, or the call let through.
    pub struct AuthFuture<F, ResBody> {
        // The call, let through (`None` when refused).
        #[pin]
        inner: Option<F>,
        // The refusal's status, answered at once.
        refused: Option<http::Response<ResBody>>,
    }
}

impl<F, ResBody> AuthFuture<F, ResBody> {
    fn refused(answer: http::Response<ResBody>) -> Self {
        Self { inner: None, refused: Some(answer) }
    }

    fn passed(inner: F) -> Self {
        Self { inner: Some(inner), refused: None }
    }
}

impl<F, ResBody, E> Future for AuthFuture<F, ResBody>
where
    F: Future<Output = Result<http::Response<ResBody>, E>>,
{
    type Output = Result<http::Response<ResBody>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Some(answer) = this.refused.take() {
            return Poll::Ready(Ok(answer));
        }
        match this.inner.as_pin_mut() {
            Some(inner) => inner.poll(cx),
            None => panic!("an AuthFuture was polled after it completed"),
        }
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
