use std::os::unix::fs::PermissionsExt;

use http_body_util::BodyExt;
use hyper::header::HeaderMap;

use super::*;

/// A web directory with an app, a hidden file, links out, a FIFO and a bare
/// directory; and a secret file beside it.
fn site() -> (tempfile::TempDir, WebRoot) {
    let top = tempfile::tempdir().unwrap();
    std::fs::set_permissions(top.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let web = top.path().join("web");
    std::fs::create_dir(&web).unwrap();
    std::fs::write(web.join("index.html"), "<!doctype html><p>app").unwrap();
    std::fs::write(web.join("app.js"), "console.log(1)").unwrap();
    std::fs::write(web.join("data.bin"), "abcdefghij").unwrap();
    std::fs::write(web.join(".env"), "TOKEN=secret").unwrap();
    std::fs::create_dir(web.join("docs")).unwrap();
    std::fs::write(web.join("docs/index.html"), "docs").unwrap();
    std::fs::create_dir(web.join("bare")).unwrap();
    std::fs::write(web.join("bare/x.txt"), "x").unwrap();
    std::fs::write(top.path().join("secret.txt"), "outside").unwrap();
    std::os::unix::fs::symlink(top.path().join("secret.txt"), web.join("out.txt")).unwrap();
    std::os::unix::fs::symlink(web.join("app.js"), web.join("inside.js")).unwrap();
    std::os::unix::fs::symlink(top.path(), web.join("up")).unwrap();
    let fifo =
        std::ffi::CString::new(web.join("pipe.txt").into_os_string().into_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path; mkfifo only creates the node.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
    let root = WebRoot::open(&web).unwrap();
    (top, root)
}

async fn get(root: &WebRoot, path: &str, headers: &[(&str, &str)]) -> (u16, HeaderMap, String) {
    let mut map = HeaderMap::new();
    for (name, value) in headers {
        map.insert(
            hyper::header::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            HeaderValue::from_str(value).unwrap(),
        );
    }
    let response = root.answer(&Method::GET, path, &map);
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, headers, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test]
async fn files_are_served_with_their_type_and_a_policy() {
    let (_top, root) = site();
    let (status, headers, body) = get(&root, "/", &[]).await;
    assert_eq!((status, body.as_str()), (200, "<!doctype html><p>app"));
    assert_eq!(headers["content-type"], "text/html; charset=utf-8");
    assert_eq!(headers["content-security-policy"], CONTENT_SECURITY_POLICY);
    assert_eq!(headers["x-content-type-options"], "nosniff");
    let (status, headers, body) = get(&root, "/app.js", &[]).await;
    assert_eq!((status, body.as_str()), (200, "console.log(1)"));
    assert_eq!(headers["content-type"], "text/javascript; charset=utf-8");
    let (status, _, body) = get(&root, "/docs/", &[]).await;
    assert_eq!((status, body.as_str()), (200, "docs"));
    // A route of the single-page app gets its index; a missing asset does not.
    let (status, _, body) = get(&root, "/chat/42", &[]).await;
    assert_eq!((status, body.as_str()), (200, "<!doctype html><p>app"));
    assert_eq!(get(&root, "/missing.js", &[]).await.0, 404);
}

#[tokio::test]
async fn nothing_outside_the_directory_or_hidden_or_special_is_served() {
    let (_top, root) = site();
    for path in [
        "/../secret.txt",
        "/%2e%2e/secret.txt",
        "/docs/../../secret.txt",
        "/.env",
        "/%2eenv",
        "/out.txt",
        "/inside.js",
        "/up/secret.txt",
        "/pipe.txt",
        "/a%00b.txt",
        "/a%5c..%5csecret.txt",
    ] {
        let (status, _, body) = get(&root, path, &[]).await;
        assert!(
            status == 404 && !body.contains("outside") && !body.contains("TOKEN"),
            "{path}: {status} {body}"
        );
    }
    // A directory is never listed: without its own index it is an app route.
    let (status, _, body) = get(&root, "/bare/", &[]).await;
    assert_eq!((status, body.as_str()), (200, "<!doctype html><p>app"));
}

#[tokio::test]
async fn ranges_revalidation_head_and_methods() {
    let (_top, root) = site();
    let (status, headers, body) = get(&root, "/data.bin", &[("range", "bytes=2-5")]).await;
    assert_eq!((status, body.as_str()), (206, "cdef"));
    assert_eq!(headers["content-range"], "bytes 2-5/10");
    let (status, _, body) = get(&root, "/data.bin", &[("range", "bytes=-3")]).await;
    assert_eq!((status, body.as_str()), (206, "hij"));
    let (status, _, body) = get(&root, "/data.bin", &[("range", "bytes=7-")]).await;
    assert_eq!((status, body.as_str()), (206, "hij"));
    let (status, headers, _) = get(&root, "/data.bin", &[("range", "bytes=10-")]).await;
    assert_eq!(status, 416);
    assert_eq!(headers["content-range"], "bytes */10");
    let (status, _, body) = get(&root, "/data.bin", &[("range", "bytes=0-1,4-5")]).await;
    assert_eq!((status, body.as_str()), (200, "abcdefghij"));

    let (_, headers, _) = get(&root, "/data.bin", &[]).await;
    let etag = headers["etag"].to_str().unwrap().to_string();
    let (status, _, body) = get(&root, "/data.bin", &[("if-none-match", &etag)]).await;
    assert_eq!((status, body.as_str()), (304, ""));
    std::fs::write(root.path().join("data.bin"), "changed!!!x").unwrap();
    assert_eq!(
        get(&root, "/data.bin", &[("if-none-match", &etag)]).await.0,
        200,
        "a changed file has a new tag"
    );

    let head = root.answer(&Method::HEAD, "/app.js", &HeaderMap::new());
    assert_eq!(head.headers()["content-length"], "14");
    let body = head.into_body().collect().await.unwrap().to_bytes();
    assert!(body.is_empty());
    let post = root.answer(&Method::POST, "/app.js", &HeaderMap::new());
    assert_eq!(post.status(), StatusCode::METHOD_NOT_ALLOWED);
}

#[test]
fn a_link_or_a_directory_others_can_change_is_refused() {
    let top = tempfile::tempdir().unwrap();
    std::fs::set_permissions(top.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let web = top.path().join("web");
    std::fs::create_dir(&web).unwrap();
    std::os::unix::fs::symlink(&web, top.path().join("link")).unwrap();
    assert!(matches!(
        WebRoot::open(&top.path().join("link")),
        Err(WebError::Open { .. })
    ));
    std::fs::set_permissions(&web, std::fs::Permissions::from_mode(0o777)).unwrap();
    assert!(matches!(WebRoot::open(&web), Err(WebError::Untrusted(_))));
}

/// Issue 28, item 8: below the top directory, a directory others may write to, a
/// file another user owns or may write to, and a hard link to a file outside are
/// refused with 403 naming the path inside, and none of their bytes are served.
#[tokio::test]
async fn what_another_user_could_write_below_the_top_is_refused_not_served() {
    let (top, root) = site();
    let web = root.path().to_path_buf();
    let mode = |path: &Path, mode: u32| {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap()
    };
    std::fs::create_dir(web.join("open")).unwrap();
    std::fs::write(web.join("open/planted.js"), "planted").unwrap();
    mode(&web.join("open"), 0o777);
    std::fs::write(web.join("shared.js"), "planted").unwrap();
    mode(&web.join("shared.js"), 0o666);
    std::fs::hard_link(top.path().join("secret.txt"), web.join("linked.txt")).unwrap();
    let mut refused = vec![
        ("/open/planted.js", "open"),
        ("/open/", "open"),
        ("/shared.js", "shared.js"),
        ("/linked.txt", "linked.txt"),
    ];
    let running_as_root = arcane_files::trust::current_uid() == 0;
    if running_as_root {
        std::fs::create_dir(web.join("theirs")).unwrap();
        std::fs::write(web.join("theirs/index.html"), "planted").unwrap();
        std::os::unix::fs::chown(web.join("theirs/index.html"), Some(65534), None).unwrap();
        std::fs::write(web.join("other.js"), "planted").unwrap();
        std::os::unix::fs::chown(web.join("other.js"), Some(65534), None).unwrap();
        refused.extend([("/theirs/", "theirs/index.html"), ("/other.js", "other.js")]);
    }
    for (request, inside) in refused {
        let (status, headers, body) = get(&root, request, &[]).await;
        assert_eq!(status, 403, "{request}: {body}");
        assert!(
            !body.contains("planted") && !body.contains("outside"),
            "{request}: {body}"
        );
        assert_eq!(headers["content-type"], "application/json", "{request}");
        let error: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(error["error"]["code"], "ARCANE_POLICY_DENIED", "{body}");
        assert_eq!(error["error"]["details"]["path"], inside, "{body}");
        assert!(
            !body.contains(&top.path().display().to_string()),
            "names the path inside, not where the directory is: {body}"
        );
    }
    // A sticky directory others may add to is walked; what is ours in it is served.
    mode(&web.join("open"), 0o1777);
    let (status, _, body) = get(&root, "/open/planted.js", &[]).await;
    assert_eq!((status, body.as_str()), (200, "planted"));
    // Once the top itself becomes writable by others, nothing is served.
    mode(&web, 0o777);
    assert_eq!(get(&root, "/app.js", &[]).await.0, 403);
    assert_eq!(get(&root, "/chat/42", &[]).await.0, 403);
}
