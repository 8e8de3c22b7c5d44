//! Passthrough: forwards a request to the target's OpenAI-compatible API and streams the
//! answer back without buffering it. The chat and completion handlers call [`forward`] when
//! `decide` says so; [`Passthrough`] serves the other routes approxy allows (and refuses the
//! rest). Headers cross in both directions through allow-lists; the target's errors are
//! mapped to the gateway's. Connect failures are retried (nothing reached the target, so a
//! retry cannot duplicate work), and so is a 429 or 503 that says when to come back, by the
//! engine's retry policy (`approxy_verifier::infer::transport`); once the target has answered,
//! its body is relayed with a bound on each read rather than on the whole stream.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use approxy_verifier::infer::transport::{SendFailure, Verdict, status_verdict};
use axum::body::Body;
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, Request, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::StreamExt;

use crate::error::ApiError;
use crate::reason::Reason;
use crate::route::{has_dot_segments, methods_served, route_allowed};
use crate::state::{AppState, Runtime};

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
            let rt = state.runtime_of(req.extensions());
            let path = req.uri().path();
            if let Some(e) = unsafe_path(path) {
                return Ok(e.into_response());
            }
            let extra = &rt.policy.passthrough.extra_routes;
            if !route_allowed(req.method(), path, extra) {
                let served: Vec<&str> = methods_served(path, extra).collect();
                if served.is_empty() {
                    return Ok(ApiError::NotFound.into_response());
                }
                let mut resp = ApiError::MethodNotAllowed.into_response();
                if let Ok(allow) = HeaderValue::from_str(&served.join(", ")) {
                    resp.headers_mut().insert(header::ALLOW, allow);
                }
                return Ok(resp);
            }
            let limit = rt.policy.gateway.max_body_bytes;
            let (parts, body) = req.into_parts();
            let response = match axum::body::to_bytes(body, limit).await {
                Ok(bytes) => forward(&state, parts, bytes, Reason::Route).await,
                Err(_) => ApiError::PayloadTooLarge(limit).into_response(),
            };
            Ok(response)
        })
    }
}

/// The 400 for a path that could resolve somewhere else upstream (see [`has_dot_segments`]).
pub fn unsafe_path(path: &str) -> Option<ApiError> {
    has_dot_segments(path)
        .then(|| ApiError::bad("path", "the path has dot segments or encoded separators"))
}

/// Client headers passed to the target: what describes the request, and trace context.
/// Credentials and account selectors (`authorization`, `api-key`, `openai-organization`,
/// `openai-project`, cookies) are not: the target gets the gateway's key only.
fn forwarded_request_header(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "content-type"
            | "accept"
            | "user-agent"
            | "traceparent"
            | "tracestate"
            | "openai-beta"
            | "idempotency-key"
    )
}

/// Target headers passed back: what the client needs to read the body. Not the target's
/// cookies, account or organisation headers, request ids or rate-limit state of the
/// operator's account; `retry-after` only where it tells the client when to come back.
fn returned_response_header(name: &HeaderName, status: u16) -> bool {
    match name.as_str() {
        "content-type" | "cache-control" => true,
        "retry-after" => status == 429 || status == 503,
        _ => false,
    }
}

/// A passthrough attempt that did not give the client's answer.
enum Refused {
    /// The target answered 429 or 503 and said when to come back: kept, as the client's
    /// answer when no retry is left or the wait does not fit.
    Wait(reqwest::Response, Duration),
    /// Nothing reached the target: why (without the URL), and whether the connect timed out.
    Unreachable { why: String, timed_out: bool },
    /// Final.
    Error(ApiError),
}

impl Refused {
    fn verdict(&self) -> Verdict {
        match self {
            Self::Wait(_, after) => Verdict::RetryAfter(*after),
            Self::Unreachable { .. } => Verdict::Retry,
            Self::Error(_) => Verdict::Final,
        }
    }
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Wait(r, after) => write!(f, "HTTP {}, retry after {after:?}", r.status()),
            Self::Unreachable { why, .. } => f.write_str(why),
            Self::Error(e) => write!(f, "{e}"),
        }
    }
}

