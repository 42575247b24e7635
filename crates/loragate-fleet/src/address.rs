//! Workers' addresses, and the engine-side names of versioned adapters (`NAME@VERSION`).

use std::fmt;
use std::sync::Arc;

use loragate_core::{AdapterName, AdapterVersion};

use crate::error::FleetError;

/// A worker's gRPC address as the operator gave it (`http://127.0.0.1:9001`), validated; it is how the fleet names
/// the worker everywhere (`ListWorkers`, metrics labels, errors).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WorkerAddress(Arc<str>);

impl WorkerAddress {
    /// Parses an `http://HOST:PORT` (or `https://`) URL. Errors name the `address` field.
    pub fn parse(raw: &str) -> Result<Self, FleetError> {
        let invalid = |reason: String| FleetError::InvalidAddress { address: raw.to_owned(), reason };
        let uri: http::Uri = raw.parse().map_err(|err| invalid(format!("is not a URL: {err}")))?;
        match uri.scheme_str() {
            Some("http" | "https") => {}
            _ => return Err(invalid("must start with http:// or https://".into())),
        }
        if uri.host().is_none_or(str::is_empty) {
            return Err(invalid("names no host".into()));
        }
        if uri.port_u16().is_none() {
            return Err(invalid("names no port".into()));
        }
        if uri.path_and_query().is_some_and(|path| path.as_str() != "/" && !path.as_str().is_empty()) {
            return Err(invalid("must have no path".into()));
        }
        Ok(Self(raw.into()))
    }

    /// The address as given.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for WorkerAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for WorkerAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

/// The name under which version `version` of adapter `name` is loaded on the workers: `NAME@VERSION`. A version's
/// weights never change, so a name is never reloaded in place (vLLM refuses that) and vLLM's prefix cache, keyed by
/// adapter name, never mixes two policies.
pub fn versioned_name(name: &AdapterName, version: AdapterVersion) -> String {
    format!("{name}@{}", version.0)
}

/// Whether `engine_name` has the `NAME@VERSION` form the fleet loads (so a joining worker's stale copies can be told
/// from adapters someone else loaded).
pub(crate) fn is_versioned_name(engine_name: &str) -> bool {
    engine_name.rsplit_once('@').is_some_and(|(name, version)| {
        !name.is_empty() && !version.is_empty() && version.bytes().all(|b| b.is_ascii_digit())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_urls_with_host_and_port_kept_as_given() {
        let address = WorkerAddress::parse("http://127.0.0.1:9001").expect("valid");
        assert_eq!(address.as_str(), "http://127.0.0.1:9001");
        assert!(WorkerAddress::parse("https://worker-3.internal:443").is_ok());
        for bad in ["127.0.0.1:9001", "http://127.0.0.1", "ftp://h:1", "http://:9001", "http://h:1/path", ""] {
            let err = WorkerAddress::parse(bad).expect_err(bad);
            assert!(err.to_string().starts_with("address"), "{bad}: {err}");
        }
    }

    #[test]
    fn versions_are_loaded_as_name_at_version() {
        let meow = AdapterName::parse("meow").expect("name");
        assert_eq!(versioned_name(&meow, AdapterVersion(3)), "meow@3");
        assert!(is_versioned_name("meow@3") && is_versioned_name("team@run@12"));
        for foreign in ["meow", "meow@", "@3", "meow@v3", "meow@3a"] {
            assert!(!is_versioned_name(foreign), "{foreign}");
        }
    }
}
