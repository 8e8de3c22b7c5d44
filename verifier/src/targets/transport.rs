//! The HTTP transport every target client shares, and passthrough with it: the client
//! (TLS, pool, timeouts), one retry policy and one classification of a failed send, JSON and
//! server-sent-event calls, and the small wire helpers the clients read answers with.

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::time::Duration;

use futures::{Stream, StreamExt};

use super::{retry, trace};
use crate::error::TargetError;

/// Connection settings shared by all clients.
#[derive(Debug, Clone)]
pub struct TargetConfig {
    /// Base URL, e.g. `http://127.0.0.1:8081` (llama.cpp) or `http://host:8000/v1` (OpenAI-style).
    pub base_url: String,
    /// Bearer token, if the target needs one. Never logged.
    pub api_key: Option<String>,
    /// Model name sent in OpenAI-style requests.
    pub model: String,
    /// Per-attempt timeout; a call's retries wait only within its attempts' time ([`retry`]).
    pub timeout: Duration,
    /// Attempts after the first on connect errors, timeouts, 5xx and a 429 that says when.
    pub retries: u32,
    /// First backoff; doubled for each further retry, capped, jittered ([`retry`]).
    pub backoff: Duration,
    /// PEM file of extra CA certificates trusted for the target (a private CA), beside the
    /// webpki roots compiled in.
    pub ca_file: Option<PathBuf>,
    /// What engine calls carry so that re-sent prefixes hit the provider's prompt cache.
    pub cache_hints: CacheHints,
    /// Go through the proxy that `HTTP_PROXY`/`HTTPS_PROXY` name. Off unless asked: the target
    /// key must not travel through a proxy nobody chose for it.
    pub use_env_proxy: bool,
}

/// Request fields and headers that make a provider reuse its prompt cache across the calls of
/// one conversation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CacheHints {
    /// Send OpenAI-style `prompt_cache_key` and a stable `user` (both the conversation's
    /// [`super::ContinuationRequest::cache_key`]).
    pub key: bool,
    /// A header that pins the conversation to one replica (Fireworks: `x-session-affinity`),
    /// set to the same key.
    pub affinity_header: Option<String>,
    /// Keep each answer's calls on one server slot (llama-server's `id_slot`; see
    /// [`super::slots`]). Only for a server whose RAM prompt cache is off (`--cache-ram 0`).
    pub slots: bool,
    /// Send each answer's prompt to the slot it holds as the answer starts, to be computed
    /// while the draft writes ([`super::TargetClient::warm`]); needs `slots`.
    pub warm: bool,
}

impl CacheHints {
    /// Adds the hints to a JSON body.
    pub(crate) fn apply_to_body(&self, body: &mut serde_json::Value, key: &str) {
        if self.key {
            body["prompt_cache_key"] = serde_json::json!(key);
            body["user"] = serde_json::json!(key);
        }
    }

    /// The affinity header and its value, when one is set.
    pub(crate) fn header(&self, key: &str) -> Option<(String, String)> {
        self.affinity_header
            .as_ref()
            .map(|h| (h.clone(), key.to_string()))
    }
}

/// How long an idle connection to the target is kept for reuse. Shorter than the 5 s
/// keep-alive of llama-server (cpp-httplib) and of uvicorn (vLLM): a connection the server
/// has already closed would otherwise be picked for the next request, which then fails with
/// nothing sent back (seen as a 502 under the quality benchmark).
pub const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(4);

/// What every connection to a target shares, for engine calls, passthrough and health
/// checks alike: TLS by rustls with the webpki roots plus `cfg.ca_file`, HTTP/2 where the
/// server offers it by ALPN, gzip and brotli bodies, a bounded connect time, and an idle pool
/// shorter than the servers' keep-alive. No overall timeout: callers set their own.
pub fn http_client_builder(cfg: &TargetConfig) -> Result<reqwest::ClientBuilder, TargetError> {
    let mut b = reqwest::Client::builder();
    if !cfg.use_env_proxy {
        b = b.no_proxy();
    }
    let mut b = b
        .use_rustls_tls()
        .connect_timeout(cfg.timeout.min(Duration::from_secs(10)))
        .pool_idle_timeout(POOL_IDLE_TIMEOUT);
    if let Some(path) = &cfg.ca_file {
        for cert in load_ca_file(path)? {
            b = b.add_root_certificate(cert);
        }
    }
    Ok(b)
}

