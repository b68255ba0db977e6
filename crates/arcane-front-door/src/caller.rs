//! Who a request comes from and how long it will wait: what the gateway's routing needs
//! beside the model ([`RouteRequest::caller`], [`RouteRequest::deadline`]).
//!
//! The principal is the one admission put in the request's extensions
//! ([`crate::http`]); a request that carries none (the dashboard's calls, made with the
//! workspace's session) acts as the workspace. The deadline is the client's own:
//! `X-Stainless-Timeout` (seconds; the official OpenAI and Anthropic SDKs send their
//! timeout with every call) or `X-Arcane-Deadline` (seconds, for any client). When
//! both are sent the shorter counts.

use std::time::Duration;

use hyper::header::HeaderMap;

use arcane_core::keys::Principal;
use arcane_core::route::RouteRequest;

/// The headers a deadline is read from, in seconds from now.
pub const DEADLINE_HEADERS: [&str; 2] = ["x-stainless-timeout", "x-arcane-deadline"];

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

/// `route` with the caller and deadline of a request with these `extensions` and
/// `headers`.
pub fn fill(
    route: RouteRequest,
    extensions: &hyper::http::Extensions,
    headers: &HeaderMap,
) -> RouteRequest {
    RouteRequest {
        caller: principal(extensions),
        deadline: deadline(headers),
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
