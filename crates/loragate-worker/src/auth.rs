//! Keys on the worker: `--api-key` may call `vllm.Inference`, `--admin-key` may call everything (`vllm.Control`
//! included: the fleet coordinator presents it with `--worker-key`). Health stays open. The key → permission logic
//! is the core's ([`Keyring`]); this module reads the credential (metadata `authorization: Bearer KEY`) in a tonic
//! interceptor per service.

use loragate_core::{Action, Keyring, bearer_token};
use tonic::service::Interceptor;
use tonic::{Request, Status};

use crate::error::WorkerError;

/// Refuses calls whose caller may not do `action` (with authentication off, nobody is refused).
#[derive(Clone, Debug)]
pub(crate) struct RequireKey {
    keyring: Keyring,
    action: Action,
}

impl RequireKey {
    /// Calls must present a key that may do `action`.
    pub(crate) fn new(keyring: Keyring, action: Action) -> Self {
        Self { keyring, action }
    }
}

impl Interceptor for RequireKey {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        let presented = request.metadata().get("authorization").and_then(|value| value.to_str().ok());
        self.keyring
            .authenticate(presented.and_then(bearer_token))
            .and_then(|principal| principal.may(self.action))
            .map_err(|err| Status::from(WorkerError::from_core(err)))?;
        Ok(request)
    }
}
