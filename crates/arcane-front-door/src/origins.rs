//! Browser origins the user allows: CORS for exactly the origins named in
//! `allowed_origins` (`arcane.toml`) or `--allow-origin`, and nothing for any other.
//!
//! # Why it is opt-in, exact, and still behind the token
//!
//! A web page may send requests to the loopback port from any browser tab, so by
//! default a request with an `Origin` other than the listener's own is refused (403)
//! before anything runs. A web app the user builds (a dev server on
//! `http://localhost:3000`) needs to call the Core from its own origin; the user names
//! that origin, and only it gets CORS answers:
//!
//! * **Exact.** An origin is `scheme://host[:port]` as a browser sends it (`http` or
//!   `https`, no path, no user info, the default port left out); it is compared with
//!   the `Origin` header exactly (ASCII case-insensitively). A wildcard (`*`, `*.x`),
//!   `null` and anything with a path are refused when the configuration is read: a
//!   wildcard would let every page on the machine's browsers reach the models.
//! * **Still the token.** An allowed origin only makes the browser let the page read
//!   answers; every request but the preflight still needs the bearer token, which
//!   the page must have been given. The preflight (`OPTIONS` with
//!   `Access-Control-Request-Method`) carries no credentials by the CORS standard, so
//!   it is answered without the token, and it reveals nothing but these headers.
//! * **No cookies.** `Access-Control-Allow-Credentials` is never sent: the token
//!   travels in a header the page sets itself.

use hyper::header::{HeaderMap, HeaderValue};

/// Why an allowed origin was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OriginError {
    /// A wildcard or `null`: it would allow every page.
    #[error(
        "the allowed origin `{origin}` is a wildcard: it would let every web page use the models"
    )]
    Wildcard {
        /// The value given.
        origin: String,
    },
    /// Not `scheme://host[:port]` with `http` or `https`.
    #[error("the allowed origin `{origin}` is not an origin: {why}")]
    Malformed {
        /// The value given.
        origin: String,
        /// What is wrong with it.
        why: &'static str,
    },
}

impl arcane_report::Diagnostic for OriginError {
    fn code(&self) -> &'static str {
        arcane_report::codes::ARCANE_USAGE
    }

    fn details(&self) -> serde_json::Value {
        match self {
            Self::Wildcard { origin } | Self::Malformed { origin, .. } => {
                serde_json::json!({"origin": origin})
            }
        }
    }

    fn hints(&self) -> Vec<String> {
        vec![
            "name each origin exactly as the browser sends it: `scheme://host[:port]`, e.g. `http://localhost:3000`".into(),
        ]
    }
}

/// The origins whose pages may read the Core's answers (see the module documentation).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowedOrigins(Vec<String>);

/// The request headers a preflight may ask for: what the official clients send
/// (`x-stainless-*` are the OpenAI and Anthropic SDKs' own).
const ALLOWED_HEADERS: &[&str] = &[
    "accept",
    "authorization",
    "content-type",
    "x-api-key",
    "x-arcane-client",
    "anthropic-version",
    "anthropic-beta",
    "anthropic-dangerous-direct-browser-access",
    "openai-organization",
    "openai-project",
    "openai-beta",
];

/// How long a browser may cache a preflight answer, in seconds.
const PREFLIGHT_MAX_AGE: &str = "600";

impl AllowedOrigins {
    /// Parses each of `origins` (see the module documentation for what is refused).
    pub fn parse<S: AsRef<str>>(origins: &[S]) -> Result<Self, OriginError> {
        let mut allowed: Vec<String> = Vec::new();
        for origin in origins {
            let origin = normalize(origin.as_ref())?;
            if !allowed.contains(&origin) {
                allowed.push(origin);
            }
        }
        Ok(Self(allowed))
    }

    /// The allowed origins, normalized.
    pub fn as_slice(&self) -> &[String] {
        &self.0
    }

    /// Whether a page of `origin` (an `Origin` header's value) may read answers.
    pub fn allows(&self, origin: &str) -> bool {
        self.0
            .iter()
            .any(|allowed| allowed.eq_ignore_ascii_case(origin))
    }