/// The wait a 429 or 503 answer names in its `Retry-After`, if any.
fn named_wait(r: &reqwest::Response) -> Option<Duration> {
    let header = r
        .headers()
        .get(header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok());
    match status_verdict(r.status().as_u16(), header) {
        Verdict::RetryAfter(after) => Some(after),
        Verdict::Retry | Verdict::Final => None,
    }
}

/// Sends the request (head `parts`, body `bytes`) to the target and streams its answer back,
/// marked with `reason`.
pub async fn forward(state: &AppState, parts: Parts, bytes: Bytes, reason: Reason) -> Response {
    let mut resp = send(state, parts, bytes, reason.as_str())
        .await
        .unwrap_or_else(IntoResponse::into_response);
    // On the target's errors too: a client telling approxy's own refusals from the target's
    // reads these.
    let h = resp.headers_mut();
    h.insert("x-approxy-mode", HeaderValue::from_static("passthrough"));
    h.insert(
        "x-approxy-passthrough-reason",
        HeaderValue::from_static(reason.as_str()),
    );
    resp
}

/// Sends the request to the target, as many times as the engine's retry policy allows, and
/// relays the answer that stands; a failed answer becomes the gateway's error.
async fn send(
    state: &AppState,
    parts: Parts,
    bytes: Bytes,
    reason: &'static str,
) -> Result<Response, ApiError> {
    let rt = state.runtime_of(&parts.extensions);
    // A call the target's counters will count (its time is learned from them).
    if parts.method == Method::POST {
        rt.meter.passed_through();
    }
    let url = target_url(&rt, &parts);
    let headers = target_headers(&rt, &parts)?;
    let started = Instant::now();
    let upstream = ask_target(&rt, &parts.method, &url, &headers, &bytes).await?;
    let status = upstream.status();
    metrics::counter!("approxy_passthrough_total", "reason" => reason).increment(1);
    metrics::histogram!("approxy_passthrough_head_seconds").record(started.elapsed().as_secs_f64());
    if !status.is_success() {
        metrics::counter!("approxy_requests_total", "mode" => "passthrough", "outcome" => "upstream_error").increment(1);
        return Err(upstream_error(upstream).await);
    }
    relayed(&rt, upstream)
}

/// The target's URL for the request: its path under the target's OpenAI base, its query as
/// sent.
fn target_url(rt: &Runtime, parts: &Parts) -> String {
    let path = parts
        .uri
        .path()
        .strip_prefix("/v1")
        .unwrap_or(parts.uri.path());
    let mut url = format!("{}{}", rt.policy.target.openai_base(), path);
    if let Some(q) = parts.uri.query() {
        url.push('?');
        url.push_str(q);
    }
    url
}

/// The headers sent to the target: the client's that may cross, and the gateway's own key.
fn target_headers(rt: &Runtime, parts: &Parts) -> Result<HeaderMap, ApiError> {
    let mut headers = HeaderMap::new();
    for (k, v) in &parts.headers {
        if forwarded_request_header(k) {
            headers.append(k.clone(), v.clone());
        }
    }
    if let Some(key) = &rt.target_key {
        let v = HeaderValue::from_str(&format!("Bearer {key}"))
            .map_err(|_| ApiError::Internal("target key is not a valid header value".into()))?;
        headers.insert(header::AUTHORIZATION, v);
    }
    Ok(headers)
}

/// The target's answer, by the engine's retry policy. A 429 or 503 kept for want of retries
/// is the client's answer; a target never reached is a timeout or a bad gateway.
async fn ask_target(
    rt: &Runtime,
    method: &Method,
    url: &str,
    headers: &HeaderMap,
    bytes: &Bytes,
) -> Result<reqwest::Response, ApiError> {
    let attempt = || try_once(rt, method, url, headers, bytes);
    match rt
        .target_config
        .retry_policy()
        .run(attempt, Refused::verdict)
        .await
    {
        Ok(r) | Err(Refused::Wait(r, _)) => Ok(r),
        Err(Refused::Unreachable { why, timed_out }) => {
            tracing::warn!(error = %why, "passthrough to target failed");
            Err(if timed_out {
                ApiError::GatewayTimeout
            } else {
                ApiError::BadGateway
            })
        }
        Err(Refused::Error(e)) => Err(e),
    }
}

