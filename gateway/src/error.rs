//! The gateway's error type and the one place errors become HTTP responses, in the OpenAI
//! shape `{"error":{"message","type","param","code"}}`. 5xx messages are fixed texts: they
//! never carry upstream bodies, URLs or keys.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use approxy_verifier::infer::{EngineError, TargetError};

/// Errors a request can end with.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// Malformed JSON or an invalid parameter.
    #[error("{message}")]
    BadRequest {
        /// What is wrong, for the client.
        message: String,
        /// The offending field.
        param: Option<String>,
    },
    /// Missing or wrong gateway key.
    #[error("invalid or missing API key")]
    Unauthorized,
    /// No such route.
    #[error("not found")]
    NotFound,
    /// The route exists, not with this method.
    #[error("method not allowed on this route")]
    MethodNotAllowed,
    /// The target lists no model with this id.
    #[error("the model {0:?} does not exist")]
    ModelNotFound(String),
    /// Body over the limit.
    #[error("request body exceeds {0} bytes")]
    PayloadTooLarge(usize),
    /// The request target (path and query) is longer than the gateway reads.
    #[error("the request's path and query exceed {0} bytes")]
    UriTooLong(usize),
    /// More header fields, or more header bytes, than the gateway reads.
    #[error("the request's headers exceed {fields} fields or {bytes} bytes")]
    HeadersTooLarge {
        /// Most fields.
        fields: usize,
        /// Most bytes (names and values).
        bytes: usize,
    },
    /// The request body did not arrive within the gateway's body deadlines: the client's
    /// fault, never the target's.
    #[error(
        "the request body did not arrive in time: it must arrive within {total_secs} s, with no pause over {idle_secs} s"
    )]
    BodyTimeout {
        /// `gateway.body_timeout` in seconds.
        total_secs: u64,
        /// `gateway.body_idle_timeout` in seconds.
        idle_secs: u64,
    },
    /// The body is not JSON by its `content-type` (another type, or a charset other than
    /// UTF-8): parsed anyway, a UTF-16 body would read as garbage.
    #[error("the request body must be JSON in UTF-8 (content-type: application/json), not {0:?}")]
    UnsupportedMediaType(String),
    /// A transfer coding the gateway does not decode (RFC 9112 6.1: 501): read as chunked, a
    /// gzip body would reach the target as its compressed bytes.
    #[error(
        "the transfer coding {0:?} is not supported; send the body uncompressed, chunked or with a length"
    )]
    UnsupportedTransferCoding(String),
    /// Too many requests in flight.
    #[error("the gateway is at capacity; retry shortly")]
    Overloaded,
    /// The target could not be reached or kept failing.
    #[error("the target model server is unavailable")]
    BadGateway,
    /// The TLS connection to the target failed: its certificate is not trusted (see
    /// `target.ca_file`), names another host, or the handshake was refused.
    #[error("the gateway could not establish a trusted TLS connection to the target model server")]
    TargetTls,
    /// The target did not answer in time.
    #[error("the target model server timed out")]
    GatewayTimeout,
    /// The target rejected the request (4xx): its status is passed on.
    #[error("the target model server rejected the request (HTTP {0})")]
    UpstreamRejected(u16),
    /// The target rejected a call approxy composed for an approximate answer (4xx): its status
    /// is passed on as for a rejected request, but the fault is not plainly the client's (the
    /// gateway checked the request first and wrote the call itself).
    #[error("the target model server rejected a call made for this answer (HTTP {0})")]
    EngineCallRejected(u16),
    /// The target rejected a passed-through request (4xx) and said why: its status and the
    /// message fields of its error, nothing else.
    #[error("the target model server rejected the request: {}", message.as_deref().unwrap_or("no reason given"))]
    UpstreamRejectedWith {
        /// The target's status.
        status: u16,
        /// The target's `error.message`.
        message: Option<String>,
        /// The target's `error.param`.
        param: Option<String>,
    },
    /// The target refused the gateway's own credentials (its 401 or 403): the operator's
    /// problem, not the client's.
    #[error("the target model server refused the gateway's credentials for it")]
    TargetCredentials,
    /// The target is rate-limiting the gateway; `retry-after` when it said.
    #[error("the target model server is rate-limiting requests; retry later")]
    TargetRateLimited(Option<HeaderValue>),
    /// A passed-through answer grew past `gateway.max_response_bytes`: cut off there.
    #[error("the answer exceeded the gateway's limit of {0} bytes and was cut off")]
    ResponseTooLarge(usize),
    /// Anything else; details go to the log only.
    #[error("internal error")]
    Internal(String),
}

impl ApiError {
    /// A 400 naming the field.
    pub fn bad(param: &str, message: impl Into<String>) -> Self {
        ApiError::BadRequest {
            message: message.into(),
            param: Some(param.to_string()),
        }
    }

