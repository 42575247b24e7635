//! Connecting to a server and presenting a key: one channel per client, with `authorization: Bearer KEY` on every
//! call when a key is given.

use std::time::Duration;

use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;
use tonic::{Request, Status};

use crate::error::ClientError;

/// A channel whose calls present the client's key.
pub(crate) type KeyedChannel = InterceptedService<Channel, BearerKey>;

/// The key a client presents (`authorization: Bearer KEY`), or none.
#[derive(Clone, Debug, Default)]
pub struct BearerKey(Option<MetadataValue<Ascii>>);

impl BearerKey {
    /// No key: calls carry no `authorization` metadata.
    pub fn none() -> Self {
        Self(None)
    }

    /// Presents `key` on every call. `field` names the argument in the error for a key that cannot be sent (empty,
    /// or not printable ASCII).
    pub fn new(key: &str, field: &str) -> Result<Self, ClientError> {
        if key.is_empty() {
            return Err(ClientError::invalid(field, "the key is empty"));
        }
        if !key.bytes().all(|byte| byte.is_ascii_graphic()) {
            return Err(ClientError::invalid(field, "the key must be printable ASCII without spaces"));
        }
        let value = format!("Bearer {key}")
            .parse()
            .map_err(|err| ClientError::invalid(field, format!("the key cannot be sent as metadata: {err}")))?;
        Ok(Self(Some(value)))
    }

    /// `key` when given, else no key.
    pub fn optional(key: Option<&str>, field: &str) -> Result<Self, ClientError> {
        key.map_or_else(|| Ok(Self::none()), |key| Self::new(key, field))
    }
}

impl Interceptor for BearerKey {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if let Some(value) = &self.0 {
            request.metadata_mut().insert("authorization", value.clone());
        }
        Ok(request)
    }
}

/// How long establishing a connection (the first, or a reconnection) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Connects to a loragate gRPC endpoint: `http://host:port`, or `host:port` (plain HTTP/2 is assumed).
pub async fn connect(endpoint: impl Into<String>) -> Result<Channel, ClientError> {
    let endpoint = endpoint.into();
    let uri = if endpoint.contains("://") { endpoint } else { format!("http://{endpoint}") };
    let channel = Channel::from_shared(uri)
        .map_err(|err| ClientError::invalid("endpoint", format!("not a URL: {err}")))?
        .connect_timeout(CONNECT_TIMEOUT)
        .connect()
        .await?;
    Ok(channel)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_presented_as_a_bearer_token_and_none_presents_nothing() {
        let mut keyed = BearerKey::new("s3cret", "api_key").expect("a valid key");
        let request = keyed.call(Request::new(())).expect("intercepted");
        assert_eq!(request.metadata().get("authorization").expect("set"), "Bearer s3cret");
        let request = BearerKey::none().call(Request::new(())).expect("intercepted");
        assert!(request.metadata().get("authorization").is_none());
    }

    #[test]
    fn keys_that_cannot_be_sent_are_refused_naming_the_argument() {
        for bad in ["", "has space", "tab\tkey", "ключ"] {
            match BearerKey::new(bad, "admin_key") {
                Err(ClientError::InvalidArgument { field, .. }) => assert_eq!(field, "admin_key", "{bad:?}"),
                other => panic!("{bad:?} was accepted: {other:?}"),
            }
        }
    }
}
