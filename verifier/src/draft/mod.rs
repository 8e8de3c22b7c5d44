//! The local draft model. [`Draft`] is what the decode loop needs of it (one sequence's KV
//! cache: prefill, extend, roll back); [`DraftWorkers`] hands one out per request. The
//! implementation is ONNX Runtime sessions owned by dedicated worker threads ([`pool`]);
//! tests use the scripted one in `crate::testing`.

pub mod batch;
pub mod capacity;
mod gather;
pub mod kv;
pub mod lazy;
pub mod pool;
pub mod rows;
pub mod session;

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use async_trait::async_trait;
use serde::Deserialize;

use crate::error::EngineError;
use crate::logits::LogitScan;

/// Shape facts about the draft, written by the conversion step as `approxy_draft.json`.
#[derive(Debug, Clone, Deserialize)]
pub struct DraftMeta {
    /// Transformer layers (one KV pair each).
    pub num_hidden_layers: usize,
    /// KV heads.
    pub num_key_value_heads: usize,
    /// Per-head dimension.
    pub head_dim: usize,
    /// Width of the `hidden_states` rows.
    pub hidden_size: usize,
    /// Vocabulary size of the logits.
    pub vocab_size: usize,
    /// End-of-sequence token text.
    pub eos_token: Option<String>,
    /// Positions the model takes (prompt and answer together), from `genai_config.json`.
    #[serde(default = "default_context_length")]
    pub context_length: usize,
    /// The ONNX builder's `--precision` for this conversion (absent in conversions from before
    /// it was recorded, which were all the builder's int4 defaults).
    #[serde(default)]
    pub precision: Option<String>,
    /// The builder's `--extra_options` beyond `include_hidden_states=true`.
    #[serde(default)]
    pub extra_options: Vec<String>,
}

/// The build of the conversions that predate the record: the builder's int4 defaults.
pub const LEGACY_DRAFT_BUILD: &str = "int4";

/// The graph the runtime loads from a converted draft's directory: the builder's `model.onnx`
/// with its attention regrouped for batches (`verifier/scripts/regroup_attention.py`, run by
/// `approxy setup`), over the same weights file.
pub const DRAFT_GRAPH: &str = "model-grouped.onnx";

/// The Qwen2.5 family's context, for a model directory that does not say.
fn default_context_length() -> usize {
    32_768
}

impl DraftMeta {
    /// How the weights were converted, e.g. `int4` or `int4 block_size=128`: two conversions
    /// of one GGUF give different logits, so a verifier is bound to this as well as to the
    /// GGUF's sha256.
    pub fn build(&self) -> String {
        let precision = self.precision.as_deref().unwrap_or(LEGACY_DRAFT_BUILD);
        std::iter::once(precision)
            .chain(self.extra_options.iter().map(String::as_str))
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// Reads `approxy_draft.json` from the model directory.
    pub fn load(dir: &Path) -> Result<Self, EngineError> {
        let p = dir.join("approxy_draft.json");
        let bytes =
            std::fs::read(&p).map_err(|e| EngineError::Draft(format!("{}: {e}", p.display())))?;
        let mut meta: Self = serde_json::from_slice(&bytes)
            .map_err(|e| EngineError::Draft(format!("{}: {e}", p.display())))?;
        // The ONNX export's own config holds the context length.
        let genai: Option<serde_json::Value> = std::fs::read(dir.join("genai_config.json"))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok());
        if let Some(n) = genai
            .as_ref()
            .and_then(|g| g["model"]["context_length"].as_u64())
        {
            meta.context_length = usize::try_from(n).unwrap_or(meta.context_length);
        }
        Ok(meta)
    }
}

/// Where the draft comes from and how many resources it may use.
#[derive(Debug, Clone)]
pub struct DraftConfig {
    /// Directory with `model.onnx`, `tokenizer.json`, `approxy_draft.json`.
    pub model_dir: PathBuf,
    /// Path of `libonnxruntime.so`.
    pub onnxruntime_lib: PathBuf,
    /// Worker threads, each with its own session (and so its own copy of the weights).
    pub workers: usize,
    /// Intra-op threads per session.
    pub threads_per_worker: usize,
    /// Let idle intra-op threads spin-wait (lower latency on dedicated cores; starves a
    /// target that shares the cores).
    pub spin_wait: bool,
    /// Streams one worker drafts for at once, in one batch.
    pub streams_per_worker: usize,
    /// The draft speed, tokens a second, below which a worker takes no more streams (0: no
    /// floor).
    pub min_stream_speed: f64,
    /// Bytes one worker's batch cache may grow to before it takes no more streams (one
    /// stream alone is always taken).
    pub kv_bytes_per_worker: usize,
}

