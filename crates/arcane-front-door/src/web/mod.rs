//! The application's packaged web: a directory of static files (`arcane serve --web
//! DIR`, a bundle's `app/web/`) served by the Core at `/app/`.
//!
//! # Why under the Core's origin
//!
//! The app's pages call the Core's API. Served at `/app/` on the Core's own origin,
//! they do so same-origin, with the dashboard's session (no CORS, no token in a page
//! URL); on an origin of their own they would need CORS and a token handed over in a
//! URL. The Content-Security-Policy keeps the pages to their own origin.
//!
//! # Containment by physical identity
//!
//! The directory is opened once ([`WebRoot::open`]); every request walks from that
//! descriptor one component at a time with `openat(O_NOFOLLOW)`, so `..`, a symbolic
//! link (even one pointing inside), or a directory swapped for a link after start
//! never leads out. Only regular files are served (a FIFO would block, a device would
//! leak): each is opened non-blocking and checked with `fstat` before a byte is read.
//! Names starting with `.` (`.git`, `.env`) are not served, and a directory is never
//! listed.
//!
//! # Whose files
//!
//! Every directory walked through and every file served is checked by its own
//! descriptor ([`arcane_files::trust::check_opened`]), not only the top directory: it
//! belongs to this user or root and no one else may write to it (a sticky directory
//! may be), and a file has a single link (a hard link could be another user's file
//! from outside the directory). Anything else is refused with 403 and
//! `ARCANE_POLICY_DENIED`, naming the path inside the web directory; none of its
//! bytes are served, and no `index.html` stands in for it.
//!
//! # What a browser gets
//!
//! The MIME type of the extension (`nosniff`), an `ETag` (inode, size, modification
//! time) with `If-None-Match` → 304, one byte range (`Range: bytes=…` → 206, 416 when
//! unsatisfiable; several ranges get the whole file), `HEAD`, and, for a path with no
//! extension that names no file, the root `index.html` (a single-page app's route).

mod mime;

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use bytes::Bytes;
use hyper::header::{HeaderMap, HeaderValue};
use hyper::{Method, Response, StatusCode};
use rustix::fs::{Mode, OFlags};

use arcane_core::upstream::HttpBody;

/// The largest file served, in bytes (an app's assets, not a media library).
pub const MAX_FILE: u64 = 256 * 1024 * 1024;

/// The policy every page of the app runs under: its own origin only.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data: blob:; media-src 'self' blob:; connect-src 'self'; frame-ancestors 'none'; base-uri 'self'; form-action 'self'; object-src 'none'";

/// Why the web directory cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum WebError {
    /// It is missing, not a directory, or a symbolic link.
    #[error("the web directory `{}` cannot be opened: {source}", path.display())]
    Open {
        /// The directory given.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Another user could change what it serves.
    #[error("the web directory is not safe to serve: {}", .0.describe())]
    Untrusted(arcane_files::trust::Untrusted),
    /// A file or directory inside it (its path relative to the web directory) that
    /// another user could have written or changed: refused for one request.
    #[error("not served from the web directory: {}", .0.describe())]
    Refused(arcane_files::trust::Untrusted),
}

impl arcane_report::Diagnostic for WebError {
    fn code(&self) -> &'static str {
        match self {
            Self::Open { .. } => arcane_report::codes::ARCANE_USAGE,
            Self::Untrusted(_) | Self::Refused(_) => arcane_report::codes::ARCANE_POLICY_DENIED,
        }
    }

    fn details(&self) -> serde_json::Value {
        match self {
            Self::Open { path, .. } => serde_json::json!({"path": path}),
            Self::Untrusted(untrusted) => serde_json::json!({"path": untrusted.path}),
            Self::Refused(untrusted) => serde_json::json!({
                "path": untrusted.path,
                "owner": untrusted.owner,
                "mode": format!("{:04o}", untrusted.mode),
            }),
        }
    }

    fn hints(&self) -> Vec<String> {
        match self {
            Self::Open { .. } => vec![
                "`--web` names a directory of the app's static files (its `index.html` at the top)"
                    .into(),
            ],
            Self::Untrusted(untrusted) => vec![untrusted.fix()],
            Self::Refused(untrusted) => vec![format!(
                "in the web directory, {}; then reload the page",
                untrusted.fix()
            )],
        }
    }
}