/// One attempt at the target. The timeout covers the answer's head only; the body is bounded
/// per read (see [`relay`]), so a long stream is not cut while it flows.
async fn try_once(
    rt: &Runtime,
    method: &Method,
    url: &str,
    headers: &HeaderMap,
    bytes: &Bytes,
) -> Result<reqwest::Response, Refused> {
    let sent = tokio::time::timeout(
        rt.policy.target.timeout,
        rt.http
            .request(method.clone(), url)
            .headers(headers.clone())
            .body(bytes.clone())
            .send(),
    )
    .await;
    match sent {
        Err(_) => Err(Refused::Error(ApiError::GatewayTimeout)),
        // A target that says when to come back is asked again then; any other answer, an
        // error included, is the client's to see.
        Ok(Ok(r)) => match named_wait(&r) {
            Some(after) => Err(Refused::Wait(r, after)),
            None => Ok(r),
        },
        Ok(Err(e)) => Err(unsent(&e)),
    }
}

/// Why a request the target never answered was refused: only a failed connect is worth
/// another try, as nothing reached the target.
fn unsent(e: &reqwest::Error) -> Refused {
    match SendFailure::of(e) {
        SendFailure::Tls(why) => {
            tracing::error!(tls = %why, "passthrough: TLS with the target failed");
            Refused::Error(ApiError::TargetTls)
        }
        SendFailure::Connect { why, timed_out } => Refused::Unreachable { why, timed_out },
        SendFailure::Timeout => Refused::Error(ApiError::GatewayTimeout),
        SendFailure::Other(why) => {
            tracing::warn!(error = %why, "passthrough to target failed");
            Refused::Error(ApiError::BadGateway)
        }
    }
}

/// The client's response to the target's successful answer: its status, the headers that may
/// cross, and its body relayed as it comes (see [`relay`]).
fn relayed(rt: &Runtime, upstream: reqwest::Response) -> Result<Response, ApiError> {
    let status = upstream.status().as_u16();
    let mut resp = Response::builder().status(status);
    for (k, v) in upstream.headers() {
        if returned_response_header(k, status) {
            resp = resp.header(k, v);
        }
    }
    let sse = upstream
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    let cap = rt.policy.gateway.max_response_bytes;
    resp.body(Body::from_stream(relay(
        upstream,
        rt.policy.target.timeout,
        sse,
        cap,
    )))
    .map_err(|e| ApiError::Internal(e.to_string()))
}

