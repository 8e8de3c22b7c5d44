//! The gateway's own tower middleware: auth, body-size precheck, load-shedding concurrency
//! limit whose permit lives as long as the response body, request timeout, and request
//! metrics. Their order is set in `stack.rs`.

use std::time::Instant;

use axum::body::Body;
use axum::extract::{MatchedPath, Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures::StreamExt;

use crate::error::ApiError;
use crate::state::AppState;

/// Rejects requests without a valid `Authorization: Bearer <key>` when keys are configured.
/// Keys are compared in constant time so response timing does not reveal a prefix.
pub async fn auth(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let rt = state.runtime();
    if rt.client_keys.is_empty() {
        return next.run(req).await;
    }
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    let ok = given.is_some_and(|g| {
        rt.client_keys
            .iter()
            .fold(false, |found, k| found | keys_match(k, g))
    });
    if ok {
        next.run(req).await
    } else {
        ApiError::Unauthorized.into_response()
    }
}

/// Compares digests rather than the keys, so neither a shared prefix nor the key's length
/// shows in the time taken; every configured key is compared (no early exit).
fn keys_match(key: &str, given: &str) -> bool {
    use sha2::{Digest, Sha256};
    let (a, b) = (
        Sha256::digest(key.as_bytes()),
        Sha256::digest(given.as_bytes()),
    );
    a.iter()
        .zip(b.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y))
        == 0
}

/// Refuses bodies whose declared length is over the limit before reading them (bodies
/// without a length are limited where they are read).
pub async fn body_limit(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let limit = state.runtime().policy.gateway.max_body_bytes;
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > limit) {
        return ApiError::PayloadTooLarge(limit).into_response();
    }
    next.run(req).await
}

/// Load shedding: a request that finds every slot taken gets 429 at once. The slot is held
/// until the response body has been sent completely (streams included), not just until the
/// handler returns.
pub async fn concurrency(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let Ok(permit) = state.shared.inflight.clone().try_acquire_owned() else {
        metrics::counter!("approxy_requests_shed_total").increment(1);
        return ApiError::Overloaded.into_response();
    };
    let resp = next.run(req).await;
    let (parts, body) = resp.into_parts();
    let stream = body.into_data_stream().map(move |chunk| {
        let _held = &permit;
        chunk
    });
    Response::from_parts(parts, Body::from_stream(stream))
}

/// Bounds the time to produce a response head (a stream's body is bounded by the target's
/// own per-call timeout instead).
pub async fn timeout(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let limit = state.runtime().policy.gateway.request_timeout;
    match tokio::time::timeout(limit, next.run(req)).await {
        Ok(r) => r,
        Err(_) => ApiError::GatewayTimeout.into_response(),
    }
}

/// Counts requests by route and status and records their latency to the response head.
pub async fn request_metrics(req: Request, next: Next) -> Response {
    // The route that matched, not the raw path: a label per client-chosen path would let
    // clients grow the metric without bound.
    let path = match req
        .extensions()
        .get::<MatchedPath>()
        .map(MatchedPath::as_str)
    {
        Some("/v1/chat/completions") => "/v1/chat/completions",
        Some("/v1/completions") => "/v1/completions",
        Some("/v1/models") => "/v1/models",
        _ => "other",
    };
    let started = Instant::now();
    let resp = next.run(req).await;
    metrics::counter!("approxy_http_requests_total", "path" => path, "status" => resp.status().as_str().to_string()).increment(1);
    metrics::histogram!("approxy_http_response_head_seconds", "path" => path)
        .record(started.elapsed().as_secs_f64());
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_comparison() {
        assert!(keys_match("abc", "abc"));
        assert!(!keys_match("abc", "abd"));
        assert!(!keys_match("abc", "ab"));
        assert!(!keys_match("abc", "abcd"));
    }
}