    /// HTTP status.
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest { .. } => StatusCode::BAD_REQUEST,
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::NotFound | ApiError::ModelNotFound(_) => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::UriTooLong(_) => StatusCode::URI_TOO_LONG,
            ApiError::HeadersTooLarge { .. } => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            ApiError::BodyTimeout { .. } => StatusCode::REQUEST_TIMEOUT,
            ApiError::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::UnsupportedTransferCoding(_) => StatusCode::NOT_IMPLEMENTED,
            ApiError::Overloaded | ApiError::TargetRateLimited(_) => StatusCode::TOO_MANY_REQUESTS,
            ApiError::BadGateway
            | ApiError::TargetTls
            | ApiError::TargetCredentials
            | ApiError::ResponseTooLarge(_) => StatusCode::BAD_GATEWAY,
            ApiError::GatewayTimeout => StatusCode::GATEWAY_TIMEOUT,
            // The target's own refusal is passed on as it said it.
            ApiError::UpstreamRejected(s)
            | ApiError::EngineCallRejected(s)
            | ApiError::UpstreamRejectedWith { status: s, .. } => {
                StatusCode::from_u16(*s).unwrap_or(StatusCode::BAD_GATEWAY)
            }
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The OpenAI error `type`, by family. A target's refusal of the request is an invalid
    /// request, as OpenAI's own would be; the target failing is an upstream error.
    fn kind(&self) -> &'static str {
        match self {
            ApiError::BadRequest { .. }
            | ApiError::NotFound
            | ApiError::MethodNotAllowed
            | ApiError::ModelNotFound(_)
            | ApiError::PayloadTooLarge(_)
            | ApiError::UriTooLong(_)
            | ApiError::HeadersTooLarge { .. }
            | ApiError::BodyTimeout { .. }
            | ApiError::UnsupportedMediaType(_)
            | ApiError::UnsupportedTransferCoding(_)
            | ApiError::UpstreamRejected(_)
            | ApiError::EngineCallRejected(_)
            | ApiError::UpstreamRejectedWith { .. } => "invalid_request_error",
            ApiError::Unauthorized => "authentication_error",
            ApiError::Overloaded | ApiError::TargetRateLimited(_) => "rate_limit_error",
            ApiError::BadGateway
            | ApiError::TargetTls
            | ApiError::GatewayTimeout
            | ApiError::TargetCredentials => "upstream_error",
            ApiError::ResponseTooLarge(_) | ApiError::Internal(_) => "server_error",
        }
    }

    /// The response's status, OpenAI `type` and `code`. A plain invalid parameter has no code:
    /// its `param` says more. The codes are written out here, where the docs test finds them.
    fn parts(&self) -> (StatusCode, &'static str, Option<&'static str>) {
        let code = match self {
            ApiError::BadRequest { .. } => None,
            ApiError::Unauthorized => Some("invalid_api_key"),
            ApiError::NotFound => Some("not_found"),
            ApiError::MethodNotAllowed => Some("method_not_allowed"),
            ApiError::ModelNotFound(_) => Some("model_not_found"),
            ApiError::PayloadTooLarge(_) => Some("payload_too_large"),
            ApiError::UriTooLong(_) => Some("uri_too_long"),
            ApiError::HeadersTooLarge { .. } => Some("headers_too_large"),
            ApiError::BodyTimeout { .. } => Some("request_timeout"),
            ApiError::UnsupportedMediaType(_) => Some("unsupported_media_type"),
            ApiError::UnsupportedTransferCoding(_) => Some("unsupported_transfer_coding"),
            ApiError::Overloaded => Some("overloaded"),
            ApiError::BadGateway => Some("target_unavailable"),
            ApiError::TargetTls => Some("target_tls_error"),
            ApiError::GatewayTimeout => Some("target_timeout"),
            ApiError::UpstreamRejected(_)
            | ApiError::EngineCallRejected(_)
            | ApiError::UpstreamRejectedWith { .. } => Some("target_rejected"),
            ApiError::TargetCredentials => Some("target_auth_failed"),
            ApiError::TargetRateLimited(_) => Some("target_rate_limited"),
            ApiError::ResponseTooLarge(_) => Some("response_too_large"),
            ApiError::Internal(_) => Some("internal_error"),
        };
        (self.status(), self.kind(), code)
    }

    /// Whose fault the error is, for metrics and alerts: `client` (a request the gateway or
    /// the target refused as the client's mistake, or a client too slow), `target` (the target
    /// or the way to it failed), `gateway` (full, its own failure, or a call it composed that
    /// the target refused). Alerts on target health
    /// read `target` only, so client mistakes never page anyone about the target.
    pub fn side(&self) -> &'static str {
        match self {
            ApiError::BadRequest { .. }
            | ApiError::Unauthorized
            | ApiError::NotFound
            | ApiError::MethodNotAllowed
            | ApiError::ModelNotFound(_)
            | ApiError::PayloadTooLarge(_)
            | ApiError::UriTooLong(_)
            | ApiError::HeadersTooLarge { .. }
            | ApiError::BodyTimeout { .. }
            | ApiError::UnsupportedMediaType(_)
            | ApiError::UnsupportedTransferCoding(_)
            | ApiError::UpstreamRejected(_)
            | ApiError::UpstreamRejectedWith { .. } => "client",
            ApiError::BadGateway
            | ApiError::TargetTls
            | ApiError::GatewayTimeout
            | ApiError::TargetCredentials
            | ApiError::TargetRateLimited(_) => "target",
            ApiError::Overloaded
            | ApiError::ResponseTooLarge(_)
            | ApiError::Internal(_)
            | ApiError::EngineCallRejected(_) => "gateway",
        }
    }

    /// The OpenAI-shaped body, also used for SSE error events.
    pub fn body(&self) -> serde_json::Value {
        let (_, kind, code) = self.parts();
        let param = match self {
            ApiError::BadRequest { param, .. } | ApiError::UpstreamRejectedWith { param, .. } => {
                param.clone()
            }
            ApiError::ModelNotFound(_) => Some("model".into()),
            _ => None,
        };
        json!({"error": {"message": self.to_string(), "type": kind, "param": param, "code": code}})
    }
}

