//! Passthrough: forwards a request to the target's OpenAI-compatible API unchanged and streams
//! the answer back without buffering it. The chat and completion handlers call [`forward`]
//! when `decide` says so; [`Passthrough`] serves every other route. Connect failures are retried
//! (nothing reached the target, so a retry cannot duplicate work); once the target has
//! answered, its status and body are passed on as they are.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use axum::body::Body;
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Request, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::TryStreamExt;

use crate::decide::Reason;
use crate::error::ApiError;
use crate::state::AppState;

/// Forwards requests on routes other than chat and completions to the target.
#[derive(Clone)]
pub struct Passthrough {
    state: AppState,
}

impl Passthrough {
    /// A passthrough service.
    pub fn new(state: AppState) -> Self {
        Self { state }
    }
}

impl tower::Service<Request<Body>> for Passthrough {
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let state = self.state.clone();
        Box::pin(async move {
            let limit = state.runtime().policy.gateway.max_body_bytes;
            let (parts, body) = req.into_parts();
            let response = match axum::body::to_bytes(body, limit).await {
                Ok(bytes) => forward(&state, parts, bytes, Reason::Route).await,
                Err(_) => ApiError::PayloadTooLarge(limit).into_response(),
            };
            Ok(response)
        })
    }
}

/// Headers that describe one hop, not the message (RFC 9110 7.6.1), plus the ones this hop
/// sets itself.
fn hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection" | "keep-alive" | "proxy-authenticate" | "proxy-authorization" | "te" | "trailer"
            | "transfer-encoding" | "upgrade" | "host" | "content-length" | "authorization"
    ) || name.as_str().starts_with("x-approxy-")
}

/// Sends the request (head `parts`, body `bytes`) to the target and streams its answer back,
/// marked with `reason`.
pub async fn forward(state: &AppState, parts: Parts, bytes: Bytes, reason: Reason) -> Response {
    send(state, parts, bytes, reason.as_str()).await.unwrap_or_else(IntoResponse::into_response)
}

async fn send(state: &AppState, parts: Parts, bytes: Bytes, reason: &'static str) -> Result<Response, ApiError> {
    let rt = state.runtime();
    let path = parts.uri.path().strip_prefix("/v1").unwrap_or(parts.uri.path());
    let mut url = format!("{}{}", rt.policy.target.openai_base(), path);
    if let Some(q) = parts.uri.query() {
        url.push('?');
        url.push_str(q);
    }
    let mut headers = HeaderMap::new();
    for (k, v) in &parts.headers {
        if !hop_by_hop(k) {
            headers.append(k.clone(), v.clone());
        }
    }
    if let Some(key) = &rt.target_key {
        let v = HeaderValue::from_str(&format!("Bearer {key}")).map_err(|_| ApiError::Internal("target key is not a valid header value".into()))?;
        headers.insert(header::AUTHORIZATION, v);
    }
    let started = Instant::now();
    let mut attempt = 0;
    let upstream = loop {
        let sent = rt
            .http
            .request(parts.method.clone(), &url)
            .headers(headers.clone())
            .body(bytes.clone())
            .timeout(rt.policy.target.timeout)
            .send()
            .await;
        match sent {
            Ok(r) => break r,
            Err(e) if e.is_connect() && attempt < rt.policy.target.retries => {
                tokio::time::sleep(rt.policy.target.backoff * 2u32.pow(attempt)).await;
                attempt += 1;
            }
            Err(e) if e.is_timeout() => return Err(ApiError::GatewayTimeout),
            Err(e) => {
                if let Some(why) = approxy_verifier::target::tls_failure(&e) {
                    tracing::error!(tls = %why, "passthrough: TLS with the target failed");
                    return Err(ApiError::TargetTls);
                }
                tracing::warn!(error = %e.without_url(), "passthrough to target failed");
                return Err(ApiError::BadGateway);
            }
        }
    };
    let status = upstream.status();
    let outcome = if status.is_success() { "ok" } else { "upstream_error" };
    metrics::counter!("approxy_requests_total", "mode" => "passthrough", "outcome" => outcome).increment(1);
    metrics::counter!("approxy_passthrough_total", "reason" => reason).increment(1);
    metrics::histogram!("approxy_passthrough_head_seconds").record(started.elapsed().as_secs_f64());
    let mut resp = Response::builder().status(status.as_u16());
    for (k, v) in upstream.headers() {
        if !hop_by_hop(k) {
            resp = resp.header(k, v);
        }
    }
    resp = resp.header("x-approxy-mode", "passthrough").header("x-approxy-passthrough-reason", reason);
    let stream = upstream.bytes_stream().map_err(|e| std::io::Error::other(e.without_url()));
    resp.body(Body::from_stream(stream)).map_err(|e| ApiError::Internal(e.to_string()))
}
