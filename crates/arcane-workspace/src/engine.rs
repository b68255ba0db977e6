//! [`Engine`]: which kind of engine a runtime, a record, a configuration or a request
//! means — the one engine identity of every crate — and [`EngineKind`], the descriptor
//! that says everything Arcane knows about that kind.
//!
//! # Why a descriptor
//!
//! What differs between llama.cpp, Ollama, ONNX sessions and an arbitrary
//! OpenAI-compatible server (its ids, default url, how it starts and listens, how its
//! readiness and version are read, how it is pinned to a device, which model formats
//! and API paths it has) lives in one module per kind under `kinds/`, behind the
//! [`EngineKind`] trait. The registry, the supervisor, the Core host and the CLI ask
//! the descriptor instead of matching on the kind, so a new kind is one module plus one
//! row in [`Engine::kind`] — never an arm in every crate.
//!
//! Everything here is pure (no I/O): the supervisor does the probing and spawning, and
//! hands the descriptor what it observed ([`EngineKind::classify`],
//! [`EngineKind::parse_version`]) or what it decided ([`EngineKind::command_line`]).

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

pub use crate::kinds::Engine;

impl Engine {
    /// The kind's id, also the default runtime id: `llama.cpp`, `ollama`, `onnx`,
    /// `command`.
    pub fn as_str(self) -> &'static str {
        self.kind().id()
    }

    /// The SDK's default listener url (`None`: the kind has no fixed one).
    pub fn default_url(self) -> Option<&'static str> {
        self.kind().default_url()
    }

    /// The kind that serves models of `format`: the first in [`Engine::ALL`] whose
    /// descriptor lists it.
    pub fn for_format(format: ModelFormat) -> Option<Engine> {
        Self::ALL
            .into_iter()
            .find(|e| e.kind().formats().contains(&format))
    }

    /// The kind whose `arcane/1` methods are in `namespace` (`llama`:
    /// [`EngineKind::rpc_namespace`]).
    pub fn for_namespace(namespace: &str) -> Option<Engine> {
        Self::ALL
            .into_iter()
            .find(|e| e.kind().rpc_namespace() == Some(namespace))
    }

    /// The kinds whose runtime is a library ([`EngineKind::runtime_library`]: those
    /// whose sessions run in Arcane's own workers), registered with `arcane runtime add
    /// <kind> --library PATH`.
    pub fn library_kinds() -> impl Iterator<Item = Engine> {
        Self::ALL
            .into_iter()
            .filter(|e| e.kind().runtime_library().is_some())
    }

    /// Where this kind's runtime libraries are listed: `<kind>Runtimes`, the kind's id
    /// in camel case (`onnxRuntimes`, `stableDiffusionCppRuntimes`), in
    /// `registry.json`, a bundle's manifest and `arcane runtime list --output json`.
    pub fn runtimes_key(self) -> String {
        let mut key = String::new();
        for (i, word) in self
            .as_str()
            .split(|c: char| !c.is_ascii_alphanumeric())
            .enumerate()
        {
            let mut chars = word.chars();
            if let (true, Some(first)) = (i > 0, chars.next()) {
                key.push(first.to_ascii_uppercase());
                key.push_str(chars.as_str());
            } else {
                key.push_str(word);
            }
        }
        key + "Runtimes"
    }

    /// The kind that forwards the `arcane/1` method `name`, with its row
    /// ([`EngineKind::forwarded_methods`]).
    pub fn forwarding(name: &str) -> Option<(Engine, ForwardedMethod)> {
        Self::ALL.into_iter().find_map(|e| {
            e.kind()
                .forwarded_methods()
                .iter()
                .find(|m| m.name == name)
                .map(|m| (e, *m))
        })
    }

    /// Every model format some kind loads, in the table's order.
    pub fn formats() -> impl Iterator<Item = ModelFormat> {
        Self::ALL
            .into_iter()
            .flat_map(|e| e.kind().formats().iter().copied())
    }

    /// The kinds registered as a server executable (`arcane runtime add KIND
    /// --executable PATH`).
    pub fn registrable() -> impl Iterator<Item = Engine> {
        Self::ALL
            .into_iter()
            .filter(|e| matches!(e.kind().starts(), Starts::Server { .. }))
    }
}

