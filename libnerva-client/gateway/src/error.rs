//! OpenAI-shaped errors: `{"error": {"message", "type", "param", "code"}}` with the matching
//! HTTP status.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use nerva_client::StatusCode as Wire;
use serde_json::json;

use crate::daemon::Failure;

/// An error answered to an HTTP client.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Human-readable message.
    pub message: String,
    /// The offending request parameter, if one is to blame.
    pub param: Option<&'static str>,
    /// Short machine-readable code.
    pub code: Option<&'static str>,
}

impl ApiError {
    /// 400 naming the parameter.
    pub fn invalid(param: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            param: Some(param),
            code: Some("invalid_value"),
        }
    }

    /// Any status with a message.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            param: None,
            code: Some(code),
        }
    }

    /// The daemon cannot be reached.
    pub fn unavailable() -> ApiError {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "daemon_unavailable",
            "the nervad daemon is not reachable (not running or restarting); retry",
        )
    }

    /// The OpenAI error `type` for this status.
    pub fn kind(&self) -> &'static str {
        match self.status.as_u16() {
            400 | 413 | 422 => "invalid_request_error",
            401 => "authentication_error",
            404 => "not_found_error",
            429 => "rate_limit_error",
            503 => "service_unavailable_error",
            _ => "server_error",
        }
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        json!({
            "error": {
                "message": self.message,
                "type": self.kind(),
                "param": self.param,
                "code": self.code,
            }
        })
    }

    /// A request failure reported by the daemon or the client library.
    pub fn from_failure(failure: &Failure, prompt_param: &'static str) -> ApiError {
        match failure {
            Failure::DaemonGone => ApiError::unavailable(),
            Failure::ShuttingDown => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "daemon_shutting_down",
                "the nervad daemon is shutting down; retry",
            ),
            Failure::Invalid(m) => ApiError::invalid(prompt_param, m.clone()),
            Failure::Other(m) => ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal_error",
                m.clone(),
            ),
            Failure::Rejected { status, detail } => {
                let described = match Wire::from_u16(*status) {
                    Some(code) if detail.is_empty() => code.to_string(),
                    Some(code) => format!("{code}: {detail}"),
                    None => format!("request status {status}: {detail}"),
                };
                let param = match Wire::from_u16(*status) {
                    Some(Wire::BadMaxTokens) => Some("max_tokens"),
                    Some(Wire::BadTemperature) => Some("temperature"),
                    Some(Wire::BadTopP) => Some("top_p"),
                    Some(Wire::BadMinP) => Some("min_p"),
                    Some(Wire::BadRepetitionPenalty) => Some("repetition_penalty"),
                    Some(Wire::BadSampleCount) => Some("n"),
                    Some(Wire::BadExtension) => Some("stop"),
                    Some(
                        Wire::EmptyPrompt
                        | Wire::InvalidUtf8
                        | Wire::TokenOutOfVocab
                        | Wire::PromptTooLong
                        | Wire::BadChatMessages,
                    ) => Some(prompt_param),
                    _ => None,
                };
                match Wire::from_u16(*status) {
                    Some(Wire::Overloaded) => ApiError::new(
                        StatusCode::TOO_MANY_REQUESTS,
                        "daemon_busy",
                        format!("the daemon is at capacity ({described}); retry later"),
                    ),
                    Some(Wire::ShuttingDown) => ApiError::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "daemon_shutting_down",
                        described,
                    ),
                    _ if param.is_some() => ApiError {
                        status: StatusCode::BAD_REQUEST,
                        message: described,
                        param,
                        code: Some("invalid_value"),
                    },
                    _ => {
                        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "daemon_error", described)
                    }
                }
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = axum::Json(self.body()).into_response();
        *r.status_mut() = self.status;
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rejected(code: Wire) -> ApiError {
        ApiError::from_failure(
            &Failure::Rejected {
                status: code.as_u16(),
                detail: String::new(),
            },
            "prompt",
        )
    }

    #[test]
    fn daemon_answers_map_to_openai_statuses() {
        assert_eq!(rejected(Wire::Overloaded).status.as_u16(), 429);
        assert_eq!(rejected(Wire::Overloaded).kind(), "rate_limit_error");
        assert_eq!(rejected(Wire::ShuttingDown).status.as_u16(), 503);
        assert_eq!(
            ApiError::from_failure(&Failure::DaemonGone, "prompt")
                .status
                .as_u16(),
            503
        );
        let e = rejected(Wire::PromptTooLong);
        assert_eq!((e.status.as_u16(), e.param), (400, Some("prompt")));
        let e = rejected(Wire::BadTopP);
        assert_eq!((e.status.as_u16(), e.param), (400, Some("top_p")));
        assert_eq!(rejected(Wire::Internal).status.as_u16(), 500);
        let body = rejected(Wire::Overloaded).body();
        assert_eq!(body["error"]["code"], "daemon_busy");
        assert!(
            body["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty())
        );
    }
}
