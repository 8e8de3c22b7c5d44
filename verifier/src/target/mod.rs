//! Target clients: the remote model that is called only when the verifier rejects. One
//! trait; token-level clients (llama.cpp's `/completion`, OpenAI-style `/v1/completions` with a
//! token-id prompt as vLLM serves) and text-level ones (`/v1/completions` with a text prompt,
//! chat completions that continue a partial assistant message), which need no tokenizer in
//! common with the draft; one shared test suite in `tests/`.

pub mod chat_only;
pub mod chat_prefix;
pub mod llamacpp;
pub mod openai;
pub mod openai_text;
pub mod retry;
pub mod text;
pub mod trace;

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::{Stream, StreamExt};
use serde::{Deserialize, Serialize};

use crate::error::TargetError;
use crate::sampling::SamplingParams;
use crate::template::{ChatMessage, ChatTemplate};
use crate::tokenizer::Tokenizer;

pub use chat_only::ChatOnlyTarget;
pub use chat_prefix::{ChatPrefixTarget, PrefixStyle};
pub use llamacpp::LlamaCppTarget;
pub use openai::OpenAiCompletionsTarget;
pub use openai_text::OpenAiTextTarget;

/// Ask the target to continue an exact token prefix.
#[derive(Debug, Clone)]
pub struct ContinuationRequest {
    /// Prompt tokens plus every token emitted so far.
    pub prefix: Vec<u32>,
    /// How many of `prefix` are the prompt (the rest is the answer so far). Text-level targets
    /// send the answer separately and heal its last token boundary.
    pub prompt_len: usize,
    /// The chat messages the prompt was rendered from (chat requests only): chat-level targets
    /// send these and the partial answer instead of the rendered prompt.
    pub messages: Option<Arc<Vec<ChatMessage>>>,
    /// How many tokens to generate at most.
    pub max_tokens: u32,
    /// Same parameters the draft uses.
    pub sampling: SamplingParams,
    /// Model id to name in the call (OpenAI-style targets); `None` uses the configured one.
    pub model: Option<String>,
    /// Ask for the target's top log-probabilities at every generated position (this many
    /// entries each; 0: none). Label collection needs them; the engine does not ask.
    pub top_logprobs: u32,
}

impl ContinuationRequest {
    /// A greedy request for `max_tokens` after `prefix`, all of which is prompt.
    pub fn greedy(prefix: Vec<u32>, max_tokens: u32) -> Self {
        Self {
            prompt_len: prefix.len(),
            prefix,
            messages: None,
            max_tokens,
            sampling: SamplingParams::default(),
            model: None,
            top_logprobs: 0,
        }
    }

    /// A key that stays the same for every call of one conversation (its first prompt tokens),
    /// so a provider that routes by it sends the re-sent prefixes to the machine that cached them.
    pub fn cache_key(&self) -> String {
        use sha2::{Digest, Sha256};
        let head = &self.prefix[..self.prompt_len.min(self.prefix.len()).min(CACHE_KEY_TOKENS)];
        let mut h = Sha256::new();
        for t in head {
            h.update(t.to_le_bytes());
        }
        let mut key = format!("approxy-{:x}", h.finalize());
        // 12 bytes of the digest are unique enough for a conversation's cache key.
        key.truncate("approxy-".len() + 24);
        key
    }
}

/// Prompt tokens the cache key is computed from: a conversation's later turns keep its start.
const CACHE_KEY_TOKENS: usize = 256;

/// The target's continuation.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Continuation {
    /// Generated token ids (an end-of-sequence token is included when the target stopped on it).
    pub tokens: Vec<u32>,
    /// True when the target stopped because it produced end-of-sequence.
    pub stopped_on_eos: bool,
    /// Prompt tokens the target reports it served from its prompt cache, when it says.
    pub cached_prompt_tokens: Option<u32>,
    /// Calls made beyond the one asked for (a text-level target whose answer did not start
    /// with the healed text is asked again without healing).
    pub extra_calls: u32,
    /// When [`ContinuationRequest::top_logprobs`] asked for them and the target gives them:
    /// at each generated token, the target's top (token, natural-log probability at
    /// temperature 1), most likely first. Empty otherwise.
    pub top_logprobs: Vec<Vec<(u32, f32)>>,
    /// The compute the call took, when the target reports it.
    pub timings: Option<TargetTimings>,
}

/// What one call cost the target in compute, as it reports it (llama-server's `timings`): the
/// prompt tokens it had to process (those its cache did not serve) and the tokens it
/// generated, with the milliseconds each took. The measure of a self-hosted target's cost.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TargetTimings {
    /// Prompt tokens processed (not served from the cache).
    pub prompt_tokens: u64,
    /// Time processing them, ms.
    pub prompt_ms: f64,
    /// Tokens generated.
    pub predicted_tokens: u64,
    /// Time generating them, ms.
    pub predicted_ms: f64,
}

