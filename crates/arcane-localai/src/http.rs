//! A minimal HTTP/1.1 GET over a fresh connection (TCP or Unix socket, hyper 1), and the one place that
//! tells a refused connection from every other failure.
//!
//! Why so small: probes go to one listener, once per attempt, with a hard timeout. A
//! pooled client would keep connections open to a server we are about to stop.

use std::io;
use std::time::Duration;

use crate::endpoint::{ConnectFailure, EngineAddress, EngineStream};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper::header::{CONNECTION, HOST};
use hyper_util::rt::TokioIo;

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

/// `GET path` at `address`, within `timeout` for the whole exchange.
pub(crate) async fn get(
    address: &EngineAddress,
    path: &str,
    timeout: Duration,
) -> Result<Answer, Failure> {
    let stream = match tokio::time::timeout(timeout, address.connect()).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(ConnectFailure::Refused)) => return Err(Failure::Refused),
        Ok(Err(ConnectFailure::Other(error))) => return Err(Failure::Connect(error)),
        Err(_) => {
            return Err(Failure::Connect(io::Error::new(
                io::ErrorKind::TimedOut,
                "connecting timed out",
            )))
        }
    };
    match tokio::time::timeout(timeout, exchange(stream, address, path)).await {
        Ok(Ok(answer)) => Ok(answer),
        Ok(Err(error)) => Err(Failure::NoHttp(error)),
        Err(_) => Err(Failure::NoHttp(io::Error::new(
            io::ErrorKind::TimedOut,
            "no HTTP answer in time",
        ))),
    }
}

async fn exchange(stream: EngineStream, address: &EngineAddress, path: &str) -> io::Result<Answer> {
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake::<_, Empty<Bytes>>(TokioIo::new(stream))
            .await
            .map_err(io::Error::other)?;
    let connection = tokio::spawn(connection);
    let request = hyper::Request::get(path)
        .header(HOST, address.authority())
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
