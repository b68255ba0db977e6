//! Shared helpers: fresh workspaces, fake-but-runnable engine executables, test GGUF
//! files, archives (including malicious ones) and a loopback HTTP server.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use sha2::{Digest, Sha256};

/// A fresh temporary directory.
pub fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("arcane-registry-")
        .tempdir()
        .expect("temp dir")
}

/// SHA-256 of bytes, lowercase hex.
pub fn sha256(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// The real `llama-server` (`LLAMA_SERVER`); fails loudly when absent.
pub fn llama_server() -> PathBuf {
    real_part("LLAMA_SERVER")
}

/// The real SmolLM2 GGUF (`ARCANE_TEST_MODEL`); fails loudly when absent.
pub fn smollm2() -> PathBuf {
    real_part("ARCANE_TEST_MODEL")
}

/// The provisioned random-weight SDXS-512-DS safetensors (`ARCANE_SD_MODEL`); fails
/// loudly when absent.
pub fn sd_model() -> PathBuf {
    real_part("ARCANE_SD_MODEL")
}

/// The provisioned `libstable-diffusion.so` (`ARCANE_SD_LIBRARY`); fails loudly when
/// absent.
pub fn sd_library() -> PathBuf {
    real_part("ARCANE_SD_LIBRARY")
}

#[allow(clippy::disallowed_methods)]
fn real_part(var: &str) -> PathBuf {
    let value = std::env::var_os(var).unwrap_or_else(|| {
        panic!("{var} is not set: run the tests through `./scripts/test.sh` (or source ~/.cache/arcane/embedded.env)")
    });
    let path = PathBuf::from(value);
    assert!(
        path.is_file(),
        "{var}={} does not exist; rerun `bash scripts/provision.sh`",
        path.display()
    );
    path
}

/// `sha256sum FILE`, computed independently of the code under test.
pub fn sha256sum(path: &Path) -> String {
    let output = std::process::Command::new("sha256sum")
        .arg(path)
        .output()
        .expect("run sha256sum");
    assert!(output.status.success());
    String::from_utf8_lossy(&output.stdout)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string()
}

/// A shell script that behaves like `llama-server --version` of build `build`.
pub fn fake_llama_server_script(build: u32) -> String {
    format!("#!/bin/sh\necho \"version: {build} (deadbeef)\" >&2\necho 'built with test for Linux' >&2\nexit 0\n")
}

/// Writes an executable file.
pub fn write_executable(path: &Path, content: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, content).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// A small valid GGUF v3 file at `path` (architecture `llama`, context 2048, Q4_1).
pub fn write_gguf(path: &Path, name: &str) {
    arcane_registry::write_test_gguf(
        path,
        &[("general.architecture", "llama"), ("general.name", name)],
        &[("general.file_type", 3), ("llama.context_length", 2048)],
        4096,
    )
    .unwrap();
}

/// One entry of a test archive.
#[derive(Clone)]
pub enum Entry {
    /// A regular file.
    File {
        path: String,
        data: Vec<u8>,
        mode: u32,
    },
    /// A directory.
    Dir { path: String },
    /// A symbolic link.
    Symlink { path: String, target: String },
}

impl Entry {
    pub fn file(path: &str, data: impl Into<Vec<u8>>) -> Entry {
        Entry::File {
            path: path.into(),
            data: data.into(),
            mode: 0o644,
        }
    }
    pub fn exe(path: &str, data: impl Into<Vec<u8>>) -> Entry {
        Entry::File {
            path: path.into(),
            data: data.into(),
            mode: 0o755,
        }
    }
    pub fn dir(path: &str) -> Entry {
        Entry::Dir { path: path.into() }
    }
    pub fn symlink(path: &str, target: &str) -> Entry {
        Entry::Symlink {
            path: path.into(),
            target: target.into(),
        }
    }
}

/// A tar header whose name is written raw (the tar crate refuses `..` and absolute
/// names, which is exactly what the tests need to produce).
pub fn raw_header(path: &str, kind: tar::EntryType, size: u64, mode: u32) -> tar::Header {
    let mut header = tar::Header::new_old();
    {
        let name = &mut header.as_old_mut().name;
        assert!(path.len() < name.len(), "test entry name too long");
        name[..path.len()].copy_from_slice(path.as_bytes());
    }
    header.set_entry_type(kind);
    header.set_size(size);
    header.set_mode(mode);
    header.set_mtime(0);
    header.set_cksum();
    header
}

/// A gzip-compressed tar holding `entries`, names written verbatim.
pub fn tar_gz(entries: &[Entry]) -> Vec<u8> {
    let encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let mut builder = tar::Builder::new(encoder);
    for entry in entries {
        match entry {
            Entry::File { path, data, mode } => {
                let header = raw_header(path, tar::EntryType::Regular, data.len() as u64, *mode);
                builder.append(&header, data.as_slice()).unwrap();
            }
            Entry::Dir { path } => {
                let header = raw_header(path, tar::EntryType::Directory, 0, 0o755);
                builder.append(&header, std::io::empty()).unwrap();
            }
            Entry::Symlink { path, target } => {
                let mut header = raw_header(path, tar::EntryType::Symlink, 0, 0o777);
                {
                    let link = &mut header.as_old_mut().linkname;
                    link[..target.len()].copy_from_slice(target.as_bytes());
                }
                header.set_cksum();
                builder.append(&header, std::io::empty()).unwrap();
            }
        }
    }
    builder.into_inner().unwrap().finish().unwrap()
}

/// A zip holding `entries`, names written verbatim.
pub fn zip(entries: &[Entry]) -> Vec<u8> {
    let mut writer = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    for entry in entries {
        match entry {
            Entry::File { path, data, mode } => {
                let options = zip::write::SimpleFileOptions::default().unix_permissions(*mode);
                writer.start_file(path.as_str(), options).unwrap();
                writer.write_all(data).unwrap();
            }
            Entry::Dir { path } => {
                writer
                    .add_directory(path.as_str(), zip::write::SimpleFileOptions::default())
                    .unwrap();
            }
            Entry::Symlink { path, target } => {
                writer
                    .add_symlink(
                        path.as_str(),
                        target.as_str(),
                        zip::write::SimpleFileOptions::default(),
                    )
                    .unwrap();
            }
        }
    }
    writer.finish().unwrap().into_inner()
}

/// The layout of an official release: `build/bin/llama-server` plus a library and its link.
pub fn release_entries(build: u32) -> Vec<Entry> {
    vec![
        Entry::dir("build/"),
        Entry::dir("build/bin/"),
        Entry::exe("build/bin/llama-server", fake_llama_server_script(build)),
        Entry::file("build/bin/libllama.so.0.0.1", "not really a library"),
        Entry::symlink("build/bin/libllama.so", "libllama.so.0.0.1"),
        Entry::file("LICENSE", "MIT"),
    ]
}

/// Every path under `root`, relative, sorted (directories end with `/`).
pub fn tree(root: &Path) -> Vec<String> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let relative = path
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            let kind = entry.file_type().unwrap();
            if kind.is_dir() {
                out.push(format!("{relative}/"));
                walk(root, &path, out);
            } else {
                out.push(relative);
            }
        }
    }
    let mut out = Vec::new();
    walk(root, root, &mut out);
    out.sort();
    out
}