/// The target's body, chunk by chunk, each read bounded by `idle` and all of it by `cap`
/// bytes. A body that stalls, breaks off or grows past the cap ends with an error event when it
/// is a stream of events (the client sees why, then the end), or is cut off otherwise, so that
/// a truncated answer never reads as complete. An event stream that closes cleanly but without
/// `data: [DONE]` (every OpenAI-style stream ends with it) was cut short too, and gets the same
/// error event.
fn relay(
    upstream: reqwest::Response,
    idle: std::time::Duration,
    sse: bool,
    cap: usize,
) -> impl futures::Stream<Item = Result<Bytes, std::io::Error>> + Send {
    let body = upstream.bytes_stream();
    let state = Some((
        Box::pin(body),
        DoneWatch::default(),
        0usize,
        Outcome::default(),
    ));
    futures::stream::unfold(state, move |state| async move {
        let (mut body, mut done, sent, mut outcome) = state?;
        let failure = match tokio::time::timeout(idle, body.next()).await {
            Ok(Some(Ok(chunk))) if sent + chunk.len() <= cap => {
                done.push(&chunk);
                let sent = sent + chunk.len();
                return Some((Ok(chunk), Some((body, done, sent, outcome))));
            }
            Ok(Some(Ok(_))) => {
                tracing::warn!(
                    cap,
                    "passthrough: the target's answer grew past gateway.max_response_bytes"
                );
                ApiError::ResponseTooLarge(cap)
            }
            Ok(None) if !sse || done.seen => {
                outcome.ended = Some("ok");
                return None;
            }
            Ok(None) => {
                tracing::warn!("passthrough: the target's stream ended without [DONE]");
                ApiError::BadGateway
            }
            Ok(Some(Err(e))) => {
                tracing::warn!(error = %e.without_url(), "passthrough: the target's body broke off");
                ApiError::BadGateway
            }
            Err(_) => {
                tracing::warn!(idle = ?idle, "passthrough: the target's body stalled");
                ApiError::GatewayTimeout
            }
        };
        metrics::counter!("approxy_passthrough_broken_bodies_total").increment(1);
        outcome.ended = Some("upstream_error");
        if sse {
            let event = format!("data: {}\n\n", failure.body());
            Some((Ok(Bytes::from(event)), None))
        } else {
            Some((
                Err(std::io::Error::other("the target's body broke off")),
                None,
            ))
        }
    })
}

/// How a relayed answer ended, counted once when the relay is dropped: `ok` when the target's
/// body ended as it should, `upstream_error` when it broke off, stalled, grew past the cap or
/// ended without `[DONE]`, and `client_gone` when the client left before any of these (the
/// body is dropped unfinished).
#[derive(Default)]
struct Outcome {
    ended: Option<&'static str>,
}

impl Drop for Outcome {
    fn drop(&mut self) {
        let outcome = self.ended.unwrap_or("client_gone");
        metrics::counter!("approxy_requests_total", "mode" => "passthrough", "outcome" => outcome)
            .increment(1);
    }
}

/// Watches a relayed event stream for a `data: [DONE]` line, which may be split across chunks.
/// Only at the start of a line: inside an event's JSON a newline is escaped, so an answer whose
/// text says "data: [DONE]" is not taken for the end.
struct DoneWatch {
    /// The last bytes seen, enough to hold a marker's start.
    tail: Vec<u8>,
    seen: bool,
}

impl Default for DoneWatch {
    fn default() -> Self {
        // The stream's start is a line start.
        Self {
            tail: b"\n".to_vec(),
            seen: false,
        }
    }
}

impl DoneWatch {
    /// With and without the optional space after the field name.
    const MARKERS: [&'static [u8]; 2] = [b"\ndata: [DONE]", b"\ndata:[DONE]"];

    fn push(&mut self, chunk: &[u8]) {
        if self.seen {
            return;
        }
        self.tail.extend_from_slice(chunk);
        self.seen = Self::MARKERS
            .iter()
            .any(|m| self.tail.windows(m.len()).any(|w| w == *m));
        let keep = Self::MARKERS[0].len() - 1;
        if self.tail.len() > keep {
            self.tail.drain(..self.tail.len() - keep);
        }
    }
}

/// A target's error answer as the client's: credentials the target refused are the gateway's
/// problem (502, not the client's 401); a rate limit keeps its `retry-after`; other 4xx keep
/// their status and the provider's message fields, nothing else; 5xx is a fixed 502.
async fn upstream_error(upstream: reqwest::Response) -> ApiError {
    let status = upstream.status().as_u16();
    let retry_after = upstream.headers().get(header::RETRY_AFTER).cloned();
    let body: serde_json::Value = upstream.json().await.unwrap_or(serde_json::Value::Null);
    tracing::warn!(status, "passthrough: the target answered with an error");
    match status {
        401 | 403 => ApiError::TargetCredentials,
        429 => ApiError::TargetRateLimited(retry_after),
        400..=499 => {
            let e = &body["error"];
            let text = |v: &serde_json::Value| v.as_str().map(|s| scrubbed(s, 500));
            ApiError::UpstreamRejectedWith {
                status,
                message: text(&e["message"]).or_else(|| text(e)),
                param: text(&e["param"]),
            }
        }
        _ => ApiError::BadGateway,
    }
}

/// The target's own words for the client, at most `limit` characters, with what would tell
/// about the target's insides left out: URLs (its address, an upstream's), IP addresses with
/// or without a port, and absolute file paths become `[…]`. Words end at any white space and
/// at `=` (`path=/srv/x`).
fn scrubbed(message: &str, limit: usize) -> String {
    let inside = |w: &str| {
        let w = w.trim_matches(|c: char| {
            matches!(
                c,
                '(' | ')' | '"' | '\'' | ',' | ';' | ':' | '.' | '<' | '>'
            )
        });
        w.contains("://")
            || (w.starts_with('/') && w[1..].contains('/'))
            || w.parse::<std::net::SocketAddr>().is_ok()
            || w.parse::<std::net::IpAddr>().is_ok()
    };
    let mut out = String::with_capacity(message.len().min(limit * 4));
    let mut rest = message;
    while !rest.is_empty() {
        let end = rest
            .find(|c: char| c.is_whitespace() || c == '=')
            .unwrap_or(rest.len());
        let (word, after) = rest.split_at(end);
        out.push_str(if inside(word) { "[…]" } else { word });
        let sep = after.chars().next().map_or(0, char::len_utf8);
        out.push_str(&after[..sep]);
        rest = &after[sep..];
    }
    out.chars().take(limit).collect()
}

#[cfg(test)]
mod tests {
    use super::{DoneWatch, scrubbed};

