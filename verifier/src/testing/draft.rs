//! A draft that says a fixed answer with set confidences, and workers that lease it.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;

use crate::draft::{Draft, DraftMeta, DraftWorkers, PositionOutput};
use crate::error::EngineError;

use super::tokens::*;

/// What the scripted draft says: `answer`, then `<|im_end|>`, position by position.
#[derive(Debug, Clone)]
pub struct DraftScript {
    /// Tokens after the prompt.
    pub answer: Vec<u32>,
    /// Top-1 probability at each answer position (missing ones: `default_confidence`).
    pub confidence: Vec<f32>,
    /// Top-1 probability elsewhere.
    pub default_confidence: f32,
}

impl DraftScript {
    /// The draft says `text` (in the tiny tokenizer's bytes) with this confidence everywhere.
    pub fn says(text: &str, confidence: f32) -> Self {
        Self {
            answer: text.bytes().map(u32::from).collect(),
            confidence: Vec::new(),
            default_confidence: confidence,
        }
    }

    pub(super) fn output(&self, seq: &[u32]) -> PositionOutput {
        let i = seq.len() - answer_position(seq);
        let top = self.answer.get(i).copied().unwrap_or(IM_END);
        let p = self
            .confidence
            .get(i)
            .copied()
            .unwrap_or(self.default_confidence)
            .clamp(1e-4, 1.0 - 1e-4);
        // Every other token gets logit 0; the top one the logit that gives it probability p.
        let mut logits = vec![0.0f32; VOCAB];
        logits[top as usize] = (p * (VOCAB as f32 - 1.0) / (1.0 - p)).ln();
        PositionOutput::new(logits, vec![0.0; HIDDEN].into())
    }
}

/// One scripted draft "worker": keeps the sequence it was fed, as a KV cache would.
struct ScriptedDraft {
    script: DraftScript,
    seq: Mutex<Vec<u32>>,
    steps: std::sync::Arc<AtomicUsize>,
    busy: std::sync::Arc<AtomicUsize>,
}

impl ScriptedDraft {
    fn seq(&self) -> std::sync::MutexGuard<'_, Vec<u32>> {
        self.seq
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[async_trait]
impl Draft for ScriptedDraft {
    async fn prefill(&self, prompt: Vec<u32>) -> Result<PositionOutput, EngineError> {
        self.steps.fetch_add(1, Ordering::SeqCst);
        let mut seq = self.seq();
        *seq = prompt;
        Ok(self.script.output(&seq))
    }

    async fn extend(
        &self,
        tokens: Vec<u32>,
        all: bool,
    ) -> Result<Vec<PositionOutput>, EngineError> {
        self.steps.fetch_add(1, Ordering::SeqCst);
        let mut seq = self.seq();
        let mut outs = Vec::new();
        for t in tokens {
            seq.push(t);
            if all {
                outs.push(self.script.output(&seq));
            }
        }
        if !all {
            outs.push(self.script.output(&seq));
        }
        Ok(outs)
    }

    async fn rollback(&self, n: usize) -> Result<(), EngineError> {
        let mut seq = self.seq();
        let keep = seq.len().saturating_sub(n);
        seq.truncate(keep);
        Ok(())
    }
}

impl Drop for ScriptedDraft {
    fn drop(&mut self) {
        self.busy.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Scripted draft workers: `workers` drafts that all follow one script.
#[derive(Debug)]
pub struct ScriptedWorkers {
    script: DraftScript,
    workers: usize,
    busy: std::sync::Arc<AtomicUsize>,
    steps: std::sync::Arc<AtomicUsize>,
    meta: DraftMeta,
}

impl ScriptedWorkers {
    /// The same workers claiming to be a draft converted with this precision and these
    /// builder options (see `DraftMeta::build`).
    pub fn converted_as(mut self, precision: &str, options: &[&str]) -> Self {
        self.meta.precision = Some(precision.into());
        self.meta.extra_options = options.iter().map(|o| o.to_string()).collect();
        self
    }

    /// Workers following `script`.
    pub fn new(script: DraftScript, workers: usize) -> Self {
        let meta = DraftMeta {
            num_hidden_layers: 1,
            num_key_value_heads: 1,
            head_dim: 1,
            hidden_size: HIDDEN,
            vocab_size: VOCAB,
            eos_token: Some("<|im_end|>".into()),
            context_length: CONTEXT,
            precision: None,
            extra_options: Vec::new(),
        };
        Self {
            script,
            workers,
            busy: Default::default(),
            steps: Default::default(),
            meta,
        }
    }

    /// Draft forward passes so far (prefill and extend calls).
    pub fn steps(&self) -> usize {
        self.steps.load(Ordering::SeqCst)
    }
}

impl DraftWorkers for ScriptedWorkers {
    fn try_lease(&self) -> Option<Box<dyn Draft>> {
        let taken = self
            .busy
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |b| {
                (b < self.workers).then_some(b + 1)
            });
        taken.ok()?;
        Some(Box::new(ScriptedDraft {
            script: self.script.clone(),
            seq: Mutex::new(Vec::new()),
            steps: self.steps.clone(),
            busy: self.busy.clone(),
        }))
    }

    fn meta(&self) -> &DraftMeta {
        &self.meta
    }

    fn workers(&self) -> usize {
        self.workers
    }

    fn idle(&self) -> usize {
        self.workers
            .saturating_sub(self.busy.load(Ordering::SeqCst))
    }
}
