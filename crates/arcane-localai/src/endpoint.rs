//! Where an engine is reached, in one place:
//!
//! * [`Endpoint`]: the configured listener url, parsed once: scheme, host, port, and
//!   whether the host is loopback (the only hosts on which Arcane ever starts a server).
//! * [`EngineAddress`]: where the engine's HTTP API actually answers: that TCP
//!   endpoint, or a Unix socket in the workspace's private run directory (an owned
//!   llama.cpp by default, so it has no port at all), and the one way to connect to
//!   either, telling "nothing listens" from every other failure.
//! * [`ApiKey`]: the random key an owned engine on a TCP port demands, so its port
//!   answers 401 to everyone but the Core.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use serde_json::json;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, UnixStream};

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

    /// `127.0.0.1` on port `port`, for an engine whose listener Arcane chose itself
    /// (port 0: it listens on a socket, and the url is never contacted).
    pub(crate) fn loopback(port: u16) -> Self {
        Self {
            host: "127.0.0.1".into(),
            port,
        }
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
    pub fn authority(&self) -> String {
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

/// Where an engine's HTTP API answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EngineAddress {
    /// A TCP listener (an adopted server, Ollama, or an owned llama.cpp on a url the
    /// user asked for).
    Tcp(Endpoint),
    /// A Unix socket: the path is the socket file.
    Unix(PathBuf),
}

/// Why no connection to an [`EngineAddress`] could be made.
#[derive(Debug)]
pub enum ConnectFailure {
    /// Nothing listens there: every TCP address refused, or the socket file is missing
    /// or has no listener.
    Refused,
    /// Anything else (DNS, unreachable, permissions).
    Other(io::Error),
}

impl fmt::Display for ConnectFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Refused => f.write_str("connection refused"),
            Self::Other(error) => write!(f, "{error}"),
        }
    }
}

impl std::error::Error for ConnectFailure {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Refused => None,
            Self::Other(error) => Some(error),
        }
    }
}

impl EngineAddress {
    /// The value of the `Host` header for requests to this address (`localhost` on a
    /// Unix socket, as curl sends).
    pub fn authority(&self) -> String {
        match self {
            Self::Tcp(endpoint) => endpoint.authority(),
            Self::Unix(_) => "localhost".into(),
        }
    }

    /// The socket file, for a Unix address.
    pub fn socket(&self) -> Option<&Path> {
        match self {
            Self::Tcp(_) => None,
            Self::Unix(path) => Some(path),
        }
    }

    /// `path` at this address, for messages and logs: `http://127.0.0.1:8080/health`,
    /// or `unix:/w/.arcane/run/llama.cpp.sock:/health`.
    pub fn url_of(&self, path: &str) -> String {
        match self {
            Self::Tcp(endpoint) => format!("{endpoint}{path}"),
            Self::Unix(socket) => format!("unix:{}:{path}", socket.display()),
        }
    }

    /// Connects. On TCP, the first address that accepts wins and only a refusal by
    /// every address is [`ConnectFailure::Refused`] (`localhost` resolves to both `::1`
    /// and `127.0.0.1`); on a Unix socket, a missing file or a file without a listener
    /// is a refusal.
    pub async fn connect(&self) -> Result<EngineStream, ConnectFailure> {
        match self {
            Self::Tcp(endpoint) => connect_tcp(endpoint).await.map(EngineStream::Tcp),
            Self::Unix(socket) => match UnixStream::connect(socket).await {
                Ok(stream) => Ok(EngineStream::Unix(stream)),
                Err(error)
                    if matches!(
                        error.kind(),
                        io::ErrorKind::ConnectionRefused | io::ErrorKind::NotFound
                    ) =>
                {
                    Err(ConnectFailure::Refused)
                }
                Err(error) => Err(ConnectFailure::Other(error)),
            },
        }
    }
}

