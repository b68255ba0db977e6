//! An application's own Arcane host: serves the models of `WORKSPACE/arcane.toml` on
//! loopback HTTP (OpenAI, Anthropic and Ollama APIs behind the workspace's token)
//! until Ctrl-C. Run: `cargo run -p arcane-host --example embed_host -- WORKSPACE`.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use arcane_host::{Host, Listening, Presenter};

/// Prints where the host listens (the token is in `.arcane/core.json`); says nothing else.
struct PrintUrl;

impl Presenter for PrintUrl {
    fn listening(&self, at: &Listening) {
        println!("listening on {}", at.url);
    }
}

fn main() -> std::process::ExitCode {
    let Some(workspace) = std::env::args_os().nth(1) else {
        eprintln!("usage: embed_host WORKSPACE");
        return 2.into();
    };
    let host = Host::new(workspace);
    // Ctrl-C or SIGTERM: drain the requests, stop the engines, return.
    let cancel = host.cancel();
    let signals = [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM];
    let mut signals = signal_hook::iterator::Signals::new(signals).expect("signal handlers");
    std::thread::spawn(move || signals.forever().next().map(|_| cancel.cancel()));
    match host.serve(&PrintUrl) {
        Ok(code) => code.into(),
        Err(error) => {
            eprintln!("{error:?}"); // `CODE: message`
            1.into()
        }
    }
}
