//! The local draft model: ONNX Runtime sessions owned by dedicated worker threads.

pub mod kv;
pub mod pool;
pub mod session;

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::error::EngineError;

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
}

impl DraftMeta {
    /// Reads `approxy_draft.json` from the model directory.
    pub fn load(dir: &Path) -> Result<Self, EngineError> {
        let p = dir.join("approxy_draft.json");
        let bytes = std::fs::read(&p).map_err(|e| EngineError::Draft(format!("{}: {e}", p.display())))?;
        serde_json::from_slice(&bytes).map_err(|e| EngineError::Draft(format!("{}: {e}", p.display())))
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
}

/// The draft's output at one position.
#[derive(Debug, Clone)]
pub struct PositionOutput {
    /// Raw logits over the vocabulary.
    pub logits: Vec<f32>,
    /// The last hidden state row.
    pub hidden: Vec<f32>,
}