/// Reads a PEM bundle of CA certificates; a file that holds none is an error, not a silent
/// fallback to the public roots.
pub fn load_ca_file(path: &Path) -> Result<Vec<reqwest::Certificate>, TargetError> {
    let pem = std::fs::read(path)
        .map_err(|e| TargetError::Tls(format!("cannot read CA file {}: {e}", path.display())))?;
    let certs = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| {
        TargetError::Tls(format!(
            "CA file {} is not a PEM certificate bundle: {e}",
            path.display()
        ))
    })?;
    if certs.is_empty() {
        return Err(TargetError::Tls(format!(
            "CA file {} holds no PEM certificate",
            path.display()
        )));
    }
    Ok(certs)
}

/// A client whose every read must arrive within the target timeout. Not a total timeout: a
/// streamed answer longer than it (a hand-off writing thousands of tokens) must not be cut
/// while tokens keep coming. Calls whose answer is read whole add the total bound themselves.
pub(crate) fn http_client(cfg: &TargetConfig) -> Result<reqwest::Client, TargetError> {
    http_client_builder(cfg)?
        .read_timeout(cfg.timeout)
        .build()
        .map_err(|e| TargetError::Protocol(format!("cannot build HTTP client: {e}")))
}

/// The TLS failure inside a request error, if that is what it was (an untrusted certificate,
/// a name mismatch, a handshake the server refused). rustls' error sits inside nested
/// `io::Error`s, whose `source()` skips the error they wrap, so each link is opened with
/// `get_ref` as well.
pub fn tls_failure(e: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(t) = err.downcast_ref::<rustls::Error>() {
            return Some(t.to_string());
        }
        cur = match err
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            Some(inner) => Some(inner as &(dyn std::error::Error + 'static)),
            None => err.source(),
        };
    }
    None
}

/// Why a request to the target got no answer, as both the engine and passthrough classify
/// it. The order decides: a TLS failure first (reqwest counts a failed handshake as a connect
/// error, and a certificate not trusted now will not be trusted on a retry), then a connection
/// never made (nothing reached the target, so a retry cannot duplicate work), then a timeout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SendFailure {
    /// TLS with the target failed: what rustls said.
    Tls(String),
    /// No connection was made (`timed_out`: the connect timed out).
    Connect {
        /// What went wrong, without the URL.
        why: String,
        /// Whether the connect attempt ran out of time.
        timed_out: bool,
    },
    /// The target did not answer in time.
    Timeout,
    /// Anything else (the connection broke, a body could not be sent), without the URL.
    Other(String),
}

impl SendFailure {
    /// Classifies a failed send.
    pub fn of(e: &reqwest::Error) -> Self {
        if let Some(t) = tls_failure(e) {
            Self::Tls(t)
        } else if e.is_connect() {
            Self::Connect {
                why: without_url(e),
                timed_out: e.is_timeout(),
            }
        } else if e.is_timeout() {
            Self::Timeout
        } else {
            Self::Other(without_url(e))
        }
    }
}

/// Maps a failed send to the error the engine reports.
pub(crate) fn send_error(e: &reqwest::Error, cfg: &TargetConfig, url: &str) -> TargetError {
    match SendFailure::of(e) {
        SendFailure::Tls(t) => TargetError::Tls(t),
        SendFailure::Timeout
        | SendFailure::Connect {
            timed_out: true, ..
        } => TargetError::Timeout(cfg.timeout),
        SendFailure::Connect { why: reason, .. } | SendFailure::Other(reason) => {
            TargetError::Unreachable {
                url: url.to_string(),
                reason,
            }
        }
    }
}

/// GETs `url` and wants a 2xx: the health checks.
pub(crate) async fn get_ok(
    http: &reqwest::Client,
    cfg: &TargetConfig,
    url: &str,
) -> Result<(), TargetError> {
    let mut rb = http.get(url).timeout(cfg.timeout);
    if let Some(k) = &cfg.api_key {
        rb = rb.bearer_auth(k);
    }
    let resp = rb.send().await.map_err(|e| send_error(&e, cfg, url))?;
    if resp.status().is_success() {
        Ok(())
    } else {
        Err(TargetError::Status {
            status: resp.status().as_u16(),
            body: String::new(),
        })
    }
}

/// GETs a JSON answer (no retries: callers treat a failure as "not known yet").
pub(crate) async fn get_json(
    http: &reqwest::Client,
    cfg: &TargetConfig,
    url: &str,
) -> Result<serde_json::Value, TargetError> {
    let mut rb = http.get(url).timeout(cfg.timeout);
    if let Some(k) = &cfg.api_key {
        rb = rb.bearer_auth(k);
    }
    let resp = rb.send().await.map_err(|e| send_error(&e, cfg, url))?;
    if !resp.status().is_success() {
        return Err(TargetError::Status {
            status: resp.status().as_u16(),
            body: String::new(),
        });
    }
    resp.json()
        .await
        .map_err(|e| TargetError::Protocol(format!("bad JSON from target: {e}")))
}

