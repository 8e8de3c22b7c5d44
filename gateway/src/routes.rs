//! One handler per endpoint. Chat and completions ask `decide` and then either run the
//! engine (`respond`) or forward the request as sent (`passthrough`); the rest report health,
//! readiness and metrics. Every other `/v1` route is the passthrough service's (see `stack`).

use std::time::Duration;

use axum::extract::{Path, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::json;

use approxy_verifier::infer::transport::TraceContext;
use approxy_verifier::infer::{EngineError, TargetError};

use crate::decide::{Decision, decide};
use crate::error::ApiError;
use crate::reason::Reason;
use crate::request::Endpoint;
use crate::respond::Failed;
use crate::state::{AppState, TokenizerCheck};
use crate::{passthrough, respond};

/// `POST /v1/chat/completions`.
pub async fn chat_completions(State(state): State<AppState>, req: Request) -> Response {
    generate(state, Endpoint::Chat, req).await
}

/// `POST /v1/completions`.
pub async fn completions(State(state): State<AppState>, req: Request) -> Response {
    generate(state, Endpoint::Completions, req).await
}

async fn generate(state: AppState, endpoint: Endpoint, req: Request) -> Response {
    // The request's own runtime: a policy reload mid-request does not change its rules.
    let rt = state.runtime_of(req.extensions());
    if let Err(e) = crate::middleware::json_body(req.headers()) {
        return e.into_response();
    }
    let limit = rt.policy.gateway.max_body_bytes;
    let (parts, body) = req.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, limit).await else {
        return ApiError::PayloadTooLarge(limit).into_response();
    };
    match decide(&state, &rt, endpoint, &parts.headers, &bytes).await {
        Ok(Decision::Approximate(a)) => {
            let fallback = a.model.policy.fallback_to_passthrough && a.passable;
            let header = |name: &str| parts.headers.get(name).and_then(|v| v.to_str().ok());
            let trace = TraceContext::from_headers(header("traceparent"), header("tracestate"));
            match respond::approximate(rt, *a, trace).await {
                Ok(r) => r,
                // Nothing was sent yet. A target that is down or refuses the gateway would fail
                // the same way again, so only the engine's own failures go to the target.
                Err(Failed::BeforeFirstToken(e)) if fallback && engine_could_be_bypassed(&e) => {
                    tracing::warn!(error = %e, "the engine failed before its first token; passing the request through");
                    metrics::counter!("approxy_requests_total", "mode" => "approximate", "outcome" => "fell_back").increment(1);
                    passthrough::forward(&state, parts, bytes, Reason::EngineFailed).await
                }
                Err(Failed::BeforeFirstToken(e)) => {
                    metrics::counter!("approxy_requests_total", "mode" => "approximate", "outcome" => "error").increment(1);
                    ApiError::from(e).into_response()
                }
                Err(Failed::Error(e)) => e.into_response(),
            }
        }
        Ok(Decision::Passthrough(reason)) => {
            passthrough::forward(&state, parts, bytes, reason).await
        }
        Err(e) => e.into_response(),
    }
}

/// Whether passing the request through could succeed where the engine failed: not when the
/// target itself is unreachable, slow, untrusted, limiting or refusing the gateway.
fn engine_could_be_bypassed(e: &EngineError) -> bool {
    match e {
        EngineError::Target(t) => match t {
            TargetError::Protocol(_) => true,
            TargetError::Status { status, .. } => {
                !matches!(status, 401 | 403 | 429) && *status < 500
            }
            TargetError::Unreachable { .. } | TargetError::Timeout(_) | TargetError::Tls(_) => {
                false
            }
        },
        EngineError::Saturated => false,
        EngineError::Draft(_)
        | EngineError::Tokenizer(_)
        | EngineError::Artifact(_)
        | EngineError::TokenizerMismatch(_)
        | EngineError::Grammar(_)
        | EngineError::WorkerGone => true,
    }
}

/// Largest model list read to answer `GET /v1/models/{id}`.
const MODEL_LIST_LIMIT: usize = 4 << 20;

/// `GET /v1/models/{id}`: the entry for `id` in the target's model list (`GET /v1/models`,
/// passed through with the operator's key), or 404 `model_not_found`. llama-server and vLLM
/// serve only the list, so the gateway answers from it for every target; an id may hold
/// slashes (`Qwen/Qwen2.5-7B-Instruct`).
pub async fn model(
    State(state): State<AppState>,
    Path(id): Path<String>,
    req: Request,
) -> Response {
    // Refused as on every passthrough route, though only the list is ever asked for here.
    if let Some(e) = passthrough::unsafe_path(req.uri().path()) {
        return e.into_response();
    }
    let (mut parts, _) = req.into_parts();
    parts.uri = axum::http::Uri::from_static("/v1/models");
    let listed = passthrough::forward(&state, parts, Bytes::new(), Reason::Route).await;
    if !listed.status().is_success() {
        return listed;
    }
    // The list's head (its passthrough headers, content type) goes with the one entry.
    let (mut head, body) = listed.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, MODEL_LIST_LIMIT).await else {
        return ApiError::BadGateway.into_response();
    };
    let list: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
    let found = list["data"]
        .as_array()
        .and_then(|d| d.iter().find(|m| m["id"].as_str() == Some(id.as_str())));
    match found {
        Some(m) => {
            head.headers.remove(axum::http::header::CONTENT_LENGTH);
            Response::from_parts(head, axum::body::Body::from(m.to_string()))
        }
        None => ApiError::ModelNotFound(id).into_response(),
    }
}