/// A web directory, opened once (see the module documentation).
#[derive(Debug)]
pub struct WebRoot {
    dir: OwnedFd,
    path: PathBuf,
}

impl WebRoot {
    /// Opens `path` (a directory, not a link, that only this user or root can change).
    pub fn open(path: &Path) -> Result<Self, WebError> {
        let open = |source| WebError::Open {
            path: path.to_path_buf(),
            source,
        };
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let dir = rustix::fs::open(path, flags, Mode::empty()).map_err(|e| open(e.into()))?;
        match arcane_files::trust::check_path(path) {
            Ok(Ok(())) => {}
            Ok(Err(untrusted)) => return Err(WebError::Untrusted(untrusted)),
            Err(source) => return Err(open(source)),
        }
        Ok(Self {
            dir,
            path: path.to_path_buf(),
        })
    }

    /// The directory as given.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Answers `method` on `path` (below the mount point, percent-encoded as sent),
    /// with the request's `headers` (`If-None-Match`, `Range`).
    pub fn answer(&self, method: &Method, path: &str, headers: &HeaderMap) -> Response<HttpBody> {
        if method != Method::GET && method != Method::HEAD {
            let mut response = plain(StatusCode::METHOD_NOT_ALLOWED, "GET or HEAD only\n");
            response
                .headers_mut()
                .insert(hyper::header::ALLOW, HeaderValue::from_static("GET, HEAD"));
            return response;
        }
        let Some(parts) = components(path) else {
            return plain(StatusCode::NOT_FOUND, "not found\n");
        };
        let found = match self.find(&parts) {
            // A single-page app's own route: its `index.html`.
            Ok(None) if parts.last().is_none_or(|name| !name.contains('.')) => {
                self.find(&["index.html".to_string()])
            }
            other => other,
        };
        match found {
            Ok(Some((file, meta, name))) => serve_file(file, &meta, &name, method, headers),
            Ok(None) => plain(StatusCode::NOT_FOUND, "not found\n"),
            Err(untrusted) => {
                crate::http::error_response(StatusCode::FORBIDDEN, &WebError::Refused(untrusted))
            }
        }
    }

    /// Walks `parts` from the root with `O_NOFOLLOW`; a directory's `index.html`; only
    /// a regular file. The open file, its metadata and its name; `Ok(None)` when there
    /// is none; `Err` for the first directory or file on the way that fails the trust
    /// rule (see the module documentation), named by its path inside the web directory.
    fn find(&self, parts: &[String]) -> Result<Option<Found>, arcane_files::trust::Untrusted> {
        let mut inside = PathBuf::new();
        if trusted(&self.dir, Path::new("."))?.is_none() {
            return Ok(None);
        }
        let mut current: Option<OwnedFd> = None;
        for (index, part) in parts.iter().enumerate() {
            let dir = current.as_ref().map_or(self.dir.as_fd(), |fd| fd.as_fd());
            let Some(next) = open_beneath(dir, part) else {
                return Ok(None);
            };
            inside.push(part);
            let Some(meta) = trusted(&next, &inside)? else {
                return Ok(None);
            };
            let last = index + 1 == parts.len();
            match (meta.is_dir(), meta.is_file() && last) {
                (true, _) => current = Some(next),
                (false, true) => return Ok(Some((next, meta, part.clone()))),
                (false, false) => return Ok(None),
            }
        }
        let dir = current.as_ref().map_or(self.dir.as_fd(), |fd| fd.as_fd());
        let Some(index) = open_beneath(dir, "index.html") else {
            return Ok(None);
        };
        inside.push("index.html");
        Ok(trusted(&index, &inside)?
            .filter(std::fs::Metadata::is_file)
            .map(|meta| (index, meta, "index.html".to_string())))
    }
}