impl DraftConfig {
    /// `workers` workers of `threads` threads, one stream each and no floor or memory bound:
    /// what a caller that leases drafts for itself wants (training, benchmarks, tests).
    pub fn one_stream_per_worker(
        model_dir: PathBuf,
        onnxruntime_lib: PathBuf,
        workers: usize,
        threads: usize,
    ) -> Self {
        Self {
            model_dir,
            onnxruntime_lib,
            workers,
            threads_per_worker: threads,
            spin_wait: false,
            streams_per_worker: 1,
            min_stream_speed: 0.0,
            kv_bytes_per_worker: usize::MAX,
        }
    }
}

/// The draft's output at one position.
#[derive(Debug, Clone)]
pub struct PositionOutput {
    /// Raw logits over the vocabulary.
    pub logits: Vec<f32>,
    /// The last hidden state row (shared: the verifier's features hold it without a copy).
    pub hidden: Arc<[f32]>,
    /// The one pass over `logits`, taken when something first reads it.
    scan: OnceLock<LogitScan>,
}

impl PositionOutput {
    /// An output from its logits and hidden row.
    pub fn new(logits: Vec<f32>, hidden: Arc<[f32]>) -> Self {
        Self {
            logits,
            hidden,
            scan: OnceLock::new(),
        }
    }

    /// The top token and softmax statistics here. The sampler's greedy pick, the verifier's
    /// features, the cursor's guess and the answer's context all read this one pass over the
    /// 151,936 logits instead of each making its own.
    pub fn scan(&self) -> &LogitScan {
        self.scan.get_or_init(|| LogitScan::of(&self.logits))
    }

    /// The draft's most likely token (the first on a tie).
    pub fn top1(&self) -> u32 {
        self.scan().top1 as u32
    }
}

/// One generation's exclusive use of a draft model and its KV cache.
#[async_trait]
pub trait Draft: Send + Sync {
    /// Makes the cache hold exactly `prompt` (reusing a common prefix); output at the last
    /// prompt position.
    async fn prefill(&self, prompt: Vec<u32>) -> Result<PositionOutput, EngineError>;
    /// Appends `tokens` (drafted or produced by the target) to the cache; outputs at every
    /// new position when `all`, else at the last only.
    async fn extend(&self, tokens: Vec<u32>, all: bool)
    -> Result<Vec<PositionOutput>, EngineError>;
    /// Drops the newest `n` positions from the cache.
    async fn rollback(&self, n: usize) -> Result<(), EngineError>;
}

/// Draft models a request can lease a stream of, for its whole generation.
pub trait DraftWorkers: Send + Sync {
    /// A draft stream, or `None` at once when none can take one more (the gateway then passes
    /// through instead of queueing). Returned to the set when dropped.
    fn try_lease(&self) -> Option<Box<dyn Draft>>;
    /// [`DraftWorkers::try_lease`] for a stream that may reach `positions` positions (prompt
    /// and answer), which a worker's memory bound counts.
    fn try_lease_for(&self, positions: usize) -> Option<Box<dyn Draft>> {
        let _ = positions;
        self.try_lease()
    }
    /// Streams leased now.
    fn streams(&self) -> usize {
        self.workers() - self.idle()
    }
    /// The most streams the workers take at once.
    fn stream_limit(&self) -> usize {
        self.workers()
    }
    /// Model shape facts.
    fn meta(&self) -> &DraftMeta;
    /// Number of drafts.
    fn workers(&self) -> usize;
    /// Number of drafts with no stream.
    fn idle(&self) -> usize;
    /// Number of drafts whose worker is running (one whose thread ended is never leased).
    fn alive(&self) -> usize {
        self.workers()
    }
    /// Whether the drafts are loaded (see [`lazy`]: a passthrough-only gateway never loads them).
    fn started(&self) -> bool {
        true
    }
    /// Loads and starts the drafts if they are not running yet; blocks while loading.
    fn ensure_started(&self) -> Result<(), EngineError> {
        Ok(())
    }
}
