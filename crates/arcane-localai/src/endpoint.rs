//! The engine's listener url, parsed once: scheme, host, port, and whether the host is
//! loopback (the only hosts on which Arcane ever starts a server).

use std::fmt;

use serde_json::json;

use crate::Error;

/// A parsed `http://host:port` listener url. Any path in the configured url is dropped:
/// probes go to absolute paths (`/health`, `/api/version`) at the origin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    host: String,
    port: u16,
}

impl Endpoint {
    /// Parses `url`. Only `http://` is accepted: the supervisor talks plain HTTP to a
    /// local listener. IPv6 hosts are written in brackets (`http://[::1]:9000`).
    pub fn parse(url: &str) -> Result<Self, Error> {
        let bad = |why: &str| {
            Error::config(
                format!("`{url}` is not a usable engine url: {why}"),
                json!({"url": url}),
            )
        };
        let rest = match url.split_once("://") {
            Some((scheme, rest)) if scheme.eq_ignore_ascii_case("http") => rest,
            Some((scheme, _)) => {
                return Err(bad(&format!(
                    "the scheme `{scheme}` is not supported (use `http`)"
                )))
            }
            None => return Err(bad("it has no `http://` scheme")),
        };
        let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
        if authority.contains('@') {
            return Err(bad("credentials in the url are not supported"));
        }
        let (host, port) = if let Some(after) = authority.strip_prefix('[') {
            let (host, tail) = after
                .split_once(']')
                .ok_or_else(|| bad("an IPv6 host misses its `]`"))?;
            let port = match tail {
                "" => None,
                tail => Some(
                    tail.strip_prefix(':')
                        .ok_or_else(|| bad("unexpected text after the IPv6 host"))?,
                ),
            };
            (host.to_string(), port)
        } else {
            match authority.rsplit_once(':') {
                Some((host, port)) => (host.to_string(), Some(port)),
                None => (authority.to_string(), None),
            }
        };
        if host.is_empty() {
            return Err(bad("it has no host"));
        }
        let port = match port {
            None | Some("") => 80,
            Some(port) => port
                .parse::<u16>()
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(|| {
                    bad(&format!(
                        "the port `{port}` is not a number from 1 to 65535"
                    ))
                })?,
        };
        Ok(Self {
            host: host.to_ascii_lowercase(),
            port,
        })
    }

    /// The host without brackets (`127.0.0.1`, `::1`, `localhost`).
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The port (80 when the url names none).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Whether the host is loopback: exactly `localhost`, `127.0.0.1` or `::1`, as the
    /// SDK defines it. Only on such a host does a refused connection lead to a spawn.
    pub fn is_loopback(&self) -> bool {
        matches!(self.host.as_str(), "localhost" | "127.0.0.1" | "::1")
    }

    /// `http://host:port` (brackets around IPv6 hosts): the origin, used for
    /// `OLLAMA_HOST` and in messages.
    pub fn origin(&self) -> String {
        self.to_string()
    }

    /// `host:port` for the HTTP `Host` header and for connecting.
    pub(crate) fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "http://{}", self.authority())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_hosts_ports_and_drops_paths() {
        let e = Endpoint::parse("http://127.0.0.1:8080/api").unwrap();
        assert_eq!((e.host(), e.port()), ("127.0.0.1", 8080));
        assert_eq!(e.origin(), "http://127.0.0.1:8080");
        let e = Endpoint::parse("http://[::1]:9000").unwrap();
        assert_eq!((e.host(), e.port()), ("::1", 9000));
        assert_eq!(e.origin(), "http://[::1]:9000");
        assert_eq!(Endpoint::parse("http://localhost").unwrap().port(), 80);
    }

    #[test]
    fn loopback_is_exactly_the_three_sdk_hosts() {
        for url in ["http://localhost:1", "http://127.0.0.1:1", "http://[::1]:1"] {
            assert!(Endpoint::parse(url).unwrap().is_loopback(), "{url}");
        }
        for url in [
            "http://127.0.0.2:1",
            "http://192.168.1.5:1",
            "http://example.com:1",
        ] {
            assert!(!Endpoint::parse(url).unwrap().is_loopback(), "{url}");
        }
    }

    #[test]
    fn rejects_other_schemes_and_bad_ports() {
        for url in [
            "https://127.0.0.1:1",
            "127.0.0.1:8080",
            "http://:80",
            "http://h:0",
            "http://h:99999",
        ] {
            assert!(Endpoint::parse(url).is_err(), "{url}");
        }
    }
}
