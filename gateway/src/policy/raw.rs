//! The policy file exactly as written: every table rejects unknown keys, so a typo is an
//! error instead of a silently ignored setting. The same types serialise, so tools that write
//! policies (the benchmark) go through serde, and what they write reads back the same.

use std::collections::BTreeMap;

use approxy_verifier::policy::Pricing;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Top level.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawPolicy {
    /// Where the target is.
    pub target: RawTarget,
    /// Listener, auth and limits.
    #[serde(default)]
    pub gateway: RawGateway,
    /// Draft runtime.
    #[serde(default)]
    pub draft: RawDraft,
    /// What passthrough may forward.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub passthrough: Option<RawPassthrough>,
    /// Per model id (`"*"` matches any model without its own entry).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub models: BTreeMap<String, RawModel>,
}

/// `[target]`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawTarget {
    /// `llama_cpp`, `vllm` (or its earlier name `openai`), `sglang`, `openai_text`,
    /// `chat_prefix` or `openai_chat`.
    pub kind: String,
    /// llama.cpp and SGLang: the server root; the others: the base URL ending in `/v1`.
    pub base_url: String,
    /// Name of the environment variable holding the target's API key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api_key_env: Option<String>,
    /// Per-call timeout, e.g. "120s".
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    /// Retries on connect errors and 5xx.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retries: Option<u32>,
    /// First retry backoff, e.g. "200ms".
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backoff: Option<String>,
    /// PEM file of CA certificates to trust for an `https://` target with a private CA.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<String>,
    /// The target model's name: a learned verifier is calibrated for one draft–target pair,
    /// and is used only when this names its target.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// `openai_text` only: the target's own chat template (a Jinja file), for a model of
    /// another family than the draft's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chat_template: Option<String>,
    /// `chat_prefix` only: `prefix` (DeepSeek, Mistral), `continue_final_message` (vLLM) or
    /// `prefill` (llama-server).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefix_style: Option<String>,
    /// Reach the target through the proxy in `HTTP_PROXY`/`HTTPS_PROXY` (default: no).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub use_env_proxy: Option<bool>,
    /// The provider's prompt cache: hints sent with engine calls, and its rules.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache: Option<RawCache>,
    /// Positions (prompt and answer) one request may take at the target, when the target does
    /// not say (llama-server's `/props` and vLLM's model list do).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub context_length: Option<usize>,
    /// Where the target's time is learned from under `price = "busy"`: milliseconds per
    /// computed prompt token, per generated token and per call (default: the CPU
    /// llama-server the run command starts, 10.6, 37.5 and 0).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub busy_prior: Option<RawBusyRates>,
}

/// `[target.busy_prior]`: milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawBusyRates {
    /// Per prompt token the target computes (its cache does not serve it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefill_ms: Option<f64>,
    /// Per token it generates.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub generate_ms: Option<f64>,
    /// Per call, whatever its length.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub call_ms: Option<f64>,
}

/// `[target.cache]`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawCache {
    /// Send `prompt_cache_key` and a stable `user` with engine calls.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<bool>,
    /// Header that pins a conversation to one replica (Fireworks: `x-session-affinity`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub affinity_header: Option<String>,
    /// Keep each answer's calls on one llama-server slot (`id_slot`); the server's RAM prompt
    /// cache must be off (`--cache-ram 0`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slots: Option<bool>,
    /// Send each answer's prompt to its slot as the answer starts, computed while the draft
    /// writes (needs `slots`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warm: Option<bool>,
    /// Shortest prefix the cache serves (OpenAI: 1024).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_tokens: Option<u64>,
    /// Granularity of a cache hit in tokens (OpenAI: 128; vLLM: 16).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub block: Option<u64>,
}

/// `[passthrough]`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawPassthrough {
    /// Routes forwarded beyond the ones approxy serves, as `"METHOD /v1/path"` (`/*` at the end
    /// covers everything below).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extra_routes: Vec<String>,
    /// `refuse` (the default) or `forward`: a passed-through chat request whose messages hold
    /// special-token text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub special_token_text: Option<String>,
}

