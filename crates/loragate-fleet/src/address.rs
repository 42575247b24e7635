//! Workers' addresses (the URL scheme picks the protocol; one canonical spelling per worker; never a credential),
//! and the engine-side names of versioned adapters (`NAME@VERSION`).

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use loragate_core::{AdapterName, AdapterVersion};

use crate::error::FleetError;

/// The port of an address that names none: every protocol here runs over plain HTTP.
const DEFAULT_PORT: u16 = 80;
/// How long resolving a worker's host name may take.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(2);

/// The protocol a worker speaks, chosen by its address's scheme.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Protocol {
    /// vLLM's own gRPC protocol (`vllm.Inference`, `vllm.Control`, `grpc.health.v1`): `grpc://`, or `http://` (its
    /// older spelling). `loragate worker`, vLLM's Rust frontend.
    Grpc,
    /// vLLM's OpenAI-compatible HTTP server (`vllm serve`): `vllm+http://`.
    VllmHttp,
    /// SGLang's HTTP server (`python -m sglang.launch_server`): `sglang+http://`.
    SglangHttp,
}

impl Protocol {
    /// The canonical scheme.
    pub fn scheme(self) -> &'static str {
        match self {
            Self::Grpc => "grpc",
            Self::VllmHttp => "vllm+http",
            Self::SglangHttp => "sglang+http",
        }
    }

    fn from_scheme(scheme: &str) -> Option<Self> {
        match scheme.to_ascii_lowercase().as_str() {
            "grpc" | "http" => Some(Self::Grpc),
            "vllm+http" => Some(Self::VllmHttp),
            "sglang+http" => Some(Self::SglangHttp),
            _ => None,
        }
    }
}

/// A worker's address, validated and canonical: `SCHEME://host:port` with the scheme and host in lower case, the
/// port always written (80 when none was given) and without leading zeros, no path. It names the worker everywhere
/// (`ListWorkers`, metrics labels, errors, logs) and never carries a credential (user-info is refused).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WorkerAddress {
    canonical: Arc<str>,
    protocol: Protocol,
    host: Arc<str>,
    port: u16,
    /// The `loragate agent` beside an HTTP worker (`?agent=HOST:PORT`), which receives pushed versions for it.
    agent: Option<Arc<str>>,
}

impl WorkerAddress {
    /// Parses `grpc://HOST[:PORT]` (or `http://`, its alias), `vllm+http://HOST[:PORT]` or
    /// `sglang+http://HOST[:PORT]`; a trailing `/` is allowed, and for the HTTP protocols a query naming the worker's
    /// `loragate agent`, `?agent=HOST:PORT`; nothing else after the authority. Errors name the
    /// `address` field and quote the address without its user-info, query or fragment.
    pub fn parse(raw: &str) -> Result<Self, FleetError> {
        let invalid = |reason: &str| FleetError::InvalidAddress { address: redacted(raw), reason: reason.to_owned() };
        let uri: http::Uri = raw.trim().parse().map_err(|_| invalid("is not a URL"))?;
        let Some(protocol) = uri.scheme_str().and_then(Protocol::from_scheme) else {
            return Err(invalid(
                "must start with grpc:// (or http://, its alias), vllm+http:// or sglang+http:// (no TLS)",
            ));
        };
        let Some(authority) = uri.authority() else { return Err(invalid("names no host")) };
        if authority.as_str().contains('@') {
            return Err(invalid(
                "must not carry user-info (credentials); the coordinator presents no credentials in addresses",
            ));
        }
        let host = authority.host().to_ascii_lowercase();
        if host.is_empty() || host == "[]" {
            return Err(invalid("names no host"));
        }
        let port = match authority.port() {
            None => DEFAULT_PORT,
            Some(port) => match port.as_u16() {
                0 => return Err(invalid("port 0 is not a worker's port")),
                port => port,
            },
        };
        if !matches!(uri.path(), "" | "/") {
            return Err(invalid("must have no path"));
        }
        let agent = match uri.query() {
            None => None,
            Some(query) if protocol != Protocol::Grpc => Some(parse_agent(query).map_err(|reason| invalid(&reason))?),
            Some(_) => return Err(invalid("must have no query (only vllm+http:// and sglang+http:// name an agent)")),
        };
        let mut canonical = format!("{}://{host}:{port}", protocol.scheme());
        if let Some(agent) = &agent {
            canonical.push_str(&format!("?agent={agent}"));
        }
        Ok(Self { canonical: canonical.into(), protocol, host: host.into(), port, agent: agent.map(Into::into) })
    }