/// What a failed operation may leave in a workspace: the lock's sentinel and the
/// (empty) directories the registry keeps. Anything else is a partial install.
pub fn assert_clean(workspace: &Path) {
    let allowed = [
        ".arcane/",
        ".arcane/workspace-operation.lock",
        ".arcane/runtimes/",
        ".arcane/models/",
    ];
    let left: Vec<String> = tree(workspace)
        .into_iter()
        .filter(|p| !allowed.contains(&p.as_str()))
        .collect();
    assert!(
        left.is_empty(),
        "a failed operation left files behind: {left:#?}"
    );
}

/// How the test server answers.
#[derive(Clone)]
pub enum Reply {
    /// 200 with the whole body.
    Full(Vec<u8>),
    /// 200 announcing `Content-Length: len(body)` but sending only `sent` bytes, then closing.
    Truncated { body: Vec<u8>, sent: usize },
    /// 200 announcing the body's length, sending `sent` bytes, then going silent until
    /// the server is dropped.
    Stall { body: Vec<u8>, sent: usize },
    /// An error status with no body.
    Status(u16),
}

/// A one-route HTTP/1.1 server on 127.0.0.1 (port 0) that answers every request with
/// the same [`Reply`]; stopped and joined on drop.
pub struct Server {
    address: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    requests: Arc<std::sync::atomic::AtomicUsize>,
}

impl Server {
    pub fn start(reply: Reply) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let address = listener.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let requests = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let thread_stop = stop.clone();
        let thread_requests = requests.clone();
        let thread = std::thread::spawn(move || {
            let mut open = Vec::new();
            while !thread_stop.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((mut stream, _)) => {
                        thread_requests.fetch_add(1, Ordering::SeqCst);
                        stream.set_nonblocking(false).unwrap();
                        stream
                            .set_read_timeout(Some(Duration::from_secs(5)))
                            .unwrap();
                        let mut request = Vec::new();
                        let mut buffer = [0u8; 1024];
                        while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                            match stream.read(&mut buffer) {
                                Ok(0) | Err(_) => break,
                                Ok(n) => request.extend_from_slice(&buffer[..n]),
                            }
                        }
                        let head = |len: usize| {
                            format!("HTTP/1.1 200 OK\r\nContent-Length: {len}\r\nContent-Type: application/octet-stream\r\nConnection: close\r\n\r\n")
                        };
                        match &reply {
                            Reply::Full(body) => {
                                let _ = stream.write_all(head(body.len()).as_bytes());
                                let _ = stream.write_all(body);
                            }
                            Reply::Truncated { body, sent } => {
                                let _ = stream.write_all(head(body.len()).as_bytes());
                                let _ = stream.write_all(&body[..*sent]);
                            }
                            Reply::Stall { body, sent } => {
                                let _ = stream.write_all(head(body.len()).as_bytes());
                                let _ = stream.write_all(&body[..*sent]);
                                let _ = stream.flush();
                                open.push(stream);
                                continue;
                            }
                            Reply::Status(code) => {
                                let _ = stream.write_all(
                                    format!("HTTP/1.1 {code} Nope\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").as_bytes(),
                                );
                            }
                        }
                        let _ = stream.flush();
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    Err(_) => break,
                }
            }
            drop(open);
        });
        Server {
            address,
            stop,
            thread: Some(thread),
            requests,
        }
    }

    /// The URL of `name` on this server.
    pub fn url(&self, name: &str) -> String {
        format!("http://{}/{name}", self.address)
    }

    /// How many requests it has accepted.
    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