/// `[gateway]`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawGateway {
    /// `keys` (the default: clients need a key from `api_keys_env`) or `none` (no auth, said
    /// explicitly).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auth: Option<String>,
    /// Environment variable with comma-separated client keys.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api_keys_env: Option<String>,
    /// Largest request body in bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_body_bytes: Option<usize>,
    /// Requests in flight before new ones get 429.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_concurrent_requests: Option<usize>,
    /// Time a connection has to send a request's headers, e.g. "10s" (start-up setting).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub header_timeout: Option<String>,
    /// Time a request's whole body has to arrive, e.g. "30s".
    #[serde(skip_serializing_if = "Option::is_none")]
    pub body_timeout: Option<String>,
    /// Longest pause while a request's body arrives, e.g. "10s".
    #[serde(skip_serializing_if = "Option::is_none")]
    pub body_idle_timeout: Option<String>,
    /// Most answers (`n`) one request may ask for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_n: Option<u32>,
    /// Largest passed-through answer in bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_response_bytes: Option<usize>,
    /// Connections open at once (start-up setting).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_connections: Option<usize>,
    /// Time a connection may stay open without a request in flight after its last response,
    /// e.g. "60s" (start-up setting).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idle_timeout: Option<String>,
    /// Connections one client address may hold open at once; 0 for no cap (start-up setting).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_connections_per_ip: Option<usize>,
    /// Time a streamed answer waits for a client that stopped reading before giving up, e.g. "60s".
    #[serde(skip_serializing_if = "Option::is_none")]
    pub write_idle_timeout: Option<String>,
    /// Time limit to produce a response (head), e.g. "300s"; at least 1 s.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_timeout: Option<String>,
    /// Largest `max_tokens` a request may ask for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_tokens_limit: Option<u32>,
    /// `max_tokens` when the request gives none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default_max_tokens: Option<u32>,
}

/// `[draft]`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawDraft {
    /// Directory of the ONNX draft; default `$APPROXY_HOME/models/draft-onnx`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model_dir: Option<String>,
    /// sha256 identifying the draft (default: the pinned draft GGUF it was converted from).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model_sha256: Option<String>,
    /// Worker threads, each owning a session.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workers: Option<usize>,
    /// Intra-op threads per worker.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub threads_per_worker: Option<usize>,
    /// Spin-wait between runs (only worth it when the draft has cores of its own).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spin_wait: Option<bool>,
    /// Streams one worker drafts for at once, in one batched step (default 8).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub streams_per_worker: Option<usize>,
    /// Tokens a second below which no stream's draft may fall: a worker that would draft
    /// slower than this with one more stream takes no more, and the request passes through
    /// (`draft_saturated`). 0 turns the floor off (default 10).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_stream_speed: Option<f64>,
    /// MiB one worker's batch cache may reach (rows times the longest stream's prompt and
    /// answer) before it takes no more streams; one stream alone is always taken (default 1024).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv_memory_mb: Option<usize>,
}