impl TargetTimings {
    /// Reads llama-server's `timings` object (`prompt_n`, `prompt_ms`, `predicted_n`,
    /// `predicted_ms`); `None` when it is absent or incomplete.
    pub fn from_llama(v: &serde_json::Value) -> Option<Self> {
        Some(Self {
            prompt_tokens: v["prompt_n"].as_u64()?,
            prompt_ms: v["prompt_ms"].as_f64()?,
            predicted_tokens: v["predicted_n"].as_u64()?,
            predicted_ms: v["predicted_ms"].as_f64()?,
        })
    }

    /// Time the target was busy with the call.
    pub fn busy(&self) -> std::time::Duration {
        std::time::Duration::from_secs_f64(((self.prompt_ms + self.predicted_ms) / 1e3).max(0.0))
    }
}

/// Ask the target to judge a window of draft tokens after an exact prefix.
#[derive(Debug, Clone)]
pub struct WindowRequest {
    /// Prompt tokens plus every token emitted so far.
    pub prefix: Vec<u32>,
    /// Draft tokens proposed after the prefix.
    pub window: Vec<u32>,
    /// Model id to name in the call; `None` uses the configured one.
    pub model: Option<String>,
    /// Sampled decoding: the target reports its log-probabilities at every window position
    /// (its top entries and the window token's) and samples its token after the window with
    /// these parameters. `None`: greedy, the top token is enough.
    pub sampling: Option<SamplingParams>,
    /// Greedy windows under a relaxed rule: report this many of the target's top
    /// log-probabilities (and the window token's) at every window position (0: none).
    pub top_logprobs: u32,
}

/// The target's choices over a window.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WindowScore {
    /// The target's top token at each window position (given the prefix and the window before
    /// it), then its next token after the whole window: `window.len() + 1` entries.
    pub top: Vec<u32>,
    /// At each window position, how far the target's top log-probability is above the draft
    /// token's, where the target reports both (0 when they are the same token): a small margin
    /// is a numerical tie.
    pub margins: Vec<Option<f32>>,
    /// When sampling or top log-probabilities were asked for: at each window position, (token,
    /// log-probability at temperature 1) for the target's top entries and the window token.
    /// When sampling, the last entry of `top` is the target's sampled token, not its top one.
    pub logprobs: Vec<Vec<(u32, f32)>>,
}

/// A piece of a streamed continuation.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StreamChunk {
    /// Tokens generated since the previous chunk (an end-of-sequence token is included when
    /// the target stopped on it).
    pub tokens: Vec<u32>,
    /// True when the target stopped because it produced end-of-sequence.
    pub stopped_on_eos: bool,
    /// Prompt tokens the target reports it served from its prompt cache (in the last chunk,
    /// when it says).
    pub cached_prompt_tokens: Option<u32>,
    /// Calls made beyond the one asked for, since the previous chunk (see
    /// [`Continuation::extra_calls`]).
    pub extra_calls: u32,
    /// The whole call's compute, in the last chunk, when the target reports it (a stream
    /// closed before its end never gets it).
    pub timings: Option<TargetTimings>,
}

/// A continuation arriving as the target generates it. Dropping it closes the connection,
/// which stops the generation upstream (llama.cpp and vLLM abort a request whose client has
/// gone).
pub type TokenStream = Pin<Box<dyn Stream<Item = Result<StreamChunk, TargetError>> + Send>>;

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
    /// [`ContinuationRequest::cache_key`]).
    pub key: bool,
    /// A header that pins the conversation to one replica (Fireworks: `x-session-affinity`),
    /// set to the same key.
    pub affinity_header: Option<String>,
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

/// A model server that can continue a token prefix.
#[async_trait]
pub trait TargetClient: Send + Sync + std::fmt::Debug {
    /// Continues `req.prefix`.
    async fn continue_tokens(&self, req: &ContinuationRequest)
    -> Result<Continuation, TargetError>;
    /// Streams the continuation of `req.prefix`. The default makes one call and delivers it as
    /// one chunk, for targets that cannot stream token ids.
    async fn stream_tokens(&self, req: &ContinuationRequest) -> Result<TokenStream, TargetError> {
        let c = self.continue_tokens(req).await?;
        let chunk = StreamChunk {
            tokens: c.tokens,
            stopped_on_eos: c.stopped_on_eos,
            cached_prompt_tokens: c.cached_prompt_tokens,
            extra_calls: c.extra_calls,
            timings: c.timings,
        };
        Ok(Box::pin(futures::stream::once(async move { Ok(chunk) })))
    }
    /// Scores a window of draft tokens in one call: the target's own greedy token at every
    /// window position and one more. `Ok(None)` when the target cannot (it returns no
    /// prompt log-probabilities); span or fixed corrections are the path then.
    async fn score_window(&self, _req: &WindowRequest) -> Result<Option<WindowScore>, TargetError> {
        Ok(None)
    }
    /// Whether a window call's prefix can be served from the target's prompt cache. vLLM's
    /// cannot: a request that asks for prompt log-probabilities skips reading the prefix cache
    /// (vllm/sampling_params.py, `skip_reading_prefix_cache`), so the whole prefix is computed
    /// and billed as new input every time.
    fn windows_read_cache(&self) -> bool {
        true
    }
    /// Tokenizes `text` with the target's tokenizer, when the target offers that (`None` when not).
    async fn tokenize(&self, text: &str) -> Result<Option<Vec<u32>>, TargetError>;
    /// What the target says of itself (nothing, by default).
    async fn facts(&self) -> Result<TargetFacts, TargetError> {
        Ok(TargetFacts::default())
    }
    /// Ok when the target answers its health check; the error says why not.
    async fn health(&self) -> Result<(), TargetError>;
}

