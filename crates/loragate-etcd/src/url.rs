//! `--state etcd://HOST:PORT[,HOST:PORT…]/PREFIX`: which etcd servers, and under which key prefix this group of
//! replicas keeps its state.

use std::fmt;

/// A parsed `etcd://` state URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdUrl {
    endpoints: Vec<String>,
    prefix: String,
}

/// Why an `etcd://` URL was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("--state {url:?}: {reason} (expected etcd://HOST:PORT[,HOST:PORT…]/PREFIX)")]
pub struct EtcdUrlError {
    url: String,
    reason: String,
}

impl EtcdUrl {
    /// Parses `etcd://HOST:PORT[,HOST:PORT…]/PREFIX`. Every endpoint needs a port; the prefix is not empty (it may
    /// hold `/`, e.g. `team/loragate`).
    pub fn parse(raw: &str) -> Result<Self, EtcdUrlError> {
        let refuse = |reason: &str| EtcdUrlError { url: raw.to_owned(), reason: reason.to_owned() };
        let rest = raw.strip_prefix("etcd://").ok_or_else(|| refuse("the scheme must be etcd://"))?;
        let (hosts, prefix) = rest.split_once('/').ok_or_else(|| refuse("no /PREFIX after the endpoints"))?;
        let prefix = prefix.trim_matches('/');
        if prefix.is_empty() {
            return Err(refuse("the PREFIX is empty"));
        }
        if prefix.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(refuse("the PREFIX must not contain whitespace or control characters"));
        }
        let mut endpoints = Vec::new();
        for host in hosts.split(',') {
            let (name, port) =
                host.rsplit_once(':').ok_or_else(|| refuse(&format!("endpoint {host:?} has no :PORT")))?;
            if name.is_empty() || name.contains(['/', '@', '?', '#']) || port.parse::<u16>().is_err() {
                return Err(refuse(&format!("endpoint {host:?} is not HOST:PORT")));
            }
            endpoints.push(host.to_owned());
        }
        Ok(Self { endpoints, prefix: prefix.to_owned() })
    }

    /// The servers, as `HOST:PORT`.
    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    /// The key prefix every key of this state lies under: `/PREFIX/`.
    pub fn key_prefix(&self) -> String {
        format!("/{}/", self.prefix)
    }
}

impl fmt::Display for EtcdUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "etcd://{}/{}", self.endpoints.join(","), self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_and_a_prefix() {
        let url = EtcdUrl::parse("etcd://10.0.0.1:2379,etcd-b:2379/team/loragate/").expect("valid");
        assert_eq!(url.endpoints(), ["10.0.0.1:2379", "etcd-b:2379"]);
        assert_eq!(url.key_prefix(), "/team/loragate/");
        assert_eq!(url.to_string(), "etcd://10.0.0.1:2379,etcd-b:2379/team/loragate");
        let v6 = EtcdUrl::parse("etcd://[::1]:2379/lg").expect("an IPv6 literal");
        assert_eq!(v6.endpoints(), ["[::1]:2379"]);
    }

    #[test]
    fn what_is_refused_is_named() {
        for (raw, reason) in [
            ("http://a:1/p", "scheme"),
            ("etcd://a:1", "no /PREFIX"),
            ("etcd://a:1/", "PREFIX is empty"),
            ("etcd://a/p", "has no :PORT"),
            ("etcd://a:x/p", "not HOST:PORT"),
            ("etcd://a:1,/p", "has no :PORT"),
            ("etcd://a:1/p q", "whitespace"),
        ] {
            let err = EtcdUrl::parse(raw).expect_err(raw).to_string();
            assert!(err.contains(reason) && err.contains("--state"), "{raw}: {err}");
        }
    }
}