    /// The allowed origin a request comes from, if it names one.
    pub fn of_request(&self, headers: &HeaderMap) -> Option<HeaderValue> {
        let origin = headers.get(hyper::header::ORIGIN)?;
        origin
            .to_str()
            .ok()
            .filter(|o| self.allows(o))
            .map(|_| origin.clone())
    }

    /// Adds the CORS answer headers for `origin` to a response.
    pub fn decorate(origin: &HeaderValue, headers: &mut HeaderMap) {
        headers.insert(hyper::header::ACCESS_CONTROL_ALLOW_ORIGIN, origin.clone());
        headers.append(hyper::header::VARY, HeaderValue::from_static("Origin"));
        headers.insert(
            hyper::header::ACCESS_CONTROL_EXPOSE_HEADERS,
            HeaderValue::from_static("retry-after, www-authenticate"),
        );
    }

    /// The headers of a preflight answer for `origin`, or `None` when the request
    /// asks for a method or header the Core does not take from pages (the browser then
    /// refuses the real request).
    pub fn preflight(origin: &HeaderValue, request: &HeaderMap) -> Option<HeaderMap> {
        let method = request
            .get(hyper::header::ACCESS_CONTROL_REQUEST_METHOD)?
            .to_str()
            .ok()?;
        if !matches!(method, "GET" | "POST" | "DELETE") {
            return None;
        }
        let asked = request
            .get_all(hyper::header::ACCESS_CONTROL_REQUEST_HEADERS)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(|h| h.trim().to_ascii_lowercase())
            .filter(|h| !h.is_empty());
        let mut granted = Vec::new();
        for header in asked {
            let known =
                ALLOWED_HEADERS.contains(&header.as_str()) || header.starts_with("x-stainless-");
            if !known {
                return None;
            }
            granted.push(header);
        }
        let mut headers = HeaderMap::new();
        Self::decorate(origin, &mut headers);
        headers.insert(
            hyper::header::ACCESS_CONTROL_ALLOW_METHODS,
            HeaderValue::from_static("GET, POST, DELETE"),
        );
        if !granted.is_empty() {
            headers.insert(
                hyper::header::ACCESS_CONTROL_ALLOW_HEADERS,
                HeaderValue::from_str(&granted.join(", ")).ok()?,
            );
        }
        headers.insert(
            hyper::header::ACCESS_CONTROL_MAX_AGE,
            HeaderValue::from_static(PREFLIGHT_MAX_AGE),
        );
        Some(headers)
    }
}

/// `scheme://host[:port]`, lowercased, the scheme's default port left out (as browsers
/// send it).
fn normalize(origin: &str) -> Result<String, OriginError> {
    let malformed = |why| OriginError::Malformed {
        origin: origin.to_string(),
        why,
    };
    let trimmed = origin.trim();
    if trimmed == "null" || trimmed.contains('*') {
        return Err(OriginError::Wildcard {
            origin: origin.to_string(),
        });
    }
    let lower = trimmed.to_ascii_lowercase();
    let (scheme, rest) = lower
        .split_once("://")
        .ok_or_else(|| malformed("it needs a scheme (`http://` or `https://`)"))?;
    let default_port = match scheme {
        "http" => "80",
        "https" => "443",
        _ => {
            return Err(malformed(
                "only `http` and `https` pages have origins a browser sends",
            ))
        }
    };
    let authority = rest.strip_suffix('/').unwrap_or(rest);
    if authority.is_empty() {
        return Err(malformed("it names no host"));
    }
    if authority.contains(['/', '?', '#', '@', ' ']) {
        return Err(malformed(
            "an origin has no path, query, fragment or user name",
        ));
    }
    let (host, port) = split_port(authority).map_err(malformed)?;
    if host.is_empty() {
        return Err(malformed("it names no host"));
    }
    Ok(match port {
        Some(port) if port != default_port => format!("{scheme}://{host}:{port}"),
        _ => format!("{scheme}://{host}"),
    })
}