impl fmt::Display for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A name that is no engine kind Arcane knows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownEngine {
    /// The name given.
    pub value: String,
}

impl fmt::Display for UnknownEngine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let known: Vec<String> = Engine::ALL.iter().map(|e| format!("`{e}`")).collect();
        write!(
            f,
            "`{}` is not an engine Arcane knows (use {})",
            self.value,
            known.join(", ")
        )
    }
}

impl std::error::Error for UnknownEngine {}

impl FromStr for Engine {
    type Err = UnknownEngine;

    /// Parses a kind's id or one of its aliases (`llama`, `llama-cpp`, …), ignoring
    /// case; the error names the value.
    fn from_str(value: &str) -> Result<Self, Self::Err> {
        let wanted = value.trim().to_ascii_lowercase();
        Engine::ALL
            .into_iter()
            .find(|e| e.as_str() == wanted || e.kind().aliases().contains(&wanted.as_str()))
            .ok_or_else(|| UnknownEngine {
                value: value.to_string(),
            })
    }
}

/// How a kind runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Starts {
    /// A server executable registered as a runtime (`arcane runtime add`), named
    /// `executable` in release archives.
    Server {
        /// The executable's file name in an archive.
        executable: &'static str,
    },
    /// Sessions in Arcane's own worker processes (the runtime is a library).
    Worker,
    /// Arcane's own executable run as this kind's server (`arcane <subcommand>`): an
    /// HTTP engine on the private socket, supervised like a registered server, with
    /// nothing to register (`arcane runtime add` refuses it).
    Builtin {
        /// The hidden subcommand that serves it (`__whisper-worker`).
        subcommand: &'static str,
    },
    /// A server started from the command line the configuration gives.
    Command,
}

/// Where an engine Arcane starts listens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OwnedListen {
    /// A Unix socket in the workspace's private run directory (`.arcane/run/<id>.sock`,
    /// mode 0700), reached only through the Core: no port a web page or another local
    /// process could use.
    #[default]
    PrivateSocket,
    /// A loopback TCP port with a random key (a 0600 file) that only the Core sends:
    /// the port answers 401 to everyone else.
    KeyedPort,
    /// A loopback TCP port with no key: reachable without the token, and reported so.
    OpenPort,
}

/// How a kind is pinned to the resolved device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DevicePlan {
    /// The resolver's arguments (appended last) and environment: llama.cpp.
    ArgsAndEnv,
    /// Only the resolver's environment (`CUDA_VISIBLE_DEVICES`, the variables that hide
    /// other GPUs): a command line Arcane does not know the flags of.
    EnvOnly,
    /// The engine chooses its own devices; a device or backend selection is refused.
    EngineChooses,
    /// It runs on the CPU only (built without a GPU backend): every GPU is hidden from
    /// it and a GPU target is refused, naming the device — never a silent fall-back.
    CpuOnly,
}

/// A model file format a kind loads. Each kind's module defines its own (re-exported
/// in [`crate::formats`]); [`Engine::for_format`] finds the kind that serves one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ModelFormat {
    /// Its id: what a bundle's model entry records as its `format` (`gguf`,
    /// `whisper-ggml`).
    pub id: &'static str,
    /// What users call it in messages (`GGUF`, `whisper.cpp`, `Piper voice`).
    pub label: &'static str,
    /// Whether bundles carry models of this format.
    pub bundled: bool,
    /// Files that travel with the model file, named by appending each of these to its
    /// name (a Piper voice's `.json`: `voice.onnx` → `voice.onnx.json`).
    pub companions: &'static [&'static str],
}

