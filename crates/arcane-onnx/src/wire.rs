//! The frames between the Core host and an ONNX worker process: one JSON object per
//! line on the worker's stdin (requests) and stdout (responses).
//!
//! * The worker's first line is the hello: `{"id":0,"result":{"version","providers"}}`,
//!   or `{"id":0,"error":{…}}` when the runtime did not load (then it exits 1).
//! * Requests carry an `op` and a host-chosen `id`, unique among the requests in flight;
//!   responses carry the same `id`, in any order (runs are concurrent):
//!
//! | op | fields | result |
//! |---|---|---|
//! | `load` | `session`, `model` (path), `provider` (`cpu`\|`cuda`), `options` | `{inputs, outputs}` ([`crate::IoSpec`]s) |
//! | `run` | `session`, `inputs` (`{name: {type, shape, data}}`), `outputs?`, `encoding?` | `{outputs: {name: tensor}}` |
//! | `unload` | `session` | `{}` |
//! | `cancel` | `run` (the run's id) | none: the run answers `ARCANE_CANCELLED` |
//!
//! * Each request is answered by the worker thread that read it; runs on one session
//!   take turns at its ONNX Runtime lock, runs on different sessions run in parallel,
//!   and a `cancel` is read while its run is going (even one read just before it).
//! * An error is `{"id", "error": {code, message, details, hints?}}`
//!   ([`arcane_report::error_json`]).

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{Encoding, JsonTensor, Provider, SessionOptions};

/// A request to the worker.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "camelCase")]
pub enum Request {
    /// Open a session.
    Load {
        /// The request id.
        id: u64,
        /// The session id (chosen by the host).
        session: String,
        /// The model file.
        model: PathBuf,
        /// The execution provider.
        provider: Provider,
        /// Session options.
        #[serde(default)]
        options: SessionOptions,
    },
    /// Run a session.
    Run {
        /// The request id.
        id: u64,
        /// The session id.
        session: String,
        /// The inputs, in their wire form (`{name: {type, shape, data}}`; the host
        /// sends numeric data as base64, the cheapest form to write and read).
        inputs: BTreeMap<String, JsonTensor>,
        /// The outputs wanted (default: all).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        outputs: Option<Vec<String>>,
        /// How output data is written.
        #[serde(default)]
        encoding: Encoding,
    },
    /// Close a session.
    Unload {
        /// The request id.
        id: u64,
        /// The session id.
        session: String,
    },
    /// Stop a run.
    Cancel {
        /// The request id (never answered).
        id: u64,
        /// The run's request id.
        run: u64,
    },
}

/// A response from the worker.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Response {
    /// The request's id (`0` for the hello).
    pub id: u64,
    /// The result, on success.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    /// The error (`{code, message, details}`), on failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<Value>,
}