/// A file found to serve: its descriptor, its metadata (one `fstat`, taken by the
/// trust check) and its name.
type Found = (OwnedFd, std::fs::Metadata, String);

/// The trust rule for one open directory or file, `inside` the web directory: its
/// metadata when it passes; `None` when it could not be checked (then it is not served
/// either).
fn trusted(
    fd: &OwnedFd,
    inside: &Path,
) -> Result<Option<std::fs::Metadata>, arcane_files::trust::Untrusted> {
    match arcane_files::trust::check_opened(inside, fd.as_fd()) {
        Ok(verdict) => verdict.map(Some),
        Err(_) => Ok(None),
    }
}

/// One component opened below `dir`: never through a link, never blocking (a FIFO).
fn open_beneath(dir: std::os::fd::BorrowedFd<'_>, name: &str) -> Option<OwnedFd> {
    let flags =
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK | OFlags::NOCTTY;
    rustix::fs::openat(dir, name, flags, Mode::empty()).ok()
}

/// The request path as components: percent-decoded; empty and `.` ones dropped;
/// `None` for `..`, a hidden name, a NUL or a `\`.
fn components(path: &str) -> Option<Vec<String>> {
    let path = path.split(['?', '#']).next().unwrap_or_default();
    let mut parts = Vec::new();
    for raw in path.split('/') {
        let part = crate::passthrough::percent_decode(raw);
        if part.is_empty() || part == "." {
            continue;
        }
        if part.starts_with('.') || part.contains(['\0', '\\', '/']) {
            return None;
        }
        parts.push(part);
    }
    Some(parts)
}

fn plain(status: StatusCode, text: &'static str) -> Response<HttpBody> {
    let mut response = Response::new(arcane_core::upstream::full(text));
    *response.status_mut() = status;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// The answer for an open regular file.
fn serve_file(
    file: OwnedFd,
    meta: &std::fs::Metadata,
    name: &str,
    method: &Method,
    headers: &HeaderMap,
) -> Response<HttpBody> {
    use std::os::unix::fs::MetadataExt;
    let size = meta.len();
    if size > MAX_FILE {
        return plain(
            StatusCode::PAYLOAD_TOO_LARGE,
            "this file is too large to serve\n",
        );
    }
    let etag = format!(
        "\"{:x}-{:x}-{:x}.{:x}\"",
        meta.ino(),
        size,
        meta.mtime(),
        meta.mtime_nsec()
    );
    let matches = headers
        .get(hyper::header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.split(',')
                .any(|tag| tag.trim() == etag || tag.trim() == "*")
        });
    let mut response = if matches {
        let mut response = Response::new(arcane_core::upstream::full(Bytes::new()));
        *response.status_mut() = StatusCode::NOT_MODIFIED;
        response
    } else {
        match range(headers, size) {
            Range::Unsatisfiable => {
                let mut response =
                    plain(StatusCode::RANGE_NOT_SATISFIABLE, "range not satisfiable\n");
                if let Ok(value) = HeaderValue::from_str(&format!("bytes */{size}")) {
                    response
                        .headers_mut()
                        .insert(hyper::header::CONTENT_RANGE, value);
                }
                return response;
            }
            Range::Whole => body(file, 0, size, method, StatusCode::OK, None),
            Range::Part(start, end) => {
                let content_range = format!("bytes {start}-{end}/{size}");
                body(
                    file,
                    start,
                    end + 1 - start,
                    method,
                    StatusCode::PARTIAL_CONTENT,
                    Some(content_range),
                )
            }
        }
    };
    let headers = response.headers_mut();
    let content_type = mime::of(name);
    headers.insert(
        hyper::header::CONTENT_TYPE,
        HeaderValue::from_static(content_type),
    );
    if let Ok(value) = HeaderValue::from_str(&etag) {
        headers.insert(hyper::header::ETAG, value);
    }
    headers.insert(
        hyper::header::ACCEPT_RANGES,
        HeaderValue::from_static("bytes"),
    );
    headers.insert(
        hyper::header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache"),
    );
    secure(headers);
    response
}