impl ModelFormat {
    /// The companion files of the model file `name` ([`ModelFormat::companions`]).
    pub fn companions_of(self, name: &str) -> Vec<String> {
        self.companions
            .iter()
            .map(|suffix| format!("{name}{suffix}"))
            .collect()
    }
}

impl fmt::Display for ModelFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.id)
    }
}

/// An `arcane/1` method a kind forwards to its engine's own HTTP API (`ollama.chat` →
/// `POST /api/chat`), listed by its descriptor ([`EngineKind::forwarded_methods`]) and
/// served by the local-AI service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ForwardedMethod {
    /// The method (`ollama.chat`).
    pub name: &'static str,
    /// A `POST` whose JSON body is the parameters (or their `payload`); else a `GET`.
    pub post: bool,
    /// The engine's path.
    pub path: &'static str,
    /// How long the engine may take to answer.
    pub takes: Takes,
    /// Whether the engine streams its answer when asked (`"stream": true`): each line
    /// becomes a `<namespace>.chunk` event, and the answer is the last line.
    pub streams: bool,
    /// Where a streamed line's text is (a JSON pointer, `/message/content`): the
    /// answer carries the whole text there. `None`: the lines carry no text.
    pub text: Option<&'static str>,
    /// Whether it changes the engine's models (a pull): they are listed again after.
    pub changes_models: bool,
}

/// The shared library a kind's runtime is ([`Starts::Worker`] kinds: ONNX Runtime).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuntimeLibrary {
    /// What users call it (`ONNX Runtime`).
    pub label: &'static str,
    /// The library's usual file name, without its version (`libonnxruntime.so`).
    pub file: &'static str,
    /// The start of the names of the libraries it loads from beside itself at run time
    /// (`libonnxruntime_providers`): they travel with it into bundles.
    pub plugins: &'static str,
    /// The environment variable that names one, overriding the registered one (a
    /// bundle's launcher sets it to the bundle's own).
    pub variable: &'static str,
}

/// How long a forwarded call may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Takes {
    /// A quick answer (a listing, a model's details).
    Quick,
    /// A generation.
    Generation,
    /// A transfer (a pull).
    Transfer,
}

/// What one readiness answer means ([`EngineKind::classify`]).
#[derive(Debug, Clone, PartialEq)]
pub enum Readiness {
    /// Ready; `version` is what the answer reported, if anything.
    Ready {
        /// The version the answer reported.
        version: Option<String>,
    },
    /// Answering and still loading its model.
    Loading,
    /// Something answered, but not as this kind does.
    Other,
}

/// A version read from `--version` output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probed {
    /// The normalized version (`b4589`, `0.5.7`).
    pub version: String,
    /// The line it was read from.
    pub build_info: String,
}

/// Where a started engine listens, as its command line needs it.
#[derive(Debug, Clone, Copy)]
pub enum ListenAt<'a> {
    /// A Unix socket path.
    Socket(&'a Path),
    /// A TCP host (no brackets) and port; `origin` is `http://host:port`.
    Tcp {
        /// The host.
        host: &'a str,
        /// The port.
        port: u16,
        /// `http://host:port`.
        origin: &'a str,
    },
}

