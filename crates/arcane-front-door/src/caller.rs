//! Who a request comes from and how long it will wait: what the gateway's routing needs
//! beside the model ([`RouteRequest::caller`], [`RouteRequest::deadline`]).
//!
//! The principal is the one admission put in the request's extensions
//! ([`crate::http`]); a request that carries none (the dashboard's calls, made with the
//! workspace's session) acts as the workspace. The deadline is the client's own:
//! `X-Stainless-Timeout` or `X-Stainless-Read-Timeout` (seconds: the official OpenAI
//! and Anthropic SDKs send their timeout with every call, the Anthropic ones the first,
//! the OpenAI Python one the second), or `X-Arcane-Deadline` (seconds, for any
//! client). When several are sent the shortest counts.

use std::time::Duration;

use hyper::header::HeaderMap;

use arcane_core::keys::Principal;
use arcane_core::route::RouteRequest;

/// The headers a deadline is read from, in seconds from now.
pub const DEADLINE_HEADERS: [&str; 3] = [
    "x-stainless-timeout",
    "x-stainless-read-timeout",
    "x-arcane-deadline",
];

/// The principal of an admitted request (the workspace's when none was put there).
pub fn principal(extensions: &hyper::http::Extensions) -> Principal {
    extensions.get::<Principal>().cloned().unwrap_or_default()
}

/// The client's deadline: the shortest of the [`DEADLINE_HEADERS`] that hold a positive
/// number of seconds (others are ignored).
pub fn deadline(headers: &HeaderMap) -> Option<Duration> {
    DEADLINE_HEADERS
        .iter()
        .filter_map(|name| {
            headers
                .get(*name)?
                .to_str()
                .ok()?
                .trim()
                .parse::<f64>()
                .ok()
        })
        .filter(|seconds| seconds.is_finite() && *seconds > 0.0)
        .map(|seconds| Duration::from_secs_f64(seconds.min(1e9)))
        .min()
}

/// `route` with the caller and deadline of `request`, queued when it is work
/// ([`crate::scopes::is_work`]).
pub fn fill<B>(route: RouteRequest, request: &hyper::Request<B>) -> RouteRequest {
    RouteRequest {
        caller: principal(request.extensions()),
        deadline: deadline(request.headers()),
        queued: crate::scopes::is_work(request.method(), request.uri().path()),
        ..route
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::header::HeaderValue;

    #[test]
    fn the_shorter_valid_deadline_counts() {
        let mut headers = HeaderMap::new();
        assert_eq!(deadline(&headers), None);
        headers.insert("x-stainless-timeout", HeaderValue::from_static("600"));
        assert_eq!(deadline(&headers), Some(Duration::from_secs(600)));
        headers.insert("x-arcane-deadline", HeaderValue::from_static("2.5"));
        assert_eq!(deadline(&headers), Some(Duration::from_millis(2500)));
        headers.insert("x-arcane-deadline", HeaderValue::from_static("soon"));
        assert_eq!(deadline(&headers), Some(Duration::from_secs(600)));
        headers.insert("x-stainless-timeout", HeaderValue::from_static("-1"));
        assert_eq!(deadline(&headers), None);
    }
}