impl TargetConfig {
    /// How calls with these settings are retried.
    pub fn retry_policy(&self) -> retry::RetryPolicy {
        retry::RetryPolicy {
            retries: self.retries,
            backoff: self.backoff,
            call_timeout: self.timeout,
        }
    }
}

/// Serves `app` on a free local port, as an in-process stub of a target; settings for it: no
/// key, no retries, a 10 s timeout.
#[cfg(test)]
pub(crate) async fn serve_stub(app: axum::Router) -> TargetConfig {
    #![allow(clippy::expect_used)]
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a free local port");
    let addr = listener.local_addr().expect("its address");
    tokio::spawn(async move { axum::serve(listener, app).await });
    TargetConfig {
        base_url: format!("http://{addr}"),
        api_key: None,
        model: "qwen".into(),
        timeout: Duration::from_secs(10),
        retries: 0,
        backoff: Duration::from_millis(10),
        ca_file: None,
        cache_hints: CacheHints::default(),
        use_env_proxy: false,
    }
}

/// A failed attempt and what it allows.
struct Failed(TargetError, retry::Verdict);

impl std::fmt::Display for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// POSTs JSON, retried by [`retry::RetryPolicy`] on connect errors, timeouts, 5xx and a 429
/// that says when to come back, and returns the first successful answer's head. Other 4xx
/// answers are not retried: the same request would fail the same way. Nothing is retried once
/// a body has started to arrive.
pub(crate) async fn send_with_retries(
    http: &reqwest::Client,
    cfg: &TargetConfig,
    url: &str,
    body: &serde_json::Value,
    header: Option<&(String, String)>,
    whole: bool,
) -> Result<reqwest::Response, TargetError> {
    let attempt = || async {
        let mut rb = http.post(url).json(body);
        if whole {
            // An answer read whole is bounded in total, not just per read.
            rb = rb.timeout(cfg.timeout);
        }
        if let Some(k) = &cfg.api_key {
            rb = rb.bearer_auth(k);
        }
        if let Some((name, value)) = header {
            rb = rb.header(name.as_str(), value.as_str());
        }
        if let Some(ctx) = trace::current() {
            for (name, value) in ctx.headers() {
                rb = rb.header(name, value);
            }
        }
        match rb.send().await {
            Ok(resp) if resp.status().is_success() => Ok(resp),
            Ok(resp) => {
                let status = resp.status().as_u16();
                let verdict = retry::status_verdict(
                    status,
                    resp.headers()
                        .get(reqwest::header::RETRY_AFTER)
                        .and_then(|v| v.to_str().ok()),
                );
                let text: String = resp
                    .text()
                    .await
                    .unwrap_or_default()
                    .chars()
                    .take(500)
                    .collect();
                Err(Failed(TargetError::Status { status, body: text }, verdict))
            }
            Err(e) => match send_error(&e, cfg, url) {
                // A certificate that is not trusted now will not be trusted on a retry.
                tls @ TargetError::Tls(_) => Err(Failed(tls, retry::Verdict::Final)),
                other => Err(Failed(other, retry::Verdict::Retry)),
            },
        }
    };
    cfg.retry_policy()
        .run(attempt, |f: &Failed| f.1)
        .await
        .map_err(|f| f.0)
}

/// POSTs JSON (with [`send_with_retries`]) and reads a JSON answer.
pub(crate) async fn post_json(
    http: &reqwest::Client,
    cfg: &TargetConfig,
    url: &str,
    body: &serde_json::Value,
    header: Option<&(String, String)>,
) -> Result<serde_json::Value, TargetError> {
    let resp = send_with_retries(http, cfg, url, body, header, true).await?;
    resp.json()
        .await
        .map_err(|e| TargetError::Protocol(format!("bad JSON from target: {e}")))
}

/// Server-sent events, each a JSON object.
pub(crate) type JsonStream =
    Pin<Box<dyn Stream<Item = Result<serde_json::Value, TargetError>> + Send>>;