/// What the supervisor decided for one start, handed to
/// [`EngineKind::command_line`].
#[derive(Debug, Clone, Copy)]
pub struct Launch<'a> {
    /// Where to listen.
    pub listen: ListenAt<'a>,
    /// The key file the engine must demand, when it has one.
    pub key_file: Option<&'a Path>,
    /// The one model file.
    pub model: Option<&'a Path>,
    /// The models directory (router mode, Ollama's store).
    pub models_dir: Option<&'a Path>,
    /// The name the model is served as.
    pub alias: Option<&'a str>,
    /// The user's extra arguments.
    pub user_args: &'a [String],
    /// Whether a managed device selection is in force.
    pub managed: bool,
    /// The resolver's device arguments (kinds with [`DevicePlan::ArgsAndEnv`]).
    pub device_args: &'a [String],
    /// The command kind's template (its arguments after the program), placeholders
    /// unexpanded.
    pub template: &'a [String],
    /// The command kind's own environment, placeholders unexpanded.
    pub template_env: &'a BTreeMap<String, String>,
    /// The runtime library a builtin worker loads (ONNX Runtime, for Piper voices).
    pub runtime_library: Option<&'a Path>,
    /// The auxiliary models the model's table names, each with the flag its slot
    /// passes it by ([`EngineKind::aux_models`]), checked and resolved.
    pub aux_models: &'a [(&'static str, PathBuf)],
}

/// A second model a kind can use beside its own ([`EngineKind::aux_models`]): named in a
/// model's table by [`AuxModel::key`], a registered model of [`AuxModel::format`],
/// passed to the engine as [`AuxModel::flag`] and its path. The flag is Arcane's to
/// set: a user's `args` may not (the file passed is the registered, verified one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuxModel {
    /// The key in a `[[model]]` table (`vad`).
    pub key: &'static str,
    /// What it is, for messages (`a voice-activity model`).
    pub what: &'static str,
    /// The format the registered model must have.
    pub format: ModelFormat,
    /// The engine's flag that takes its path (`--vad-model`).
    pub flag: &'static str,
}

/// The first of `args` that is one of `door_args` ([`EngineKind::door_args`]), in any
/// spelling: `--port 1`, `--port=1`, and for an entry ending in `*` any argument with
/// that start (`--api-key-file`, `--ssl-cert-file=x`).
pub fn door_arg<'a>(door_args: &[&str], args: &'a [String]) -> Option<&'a str> {
    args.iter().map(String::as_str).find(|arg| {
        let name = arg.split_once('=').map_or(*arg, |(name, _)| name);
        door_args.iter().any(|door| match door.strip_suffix('*') {
            Some(start) => name.starts_with(start),
            None => name == *door,
        })
    })
}

/// The value of the first of `args` named one of `names`: `-c 2048` or
/// `--ctx-size=2048` alike.
fn arg_value<'a>(names: &[&str], args: &'a [String]) -> Option<&'a str> {
    args.iter().enumerate().find_map(|(i, arg)| {
        let (name, inline) = match arg.split_once('=') {
            Some((name, value)) if name.starts_with("--") => (name, Some(value)),
            _ => (arg.as_str(), None),
        };
        if !names.contains(&name) {
            return None;
        }
        inline.or_else(|| args.get(i + 1).map(String::as_str))
    })
}

/// How a kind's memory need is estimated before one of its models loads
/// ([`EngineKind::memory_model`]); the estimate itself is the registry's (it reads the
/// model's header).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryModel {
    /// A GGUF language model served by llama.cpp: its weights (the file), the key/value
    /// cache of its whole context (`-c`, else the context it was trained for; shared by
    /// its slots), compute buffers for one batch, and the server itself.
    Gguf,
    /// Its file, working memory of `compute_percent` of the file (for each request
    /// served at once when `per_request`), and `runtime` bytes for the process: factors
    /// measured on the kind's own workers.
    File {
        /// Working memory, as a percentage of the file's size.
        compute_percent: u64,
        /// Whether each request served at once needs its own working memory.
        per_request: bool,
        /// The process itself, in bytes.
        runtime: u64,
    },
}

/// Whether `args` set `kind`'s thread count (one of its [`EngineKind::thread_flags`]).
pub fn threads_in(kind: &dyn EngineKind, args: &[String]) -> bool {
    arg_value(kind.thread_flags(), args).is_some()
}

/// How many requests at once `args` ask `kind` to serve (the value of one of its
/// [`EngineKind::parallel_flags`]), when they say (a positive number).
pub fn parallel_in(kind: &dyn EngineKind, args: &[String]) -> Option<usize> {
    arg_value(kind.parallel_flags(), args)
        .and_then(|n| n.parse::<usize>().ok())
        .filter(|n| *n > 0)
}