/// `host` and its port, if any (an IPv6 host is in brackets).
fn split_port(authority: &str) -> Result<(&str, Option<&str>), &'static str> {
    let (host, port) = match authority.rsplit_once(':') {
        Some((host, port)) if !port.contains(']') => (host, Some(port)),
        _ => (authority, None),
    };
    if let Some(port) = port {
        let valid = !port.is_empty()
            && port.bytes().all(|b| b.is_ascii_digit())
            && port.parse::<u16>().is_ok_and(|p| p > 0);
        if !valid {
            return Err("its port is not a number from 1 to 65535");
        }
    }
    Ok((host, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_are_normalized_as_browsers_send_them() {
        let allowed = AllowedOrigins::parse(&[
            "http://localhost:3000",
            "HTTP://LocalHost:3000/",
            "http://127.0.0.1:80",
            "https://[::1]:443",
            "https://[::1]:8443",
        ])
        .unwrap();
        assert_eq!(
            allowed.as_slice(),
            [
                "http://localhost:3000",
                "http://127.0.0.1",
                "https://[::1]",
                "https://[::1]:8443"
            ]
        );
        assert!(allowed.allows("http://localhost:3000"));
        assert!(allowed.allows("http://127.0.0.1"));
        assert!(!allowed.allows("http://localhost:3001"));
        assert!(!allowed.allows("https://localhost:3000"));
        assert!(!allowed.allows("http://localhost:3000.evil"));
    }

    #[test]
    fn wildcards_and_non_origins_are_refused_naming_the_value() {
        for wildcard in ["*", "http://*.localhost", "null"] {
            let error = AllowedOrigins::parse(&[wildcard]).unwrap_err();
            assert_eq!(
                error,
                OriginError::Wildcard {
                    origin: wildcard.into()
                }
            );
        }
        for bad in [
            "localhost:3000",
            "ftp://localhost",
            "http://",
            "http://localhost:3000/app",
            "http://user@localhost",
            "http://localhost:0",
            "http://localhost:99999",
            "http://localhost:x",
        ] {
            let error = AllowedOrigins::parse(&[bad]).unwrap_err();
            assert!(
                matches!(&error, OriginError::Malformed { origin, .. } if origin == bad),
                "{bad}: {error:?}"
            );
            assert!(error.to_string().contains(bad), "{error}");
        }
    }

    #[test]
    fn a_preflight_grants_only_what_the_core_takes_from_pages() {
        let origin = HeaderValue::from_static("http://localhost:3000");
        let mut request = HeaderMap::new();
        request.insert(
            hyper::header::ACCESS_CONTROL_REQUEST_METHOD,
            HeaderValue::from_static("POST"),
        );
        request.insert(
            hyper::header::ACCESS_CONTROL_REQUEST_HEADERS,
            HeaderValue::from_static("Authorization, content-type, x-stainless-os"),
        );
        let granted = AllowedOrigins::preflight(&origin, &request).unwrap();
        assert_eq!(
            granted[hyper::header::ACCESS_CONTROL_ALLOW_ORIGIN],
            "http://localhost:3000"
        );
        assert_eq!(
            granted[hyper::header::ACCESS_CONTROL_ALLOW_HEADERS],
            "authorization, content-type, x-stainless-os"
        );
        assert!(granted
            .get(hyper::header::ACCESS_CONTROL_ALLOW_CREDENTIALS)
            .is_none());
        // A method or header the Core does not take from pages: no grant.
        request.insert(
            hyper::header::ACCESS_CONTROL_REQUEST_METHOD,
            HeaderValue::from_static("PUT"),
        );
        assert!(AllowedOrigins::preflight(&origin, &request).is_none());
        request.insert(
            hyper::header::ACCESS_CONTROL_REQUEST_METHOD,
            HeaderValue::from_static("GET"),
        );
        request.insert(
            hyper::header::ACCESS_CONTROL_REQUEST_HEADERS,
            HeaderValue::from_static("x-forwarded-for"),
        );
        assert!(AllowedOrigins::preflight(&origin, &request).is_none());
    }
}