impl From<crate::request::error::ValidationError> for ApiError {
    fn from(e: crate::request::error::ValidationError) -> Self {
        ApiError::BadRequest {
            param: e.param(),
            message: e.to_string(),
        }
    }
}

impl From<TargetError> for ApiError {
    fn from(e: TargetError) -> Self {
        match e {
            TargetError::Timeout(_) => ApiError::GatewayTimeout,
            TargetError::Tls(_) => ApiError::TargetTls,
            TargetError::Status {
                status: 401 | 403, ..
            } => ApiError::TargetCredentials,
            TargetError::Status { status: 429, .. } => ApiError::TargetRateLimited(None),
            TargetError::Status { status, .. } if (400..500).contains(&status) => {
                ApiError::UpstreamRejected(status)
            }
            TargetError::Unreachable { .. }
            | TargetError::Status { .. }
            | TargetError::Protocol(_) => ApiError::BadGateway,
        }
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        match e {
            EngineError::Target(t) => match ApiError::from(t) {
                ApiError::UpstreamRejected(status) => ApiError::EngineCallRejected(status),
                other => other,
            },
            EngineError::Saturated => ApiError::Overloaded,
            other => ApiError::Internal(other.to_string()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        if status.is_server_error() {
            tracing::error!(error = %self, "request failed");
        }
        metrics::counter!("approxy_errors_total", "status" => status.as_str().to_string(), "side" => self.side())
            .increment(1);
        let mut resp = (status, axum::Json(self.body())).into_response();
        match self {
            ApiError::Overloaded => {
                resp.headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            }
            ApiError::TargetRateLimited(Some(v)) => {
                resp.headers_mut().insert(header::RETRY_AFTER, v);
            }
            _ => {}
        }
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_and_statuses() {
        let e = ApiError::bad("temperature", "must be in [0, 2]");
        assert_eq!(e.status(), StatusCode::BAD_REQUEST);
        assert_eq!(e.body()["error"]["param"], "temperature");
        assert_eq!(e.body()["error"]["type"], "invalid_request_error");
        assert_eq!(
            ApiError::Overloaded.into_response().headers()[header::RETRY_AFTER],
            "1"
        );
    }

    #[test]
    fn upstream_details_never_leak() {
        let e: ApiError = TargetError::Status {
            status: 500,
            body: "secret-key-123 stack trace".into(),
        }
        .into();
        assert_eq!(e.status(), StatusCode::BAD_GATEWAY);
        assert!(!e.body().to_string().contains("secret"));
        let e: ApiError = TargetError::Unreachable {
            url: "http://user:pw@host".into(),
            reason: "refused".into(),
        }
        .into();
        assert!(!e.body().to_string().contains("pw"));
        let e: ApiError = EngineError::Draft("onnx internals".into()).into();
        assert!(!e.body().to_string().contains("onnx"));
    }

    #[test]
    fn a_slow_body_and_a_target_rejection_are_the_clients_a_timeout_the_targets() {
        let slow = ApiError::BodyTimeout {
            total_secs: 30,
            idle_secs: 10,
        };
        assert_eq!(
            (slow.status(), slow.side()),
            (StatusCode::REQUEST_TIMEOUT, "client")
        );
        let rejected: ApiError = TargetError::Status {
            status: 400,
            body: String::new(),
        }
        .into();
        assert_eq!(rejected.side(), "client");
        // The same refusal of a call approxy composed: the client sees the same status and
        // code, but it is not counted as the client's fault.
        let engine: ApiError = EngineError::Target(TargetError::Status {
            status: 400,
            body: String::new(),
        })
        .into();
        assert_eq!(
            (
                engine.status(),
                engine.side(),
                engine.body()["error"]["code"].clone()
            ),
            (StatusCode::BAD_REQUEST, "gateway", json!("target_rejected"))
        );
        let timed_out: ApiError = TargetError::Timeout(std::time::Duration::from_secs(1)).into();
        assert_eq!(
            (timed_out.status(), timed_out.side()),
            (StatusCode::GATEWAY_TIMEOUT, "target")
        );
        assert_eq!(ApiError::Overloaded.side(), "gateway");
    }
}