/// The headers every answer about the app carries, its refusals included: its
/// policy, no sniffing, no referrer, no framing, same-origin readers only.
pub fn secure(headers: &mut HeaderMap) {
    let fixed = [
        (
            hyper::header::CONTENT_SECURITY_POLICY,
            CONTENT_SECURITY_POLICY,
        ),
        (hyper::header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (hyper::header::REFERRER_POLICY, "no-referrer"),
        (hyper::header::X_FRAME_OPTIONS, "DENY"),
        (
            hyper::header::HeaderName::from_static("cross-origin-resource-policy"),
            "same-origin",
        ),
    ];
    for (name, value) in fixed {
        headers.insert(name, HeaderValue::from_static(value));
    }
}

/// What part of the file a request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Range {
    Whole,
    /// First and last byte, inclusive.
    Part(u64, u64),
    Unsatisfiable,
}

/// Reads one `Range: bytes=…` (several ranges, or another unit: the whole file).
fn range(headers: &HeaderMap, size: u64) -> Range {
    let Some(spec) = headers
        .get(hyper::header::RANGE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().strip_prefix("bytes="))
    else {
        return Range::Whole;
    };
    if spec.contains(',') {
        return Range::Whole;
    }
    let Some((first, last)) = spec.trim().split_once('-') else {
        return Range::Whole;
    };
    let (first, last) = (first.trim(), last.trim());
    let parsed = match (first.parse::<u64>().ok(), last.parse::<u64>().ok()) {
        // `bytes=-N`: the last N bytes.
        (None, Some(suffix)) if first.is_empty() && suffix > 0 => {
            Some((size.saturating_sub(suffix), size.saturating_sub(1)))
        }
        (Some(start), None) if last.is_empty() => Some((start, size.saturating_sub(1))),
        (Some(start), Some(end)) if start <= end => Some((start, end.min(size.saturating_sub(1)))),
        _ => return Range::Whole,
    };
    match parsed {
        Some((start, end)) if size > 0 && start < size => Range::Part(start, end),
        _ => Range::Unsatisfiable,
    }
}

/// `length` bytes of `file` from `start`, read on a blocking thread in pieces; none
/// for `HEAD`.
fn body(
    file: OwnedFd,
    start: u64,
    length: u64,
    method: &Method,
    status: StatusCode,
    content_range: Option<String>,
) -> Response<HttpBody> {
    let stream = if method == Method::HEAD {
        arcane_core::upstream::full(Bytes::new())
    } else {
        read_in_pieces(file, start, length)
    };
    let mut response = Response::new(stream);
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(hyper::header::CONTENT_LENGTH, HeaderValue::from(length));
    if let Some(value) = content_range.and_then(|v| HeaderValue::from_str(&v).ok()) {
        headers.insert(hyper::header::CONTENT_RANGE, value);
    }
    response
}

fn read_in_pieces(file: OwnedFd, start: u64, length: u64) -> HttpBody {
    use http_body_util::BodyExt;
    const PIECE: usize = 64 * 1024;
    let (sender, receiver) = tokio::sync::mpsc::channel::<Bytes>(4);
    tokio::task::spawn_blocking(move || {
        let (mut offset, end) = (start, start + length);
        while offset < end {
            let want = usize::try_from(end - offset).unwrap_or(PIECE).min(PIECE);
            let mut buffer = vec![0u8; want];
            let Ok(read) = rustix::io::pread(&file, &mut buffer, offset) else {
                return;
            };
            if read == 0 {
                return;
            }
            buffer.truncate(read);
            offset += read as u64;
            if sender.blocking_send(Bytes::from(buffer)).is_err() {
                return;
            }
        }
    });
    arcane_core::upstream::ChannelBody::new(receiver).boxed()
}

#[cfg(test)]
mod tests;
