//! The dashboard's files, embedded in the binary: plain HTML, CSS and JavaScript with
//! no build step and nothing fetched from elsewhere (no CDN, no remote fonts), so the
//! dashboard works offline and its Content-Security-Policy can be `default-src 'self'`
//! with no inline script or style.

/// One embedded file.
#[derive(Debug, Clone, Copy)]
pub struct Asset {
    /// Its bytes.
    pub body: &'static str,
    /// Its `Content-Type`.
    pub content_type: &'static str,
}

/// The dashboard (served at `GET /ui` with a session).
pub const DASHBOARD: Asset = Asset {
    body: include_str!("../../ui/index.html"),
    content_type: "text/html; charset=utf-8",
};

/// The login page (served at `GET /ui` without a session): reveals no model, path or
/// state, only how to log in.
pub const LOGIN: Asset = Asset {
    body: include_str!("../../ui/login.html"),
    content_type: "text/html; charset=utf-8",
};

/// The icon: the pages link it, and a browser that asks the origin for
/// `/favicon.ico` (for any page) gets it too, with no token or session (it reveals
/// nothing; a 401 there only fills the browser's console).
const ICON: Asset = Asset {
    body: include_str!("../../ui/icon.svg"),
    content_type: "image/svg+xml",
};

/// The script, the style sheet and the icon, by path.
const FILES: &[(&str, Asset)] = &[
    ("/ui/icon.svg", ICON),
    ("/favicon.ico", ICON),
    (
        "/ui/app.js",
        Asset {
            body: include_str!("../../ui/app.js"),
            content_type: "text/javascript; charset=utf-8",
        },
    ),
    (
        "/ui/app.css",
        Asset {
            body: include_str!("../../ui/app.css"),
            content_type: "text/css; charset=utf-8",
        },
    ),
];

/// The embedded file at `path`, if any.
pub fn file(path: &str) -> Option<Asset> {
    FILES
        .iter()
        .find(|(served, _)| *served == path)
        .map(|(_, asset)| *asset)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pages_load_nothing_from_elsewhere_and_run_no_inline_script() {
        for page in [DASHBOARD.body, LOGIN.body] {
            assert!(!page.contains("http://") && !page.contains("https://"));
            assert!(!page.contains("<script>"), "scripts are files, not inline");
            assert!(!page.contains("style="), "styles are in app.css");
            assert!(page.contains(r#"<script src="/ui/app.js" defer></script>"#));
            assert!(page.contains(r#"<link rel="icon" href="/ui/icon.svg""#));
        }
        for path in ["/ui/app.js", "/ui/app.css", "/ui/icon.svg"] {
            // SVG's namespace is a name, not an address anything is fetched from.
            let body = file(path)
                .unwrap()
                .body
                .replace(r#"xmlns="http://www.w3.org/2000/svg""#, "");
            assert!(
                !body.contains("http://") && !body.contains("https://"),
                "{path}"
            );
        }
        assert!(file("/ui/other.js").is_none());
    }
}
