//! The gateway's own tower middleware: auth, the request body read whole within its size and
//! time limits, load-shedding concurrency limit whose permit lives as long as the response
//! body, request timeout, and request metrics. Their order is set in `stack.rs`.

use std::time::Instant;

use axum::body::Body;
use axum::extract::{MatchedPath, Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures::StreamExt;

use crate::body_budget::{ClientAddr, Spent};
use crate::error::ApiError;
use crate::state::{AppState, Snapshot};

/// The most a body's buffer takes before its bytes arrive.
const FIRST_BUFFER: usize = 64 << 10;

/// Longest client `x-request-id` kept.
const REQUEST_ID_MAX: usize = 128;

/// Keeps a client's `x-request-id` only when it is short and plain (letters, digits and
/// `-_.:/+=`); otherwise it is dropped and the gateway makes its own. The id goes into every
/// log line of the request and back to the client: an unchecked one could forge log lines
/// (newlines are refused by HTTP already; other control characters and escapes are not) or
/// bloat every line.
pub async fn request_id(mut req: Request, next: Next) -> Response {
    let plain = |v: &header::HeaderValue| {
        let b = v.as_bytes();
        !b.is_empty()
            && b.len() <= REQUEST_ID_MAX
            && b.iter()
                .all(|c| c.is_ascii_alphanumeric() || b"-_.:/+=".contains(c))
    };
    let ids = req.headers().get_all("x-request-id");
    let keep = ids.iter().count() == 1 && ids.iter().all(plain);
    if !keep {
        req.headers_mut().remove("x-request-id");
    }
    next.run(req).await
}

/// Longest request target (path and query) read. hyper itself refuses one past 64 KiB, with
/// an empty 414 before any layer runs; below that the refusal is the gateway's, in the OpenAI
/// shape and with the request id.
pub const MAX_URI_BYTES: usize = 8 << 10;

/// Most header fields read (hyper is set to parse up to [`HYPER_MAX_HEADERS`], so a request
/// between the two gets the gateway's 431 rather than hyper's empty one).
pub const MAX_HEADERS: usize = 100;

/// Most header fields hyper parses before refusing with its own empty 431.
pub const HYPER_MAX_HEADERS: usize = 1000;

/// Most header bytes read, names and values (hyper's own limit is its read buffer, 400 KiB).
pub const MAX_HEADER_BYTES: usize = 64 << 10;

/// Refuses a request target or headers past the gateway's limits: 414 and 431 in the OpenAI
/// shape, carrying the request id, where hyper's own refusals past its larger limits have no
/// body. Refuses what the gateway would otherwise misread: a transfer coding other than
/// `chunked` (501; hyper decodes only the chunking) and more than one `authorization` (only the
/// first would be checked).
pub async fn protocol_limits(req: Request, next: Next) -> Response {
    if let Some(e) = misread(req.headers()) {
        return e.into_response();
    }
    let uri = req.uri().path_and_query().map_or(0, |p| p.as_str().len());
    if uri > MAX_URI_BYTES {
        return ApiError::UriTooLong(MAX_URI_BYTES).into_response();
    }
    let h = req.headers();
    let bytes: usize = h.iter().map(|(k, v)| k.as_str().len() + v.len()).sum();
    if h.len() > MAX_HEADERS || bytes > MAX_HEADER_BYTES {
        return ApiError::HeadersTooLarge {
            fields: MAX_HEADERS,
            bytes: MAX_HEADER_BYTES,
        }
        .into_response();
    }
    next.run(req).await
}

/// What in the headers the gateway would misread, if anything.
fn misread(h: &header::HeaderMap) -> Option<ApiError> {
    let codings = h.get_all(header::TRANSFER_ENCODING).iter().flat_map(|v| {
        String::from_utf8_lossy(v.as_bytes())
            .split(',')
            .map(|c| c.trim().to_ascii_lowercase())
            .filter(|c| !c.is_empty())
            .collect::<Vec<_>>()
    });
    if let Some(other) = codings.into_iter().find(|c| c != "chunked") {
        return Some(ApiError::UnsupportedTransferCoding(other));
    }
    if h.get_all(header::AUTHORIZATION).iter().count() > 1 {
        return Some(ApiError::bad(
            "authorization",
            "more than one Authorization header: send one",
        ));
    }
    None
}

/// Refuses a body the gateway reads as JSON whose `content-type` says otherwise (415): another
/// type, or a charset other than UTF-8, which read as JSON would be garbage. No `content-type`
/// is read as JSON, as OpenAI's API does. Routes the gateway only forwards (file uploads are
/// multipart) are not checked.
pub fn json_body(h: &header::HeaderMap) -> Result<(), ApiError> {
    let types: Vec<_> = h.get_all(header::CONTENT_TYPE).iter().collect();
    match types.as_slice() {
        [] => Ok(()),
        [one] if json_in_utf8(one.as_bytes()) => Ok(()),
        _ => Err(ApiError::UnsupportedMediaType(
            types
                .iter()
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                .collect::<Vec<_>>()
                .join(", "),
        )),
    }
}

/// Whether a `content-type` says JSON (`application/json` or a `+json` type) in UTF-8 (no
/// charset, or `utf-8`; JSON has no other, RFC 8259 8.1).
fn json_in_utf8(value: &[u8]) -> bool {
    let value = String::from_utf8_lossy(value).to_ascii_lowercase();
    let mut parts = value.split(';').map(str::trim);
    let essence = parts.next().unwrap_or_default();
    let json = essence == "application/json"
        || essence
            .strip_prefix("application/")
            .is_some_and(|t| t.ends_with("+json"));
    json && parts.all(|p| match p.split_once('=') {
        Some((k, v)) if k.trim() == "charset" => {
            matches!(v.trim().trim_matches('"'), "utf-8" | "utf8")
        }
        _ => true,
    })
}

/// Takes the request's runtime once, for every layer and handler after this one (see
/// [`Snapshot`]).
pub async fn snapshot(State(state): State<AppState>, mut req: Request, next: Next) -> Response {
    req.extensions_mut().insert(Snapshot(state.runtime()));
    next.run(req).await
}

/// Rejects requests without a valid `Authorization: Bearer <key>` when keys are configured.
/// Keys are compared in constant time so response timing does not reveal a prefix.
pub async fn auth(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let rt = state.runtime_of(req.extensions());
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

/// Reads the request body whole before the request goes on: 413 when it is over
/// `max_body_bytes` (at once when its declared length says so), 429 when the body budget or
/// the client address's share of it is spent (`body_budget`), 408 when it does not arrive
/// within `body_timeout` or pauses longer than `body_idle_timeout`, 400 when its framing is
/// broken. A client that trickles or stalls its body so never holds a request slot (they are
/// taken after this) and is not blamed on the target.
pub async fn read_body(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let rt = state.runtime_of(req.extensions());
    let g = &rt.policy.gateway;
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > g.max_body_bytes) {
        return ApiError::PayloadTooLarge(g.max_body_bytes).into_response();
    }
    // Every byte received holds its part of the body budget until the request goes on (a slot
    // then bounds it); a declared length reserves nothing (see `body_budget`). When the budget,
    // or this address's share of it, is spent, the gateway is full, as when every slot is taken.
    let address = req.extensions().get::<ClientAddr>().map(|a| a.0);
    let mut held = state.shared.body_budget.hold(address);
    let shed = |spent: Spent| {
        let reason = match spent {
            Spent::Total => "body_budget",
            Spent::Address => "body_budget_per_ip",
        };
        metrics::counter!("approxy_requests_shed_total", "reason" => reason).increment(1);
        ApiError::Overloaded
    };
    let (parts, body) = req.into_parts();
    let too_slow = || {
        metrics::counter!("approxy_client_errors_total", "reason" => "body_timeout").increment(1);
        ApiError::BodyTimeout {
            total_secs: g.body_timeout.as_secs(),
            idle_secs: g.body_idle_timeout.as_secs(),
        }
    };
    let mut chunks = body.into_data_stream();
    // Grown as bytes come: a promised length allocates nothing until it is sent.
    let mut whole = bytes::BytesMut::with_capacity(declared.unwrap_or(0).min(FIRST_BUFFER));
    let read = async {
        loop {
            match tokio::time::timeout(g.body_idle_timeout, chunks.next()).await {
                Err(_) => return Err(too_slow()),
                Ok(None) => return Ok(whole.freeze()),
                Ok(Some(Ok(chunk))) => {
                    if whole.len() + chunk.len() > g.max_body_bytes {
                        return Err(ApiError::PayloadTooLarge(g.max_body_bytes));
                    }
                    held.grow(chunk.len()).map_err(shed)?;
                    whole.extend_from_slice(&chunk);
                }
                Ok(Some(Err(_))) => {
                    metrics::counter!("approxy_client_errors_total", "reason" => "body_framing")
                        .increment(1);
                    return Err(ApiError::bad(
                        "body",
                        "the request body could not be read: its framing (chunked encoding or length) is broken",
                    ));
                }
            }
        }
    };
    let refused = match tokio::time::timeout(g.body_timeout, read).await {
        Ok(Ok(bytes)) => {
            // Read: from here the request's slot bounds what it holds.
            drop(held);
            return next
                .run(Request::from_parts(parts, Body::from(bytes)))
                .await;
        }
        Ok(Err(e)) => e,
        Err(_) => too_slow(),
    };
    // The rest of that body may never come: the connection closes after the answer instead of
    // waiting to read past it.
    let mut resp = refused.into_response();
    resp.headers_mut().insert(
        header::CONNECTION,
        axum::http::HeaderValue::from_static("close"),
    );
    resp
}

/// Load shedding: a request that finds every slot taken gets 429 at once. The slot is held
/// until the response body has been sent completely (streams included), not just until the
/// handler returns.
pub async fn concurrency(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let Ok(permit) = state.shared.inflight.clone().try_acquire_owned() else {
        metrics::counter!("approxy_requests_shed_total", "reason" => "slots").increment(1);
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
    let limit = state
        .runtime_of(req.extensions())
        .policy
        .gateway
        .request_timeout;
    // The deadline is the retries' too: no retry before the head (passthrough, or a
    // non-streamed answer) waits for a target past it.
    let deadline = tokio::time::Instant::now() + limit;
    let run = approxy_verifier::infer::transport::with_deadline(deadline, next.run(req));
    match tokio::time::timeout_at(deadline, run).await {
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

    #[tokio::test]
    async fn a_client_request_id_is_kept_only_when_short_and_plain() {
        use axum::Router;
        use axum::routing::get;
        use tower::ServiceExt;
        let app = Router::new()
            .route(
                "/",
                get(|req: Request| async move {
                    req.headers()
                        .get("x-request-id")
                        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                        .unwrap_or_default()
                }),
            )
            .layer(axum::middleware::from_fn(request_id));
        let long = "a".repeat(REQUEST_ID_MAX + 1);
        for (given, kept) in [
            ("trace-42:abc/def+1=", true),
            ("id%0a[ERROR]forged", false),
            ("id\"quoted", false),
            ("id with spaces", false),
            (long.as_str(), false),
        ] {
            let req = axum::http::Request::get("/")
                .header("x-request-id", given)
                .body(Body::empty())
                .unwrap();
            let resp = app.clone().oneshot(req).await.unwrap();
            let seen = axum::body::to_bytes(resp.into_body(), 1 << 16)
                .await
                .unwrap();
            assert_eq!(seen == given.as_bytes(), kept, "{given}");
            assert!(kept || seen.is_empty(), "{given}");
        }
    }

    #[test]
    fn key_comparison() {
        assert!(keys_match("abc", "abc"));
        assert!(!keys_match("abc", "abd"));
        assert!(!keys_match("abc", "ab"));
        assert!(!keys_match("abc", "abcd"));
    }
}
