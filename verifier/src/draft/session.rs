//! One ONNX Runtime session of the draft model plus the KV cache of the sequence it is
//! working on. Not thread-safe by design: a worker thread owns it (see `pool`).

use std::path::Path;
use std::sync::OnceLock;

use ort::session::{IoBinding, Session};
use ort::value::Tensor;

use super::kv::KvCache;
use super::{DraftMeta, PositionOutput};
use crate::error::EngineError;

/// Prompts are run in chunks of this many tokens: a whole long prompt at once would
/// materialise `len x vocab` logits (151,936 floats per position).
const PREFILL_CHUNK: usize = 64;

static ORT_ENV: OnceLock<Result<ort::environment::Environment, String>> = OnceLock::new();

/// ONNX Runtime allows one environment per process; the first caller's library path wins.
fn environment(lib: &Path) -> Result<ort::environment::Environment, EngineError> {
    ORT_ENV
        .get_or_init(|| {
            ort::init_from(lib)
                .map_err(|e| format!("cannot load ONNX Runtime from {}: {e}", lib.display()))?
                .with_name("approxy")
                .build()
                .map_err(|e| e.to_string())
        })
        .clone()
        .map_err(EngineError::Draft)
}

/// The error of work stopped because its caller left; nobody receives it.
fn abandoned() -> EngineError {
    EngineError::Draft("stopped: the request went away".into())
}

/// A loaded draft model and the state of one sequence.
pub struct DraftSession {
    session: Session,
    meta: DraftMeta,
    kv: KvCache,
    /// Tokens whose keys and values are in `kv`, in order.
    tokens: Vec<u32>,
    /// Output at the last position of the most recent prefill, while nothing has run since:
    /// the same prompt again is answered without recomputation, and with exactly the numbers a
    /// fresh prefill gives.
    last: Option<PositionOutput>,
    /// Leading positions whose keys and values came from full prefill chunks aligned to
    /// multiples of `PREFILL_CHUNK`: exactly what a cold prefill computes, so reusable.
    aligned_upto: usize,
    kv_names: Vec<(String, String, String, String)>,
    /// Inputs and outputs bound to the session; the cache buffers stay bound between runs.
    binding: IoBinding,
    /// The cache generation whose buffers are bound.
    bound_generation: Option<u64>,
}

impl DraftSession {
    /// Loads `model.onnx` from `dir` with `threads` intra-op threads. With `spin` false the
    /// threads sleep between runs instead of spin-waiting: when the draft shares cores with a
    /// local target, spinning threads starve it (measured here: llama-server fell from about
    /// 13 to under 2 tokens/s per slot while a draft worker spun).
    pub fn load(
        lib: &Path,
        dir: &Path,
        meta: DraftMeta,
        threads: usize,
        spin: bool,
    ) -> Result<Self, EngineError> {
        let env = environment(lib)?;
        let session = Session::builder(&env)
            .map_err(|e| EngineError::Draft(e.to_string()))?
            .with_intra_threads(threads)
            .map_err(|e| EngineError::Draft(e.to_string()))?
            .with_intra_op_spinning(spin)
            .map_err(|e| EngineError::Draft(e.to_string()))?
            .commit_from_file(dir.join("model.onnx"))
            .map_err(|e| {
                EngineError::Draft(format!("{}: {e}", dir.join("model.onnx").display()))
            })?;
        let kv_names = (0..meta.num_hidden_layers)
            .map(|i| {
                (
                    format!("past_key_values.{i}.key"),
                    format!("past_key_values.{i}.value"),
                    format!("present.{i}.key"),
                    format!("present.{i}.value"),
                )
            })
            .collect();
        let kv = KvCache::new(
            meta.num_hidden_layers,
            meta.num_key_value_heads,
            meta.head_dim,
        );
        let binding = session.create_binding()?;
        Ok(Self {
            session,
            meta,
            kv,
            tokens: Vec::new(),
            last: None,
            aligned_upto: 0,
            kv_names,
            binding,
            bound_generation: None,
        })
    }

    /// Tokens currently cached.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Drops the newest `n` cached positions.
    pub fn rollback(&mut self, n: usize) {
        self.kv.rollback(n);
        self.tokens.truncate(self.kv.len());
        self.aligned_upto = self.aligned_upto.min(self.kv.len());
        self.last = None;
    }

    /// Makes the cache hold exactly `prompt` and returns the output at its last position.
    ///
    /// The result depends on the prompt only, never on what was cached before: ONNX Runtime's
    /// int4 kernels give slightly different numbers for different batch shapes, and near-ties
    /// in the logits would otherwise make the same request answer differently depending on
    /// history. So the prompt runs in chunks aligned to absolute multiples of `PREFILL_CHUNK`,
    /// the last position always runs alone (as decode steps do), and only whole aligned chunks
    /// computed this way are reused from a previous prompt.
    ///
    /// `gone` is asked between chunks: when it says the caller has left (a client that
    /// disconnected during a long prompt), the work stops there and the worker is free at once.
    /// What was computed stays cached and reusable, as whole aligned chunks.
    pub fn prefill(
        &mut self,
        prompt: &[u32],
        gone: &dyn Fn() -> bool,
    ) -> Result<PositionOutput, EngineError> {
        let Some((&last, body)) = prompt.split_last() else {
            return Err(EngineError::Draft("empty prompt".into()));
        };
        if self.tokens == prompt
            && let Some(out) = &self.last
        {
            return Ok(out.clone());
        }
        let common = self
            .tokens
            .iter()
            .zip(body)
            .take_while(|(a, b)| a == b)
            .count();
        let keep = common.min(self.aligned_upto) / PREFILL_CHUNK * PREFILL_CHUNK;
        self.rollback(self.tokens.len() - keep);
        for chunk in body[keep..].chunks(PREFILL_CHUNK) {
            if gone() {
                // Only whole chunks have run so far, each starting at a multiple of the chunk.
                self.aligned_upto = self.tokens.len();
                return Err(abandoned());
            }
            self.run(chunk, false)?;
        }
        self.aligned_upto = body.len() / PREFILL_CHUNK * PREFILL_CHUNK;
        let out = self
            .run(&[last], false)?
            .pop()
            .ok_or_else(|| EngineError::Draft("no output".into()))?;
        self.last = Some(out.clone());
        Ok(out)
    }