impl fmt::Display for EngineAddress {
    /// The origin (`http://127.0.0.1:8080`) or `unix:<socket path>`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Tcp(endpoint) => write!(f, "{endpoint}"),
            Self::Unix(socket) => write!(f, "unix:{}", socket.display()),
        }
    }
}

async fn connect_tcp(endpoint: &Endpoint) -> Result<TcpStream, ConnectFailure> {
    let addresses = tokio::net::lookup_host((endpoint.host(), endpoint.port()))
        .await
        .map_err(ConnectFailure::Other)?;
    let mut last: Option<io::Error> = None;
    let mut all_refused = true;
    for address in addresses {
        match TcpStream::connect(address).await {
            Ok(stream) => {
                let _ = stream.set_nodelay(true);
                return Ok(stream);
            }
            Err(error) => {
                if error.kind() != io::ErrorKind::ConnectionRefused {
                    all_refused = false;
                }
                last = Some(error);
            }
        }
    }
    match last {
        Some(_) if all_refused => Err(ConnectFailure::Refused),
        Some(error) => Err(ConnectFailure::Other(error)),
        None => Err(ConnectFailure::Other(io::Error::new(
            io::ErrorKind::NotFound,
            "the host resolved to no address",
        ))),
    }
}

/// A connection to an engine, over TCP or a Unix socket.
#[derive(Debug)]
pub enum EngineStream {
    /// Over TCP.
    Tcp(TcpStream),
    /// Over a Unix socket.
    Unix(UnixStream),
}

impl AsyncRead for EngineStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Tcp(stream) => Pin::new(stream).poll_read(cx, buf),
            Self::Unix(stream) => Pin::new(stream).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for EngineStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Tcp(stream) => Pin::new(stream).poll_write(cx, buf),
            Self::Unix(stream) => Pin::new(stream).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Tcp(stream) => Pin::new(stream).poll_flush(cx),
            Self::Unix(stream) => Pin::new(stream).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Tcp(stream) => Pin::new(stream).poll_shutdown(cx),
            Self::Unix(stream) => Pin::new(stream).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Tcp(stream) => Pin::new(stream).poll_write_vectored(cx, bufs),
            Self::Unix(stream) => Pin::new(stream).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Self::Tcp(stream) => stream.is_write_vectored(),
            Self::Unix(stream) => stream.is_write_vectored(),
        }
    }
}

/// An owned engine's API key: 32 random bytes, hex. Its `Debug` form hides it; only
/// [`ApiKey::expose`] shows it (to write the engine's key file and the Core's
/// `Authorization` header).
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(Arc<str>);

impl ApiKey {
    /// A fresh key from the kernel's random generator.
    pub fn generate() -> io::Result<Self> {
        arcane_files::secret_hex(32).map(|hex| Self(hex.into()))
    }

    /// A key someone else chose (a bearer token to send).
    pub fn from_secret(secret: &str) -> Self {
        Self(secret.into())
    }

    /// The key itself.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey(..)")
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

    #[test]
    fn an_api_key_never_shows_in_debug_output() {
        let key = ApiKey::generate().unwrap();
        assert_eq!(key.expose().len(), 64);
        assert_ne!(key, ApiKey::generate().unwrap());
        assert!(!format!("{key:?}").contains(key.expose()));
    }

    #[tokio::test]
    async fn a_missing_socket_and_a_socket_without_listener_are_refusals() {
        let dir = tempfile::tempdir().unwrap();
        let missing = EngineAddress::Unix(dir.path().join("none.sock"));
        assert!(matches!(
            missing.connect().await,
            Err(ConnectFailure::Refused)
        ));
        let path = dir.path().join("dead.sock");
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        let dead = EngineAddress::Unix(path.clone());
        assert!(matches!(dead.connect().await, Err(ConnectFailure::Refused)));
        assert_eq!(dead.to_string(), format!("unix:{}", path.display()));
        assert_eq!(dead.authority(), "localhost");
    }
}