    /// The canonical address.
    pub fn as_str(&self) -> &str {
        &self.canonical
    }

    /// The protocol the worker speaks.
    pub fn protocol(&self) -> Protocol {
        self.protocol
    }

    /// The URL the worker is reached at over plain HTTP (`http://host:port`; gRPC runs over HTTP/2 on it).
    pub(crate) fn http_base(&self) -> String {
        format!("http://{}:{}", self.host, self.port)
    }

    /// The URL of the worker's `loragate agent` (`http://HOST:PORT`), if its address names one.
    pub(crate) fn agent_base(&self) -> Option<String> {
        self.agent.as_deref().map(|agent| format!("http://{agent}"))
    }

    /// The socket addresses the host resolves to now (empty if it does not resolve in time: the worker is then
    /// told from others by its canonical address alone).
    pub(crate) async fn resolve(&self) -> Vec<SocketAddr> {
        let host = self.host.trim_start_matches('[').trim_end_matches(']').to_owned();
        match tokio::time::timeout(RESOLVE_TIMEOUT, tokio::net::lookup_host((host, self.port))).await {
            Ok(Ok(addresses)) => {
                let mut addresses: Vec<SocketAddr> = addresses.collect();
                addresses.sort_unstable();
                addresses.dedup();
                addresses
            }
            _ => Vec::new(),
        }
    }
}

impl fmt::Display for WorkerAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.canonical)
    }
}

impl fmt::Debug for WorkerAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.canonical, f)
    }
}

/// A worker's address with the socket addresses it resolved to when it joined: two workers are one process when
/// their canonical addresses match (whatever the scheme) or they share a socket address.
#[derive(Clone, Debug)]
pub(crate) struct WorkerIdentity {
    pub(crate) address: WorkerAddress,
    sockets: Vec<SocketAddr>,
}

impl WorkerIdentity {
    /// Resolves `address`.
    pub(crate) async fn resolve(address: WorkerAddress) -> Self {
        let sockets = address.resolve().await;
        Self { address, sockets }
    }

    /// Whether `self` and `other` reach the same process.
    pub(crate) fn same_worker(&self, other: &Self) -> bool {
        (self.address.host == other.address.host && self.address.port == other.address.port)
            || self.sockets.iter().any(|socket| other.sockets.contains(socket))
    }
}

/// The agent named by an address's query: exactly `agent=HOST:PORT` (host in lower case, a port other than 0).
fn parse_agent(query: &str) -> Result<String, String> {
    let Some(agent) = query.strip_prefix("agent=") else {
        return Err("may have only the query agent=HOST:PORT (its loragate agent)".to_owned());
    };
    let authority: http::uri::Authority =
        agent.parse().map_err(|_| "agent: must be HOST:PORT (its loragate agent's --http-addr)".to_owned())?;
    let port = authority.port_u16().filter(|&port| port != 0);
    if authority.as_str().contains('@') || authority.host().is_empty() || port.is_none() {
        return Err("agent: must be HOST:PORT (its loragate agent's --http-addr), no credentials".to_owned());
    }
    Ok(format!("{}:{}", authority.host().to_ascii_lowercase(), port.unwrap_or_default()))
}

