//! Anthropic's Messages API (`/v1/messages`): the engines serve it themselves (llama.cpp
//! speaks it natively), so the front door only answers its own refusals in Anthropic's
//! shape, `{"type": "error", "error": {"type", "message"}}`, with the error type the
//! official clients and their retry logic expect (`overloaded_error` for a full queue,
//! `permission_error` for a key's scope, …).

use serde_json::{json, Value};

use arcane_report::codes;

/// Where Anthropic's API lives.
pub const PREFIX: &str = "/v1/messages";

/// Anthropic's error type for one of Arcane's codes.
fn error_type(code: &str) -> &'static str {
    match code {
        codes::CORE_UNAUTHORIZED => "authentication_error",
        codes::CORE_SCOPE_DENIED | codes::CORE_MODEL_DENIED => "permission_error",
        codes::CORE_OVERLOADED | codes::LOCAL_AI_SERVER_NOT_READY | codes::CORE_SHUTTING_DOWN => {
            "overloaded_error"
        }
        codes::ARCANE_NOT_FOUND | codes::LOCAL_AI_PATH_NOT_SERVED | "model_not_found" => {
            "not_found_error"
        }
        codes::ARCANE_USAGE | "invalid_request_error" => "invalid_request_error",
        _ => "api_error",
    }
}

/// An error body in Anthropic's shape, with Arcane's stable code beside the message.
pub fn error_body(code: &str, message: &str) -> Value {
    json!({"type": "error", "error": {"type": error_type(code), "message": message, "code": code}})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_queue_is_overloaded_and_a_scope_a_permission() {
        let body = error_body(codes::CORE_OVERLOADED, "full");
        assert_eq!(body["type"], "error");
        assert_eq!(body["error"]["type"], "overloaded_error");
        assert_eq!(body["error"]["message"], "full");
        assert_eq!(
            error_body(codes::CORE_MODEL_DENIED, "")["error"]["type"],
            "permission_error"
        );
        assert_eq!(
            error_body(codes::CORE_UNAUTHORIZED, "")["error"]["type"],
            "authentication_error"
        );
    }
}
