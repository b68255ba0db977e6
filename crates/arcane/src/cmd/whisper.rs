//! The hidden `arcane __whisper-worker`: the speech-to-text worker process the Core
//! host starts and owns (`arcane_whisper::worker`), speaking JSON lines on its stdin
//! and stdout. It opens no port and no socket: the engine is reachable only through
//! the Core. whisper.cpp runs on the CPU (built without a GPU backend).

use std::path::PathBuf;

/// Arguments of the hidden `arcane __whisper-worker`.
#[derive(Debug, clap::Args)]
pub struct WorkerArgs {
    /// The Whisper model in whisper.cpp's ggml format.
    #[arg(long, value_name = "PATH")]
    pub model: PathBuf,

    /// Threads whisper.cpp uses (default: the CPUs this process may run on, at most 8).
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
}

/// Runs the worker on stdin/stdout until stdin ends (0), or reports a model that does
/// not load in its hello and exits 1.
pub fn worker(args: &WorkerArgs) -> u8 {
    let threads = args.threads.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get().min(8))
            .unwrap_or(1)
    });
    let stdin = std::io::stdin();
    let served = arcane_whisper::worker::serve(
        &args.model,
        threads,
        std::io::BufReader::new(stdin),
        std::io::stdout(),
    );
    if served {
        0
    } else {
        1
    }
}
