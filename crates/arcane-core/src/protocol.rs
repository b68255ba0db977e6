//! The `arcane/1` frames, documented on the types that serialize them.
//!
//! Every frame is one JSON object with `protocol: "arcane/1"` and a `type`:
//!
//! | `type` | shape | direction |
//! |---|---|---|
//! | `request` | [`Request`]: `{protocol, type, id, method, parameters?, sentAt?}` | client → host |
//! | `response` | [`Response`]: `{protocol, type, id, ok:true, result, time}` or `{…, ok:false, error, time}` | host → client |
//! | `event` | [`EventFrame`]: `{protocol, type, event, data, requestId?, time}` | host → client |
//! | `control` | [`Control`]: `{protocol, type, control, requestId?}` | client → host |
//!
//! Errors inside responses are `{code, message, details, causes?, hints?}`, as
//! [`arcane_report::error_json`] writes them.

use arcane_report::{error_json, Diagnostic};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use crate::error::Error;

/// The protocol name every frame carries.
pub const PROTOCOL: &str = "arcane/1";

/// A client's call: `{protocol:"arcane/1", type:"request", id, method, parameters?}`.
///
/// `id` is a non-empty string chosen by the client, unique among *its own* active
/// requests (each connection has its own id space). `parameters` defaults to `{}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Request {
    /// The client's request id.
    pub id: String,
    /// The dotted method name, e.g. `llama.chat`.
    pub method: String,
    /// The method's parameters (an object; `{}` when absent).
    #[serde(default)]
    pub parameters: Value,
}

impl Request {
    /// A request frame as JSON.
    pub fn to_frame(&self) -> Value {
        json!({
            "protocol": PROTOCOL,
            "type": "request",
            "id": self.id,
            "method": self.method,
            "parameters": self.parameters,
        })
    }
}

/// The host's answer to one request. `ok:true` carries `result`, `ok:false` carries
/// `error` (`{code, message, details, causes?}`); `time` is RFC 3339 UTC.
#[derive(Debug, Clone, PartialEq)]
pub struct Response {
    /// The client's request id (or `null` when the request had none).
    pub id: Option<String>,
    /// The result, or the serialized error.
    pub outcome: Result<Value, Value>,
    /// When the response was produced.
    pub time: String,
}

impl Response {
    /// A successful response.
    pub fn ok(id: impl Into<String>, result: Value) -> Self {
        Self {
            id: Some(id.into()),
            outcome: Ok(result),
            time: arcane_report::time::now_rfc3339(),
        }
    }

    /// A failed response carrying `error`'s code, message, details and causes.
    pub fn error(id: Option<String>, error: &dyn Diagnostic) -> Self {
        Self {
            id,
            outcome: Err(error_json(error)),
            time: arcane_report::time::now_rfc3339(),
        }
    }

    /// Whether the request succeeded.
    pub fn is_ok(&self) -> bool {
        self.outcome.is_ok()
    }

    /// The frame as JSON.
    pub fn to_frame(&self) -> Value {
        let mut frame = json!({
            "protocol": PROTOCOL,
            "type": "response",
            "id": self.id,
            "ok": self.outcome.is_ok(),
            "time": self.time,
        });
        match &self.outcome {
            Ok(result) => frame["result"] = result.clone(),
            Err(error) => frame["error"] = error.clone(),
        }
        frame
    }
}

/// An event: `{protocol, type:"event", event, data, requestId?, time}`.
///
/// Events carrying `requestId` (e.g. `llama.chunk`) belong to one request and are sent
/// only to the connection that made it, with that connection's own id. All others go
/// to every connection.
///
/// Host events: `core.ready {version, app}`, `core.state {state, services[],
/// activeRequests[{id, method, lifetime}]}`, `core.service.state {name, state, error}`,
/// `core.error {code, message, details}`. Service events: `localai.state`,
/// `llama.chunk {streamId, chunk}`, `ollama.chunk {streamId, chunk}`,
/// `local-ai.server.<state>` (the supervisor's events, forwarded).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventFrame {
    /// The dotted event name.
    pub event: String,
    /// Its payload.
    pub data: Value,
    /// The client's id of the request this event belongs to.
    #[serde(rename = "requestId", skip_serializing_if = "Option::is_none", default)]
    pub request_id: Option<String>,
    /// When it happened.
    pub time: String,
}

impl EventFrame {
    /// The frame as JSON.
    pub fn to_frame(&self) -> Value {
        let mut frame = json!({
            "protocol": PROTOCOL,
            "type": "event",
            "event": self.event,
            "data": self.data,
            "time": self.time,
        });
        if let Some(id) = &self.request_id {
            frame["requestId"] = json!(id);
        }
        frame
    }
}

