//! The validated policy: typed values the gateway runs on, which the validator builds from the
//! [`super::raw`] form and the raw form is written back from.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use approxy_verifier::policy::{
    BailoutBudget, BusyRates, CacheHints, CacheRules, Correction, Fence, JsonLayout,
    JsonThresholds, PrefixStyle, Pricing, TargetKind, Verification, VerifierChoice,
};

use super::raw;

/// Everything wrong with a policy file.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {}", .problems.join("; "))]
pub struct PolicyError {
    /// The file.
    pub path: String,
    /// One entry per problem.
    pub problems: Vec<String>,
}

/// The target section, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct TargetPolicy {
    /// Client kind.
    pub kind: TargetKind,
    /// As configured.
    pub base_url: String,
    /// Environment variable name of the API key.
    pub api_key_env: Option<String>,
    /// Per-call timeout.
    pub timeout: Duration,
    /// Retries.
    pub retries: u32,
    /// First backoff.
    pub backoff: Duration,
    /// Extra CA certificates (PEM) trusted for the target.
    pub ca_file: Option<PathBuf>,
    /// The target model's name, when the policy gives it.
    pub model: Option<String>,
    /// How a `chat_prefix` target continues an answer.
    pub prefix_style: PrefixStyle,
    /// The target's own chat template (`openai_text`), a file that compiled when the policy
    /// was validated.
    pub chat_template: Option<PathBuf>,
    /// Cache hints sent with engine calls.
    pub cache_hints: CacheHints,
    /// Whether `HTTP_PROXY`/`HTTPS_PROXY` apply to calls to the target.
    pub use_env_proxy: bool,
    /// How the target's prompt cache serves re-sent prefixes.
    pub cache_rules: CacheRules,
    /// The policy's word on the target's context (positions per request), over what the
    /// target says.
    pub context_length: Option<usize>,
    /// Where a busy-priced model's target time starts from before the target has reported
    /// any (`target.busy_prior`).
    pub busy_prior: BusyRates,
}

impl TargetPolicy {
    /// Base URL of the target's OpenAI-compatible API (ends in `/v1`), for passthrough.
    pub fn openai_base(&self) -> String {
        let b = self.base_url.trim_end_matches('/');
        format!("{b}{}", self.kind.abilities().openai_suffix)
    }
}

/// The gateway section, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct GatewayPolicy {
    /// Whether clients need a key.
    pub auth: Auth,
    /// Environment variable with client keys.
    pub api_keys_env: Option<String>,
    /// Body limit.
    pub max_body_bytes: usize,
    /// Concurrency limit.
    pub max_concurrent_requests: usize,
    /// Time to produce a response head.
    pub request_timeout: Duration,
    /// Time a new connection has to send its first request's headers (HTTP/1 and HTTP/2), and
    /// an HTTP/1 request its headers.
    pub header_timeout: Duration,
    /// Time a request's whole body has to arrive.
    pub body_timeout: Duration,
    /// Longest pause while a request's body arrives.
    pub body_idle_timeout: Duration,
    /// Most answers (`n`) one request may ask for.
    pub max_n: u32,
    /// Largest passed-through answer in bytes: a longer one is cut off with an error.
    pub max_response_bytes: usize,
    /// Connections open at once.
    pub max_connections: usize,
    /// Time a connection may stay open with no request in flight after a response.
    pub idle_timeout: Duration,
    /// Connections open at once per client address; 0 for no cap.
    pub max_connections_per_ip: usize,
    /// Time a stream waits for a client that stopped reading.
    pub write_idle_timeout: Duration,
    /// Largest `max_tokens`.
    pub max_tokens_limit: u32,
    /// Default `max_tokens`.
    pub default_max_tokens: u32,
}

