//! A minimal HTTP/1.1 GET over a fresh TCP connection (hyper 1), and the one place that
//! tells a refused connection from every other failure.
//!
//! Why so small: probes go to one listener, once per attempt, with a hard timeout. A
//! pooled client would keep connections open to a server we are about to stop.

use std::io;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper::header::{CONNECTION, HOST};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::endpoint::Endpoint;

/// The most body bytes a probe reads.
const BODY_LIMIT: usize = 64 * 1024;

/// An HTTP answer: status and body bytes.
#[derive(Debug, Clone)]
pub(crate) struct Answer {
    pub status: u16,
    pub body: Bytes,
}

/// Why no HTTP answer came back.
#[derive(Debug)]
pub(crate) enum Failure {
    /// Every address of the host refused the connection: nothing listens there.
    Refused,
    /// The connection could not be made for another reason (DNS, unreachable, timeout).
    Connect(io::Error),
    /// A connection was made, but no valid HTTP answer came back in time.
    NoHttp(io::Error),
}

/// `GET path` at `endpoint`, within `timeout` for the whole exchange.
pub(crate) async fn get(
    endpoint: &Endpoint,
    path: &str,
    timeout: Duration,
) -> Result<Answer, Failure> {
    let stream = match tokio::time::timeout(timeout, connect(endpoint)).await {
        Ok(result) => result?,
        Err(_) => {
            return Err(Failure::Connect(io::Error::new(
                io::ErrorKind::TimedOut,
                "connecting timed out",
            )))
        }
    };
    match tokio::time::timeout(timeout, exchange(stream, endpoint, path)).await {
        Ok(Ok(answer)) => Ok(answer),
        Ok(Err(error)) => Err(Failure::NoHttp(error)),
        Err(_) => Err(Failure::NoHttp(io::Error::new(
            io::ErrorKind::TimedOut,
            "no HTTP answer in time",
        ))),
    }
}

/// Connects to the first address that accepts. Refused only when every address refused
/// (`localhost` resolves to both `::1` and `127.0.0.1`).
async fn connect(endpoint: &Endpoint) -> Result<TcpStream, Failure> {
    let addresses = tokio::net::lookup_host((endpoint.host(), endpoint.port()))
        .await
        .map_err(Failure::Connect)?;
    let mut last: Option<io::Error> = None;
    let mut all_refused = true;
    for address in addresses {
        match TcpStream::connect(address).await {
            Ok(stream) => return Ok(stream),
            Err(error) => {
                if error.kind() != io::ErrorKind::ConnectionRefused {
                    all_refused = false;
                }
                last = Some(error);
            }
        }
    }
    match last {
        Some(_) if all_refused => Err(Failure::Refused),
        Some(error) => Err(Failure::Connect(error)),
        None => Err(Failure::Connect(io::Error::new(
            io::ErrorKind::NotFound,
            "the host resolved to no address",
        ))),
    }
}

async fn exchange(stream: TcpStream, endpoint: &Endpoint, path: &str) -> io::Result<Answer> {
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake::<_, Empty<Bytes>>(TokioIo::new(stream))
            .await
            .map_err(io::Error::other)?;
    let connection = tokio::spawn(connection);
    let request = hyper::Request::get(path)
        .header(HOST, endpoint.authority())
        .header(CONNECTION, "close")
        .body(Empty::new())
        .map_err(io::Error::other)?;
    let result = async {
        let response = sender
            .send_request(request)
            .await
            .map_err(io::Error::other)?;
        let status = response.status().as_u16();
        let body = Limited::new(response.into_body(), BODY_LIMIT)
            .collect()
            .await
            .map_err(io::Error::other)?
            .to_bytes();
        Ok(Answer { status, body })
    }
    .await;
    connection.abort();
    result
}