    /// Runs `tokens` after what is cached, appends them to the cache and returns the output
    /// at every new position (`all`) or only at the last. `gone` as in [`DraftSession::prefill`].
    pub fn extend(
        &mut self,
        tokens: &[u32],
        all: bool,
        gone: &dyn Fn() -> bool,
    ) -> Result<Vec<PositionOutput>, EngineError> {
        let mut outs = Vec::new();
        for chunk in tokens.chunks(PREFILL_CHUNK) {
            if gone() {
                return Err(abandoned());
            }
            let mut o = self.run(chunk, all)?;
            if all {
                outs.append(&mut o);
            } else {
                outs = o;
            }
        }
        Ok(outs)
    }

    /// Keeps at most the first `max_positions` of the cache (the part a later prompt can reuse)
    /// and frees the rest: what an idle worker holds stays bounded.
    pub fn trim(&mut self, max_positions: usize) {
        if self.kv.len() > max_positions {
            self.rollback(self.kv.len() - max_positions);
        }
        if let Err(e) = self.kv.shrink() {
            // Keeping the larger buffers is safe; only memory is not given back.
            tracing::warn!(error = %e, "could not shrink the draft's KV cache");
        }
    }

    /// Bytes the KV cache holds.
    pub fn kv_bytes(&self) -> usize {
        self.kv.capacity_bytes()
    }

    /// Forgets everything: an empty cache and token list, nothing aligned. After a failed step
    /// (the cache was moved into the run's inputs and not put back) the next prefill starts over.
    pub fn reset(&mut self) {
        self.kv.clear();
        self.tokens.clear();
        self.last = None;
        self.aligned_upto = 0;
    }

    /// One forward pass over `chunk`; on any failure the session is reset, so the cache, the
    /// token list and the aligned length never disagree.
    fn run(&mut self, chunk: &[u32], all: bool) -> Result<Vec<PositionOutput>, EngineError> {
        let r = self.run_inner(chunk, all);
        if r.is_err() {
            self.reset();
        }
        r
    }

    fn run_inner(&mut self, chunk: &[u32], all: bool) -> Result<Vec<PositionOutput>, EngineError> {
        let past = self.kv.len();
        let total = past + chunk.len();
        let s = chunk.len();
        self.kv.reserve(total)?;
        if self.bound_generation != Some(self.kv.generation()) {
            // New buffers: each layer's one buffer is both the past input and the present
            // output, so the model appends in place.
            for ((k, v), (kn, vn, pk, pv)) in self.kv.buffers_mut().iter_mut().zip(&self.kv_names) {
                self.binding.bind_input(kn.as_str(), &*k)?;
                self.binding.bind_input(vn.as_str(), &*v)?;
                self.binding.bind_output(pk.as_str(), k)?;
                self.binding.bind_output(pv.as_str(), v)?;
            }
            self.bound_generation = Some(self.kv.generation());
        }
        let ids: Vec<i64> = chunk.iter().map(|&t| i64::from(t)).collect();
        self.binding.bind_input(
            "input_ids",
            &Tensor::from_array((vec![1i64, s as i64], ids))?,
        )?;
        // Its length is what tells the model how many cached positions are real.
        self.binding.bind_input(
            "attention_mask",
            &Tensor::from_array((vec![1i64, total as i64], vec![1i64; total]))?,
        )?;
        // Their shapes change with the chunk, so they are bound afresh each run (a bound output
        // otherwise keeps the previous run's buffer and shape).
        let cpu = ort::memory::MemoryInfo::default();
        self.binding.bind_output_to_device("logits", &cpu)?;
        self.binding.bind_output_to_device("hidden_states", &cpu)?;
        let outputs = self.session.run_binding(&self.binding)?;
        let (lshape, logits) = outputs["logits"].try_extract_tensor::<f32>()?;
        let (_, hidden) = outputs["hidden_states"].try_extract_tensor::<f32>()?;
        let vocab = usize::try_from(lshape[2])
            .map_err(|_| EngineError::Draft("bad logits shape".into()))?;
        let hs = self.meta.hidden_size;
        let first = if all { 0 } else { s - 1 };
        let outs: Vec<PositionOutput> = (first..s)
            .map(|p| {
                PositionOutput::new(
                    logits[p * vocab..(p + 1) * vocab].to_vec(),
                    hidden[p * hs..(p + 1) * hs].into(),
                )
            })
            .collect();
        drop(outputs);
        self.tokens.extend_from_slice(chunk);
        self.kv.set_len(total);
        self.last = None;
        Ok(outs)
    }
}