impl GatewayPolicy {
    /// Keeps `running`'s values of the keys read once, at start-up (the request slots, the
    /// connection watcher's caps and deadlines, which include the write wait), and names those
    /// this policy would have changed. The policy a reload swaps in so says what runs, and the
    /// next reload compares with that.
    pub fn keep_start_up_keys(&mut self, running: &GatewayPolicy) -> Vec<&'static str> {
        let mut changed = Vec::new();
        // One line per key: the field is its key's name, compared and kept together.
        macro_rules! keep {
            ($($field:ident),* $(,)?) => {$(
                if self.$field != running.$field {
                    changed.push(concat!("gateway.", stringify!($field)));
                    self.$field = running.$field;
                }
            )*};
        }
        keep!(
            max_concurrent_requests,
            max_connections,
            max_connections_per_ip,
            header_timeout,
            idle_timeout,
            write_idle_timeout,
        );
        changed
    }
}

/// What passthrough may forward, validated.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PassthroughPolicy {
    /// `METHOD /v1/path` routes beyond the served ones.
    pub extra_routes: Vec<String>,
    /// What a passed-through chat request with special-token text in its messages gets.
    pub special_token_text: SpecialTokenText,
}

/// Special-token text (`<|im_start|>`) in the messages of a request that passes through: the
/// target would read it as control tokens, where the approximate path keeps it as text.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SpecialTokenText {
    /// 400 naming the message (the default).
    #[default]
    Refuse,
    /// Sent as it is: for a target that treats such text as text, or a deployment that wants
    /// clients to write their own turns.
    Forward,
}

/// Client authentication.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Auth {
    /// Every request needs one of the keys in `gateway.api_keys_env` (which must hold one).
    Keys,
    /// No keys: only when the policy says so.
    None,
}

/// The draft section, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct DraftPolicy {
    /// Explicit model directory, if any.
    pub model_dir: Option<PathBuf>,
    /// Draft identity for learned-verifier checks.
    pub model_sha256: Option<String>,
    /// Workers.
    pub workers: usize,
    /// Threads per worker.
    pub threads_per_worker: usize,
    /// Spin-wait between runs.
    pub spin_wait: bool,
    /// Streams per worker, batched.
    pub streams_per_worker: usize,
    /// Each stream's draft speed floor, tokens a second (0: none).
    pub min_stream_speed: f64,
    /// MiB a worker's batch cache may reach.
    pub kv_memory_mb: usize,
}

/// How a model is served.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Draft + verify + target on rejection.
    Approximate,
    /// Straight to the target.
    Passthrough,
}

/// A prompt's kind, code or chat: what a policy may set its dial per (detected by
/// `crate::request::prompt_kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PromptKind {
    /// Asks for, about or around source code.
    Code,
    /// Everything else.
    Chat,
}

impl PromptKind {
    /// The name policies, calibration files and `usage.approxy.prompt_kind` use.
    pub fn name(self) -> &'static str {
        match self {
            Self::Code => "code",
            Self::Chat => "chat",
        }
    }
}

/// A threshold per prompt kind.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KindThresholds {
    /// For prompts about code.
    pub code: f32,
    /// For the rest.
    pub chat: f32,
}

impl KindThresholds {
    /// The same threshold for every kind.
    pub fn all(t: f32) -> Self {
        Self { code: t, chat: t }
    }

    /// The threshold for a prompt of `kind`.
    pub fn get(&self, kind: PromptKind) -> f32 {
        match kind {
            PromptKind::Code => self.code,
            PromptKind::Chat => self.chat,
        }
    }

    /// As a policy file writes it.
    pub fn raw(&self) -> raw::RawPerKind {
        if self.code == self.chat {
            raw::RawPerKind::All(self.code)
        } else {
            raw::RawPerKind::ByKind(raw::RawByKind {
                code: self.code,
                chat: self.chat,
            })
        }
    }
}

impl std::fmt::Display for KindThresholds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.code == self.chat {
            write!(f, "{:.2}", self.code)
        } else {
            write!(f, "{:.2} on code, {:.2} on chat", self.code, self.chat)
        }
    }
}

