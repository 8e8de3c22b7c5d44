//! The policy file exactly as written: every table rejects unknown keys, so a typo is an
//! error instead of a silently ignored setting.

use std::collections::BTreeMap;

use serde::Deserialize;

/// Top level.
#[derive(Debug, Deserialize)]
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
    /// Per model id (`"*"` matches any model without its own entry).
    #[serde(default)]
    pub models: BTreeMap<String, RawModel>,
}

/// `[target]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTarget {
    /// `llama_cpp` or `openai`.
    pub kind: String,
    /// llama.cpp: the server root; openai: the base URL ending in `/v1`.
    pub base_url: String,
    /// Name of the environment variable holding the target's API key.
    pub api_key_env: Option<String>,
    /// Per-call timeout, e.g. "120s".
    pub timeout: Option<String>,
    /// Retries on connect errors and 5xx.
    pub retries: Option<u32>,
    /// First retry backoff, e.g. "200ms".
    pub backoff: Option<String>,
    /// PEM file of CA certificates to trust for an `https://` target with a private CA.
    pub ca_file: Option<String>,
}

/// `[gateway]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawGateway {
    /// Environment variable with comma-separated client keys; unset or empty: no auth.
    pub api_keys_env: Option<String>,
    /// Largest request body in bytes.
    pub max_body_bytes: Option<usize>,
    /// Requests in flight before new ones get 429.
    pub max_concurrent_requests: Option<usize>,
    /// Time limit to produce a response (head), e.g. "300s".
    pub request_timeout: Option<String>,
    /// Largest `max_tokens` a request may ask for.
    pub max_tokens_limit: Option<u32>,
    /// `max_tokens` when the request gives none.
    pub default_max_tokens: Option<u32>,
}

/// `[draft]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDraft {
    /// Directory of the ONNX draft; default `$APPROXY_HOME/models/draft-onnx`.
    pub model_dir: Option<String>,
    /// sha256 identifying the draft (default: the pinned draft GGUF it was converted from).
    pub model_sha256: Option<String>,
    /// Worker threads, each owning a session.
    pub workers: Option<usize>,
    /// Intra-op threads per worker.
    pub threads_per_worker: Option<usize>,
    /// Spin-wait between runs (only worth it when the draft has cores of its own).
    pub spin_wait: Option<bool>,
}

/// `[models."<id>"]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawModel {
    /// `approximate` or `passthrough`.
    pub mode: String,
    /// `confidence` or a path to a learned verifier artifact.
    pub verifier: Option<String>,
    /// Fixed threshold in [0, 1]...
    pub threshold: Option<f32>,
    /// ...or a quality target resolved through `calibration`.
    pub max_false_accept_rate: Option<f32>,
    /// Calibration JSON written by `approxy train report`.
    pub calibration: Option<String>,
    /// Tokens taken from the target after each rejection.
    pub correction_tokens: Option<u32>,
    /// Bail-out budget.
    pub bailout: Option<RawBailout>,
    /// `[min, max]` allowed for `x-approxy-threshold`.
    pub threshold_override: Option<[f32; 2]>,
    /// Prices in USD per million tokens.
    pub price: Option<RawPrice>,
}

/// Bail-out budget.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawBailout {
    /// Decisions looked at.
    pub window: usize,
    /// Fraction of rejections above which the target takes over.
    pub max_rejection_rate: f32,
}

/// Price table.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPrice {
    /// Input tokens.
    pub input: f64,
    /// Input tokens served from a prompt cache.
    pub cached_input: f64,
    /// Output tokens.
    pub output: f64,
}