/// `GET /health`: the process is up.
pub async fn health() -> Response {
    axum::Json(json!({"status": "ok"})).into_response()
}

/// `GET /ready`: the target answers, and what the tokenizer check and draft workers say.
pub async fn ready(State(state): State<AppState>) -> Response {
    let rt = state.runtime();
    // Bounded well below the target's call timeout: a probe must answer while the probe waits.
    let target =
        match tokio::time::timeout(Duration::from_secs(5), rt.engine.target().health()).await {
            Ok(r) => r.map_err(|e| {
                tracing::warn!(error = %e, "readiness: the target is not healthy");
                target_state(&e)
            }),
            Err(_) => Err("no answer within 5 s".to_string()),
        };
    let tokenizer = match rt.tokenizer_check.get() {
        None => json!("not checked yet"),
        Some(TokenizerCheck::Same) => json!("same"),
        Some(TokenizerCheck::Unchecked) => json!("target cannot tokenize; unchecked"),
        Some(TokenizerCheck::Different(m)) => json!(format!("different: {m}")),
        Some(TokenizerCheck::NotNeeded) => json!("not needed: the target is sent text"),
    };
    let alive = state.shared.draft.alive();
    let body = json!({
        "tokenizer_check": tokenizer,
        "draft_workers": state.shared.draft.workers(),
        "draft_workers_alive": alive,
        "draft_loaded": state.shared.draft.started(),
        "request_slots_free": state.shared.inflight.available_permits(),
        "draft_workers_idle": state.shared.draft.idle(),
        "draft_streams": state.shared.draft.streams(),
        "draft_stream_limit": state.shared.draft.stream_limit(),
        "target_reachable": target.is_ok(),
        "target_error": target.as_ref().err(),
    });
    // With no draft worker left every request would pass through: not ready as approxy,
    // unless the policy passes everything through anyway.
    let status = if target.is_ok() && (alive > 0 || !rt.policy.needs_draft()) {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, axum::Json(body)).into_response()
}

/// What `/ready` says of a target that is not healthy: the kind of failure, never its URL,
/// body or credentials (a probe's answer may be seen by anyone who can reach the port; the
/// log has the details).
fn target_state(e: &TargetError) -> String {
    match e {
        TargetError::Unreachable { .. } => "unreachable".into(),
        TargetError::Timeout(t) => format!("timed out after {} s", t.as_secs()),
        TargetError::Status { status, .. } => format!("answered HTTP {status}"),
        // rustls's reason can name the host the certificate was for.
        TargetError::Tls(_) => {
            "TLS failed: its certificate is not trusted or not valid for its name".into()
        }
        TargetError::Protocol(_) => "answered in an unexpected shape".into(),
    }
}

/// `GET /metrics`: Prometheus text format.
pub async fn metrics(State(state): State<AppState>) -> Response {
    // Levels rather than events: read at scrape time.
    metrics::gauge!("approxy_request_slots_free")
        .set(state.shared.inflight.available_permits() as f64);
    metrics::gauge!("approxy_draft_workers_idle").set(state.shared.draft.idle() as f64);
    metrics::gauge!("approxy_draft_workers").set(state.shared.draft.workers() as f64);
    metrics::gauge!("approxy_draft_streams").set(state.shared.draft.streams() as f64);
    metrics::gauge!("approxy_draft_stream_limit").set(state.shared.draft.stream_limit() as f64);
    state.shared.prometheus.render().into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readiness_names_the_failure_without_urls_bodies_or_hosts() {
        let failures = [
            TargetError::Unreachable {
                url: "http://user:pw@10.1.2.3:8081/v1".into(),
                reason: "connection refused (10.1.2.3:8081)".into(),
            },
            TargetError::Status {
                status: 503,
                body: "internal detail at 10.1.2.3".into(),
            },
            TargetError::Tls(
                "invalid peer certificate: certificate not valid for name \"10.1.2.3\"".into(),
            ),
            TargetError::Protocol("unexpected body from http://10.1.2.3".into()),
        ];
        for e in &failures {
            let said = target_state(e);
            assert!(
                !said.contains("10.1.2.3") && !said.contains("pw") && !said.contains("detail"),
                "{said}"
            );
        }
        assert_eq!(target_state(&failures[1]), "answered HTTP 503");
        assert!(target_state(&failures[2]).contains("certificate"));
    }
}