/// Which cost guard a model runs (see `approxy_verifier::request::Guard`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum GuardPolicy {
    /// Never hands off for cost.
    Off,
    /// No request above `max_cost_ratio` times passthrough, worst case.
    Strict,
    /// Calls that are expected to pay for themselves; the model's traffic at or below
    /// `max_cost_ratio` over `window`; no request above `hard_cap`.
    Budget {
        /// Per-request bound.
        hard_cap: f64,
        /// The traffic's window.
        window: std::time::Duration,
    },
}

impl GuardPolicy {
    /// Its name in a policy file.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::Strict => "strict",
            Self::Budget { .. } => "budget",
        }
    }
}

/// One model's policy.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelPolicy {
    /// Mode.
    pub mode: Mode,
    /// Verifier.
    pub verifier: VerifierChoice,
    /// Threshold per prompt kind (resolved from the quality target when one was given; the
    /// same for both kinds when the policy gives one value).
    pub threshold: KindThresholds,
    /// How draft tokens are checked (resolved with the target kind: windows where it can
    /// score them).
    pub verification: Verification,
    /// What a rejection asks the target for.
    pub correction: Correction,
    /// Largest cost relative to passthrough: per request under the strict guard, over the
    /// model's traffic under the budget guard.
    pub max_cost_ratio: f64,
    /// Which cost guard decides when the target takes over.
    pub guard: GuardPolicy,
    /// Bail-out budget.
    pub bailout: Option<BailoutBudget>,
    /// Allowed per-request threshold range.
    pub threshold_override: (f32, f32),
    /// How the target's work is priced for this model.
    pub price: Pricing,
    /// When approxy cannot answer (its engine fails before the first token, the tokenizer
    /// check cannot run, the prompt is beyond the draft), pass the request to the target
    /// instead of answering with an error.
    pub fallback_to_passthrough: bool,
    /// Most target calls one request may make (the last writes the rest).
    pub max_target_calls: Option<u32>,
    /// Keep drafting along the draft's guess while a target call is in flight.
    pub overlap: bool,
    /// Most tokens prompt lookup proposes to the draft at once (0: off).
    pub prompt_lookup: usize,
    /// Most draft tokens one window holds (targets that score windows).
    pub window_max: u32,
    /// Under a JSON grammar, the thresholds by place in the answer (no client threshold
    /// asked for); `None`: the kind's threshold everywhere.
    pub structured_threshold: Option<JsonThresholds>,
    /// How a JSON answer under a schema or JSON mode is laid out.
    pub json_layout: JsonLayout,
    /// Whether such an answer is written inside a Markdown fence, which the client is not sent.
    pub json_fence: Fence,
}

/// A validated policy.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    /// Source file.
    pub path: PathBuf,
    /// Target.
    pub target: TargetPolicy,
    /// Gateway.
    pub gateway: GatewayPolicy,
    /// Draft.
    pub draft: DraftPolicy,
    /// Passthrough.
    pub passthrough: PassthroughPolicy,
    /// Models by id; `"*"` is the fallback.
    pub models: BTreeMap<String, ModelPolicy>,
}

impl Policy {
    /// The policy for a model id: its own entry, else `"*"`, else none (passthrough).
    pub fn model(&self, id: &str) -> Option<&ModelPolicy> {
        self.model_key(id).and_then(|k| self.models.get(k))
    }

    /// The entry [`Policy::model`] takes a model id's policy from: the id, or `"*"`.
    pub fn model_key<'a>(&'a self, id: &'a str) -> Option<&'a str> {
        if self.models.contains_key(id) {
            Some(id)
        } else {
            self.models.contains_key("*").then_some("*")
        }
    }

    /// Whether any model may run the draft: if none does, the gateway never loads it.
    pub fn needs_draft(&self) -> bool {
        self.target.kind.can_continue() && self.models.values().any(|m| m.mode == Mode::Approximate)
    }
}