/// A control frame: `{protocol, type:"control", control, requestId?}`.
///
/// * `request.cancel {requestId}` cancels one of this connection's active
///   request-lifetime requests; its response becomes `ARCANE_CANCELLED`
///   (`details.reason: "REQUEST_ABORTED"`). Service-lifetime requests ignore it.
/// * `requests.cancelAll` cancels all of this connection's request-lifetime requests.
/// * `runtime.replay` sends the current state again (never history).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Control {
    /// Cancel one request.
    Cancel {
        /// The client's request id.
        request_id: String,
    },
    /// Cancel every request of this connection.
    CancelAll,
    /// Send the current state again.
    Replay,
}

/// A decoded client frame.
#[derive(Debug, Clone, PartialEq)]
pub enum Incoming {
    /// A request.
    Request(Request),
    /// A control.
    Control(Control),
}

fn field<'a>(object: &'a Map<String, Value>, name: &str) -> Option<&'a Value> {
    object.get(name).filter(|v| !v.is_null())
}

/// Validates a decoded JSON value as a client frame.
///
/// Fails with [`Error::InvalidFrame`] (carrying the request id when one could be read,
/// so the failure can be answered) when `protocol` is not `arcane/1`, `type` is not
/// `request` or `control`, the id is empty or not a string, or the method is missing.
pub fn parse_incoming(value: Value) -> Result<Incoming, Error> {
    let invalid = |reason: &str, id: Option<String>| Error::InvalidFrame {
        reason: reason.to_string(),
        id,
    };
    let Value::Object(object) = value else {
        return Err(invalid("a frame must be a JSON object", None));
    };
    let id = field(&object, "id")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .map(str::to_string);
    match field(&object, "protocol").and_then(Value::as_str) {
        Some(PROTOCOL) => {}
        Some(_) | None => return Err(invalid("`protocol` must be `arcane/1`", id)),
    }
    match field(&object, "type").and_then(Value::as_str) {
        Some("request") => {
            let Some(id) = id else {
                return Err(invalid("`id` must be a non-empty string", None));
            };
            let Some(method) = field(&object, "method")
                .and_then(Value::as_str)
                .filter(|m| !m.is_empty())
            else {
                return Err(invalid("`method` must be a non-empty string", Some(id)));
            };
            let parameters = match field(&object, "parameters") {
                None => json!({}),
                Some(p @ Value::Object(_)) => p.clone(),
                Some(_) => return Err(invalid("`parameters` must be an object", Some(id))),
            };
            Ok(Incoming::Request(Request {
                id,
                method: method.to_string(),
                parameters,
            }))
        }
        Some("control") => {
            let control = field(&object, "control").and_then(Value::as_str);
            match control {
                Some("request.cancel") => {
                    let request_id = field(&object, "requestId")
                        .and_then(Value::as_str)
                        .filter(|s| !s.is_empty())
                        .ok_or_else(|| invalid("`request.cancel` needs a `requestId`", None))?;
                    Ok(Incoming::Control(Control::Cancel {
                        request_id: request_id.to_string(),
                    }))
                }
                Some("requests.cancelAll") => Ok(Incoming::Control(Control::CancelAll)),
                Some("runtime.replay") => Ok(Incoming::Control(Control::Replay)),
                _ => Err(invalid(
                    "`control` must be `request.cancel`, `requests.cancelAll` or `runtime.replay`",
                    None,
                )),
            }
        }
        _ => Err(invalid("`type` must be `request` or `control`", id)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_request_and_defaults_parameters() {
        let frame =
            json!({"protocol": "arcane/1", "type": "request", "id": "r1", "method": "system.ping"});
        let Incoming::Request(request) = parse_incoming(frame).unwrap() else {
            panic!()
        };
        assert_eq!(request.id, "r1");
        assert_eq!(request.parameters, json!({}));
    }

    #[test]
    fn rejects_bad_frames_keeping_the_id_when_known() {
        let err = parse_incoming(
            json!({"protocol": "arcane/0", "type": "request", "id": "x", "method": "m"}),
        )
        .unwrap_err();
        assert!(matches!(err, Error::InvalidFrame { id: Some(ref i), .. } if i == "x"));
        let err = parse_incoming(
            json!({"protocol": "arcane/1", "type": "request", "id": "", "method": "m"}),
        )
        .unwrap_err();
        assert!(matches!(err, Error::InvalidFrame { id: None, .. }));
        assert!(parse_incoming(json!([1])).is_err());
        assert!(parse_incoming(
            json!({"protocol": "arcane/1", "type": "control", "control": "nope"})
        )
        .is_err());
    }

    #[test]
    fn parses_controls() {
        let c = parse_incoming(json!({"protocol": "arcane/1", "type": "control", "control": "request.cancel", "requestId": "a"})).unwrap();
        assert_eq!(
            c,
            Incoming::Control(Control::Cancel {
                request_id: "a".into()
            })
        );
    }

    #[test]
    fn responses_serialize_error_code_message_and_details() {
        let response = Response::error(Some("r".into()), &Error::ShuttingDown);
        let frame = response.to_frame();
        assert_eq!(frame["ok"], json!(false));
        assert_eq!(frame["error"]["code"], json!("CORE_SHUTTING_DOWN"));
        assert!(frame["error"]["message"].is_string());
        assert!(frame.get("result").is_none());
    }
}
