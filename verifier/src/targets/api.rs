//! What a target client is: the trait every kind implements and the requests and answers it
//! trades in (continuations, streamed chunks, windows, the target's facts and timings).

use std::pin::Pin;
use std::sync::Arc;

use async_trait::async_trait;
use futures::Stream;

use crate::error::TargetError;
use crate::sampling::SamplingParams;
use crate::template::ChatMessage;

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
    /// The answer this call continues ([`next_answer`]; the same for each of its calls), for a
    /// target that keeps an answer's cache in one place (llama-server's slots); `None` for a
    /// call of its own.
    pub answer: Option<u64>,
    /// The tokens the next one must be among (empty: any), where a grammar allows only a few
    /// and refused the target's token and its top entries, or the draft's own choice: the
    /// target answers with its own best of them, as a target constraining its own answer
    /// would. Asked of a target only where [`TargetClient::picks_among_tokens`] says it keeps
    /// to them, and for one token.
    pub allowed: Vec<u32>,
}

/// A new answer's id, unique in this process.
pub fn next_answer() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
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
            answer: None,
            allowed: Vec::new(),
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
    /// Prompt tokens the target reports its prefix cache served, when it says.
    pub cached_prompt_tokens: Option<u32>,
    /// When the call read stale rows from the cache and was made again without reading it
    /// (the whole prefix computed): the prompt tokens the first call's cache served. Both
    /// calls are billed.
    pub stale_cached: Option<u32>,
    /// The call was refused (vLLM answers 400 when a stale row holds a value JSON cannot
    /// carry) and made again through the route that recomputes the prefix: both calls are
    /// billed, the first at the cache rules' estimate.
    pub refused: bool,
}

/// How a target scores windows: the endpoint, and whether a window's prefix is served from
/// its cache or computed again each time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowRoute {
    /// The path the window calls go to.
    pub endpoint: &'static str,
    /// Whether the prefix comes from the target's cache.
    pub reads_cache: bool,
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
    /// When [`ContinuationRequest::top_logprobs`] asked for them and the target gives them: at
    /// each of `tokens`, the target's top (token, log-probability) entries.
    pub top_logprobs: Vec<Vec<(u32, f32)>>,
}

/// A continuation arriving as the target generates it. Dropping it closes the connection,
/// which stops the generation upstream (llama.cpp and vLLM abort a request whose client has
/// gone).
pub type TokenStream = Pin<Box<dyn Stream<Item = Result<StreamChunk, TargetError>> + Send>>;

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
            top_logprobs: c.top_logprobs,
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
    /// is, through its token-in endpoint where the server offers it; through `/v1/completions`
    /// a request that asks for prompt log-probabilities skips reading the prefix cache
    /// (vllm/sampling_params.py, `skip_reading_prefix_cache`), so the whole prefix is computed
    /// and billed as new input every time. Until [`TargetClient::window_route`] has found out,
    /// what it says is the costlier case.
    fn windows_read_cache(&self) -> bool {
        true
    }
    /// How this target scores windows, asking the server once where that depends on how it
    /// was started (vLLM's token-in endpoint); `Ok(None)` where it scores none. An error:
    /// the server did not say (not up yet); ask again later.
    async fn window_route(&self) -> Result<Option<WindowRoute>, TargetError> {
        Ok(None)
    }
    /// Whether a continuation keeps its token to [`ContinuationRequest::allowed`], choosing
    /// its own best among them. Where not, the engine does not ask (the draft writes there).
    fn picks_among_tokens(&self) -> bool {
        false
    }
    /// Tokenizes `text` with the target's tokenizer, when the target offers that (`None` when not).
    async fn tokenize(&self, text: &str) -> Result<Option<Vec<u32>>, TargetError>;
    /// What the target says of itself (nothing, by default).
    async fn facts(&self) -> Result<TargetFacts, TargetError> {
        Ok(TargetFacts::default())
    }
    /// Ok when the target answers its health check; the error says why not.
    async fn health(&self) -> Result<(), TargetError>;
    /// `answer` makes no more calls: what the target client kept for it may go.
    fn answer_done(&self, _answer: u64) {}
    /// Whether [`TargetClient::warm`] sends anything: only a target that keeps an answer's
    /// cache in one place it can name (llama-server's slots), where the policy asks.
    fn warms(&self) -> bool {
        false
    }
    /// Computes `req.prefix` into the cache the answer's calls will read, generating nothing,
    /// while the draft writes: the answer's first call then computes only what was drafted.
    /// `Ok(None)` when nothing was sent (no place to warm: every slot is held). The answer
    /// (`req.answer`) is the one whose calls follow.
    async fn warm(&self, _req: &ContinuationRequest) -> Result<Option<Continuation>, TargetError> {
        Ok(None)
    }
}

/// What a target says of itself, each `None` where it does not say.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TargetFacts {
    /// The most positions (prompt and answer together) one request may take.
    pub context_length: Option<usize>,
    /// Whether it takes images in messages.
    pub images: Option<bool>,
    /// Whether it takes audio in messages.
    pub audio: Option<bool>,
    /// The most answers it writes at once, where it has such a bound (llama-server's slots:
    /// it refuses a request whose `n` is over them).
    pub parallel: Option<usize>,
}