/// The cached prompt tokens a usage object reports: OpenAI-style
/// `prompt_tokens_details.cached_tokens` (OpenAI, vLLM, Together, Fireworks), DeepSeek's
/// `prompt_cache_hit_tokens`, or llama-server's `timings.cache_n` beside it.
pub(crate) fn reported_cached_tokens(usage: &serde_json::Value) -> Option<u32> {
    [
        &usage["prompt_tokens_details"]["cached_tokens"],
        &usage["prompt_cache_hit_tokens"],
    ]
    .into_iter()
    .find_map(|v| v.as_u64())
    .and_then(|x| u32::try_from(x).ok())
}

/// POSTs JSON (with [`send_with_retries`]) and reads the answer as server-sent events, each
/// `data:` a JSON object; `[DONE]` ends the stream. A stream that ends before the target said
/// it was finished (`[DONE]`, a `finish_reason`, or llama.cpp's `"stop": true`) ends with a
/// protocol error: a connection closed early must not read as a complete answer.
pub(crate) async fn post_sse(
    http: &reqwest::Client,
    cfg: &TargetConfig,
    url: &str,
    body: &serde_json::Value,
    header: Option<&(String, String)>,
) -> Result<JsonStream, TargetError> {
    use eventsource_stream::Eventsource;
    let resp = send_with_retries(http, cfg, url, body, header, false).await?;
    let timeout = cfg.timeout;
    let events = Box::pin(resp.bytes_stream().eventsource());
    // State: the events, and whether the target has said it is finished.
    Ok(Box::pin(futures::stream::unfold(
        Some((events, false)),
        move |state| async move {
            let (mut events, finished) = state?;
            let item = match events.next().await {
                None if finished => return None,
                None => Err(TargetError::Protocol(
                    "the target's stream ended before it said it was finished".into(),
                )),
                Some(Ok(e)) if e.data.trim() == "[DONE]" => return None,
                Some(Ok(e)) => match serde_json::from_str::<serde_json::Value>(&e.data) {
                    Ok(v) => {
                        let done = finished || says_finished(&v);
                        return Some((Ok(v), Some((events, done))));
                    }
                    Err(err) => Err(TargetError::Protocol(format!(
                        "bad JSON in a streamed event: {err}"
                    ))),
                },
                Some(Err(eventsource_stream::EventStreamError::Transport(t))) if t.is_timeout() => {
                    Err(TargetError::Timeout(timeout))
                }
                Some(Err(err)) => Err(TargetError::Protocol(format!(
                    "the target's stream broke off: {err}"
                ))),
            };
            // An error ends the stream.
            Some((item, None))
        },
    )))
}

/// Whether a streamed event is the target's last word on the answer: an OpenAI-style choice
/// with a `finish_reason`, llama.cpp's native `"stop": true`, or SGLang's native
/// `meta_info.finish_reason` (an object once the answer is over).
fn says_finished(v: &serde_json::Value) -> bool {
    v["stop"].as_bool() == Some(true)
        || v["meta_info"]["finish_reason"].is_object()
        || v["choices"]
            .as_array()
            .is_some_and(|c| c.iter().any(|c| c["finish_reason"].is_string()))
}

/// reqwest errors print the URL, which may carry credentials in its userinfo; drop it.
fn without_url(e: &reqwest::Error) -> String {
    let mut s = e.to_string();
    if let Some(u) = e.url() {
        s = s.replace(u.as_str(), "<target>");
    }
    let mut src = std::error::Error::source(e);
    while let Some(inner) = src {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        src = inner.source();
    }
    s
}

/// A JSON array of token ids; `None` when it is not one.
pub(crate) fn token_ids(v: &serde_json::Value) -> Option<Vec<u32>> {
    v.as_array()?
        .iter()
        .map(|t| t.as_u64().and_then(|x| u32::try_from(x).ok()))
        .collect()
}

/// An answer from an endpoint the server may not have: `None` when it has not (404 or 405),
/// which is no failure.
pub(crate) fn unless_missing<T>(answer: Result<T, TargetError>) -> Result<Option<T>, TargetError> {
    match answer {
        Ok(v) => Ok(Some(v)),
        Err(TargetError::Status {
            status: 404 | 405, ..
        }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The token ids a `/tokenize` answer carries in `tokens`; `None` when the server has no such
/// endpoint: it just cannot be checked.
pub(crate) fn tokenized(
    answer: Result<serde_json::Value, TargetError>,
) -> Result<Option<Vec<u32>>, TargetError> {
    Ok(unless_missing(answer)?.and_then(|v| token_ids(&v["tokens"])))
}

pub(crate) fn join(base: &str, path: &str) -> String {
    format!(
        "{}/{}",
        base.trim_end_matches('/'),
        path.trim_start_matches('/')
    )
}