/// The context, in tokens, an engine started with `args` holds (llama-server's
/// `-c`/`--ctx-size`, which the servers of the `command` kind mostly share); `None`
/// when the arguments leave it to the model (absent, or `0`).
pub fn context_arg(args: &[String]) -> Option<u64> {
    arg_value(&["-c", "--ctx-size"], args)?
        .parse()
        .ok()
        .filter(|c| *c > 0)
}

/// Whether an engine started with `args` answers only with vectors: llama-server with
/// `--embeddings` or `--reranking` serves embeddings (or scores), not chat or
/// completions.
pub fn serves_only_vectors(args: &[String]) -> bool {
    const VECTOR_ONLY: [&str; 4] = ["--embeddings", "--embedding", "--reranking", "--rerank"];
    args.iter().any(|arg| VECTOR_ONLY.contains(&arg.as_str()))
}

/// The context one request gets from an engine started with `args`: [`context_arg`],
/// shared among the `-np`/`--parallel` slots unless `-kvu`/`--kv-unified` lets each
/// use all of it (llama-server's rule); `None` when the model's own context applies.
pub fn request_context(args: &[String]) -> Option<u64> {
    let context = context_arg(args)?;
    let unified = args.iter().any(|a| a == "-kvu" || a == "--kv-unified");
    let slots = arg_value(&["-np", "--parallel"], args)
        .and_then(|n| n.parse::<u64>().ok())
        .filter(|n| *n > 0 && !unified)
        .unwrap_or(1);
    Some(context / slots)
}

/// Whether `path` is one of `api_paths` ([`EngineKind::api_paths`]): an entry ending in
/// `/` stands for every path below it (`/v1/` matches `/v1/models`, not `/v1`), any
/// other for exactly itself. The one reading of those lists: the front door's engine
/// routes and the gateway's choice of a model both use it.
pub fn serves_path(api_paths: &[&str], path: &str) -> bool {
    api_paths.iter().any(|served| {
        if served.ends_with('/') {
            path.len() > served.len() && path.starts_with(served)
        } else {
            path == *served
        }
    })
}

/// A command line built by a kind: arguments after the program, and variables set on
/// top of the inherited environment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CommandLine {
    /// The arguments, in order.
    pub args: Vec<String>,
    /// Variables to set.
    pub env: BTreeMap<String, String>,
}