/// `[models."<id>"]`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawModel {
    /// `approximate` or `passthrough`.
    pub mode: String,
    /// `confidence` or a path to a learned verifier artifact.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verifier: Option<String>,
    /// Fixed threshold in [0, 1], one for all prompts or one per kind...
    #[serde(skip_serializing_if = "Option::is_none")]
    pub threshold: Option<RawPerKind>,
    /// ...or a quality target resolved through `calibration`: one number on the curve of all
    /// held-out prompts, or one per kind, each on that kind's own curve.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_false_accept_rate: Option<RawPerKind>,
    /// Calibration JSON written by `approxy train fit`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub calibration: Option<String>,
    /// The earlier form of `correction = { mode = "fixed", tokens = N }`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub correction_tokens: Option<u32>,
    /// What a rejection asks the target for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub correction: Option<RawCorrection>,
    /// Most target calls one request may make; the last one writes the rest of the answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_target_calls: Option<u32>,
    /// Keep drafting while a target call is in flight.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub overlap: Option<bool>,
    /// Most tokens prompt lookup proposes to the draft at once (0: off).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_lookup: Option<u32>,
    /// Most draft tokens one window holds (targets that score windows).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window_max: Option<u32>,
    /// Under a JSON grammar, the thresholds for tokens that decide a value and for tokens
    /// inside a string value's text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub structured_threshold: Option<RawStructuredThreshold>,
    /// `indented` or `compact`: how a JSON answer under a schema or JSON mode is laid out.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub json_layout: Option<String>,
    /// `always`, `optional` or `never`: whether a JSON answer is written inside a Markdown
    /// fence (taken off the answer).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub json_fence: Option<String>,
    /// `passthrough` (the default) or `error`: what happens when approxy cannot answer a
    /// request it would have answered.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fallback: Option<String>,
    /// `approximate` (the verifier decides), `exact` (the target scores every token),
    /// `relaxed:RULE` (the target scores every token and the rule may keep a draft token it
    /// would not have chosen) or `judged` (the target scores every token and the verifier,
    /// an importance router, may keep a draft token it would not have chosen).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verification: Option<String>,
    /// Hand the rest of an answer to the target before approxy would cost more than this
    /// times passthrough (at `price`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_cost_ratio: Option<f64>,
    /// Bail-out budget.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bailout: Option<RawBailout>,
    /// `[min, max]` allowed for `x-approxy-threshold`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub threshold_override: Option<[f32; 2]>,
    /// How the target's work is priced: `"busy"` (its own time, learned from what it reports:
    /// a self-hosted target) or a price list in USD per million tokens.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub price: Option<RawPricing>,
    /// `budget` (the default: calls expected to pay for themselves, the model's traffic kept
    /// at `max_cost_ratio`), `strict` (no request above `max_cost_ratio`) or `off`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub guard: Option<String>,
    /// Budget guard: no request above this times passthrough.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hard_cost_cap: Option<f64>,
    /// Budget guard: the window the model's traffic is kept within budget over.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub budget_window: Option<String>,
}

/// `correction = { mode = "fixed", tokens = N }` or
/// `{ mode = "span", max_span = N, resync = K, end = "expected" | "resync", ask = "fewest" | "all" }`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawCorrection {
    /// `fixed` or `span`.
    pub mode: String,
    /// Fixed: target tokens per rejection.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokens: Option<u32>,
    /// Span: longest streamed correction.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_span: Option<u32>,
    /// Span: tokens the draft must predict confidently in a row to end it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resync: Option<u32>,
    /// Span: `expected` (the span ends there only when the cost guard would make the next
    /// call) or `resync` (always).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub end: Option<String>,
    /// Span: what each call asks for: `fewest` (the tokens that could end the span, another
    /// call following while it has not ended) or `all` (the rest of the span in one stream,
    /// closed where it ends). By default `fewest` for a target that writes on after a closed
    /// stream (llama-server) unless the model gives a price list, else `all`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ask: Option<String>,
}

/// Bail-out budget.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawBailout {
    /// Decisions looked at.
    pub window: usize,
    /// Fraction of rejections above which the target takes over.
    pub max_rejection_rate: f32,
}

/// Price table.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawPrice {
    /// Input tokens.
    pub input: f64,
    /// Input tokens served from a prompt cache.
    pub cached_input: f64,
    /// Output tokens.
    pub output: f64,
}

/// `price`: a class by name, or a price list.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum RawPricing {
    /// `"busy"`: the target's own time.
    Class(String),
    /// USD per million tokens.
    List(RawPrice),
}

impl From<&Pricing> for RawPricing {
    /// What a validated pricing was read from (tools that write policies).
    fn from(p: &Pricing) -> Self {
        match p {
            Pricing::Tokens(t) => RawPricing::List(RawPrice {
                input: t.input,
                cached_input: t.cached_input,
                output: t.output,
            }),
            Pricing::Busy(_) => RawPricing::Class("busy".into()),
        }
    }
}

/// A dial setting: one value for every prompt, or one per prompt kind.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(
    untagged,
    expecting = "a number, or a table { code = NUMBER, chat = NUMBER }"
)]
pub enum RawPerKind {
    /// Every prompt.
    All(f32),
    /// Per kind, as detected from the prompt.
    ByKind(RawByKind),
}

/// `{ code = ..., chat = ... }`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawByKind {
    /// Prompts about code.
    pub code: f32,
    /// Everything else.
    pub chat: f32,
}

/// `structured_threshold = { value = 0.99, text = 0.8 }`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawStructuredThreshold {
    /// For the tokens that decide a JSON value: its first token, a number's digits, the end of
    /// a string or a container.
    pub value: f32,
    /// For the tokens inside a string value's text.
    pub text: f32,
}
