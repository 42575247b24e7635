//! Listening addresses on the command line: `HOST:PORT` with HOST an IP address (IPv6 in brackets) or a host name
//! (`localhost:8000`), and vLLM's `--host`, resolved once, when the command line is parsed.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};

/// Parses `HOST:PORT`; a host name is resolved now, to its first IPv4 address if it has one (so `localhost` is
/// `127.0.0.1`), else its first address.
pub(crate) fn parse_listen_addr(raw: &str) -> Result<SocketAddr, String> {
    if let Ok(address) = raw.parse::<SocketAddr>() {
        return Ok(address);
    }
    let (host, port) = raw.rsplit_once(':').ok_or_else(|| format!("{raw:?} is not HOST:PORT"))?;
    let port: u16 = port.parse().map_err(|_| format!("{raw:?}: {port:?} is not a port (0 to 65535)"))?;
    Ok(SocketAddr::new(parse_host(host)?, port))
}

/// Parses a host: an IP address (IPv6 with or without brackets) or a host name, resolved as
/// [`parse_listen_addr`] does.
pub(crate) fn parse_host(raw: &str) -> Result<IpAddr, String> {
    let unbracketed = raw.strip_prefix('[').and_then(|rest| rest.strip_suffix(']')).unwrap_or(raw);
    if let Ok(ip) = unbracketed.parse::<IpAddr>() {
        return Ok(ip);
    }
    if raw.is_empty() || raw.contains(|c: char| c.is_whitespace() || c == ':' || c == '/') {
        return Err(format!("{raw:?} is not a host name or an IP address"));
    }
    let resolved: Vec<SocketAddr> =
        (raw, 0).to_socket_addrs().map_err(|err| format!("cannot resolve host {raw:?}: {err}"))?.collect();
    resolved
        .iter()
        .find(|address| address.is_ipv4())
        .or(resolved.first())
        .map(SocketAddr::ip)
        .ok_or_else(|| format!("host {raw:?} has no address"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ip_addresses_and_host_names_both_listen() {
        assert_eq!(parse_listen_addr("127.0.0.1:8000"), Ok("127.0.0.1:8000".parse().expect("address")));
        assert_eq!(parse_listen_addr("[::1]:9"), Ok("[::1]:9".parse().expect("address")));
        let localhost = parse_listen_addr("localhost:8000").expect("localhost resolves");
        assert!(localhost.ip().is_loopback() && localhost.port() == 8000, "{localhost}");
        assert_eq!(parse_host("0.0.0.0"), Ok(IpAddr::from([0, 0, 0, 0])));
        assert_eq!(parse_host("[::]"), Ok("::".parse().expect("ip")));
        assert!(parse_host("localhost").expect("resolves").is_loopback());
    }

    #[test]
    fn malformed_addresses_say_what_is_wrong() {
        for (raw, says) in [
            ("localhost", "is not HOST:PORT"),
            ("localhost:http", "is not a port"),
            ("localhost:70000", "is not a port"),
            (":8000", "is not a host name"),
            ("no such host.invalid:1", "is not a host name"),
        ] {
            let err = parse_listen_addr(raw).expect_err(raw);
            assert!(err.contains(says), "{raw}: {err}");
        }
    }
}