/// What a target says of itself, each `None` where it does not say.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TargetFacts {
    /// The most positions (prompt and answer together) one request may take.
    pub context_length: Option<usize>,
    /// Whether it takes images in messages.
    pub images: Option<bool>,
}

/// The kinds a policy can name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TargetKind {
    /// llama.cpp `llama-server`.
    LlamaCpp,
    /// `/v1/completions` with token-id prompts and `return_token_ids`: vLLM, and servers that
    /// accept token ids the same way (SGLang, Fireworks). Policies may also say `"openai"`,
    /// its earlier name.
    Vllm,
    /// OpenAI-compatible `/v1/completions` with a *text* prompt (Together, OpenRouter,
    /// DeepSeek's beta completions, TGI, llama-server): approxy sends the rendered prompt and
    /// the answer so far as text and re-tokenizes what comes back. No tokenizer in common with
    /// the draft is needed.
    OpenaiText,
    /// Chat completions whose last message is the partial assistant answer, marked as
    /// [`PrefixStyle`] says (DeepSeek and Mistral `prefix: true`, vLLM
    /// `continue_final_message`, llama-server's assistant prefill). Text level, like
    /// `openai_text`, and the provider applies its own chat template.
    ChatPrefix,
    /// An OpenAI-compatible chat API that cannot continue a partial assistant answer (OpenAI's
    /// current chat models, current Claude models): passthrough only.
    #[serde(rename = "openai_chat")]
    OpenAiChat,
}

impl TargetKind {
    /// Whether the target can continue an exact prefix, which approximate mode needs.
    pub fn can_continue(self) -> bool {
        !matches!(self, TargetKind::OpenAiChat)
    }

    /// Whether the target is sent text rather than token ids: it then needs no tokenizer in
    /// common with the draft (nothing to check), and its answers are re-tokenized.
    pub fn is_text_level(self) -> bool {
        matches!(self, TargetKind::OpenaiText | TargetKind::ChatPrefix)
    }

    /// Whether it needs the chat messages (a completions request cannot be continued by it).
    pub fn needs_messages(self) -> bool {
        matches!(self, TargetKind::ChatPrefix)
    }

    /// The name policies use.
    pub fn policy_name(self) -> &'static str {
        match self {
            TargetKind::LlamaCpp => "llama_cpp",
            TargetKind::Vllm => "vllm",
            TargetKind::OpenaiText => "openai_text",
            TargetKind::ChatPrefix => "chat_prefix",
            TargetKind::OpenAiChat => "openai_chat",
        }
    }
}

/// What the text-level kinds need beyond the connection.
#[derive(Debug, Clone, Default)]
pub struct TextSettings {
    /// How a `chat_prefix` target is told to continue.
    pub prefix_style: PrefixStyle,
    /// The target's own chat template, for an `openai_text` target of another model family
    /// (otherwise the prompt is the draft's rendering).
    pub chat_template: Option<Arc<ChatTemplate>>,
}

/// Builds a client of the given kind. Text-level kinds re-tokenize with the draft's
/// `tokenizer`.
pub fn build(
    kind: TargetKind,
    cfg: TargetConfig,
    tokenizer: &Tokenizer,
    text: &TextSettings,
) -> Result<Arc<dyn TargetClient>, TargetError> {
    Ok(match kind {
        TargetKind::LlamaCpp => Arc::new(LlamaCppTarget::new(cfg)?),
        TargetKind::Vllm => Arc::new(OpenAiCompletionsTarget::new(cfg)?),
        TargetKind::OpenaiText => Arc::new(
            OpenAiTextTarget::new(cfg, tokenizer.clone())?
                .with_template(text.chat_template.clone()),
        ),
        TargetKind::ChatPrefix => Arc::new(ChatPrefixTarget::new(
            cfg,
            tokenizer.clone(),
            text.prefix_style,
        )?),
        TargetKind::OpenAiChat => Arc::new(ChatOnlyTarget::new(cfg)?),
    })
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

/// Maps a failed send to the error the engine reports.
pub(crate) fn send_error(e: &reqwest::Error, cfg: &TargetConfig, url: &str) -> TargetError {
    if let Some(t) = tls_failure(e) {
        TargetError::Tls(t)
    } else if e.is_timeout() {
        TargetError::Timeout(cfg.timeout)
    } else {
        TargetError::Unreachable {
            url: url.to_string(),
            reason: without_url(e),
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
/// with a `finish_reason`, or llama.cpp's native `"stop": true`.
fn says_finished(v: &serde_json::Value) -> bool {
    v["stop"].as_bool() == Some(true)
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

pub(crate) fn join(base: &str, path: &str) -> String {
    format!(
        "{}/{}",
        base.trim_end_matches('/'),
        path.trim_start_matches('/')
    )
}