/// `raw` without user-info, query or fragment, for error messages: a credential never reaches a log or a reply.
fn redacted(raw: &str) -> String {
    let raw = raw.trim();
    let raw = raw.split(['?', '#']).next().unwrap_or_default();
    let (scheme, rest) = raw.split_once("://").map_or(("", raw), |(scheme, rest)| (scheme, rest));
    let (authority, path) = rest.split_once('/').map_or((rest, None), |(authority, path)| (authority, Some(path)));
    let authority = authority.rsplit_once('@').map_or(authority.to_owned(), |(_, host)| format!("…@{host}"));
    let mut shown = if scheme.is_empty() { authority } else { format!("{scheme}://{authority}") };
    if let Some(path) = path {
        shown.push('/');
        shown.push_str(path);
    }
    shown.chars().take(200).collect()
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

    fn canonical(raw: &str) -> String {
        WorkerAddress::parse(raw).unwrap_or_else(|err| panic!("{raw}: {err}")).to_string()
    }

    #[test]
    fn the_scheme_picks_the_protocol_and_every_spelling_of_one_address_is_one_canonical_form() {
        for raw in
            ["grpc://127.0.0.1:9001", "http://127.0.0.1:9001", "HTTP://127.0.0.1:9001/", "GrPc://127.0.0.1:09001"]
        {
            assert_eq!(canonical(raw), "grpc://127.0.0.1:9001", "{raw}");
        }
        assert_eq!(canonical("vllm+http://GPU-1.Internal:8000/"), "vllm+http://gpu-1.internal:8000");
        assert_eq!(canonical("SGLANG+HTTP://h"), "sglang+http://h:80", "the default port is written");
        assert_eq!(canonical("sglang+http://h:80"), "sglang+http://h:80");
        assert_eq!(canonical("grpc://[::1]:9001"), "grpc://[::1]:9001");
        let protocols: Vec<Protocol> = ["grpc://h:1", "http://h:1", "vllm+http://h:1", "sglang+http://h:1"]
            .iter()
            .map(|raw| WorkerAddress::parse(raw).expect("valid").protocol())
            .collect();
        assert_eq!(protocols, [Protocol::Grpc, Protocol::Grpc, Protocol::VllmHttp, Protocol::SglangHttp]);
        assert_eq!(WorkerAddress::parse("vllm+http://h:8000").expect("valid").http_base(), "http://h:8000");
    }

    #[test]
    fn malformed_addresses_name_the_field_and_never_echo_a_credential() {
        for bad in
            ["127.0.0.1:9001", "ftp://h:1", "https://h:443", "grpc://:9001", "grpc://h:1/path", "grpc://h:0", "", "x"]
        {
            let err = WorkerAddress::parse(bad).expect_err(bad);
            assert!(err.to_string().starts_with("address"), "{bad}: {err}");
        }
        for secret in ["http://user:hunter2@h:1", "vllm+http://hunter2@h:1/", "grpc://h:1/?token=hunter2"] {
            let err = WorkerAddress::parse(secret).expect_err(secret).to_string();
            assert!(!err.contains("hunter2") && err.starts_with("address"), "{err}");
        }
        assert!(WorkerAddress::parse("http://u:p@h:1").expect_err("user-info").to_string().contains("user-info"));
    }

    #[test]
    fn http_workers_may_name_their_agent_and_nothing_else_in_a_query() {
        let address = WorkerAddress::parse("vllm+http://GPU-1:8000/?agent=GPU-1:9100").expect("valid");
        assert_eq!(address.as_str(), "vllm+http://gpu-1:8000?agent=gpu-1:9100");
        assert_eq!(address.agent_base().as_deref(), Some("http://gpu-1:9100"));
        assert_eq!(address.http_base(), "http://gpu-1:8000");
        let sglang = WorkerAddress::parse("sglang+http://h:30000?agent=127.0.0.1:9100").expect("valid");
        assert_eq!(sglang.agent_base().as_deref(), Some("http://127.0.0.1:9100"));
        assert_eq!(WorkerAddress::parse("vllm+http://h:8000").expect("valid").agent_base(), None);
        for bad in [
            "grpc://h:1?agent=h:2",
            "vllm+http://h:1?agent=h",
            "vllm+http://h:1?agent=h:0",
            "vllm+http://h:1?agent=",
            "vllm+http://h:1?agnt=h:2",
            "vllm+http://h:1?agent=u:p@h:2",
            "sglang+http://h:1/v1?agent=h:2",
        ] {
            let err = WorkerAddress::parse(bad).expect_err(bad).to_string();
            assert!(err.starts_with("address") && !err.contains("u:p"), "{bad}: {err}");
        }
    }

    #[tokio::test]
    async fn names_resolving_to_the_same_socket_are_one_worker_whatever_the_scheme() {
        let identity = |raw: &str| WorkerIdentity::resolve(WorkerAddress::parse(raw).expect("valid"));
        let ip = identity("grpc://127.0.0.1:9001").await;
        assert!(ip.same_worker(&identity("http://localhost:9001").await), "a name resolving to the same socket");
        assert!(ip.same_worker(&identity("sglang+http://127.0.0.1:9001").await), "one process, two schemes");
        assert!(!ip.same_worker(&identity("grpc://127.0.0.1:9002").await));
        let unresolvable = identity("grpc://no-such-host.invalid:1").await;
        assert!(unresolvable.same_worker(&identity("vllm+http://NO-SUCH-HOST.invalid:1").await), "by canonical name");
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
