//! What the CLI's benchmarks share: the provisioned files they need, and `arcane serve`
//! in a fresh workspace with its models registered, killed when dropped.

use std::io::{BufRead, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The file `var` names (set by sourcing `scripts/provision.sh all`'s output).
pub fn real(var: &str) -> PathBuf {
    let path =
        PathBuf::from(std::env::var_os(var).unwrap_or_else(|| {
            panic!("{var} is not set: source `scripts/provision.sh all`'s output")
        }));
    assert!(path.is_file(), "{var}={} is not a file", path.display());
    path
}

/// The median of `samples`, in seconds.
pub fn median(mut samples: Vec<Duration>) -> f64 {
    samples.sort();
    samples[samples.len() / 2].as_secs_f64()
}

/// `arcane serve` in a fresh workspace.
pub struct Host {
    child: Child,
    _workspace: tempfile::TempDir,
    port: u16,
    token: String,
}

impl Host {
    /// Runs each of `setup` (`arcane ARGS FILE`: `model add`, `runtime add`), writes
    /// `toml` as `arcane.toml`, starts `serve` and waits for its first line of event
    /// `ready` (`core.listening`, `local-ai.model.ready`).
    pub fn start(setup: &[(&[&str], PathBuf)], toml: &str, ready: &str) -> Host {
        let workspace = tempfile::tempdir().unwrap();
        let arcane = |args: &[&str]| {
            let mut command = Command::new(env!("CARGO_BIN_EXE_arcane"));
            command
                .arg("--workspace")
                .arg(workspace.path())
                .args(args)
                .env_remove("ARCANE_WORKSPACE");
            command
        };
        for (args, file) in setup {
            let status = arcane(args)
                .arg(file)
                .stdout(Stdio::null())
                .status()
                .unwrap();
            assert!(status.success(), "{args:?}");
        }
        std::fs::write(workspace.path().join("arcane.toml"), toml).unwrap();
        let mut child = arcane(&["--output", "ndjson", "serve"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = std::io::BufReader::new(child.stdout.take().unwrap());
        let (seen, heard) = std::sync::mpsc::channel();
        let wanted = format!("\"{ready}\"");
        // Read every line to the end (a closed pipe would fail the host's output).
        std::thread::spawn(move || {
            for line in stdout.lines().map_while(Result::ok) {
                if line.contains(&wanted) {
                    let _ = seen.send(());
                }
            }
        });
        heard
            .recv_timeout(Duration::from_secs(120))
            .unwrap_or_else(|_| panic!("no `{ready}` within two minutes"));
        let record = workspace.path().join(".arcane/core.json");
        let endpoint: Value = serde_json::from_slice(&std::fs::read(&record).unwrap()).unwrap();
        let url = endpoint["url"].as_str().unwrap();
        let port = url
            .rsplit(':')
            .next()
            .unwrap()
            .trim_end_matches('/')
            .parse()
            .unwrap();
        Host {
            child,
            _workspace: workspace,
            port,
            token: endpoint["token"].as_str().unwrap().to_string(),
        }
    }

    /// One request; the body of a 200, else a panic with the answer.
    pub fn post(&self, path: &str, content_type: &str, body: &[u8]) -> Vec<u8> {
        self.post_timed(path, content_type, body).1
    }

    /// One request: how long until the first byte of the answer's body arrived, and
    /// the body of a 200 (a chunked one put back together), else a panic with it.
    pub fn post_timed(&self, path: &str, content_type: &str, body: &[u8]) -> (Duration, Vec<u8>) {
        let started = Instant::now();
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nAuthorization: Bearer {}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            self.port,
            self.token,
            body.len()
        );
        stream.write_all(head.as_bytes()).unwrap();
        stream.write_all(body).unwrap();
        let (mut answer, mut buffer) = (Vec::new(), vec![0u8; 1 << 16]);
        let mut first_byte = None;
        loop {
            let read = stream.read(&mut buffer).unwrap();
            if read == 0 {
                break;
            }
            answer.extend_from_slice(&buffer[..read]);
            let body_started = answer
                .windows(4)
                .position(|w| w == b"\r\n\r\n")
                .is_some_and(|split| answer.len() > split + 4);
            if body_started && first_byte.is_none() {
                first_byte = Some(started.elapsed());
            }
        }
        let split = answer.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
        assert!(
            answer.starts_with(b"HTTP/1.1 200"),
            "{}",
            String::from_utf8_lossy(&answer)
        );
        let chunked = String::from_utf8_lossy(&answer[..split])
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked");
        let body = answer.split_off(split);
        let body = if chunked { dechunk(&body) } else { body };
        (first_byte.unwrap_or_else(|| started.elapsed()), body)
    }
}

/// A chunked body put back together.
fn dechunk(mut body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let line = body.windows(2).position(|w| w == b"\r\n").unwrap();
        let size = usize::from_str_radix(
            String::from_utf8_lossy(&body[..line])
                .split(';')
                .next()
                .unwrap()
                .trim(),
            16,
        )
        .unwrap();
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&body[line + 2..line + 2 + size]);
        body = &body[line + 2 + size + 2..];
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        // SIGTERM: the host stops its engines and exits.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}