    #[test]
    fn a_target_rejection_reaches_the_client_without_addresses_or_paths() {
        let said = scrubbed(
            "model not found at http://10.1.2.3:8081/v1 (see /srv/app/config.yaml); use \"qwen\"",
            500,
        );
        assert_eq!(said, "model not found at […] (see […] use \"qwen\"");
        assert_eq!(
            scrubbed("the prompt has 5000 tokens, at most 4096", 500),
            "the prompt has 5000 tokens, at most 4096"
        );
        assert_eq!(scrubbed("a/b and /x stay", 500), "a/b and /x stay");
        assert_eq!(scrubbed(&"x".repeat(900), 500).len(), 500);
        // Addresses without a scheme, and words that end at other white space or at `=`.
        for (said, kept) in [
            ("failed:\n/srv/app/main.py line 3", "failed:\n[…] line 3"),
            ("bad key=/srv/a/b\tand more", "bad key=[…]\tand more"),
            ("upstream 10.1.2.3:8081 refused", "upstream […] refused"),
            (
                "peer [::1]:8081 gone; host 192.168.0.7.",
                "peer […] gone; host […]",
            ),
            (
                "max_tokens must be at most 4096, got 1.5",
                "max_tokens must be at most 4096, got 1.5",
            ),
        ] {
            assert_eq!(scrubbed(said, 500), kept, "{said}");
        }
    }

    #[test]
    fn the_done_marker_is_found_across_chunk_boundaries() {
        let stream = b"data: {\"choices\":[]}\n\ndata: [DONE]\n\n";
        for cut in 0..stream.len() {
            for second in cut..stream.len() {
                let mut w = DoneWatch::default();
                w.push(&stream[..cut]);
                w.push(&stream[cut..second]);
                w.push(&stream[second..]);
                assert!(w.seen, "cut at {cut} and {second}");
            }
        }
        let mut w = DoneWatch::default();
        w.push(b"data: [DONE]");
        assert!(w.seen, "at the very start");
        let mut w = DoneWatch::default();
        w.push(b"data: {}\n\ndata:[DONE]\n\n");
        assert!(w.seen, "without the space");
        let mut w = DoneWatch::default();
        w.push(b"data: {\"choices\":[{\"delta\":{\"content\":\"data: [DONE]\"}}]}\n\n");
        w.push(b"data: [DON");
        assert!(
            !w.seen,
            "a [DONE] in content, or a marker cut short, is not the end"
        );
    }
}