/// Everything Arcane knows about one kind of engine (see the module documentation).
/// Implemented once per kind, in `kinds/<kind>.rs`.
pub trait EngineKind: Sync + Send + fmt::Debug {
    /// The id (`llama.cpp`).
    fn id(&self) -> &'static str;
    /// Other accepted spellings, lowercase (`llama`, `llama-cpp`).
    fn aliases(&self) -> &'static [&'static str] {
        &[]
    }
    /// The listener url probed first and adopted when a server answers there (`None`:
    /// nothing is ever adopted for this kind by default).
    fn default_url(&self) -> Option<&'static str> {
        None
    }
    /// How it runs.
    fn starts(&self) -> Starts;
    /// Where an engine Arcane starts listens by default.
    fn default_listen(&self) -> OwnedListen {
        OwnedListen::OpenPort
    }
    /// Whether Arcane can make a started engine demand a key or listen on a socket;
    /// `false`: it always listens on an open port (reported as reachable without the
    /// token).
    fn can_close_its_door(&self) -> bool {
        false
    }
    /// The readiness path polled over HTTP.
    fn health_path(&self) -> &'static str {
        "/health"
    }
    /// What an answer to [`EngineKind::health_path`] means.
    fn classify(&self, status: u16, body: &[u8]) -> Readiness {
        let _ = body;
        match status {
            200..=299 => Readiness::Ready { version: None },
            503 => Readiness::Loading,
            _ => Readiness::Other,
        }
    }
    /// The version in the executable's `--version` output.
    fn parse_version(&self, output: &str) -> Option<Probed> {
        let _ = output;
        None
    }
    /// The arguments that decide where or how a started engine listens or
    /// authenticates (`--host`, `--port`, `--api-key*`, …): Arcane sets them itself, so
    /// the user's arguments may not. An entry ending in `*` stands for every argument
    /// that starts with it.
    fn door_args(&self) -> &'static [&'static str] {
        &[]
    }
    /// Whether a version check may read the engine's `/props` build info.
    fn reports_build_over_http(&self) -> bool {
        false
    }
    /// How it is pinned to a device.
    fn device_plan(&self) -> DevicePlan;
    /// The model formats it loads.
    fn formats(&self) -> &'static [ModelFormat];
    /// The namespace of the `arcane/1` methods that reach its engine (`llama` for
    /// `llama.chat`, `llama.load`), when it has some.
    fn rpc_namespace(&self) -> Option<&'static str> {
        None
    }
    /// The `arcane/1` methods forwarded to its engine's own HTTP API.
    fn forwarded_methods(&self) -> &'static [ForwardedMethod] {
        &[]
    }
    /// The library its runtime is, for a kind whose sessions run in Arcane's own workers.
    fn runtime_library(&self) -> Option<RuntimeLibrary> {
        None
    }
    /// The kind whose runtime library its worker loads (Piper voices: ONNX Runtime),
    /// registered with `arcane runtime add <that kind> --library PATH`; `None`: none.
    fn needs_library(&self) -> Option<Engine> {
        None
    }
    /// Whether it serves one model file given on its command line.
    fn takes_model_file(&self) -> bool {
        false
    }
    /// Whether selecting it registers the SDK's `model-assets` service (a model
    /// written in by the app, `modelAssets.*`): the kinds that load one file the app
    /// may bring (llama.cpp's GGUF, stable-diffusion.cpp's checkpoint).
    fn model_assets(&self) -> bool {
        false
    }
    /// Where its served models are listed: the path and the JSON array's key
    /// (`/v1/models`, `data`).
    fn model_list(&self) -> Option<(&'static str, &'static str)> {
        None
    }
    /// The API paths it serves (the front door's engine rows for this kind): a path
    /// ending in `/` stands for every path below it, any other for exactly itself.
    fn api_paths(&self) -> &'static [&'static str] {
        &[]
    }
    /// Which of its own [`EngineKind::api_paths`], beyond those of the APIs the front
    /// door speaks (OpenAI's, Anthropic's, Ollama's), run its models: an `inference`
    /// key may call them, where its other paths (llama.cpp's `/slots`, `/props`,
    /// `/metrics`) need an admin key. Same syntax as `api_paths`.
    fn inference_paths(&self) -> &'static [&'static str] {
        &[]
    }
    /// Which of its [`EngineKind::inference_paths`] it answers beside the requests it
    /// works on (llama.cpp's `/tokenize`): they never wait in a model's queue.
    fn light_paths(&self) -> &'static [&'static str] {
        &[]
    }
    /// The second models it can use beside its own ([`AuxModel`]; whisper.cpp's
    /// voice-activity model).
    fn aux_models(&self) -> &'static [AuxModel] {
        &[]
    }
    /// The flags of its arguments that say how many requests it serves at once
    /// (llama.cpp's `-np`/`--parallel`, the transcription worker's `--max-workers`):
    /// a model's `parallel` is read from them when its table gives none
    /// ([`parallel_in`]), and given with [`EngineKind::parallel_args`] when it does and
    /// they do not.
    fn parallel_flags(&self) -> &'static [&'static str] {
        &[]
    }
    /// How the memory one of its models needs is estimated before it loads (the
    /// default: the file and a tenth more).
    fn memory_model(&self) -> MemoryModel {
        MemoryModel::File {
            compute_percent: 10,
            per_request: false,
            runtime: 0,
        }
    }
    /// The flags of its arguments that set how many threads it computes with
    /// (llama.cpp's `-t`/`--threads`): a model kept to `cpus` gets the first with the
    /// set's size unless its arguments give one. Empty for a kind that follows the CPUs
    /// it may use by itself (Arcane's own workers).
    fn thread_flags(&self) -> &'static [&'static str] {
        &[]
    }
    /// The arguments that make it serve `parallel` requests at once (the first of
    /// [`EngineKind::parallel_flags`] with the number); empty for a kind that has none.
    fn parallel_args(&self, parallel: usize) -> Vec<String> {
        self.parallel_flags()
            .first()
            .map(|flag| vec![flag.to_string(), parallel.to_string()])
            .unwrap_or_default()
    }
    /// Its command line for one start (server and command kinds).
    fn command_line(&self, launch: &Launch<'_>) -> CommandLine {
        let _ = launch;
        CommandLine::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_api_path_ending_in_a_slash_stands_for_what_is_below_it() {
        let paths = ["/v1/", "/props"];
        assert!(serves_path(&paths, "/v1/audio/speech"));
        assert!(serves_path(&paths, "/props"));
        assert!(
            !serves_path(&paths, "/v1"),
            "the prefix itself is not below it"
        );
        assert!(
            !serves_path(&paths, "/props/x"),
            "an exact path has nothing below"
        );
        assert!(!serves_path(&paths, "/v2/models"));
        assert!(!serves_path(&[], "/v1/models"));
    }

    #[test]
    fn names_round_trip_through_text_and_json() {
        for engine in Engine::ALL {
            assert_eq!(engine.as_str().parse::<Engine>().unwrap(), engine);
            let json = serde_json::to_string(&engine).unwrap();
            assert_eq!(json, format!("\"{}\"", engine.as_str()));
            assert_eq!(
                serde_json::from_str::<Engine>(&json).unwrap(),
                engine,
                "{json}"
            );
        }
        assert_eq!("LLAMA".parse::<Engine>().unwrap(), Engine::LlamaCpp);
        let unknown = "vllm".parse::<Engine>().unwrap_err();
        assert_eq!(unknown.value, "vllm");
        // The error lists every kind, from the table, not from a hand-kept list.
        for engine in Engine::ALL {
            assert!(unknown.to_string().contains(engine.as_str()), "{unknown}");
        }
    }

    #[test]
    fn door_args_are_found_in_every_spelling() {
        let doors = Engine::LlamaCpp.kind().door_args();
        let args = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        for spelled in [
            &["-c", "512", "--port", "1"][..],
            &["--port=1"],
            &["--host", "127.0.0.1"],
            &["--api-key", "k"],
            &["--api-key-file=/k"],
            &["--ssl-cert-file", "c"],
            &["--path", "/srv"],
        ] {
            assert!(door_arg(doors, &args(spelled)).is_some(), "{spelled:?}");
        }
        assert_eq!(door_arg(doors, &args(&["-c", "512", "--jinja"])), None);
        // A value that merely looks like a flag's name is not one.
        assert_eq!(door_arg(doors, &args(&["--alias", "port"])), None);
        assert_eq!(door_arg(doors, &args(&["--portal"])), None);
    }

    #[test]
    fn runtimes_keys_are_the_ids_in_camel_case() {
        assert_eq!(Engine::Onnx.runtimes_key(), "onnxRuntimes");
        assert_eq!(
            Engine::StableDiffusion.runtimes_key(),
            "stableDiffusionCppRuntimes"
        );
        let kinds: Vec<Engine> = Engine::library_kinds().collect();
        assert_eq!(kinds, [Engine::Onnx, Engine::StableDiffusion]);
    }

    #[test]
    fn only_server_kinds_are_registered_as_executables() {
        let registrable: Vec<Engine> = Engine::registrable().collect();
        assert_eq!(registrable, [Engine::LlamaCpp, Engine::Ollama]);
    }

    #[test]
    fn the_speech_kinds_are_arcanes_own_cpu_engines_with_their_audio_routes() {
        for (engine, subcommand, paths) in [
            (
                Engine::Whisper,
                "__whisper-worker",
                &["/v1/audio/transcriptions", "/v1/audio/translations"][..],
            ),
            (Engine::Piper, "__piper-worker", &["/v1/audio/speech"]),
        ] {
            let kind = engine.kind();
            assert_eq!(kind.starts(), Starts::Builtin { subcommand });
            assert_eq!(kind.device_plan(), DevicePlan::CpuOnly);
            assert_eq!(kind.default_listen(), OwnedListen::PrivateSocket);
            assert_eq!(kind.api_paths(), paths);
            assert!(kind.takes_model_file());
        }
        assert_eq!("whisper".parse::<Engine>().unwrap(), Engine::Whisper);
        assert_eq!(
            Engine::Whisper.kind().formats(),
            [crate::formats::WHISPER_GGML]
        );
        assert_eq!(
            Engine::Piper.kind().formats(),
            [crate::formats::PIPER_VOICE]
        );
    }

    #[test]
    fn a_kinds_inference_paths_are_among_its_api_paths_and_its_light_ones_among_those() {
        for engine in Engine::ALL {
            let kind = engine.kind();
            for path in kind.inference_paths() {
                assert!(
                    serves_path(kind.api_paths(), path),
                    "{engine}: {path} is not served"
                );
            }
            for path in kind.light_paths() {
                assert!(
                    kind.inference_paths().contains(path),
                    "{engine}: {path} is light but not inference"
                );
            }
        }
        // llama.cpp's own control paths stay off the list.
        let llama = Engine::LlamaCpp.kind();
        for control in ["/slots", "/props", "/metrics", "/lora-adapters"] {
            assert!(!serves_path(llama.inference_paths(), control));
        }
    }

    #[test]
    fn ids_and_aliases_are_unique_across_kinds() {
        let mut seen = std::collections::HashSet::new();
        for engine in Engine::ALL {
            for name in
                std::iter::once(engine.as_str()).chain(engine.kind().aliases().iter().copied())
            {
                assert!(seen.insert(name), "`{name}` names two kinds");
                assert_eq!(name, name.to_ascii_lowercase());
            }
        }
    }

    #[test]
    fn the_context_of_the_arguments_is_read_in_every_spelling_and_shared_by_slots() {
        let args = |list: &[&str]| list.iter().map(|a| a.to_string()).collect::<Vec<_>>();
        assert_eq!(context_arg(&args(&["-c", "2048"])), Some(2048));
        assert_eq!(
            context_arg(&args(&["--ctx-size=4096", "-c", "1"])),
            Some(4096)
        );
        assert_eq!(context_arg(&args(&["-c", "0"])), None);
        assert_eq!(context_arg(&args(&["--jinja"])), None);
        assert_eq!(
            request_context(&args(&["-c", "2048", "-np", "2"])),
            Some(1024)
        );
        assert_eq!(
            request_context(&args(&["-c", "2048", "--parallel=4", "--kv-unified"])),
            Some(2048)
        );
        assert_eq!(request_context(&args(&["-c", "2048"])), Some(2048));
    }

    #[test]
    fn an_engine_started_for_embeddings_or_scores_serves_only_vectors() {
        let args = |list: &[&str]| list.iter().map(|a| a.to_string()).collect::<Vec<_>>();
        assert!(serves_only_vectors(&args(&[
            "--embeddings",
            "--pooling",
            "mean"
        ])));
        assert!(serves_only_vectors(&args(&["--reranking"])));
        assert!(!serves_only_vectors(&args(&["-c", "2048", "--jinja"])));
    }
}
