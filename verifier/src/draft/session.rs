//! One ONNX Runtime session of the draft model plus the KV cache of the sequence it is
//! working on. Not thread-safe by design: a worker thread owns it (see `pool`).

use std::collections::HashMap;
use std::path::Path;
use std::sync::OnceLock;

use ort::session::{IoBinding, Session};
use ort::value::Tensor;

use super::kv::{CAPACITY_STEP, KvCache, Source};
use super::rows::{Member, Rows, RowsStep, SeqId};
use super::{DRAFT_GRAPH, DraftMeta, PositionOutput};
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
    /// The solo cache's binding.
    solo: Bound,
    /// The batch: one row per sequence a worker drafts for (see `super::batch`), each filled
    /// from the solo cache's prefill.
    rows: KvCache,
    /// The batch's binding.
    rows_bound: Bound,
    /// The caches of sequences out of the batch, by sequence.
    parked: HashMap<u64, KvCache>,
}

/// A binding of the model's inputs and outputs to one cache's buffers; the buffers stay bound
/// between runs.
struct Bound {
    binding: IoBinding,
    /// The cache generation whose buffers are bound.
    generation: Option<u64>,
}

impl Bound {
    fn new(session: &Session) -> Result<Self, EngineError> {
        Ok(Self {
            binding: session.create_binding()?,
            generation: None,
        })
    }

    /// Lets go of the bound buffers. The binding holds them until it is bound anew, which
    /// only the next run does: without this a worker whose streams had all left kept its
    /// last batch's cache (`approxy bench streams`: resident memory after the streams was
    /// what it was with them).
    fn release(&mut self) {
        self.binding.clear();
        self.generation = None;
    }
}

impl DraftSession {
    /// Loads `model.onnx` from `dir` with `threads` intra-op threads. With `spin` false the
    /// threads sleep between runs instead of spin-waiting: when the draft shares cores with a
    /// local target, spinning threads starve it (see policies/README.md, `draft.spin_wait`).
    pub fn load(
        lib: &Path,
        dir: &Path,
        meta: DraftMeta,
        threads: usize,
        spin: bool,
    ) -> Result<Self, EngineError> {
        let env = environment(lib)?;
        let graph = dir.join(DRAFT_GRAPH);
        let session = Session::builder(&env)
            .map_err(|e| EngineError::Draft(e.to_string()))?
            .with_intra_threads(threads)
            .map_err(|e| EngineError::Draft(e.to_string()))?
            .with_intra_op_spinning(spin)
            .map_err(|e| EngineError::Draft(e.to_string()))?
            .commit_from_file(&graph)
            .map_err(|e| EngineError::Draft(format!("{}: {e}", graph.display())))?;
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
        let cache = || {
            KvCache::new(
                meta.num_hidden_layers,
                meta.num_key_value_heads,
                meta.head_dim,
            )
        };
        let (kv, rows) = (cache(), cache());
        let (solo, rows_bound) = (Bound::new(&session)?, Bound::new(&session)?);
        Ok(Self {
            session,
            meta,
            kv,
            tokens: Vec::new(),
            last: None,
            aligned_upto: 0,
            kv_names,
            solo,
            rows,
            rows_bound,
            parked: HashMap::new(),
        })
    }

    /// Tokens currently cached.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Drops the newest `n` cached positions.
    pub fn rollback(&mut self, n: usize) {
        let keep = self.tokens.len().saturating_sub(n);
        self.tokens.truncate(keep);
        self.aligned_upto = self.aligned_upto.min(keep);
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
        if self.tokens.len() > max_positions {
            self.rollback(self.tokens.len() - max_positions);
        }
        let want = if self.tokens.is_empty() {
            0
        } else {
            self.tokens.len().next_multiple_of(CAPACITY_STEP)
        };
        let shrunk = if want < self.kv.capacity() {
            self.solo.release();
            self.kv.resize(usize::from(want > 0), want)
        } else {
            Ok(())
        };
        if let Err(e) = shrunk {
            // Keeping the larger buffers is safe; only memory is not given back.
            tracing::warn!(error = %e, "could not shrink the draft's KV cache");
        }
    }

    /// Bytes the KV cache holds.
    pub fn kv_bytes(&self) -> usize {
        self.kv.capacity_bytes()
    }

    /// Bytes the batch's cache and the parked ones hold.
    pub fn rows_bytes(&self) -> usize {
        self.rows.capacity_bytes()
            + self
                .parked
                .values()
                .map(KvCache::capacity_bytes)
                .sum::<usize>()
    }

    /// Rows and positions per row the batch's cache holds.
    pub fn rows_shape(&self) -> (usize, usize) {
        (self.rows.rows(), self.rows.capacity())
    }

    /// A cache of this model's shape, empty.
    fn cache(&self) -> KvCache {
        KvCache::new(
            self.meta.num_hidden_layers,
            self.meta.num_key_value_heads,
            self.meta.head_dim,
        )
    }

    /// A one-row cache holding the first `len` positions of `src`'s row `row`: a sequence's
    /// own, while it is out of the batch.
    fn own_copy(&self, src: &KvCache, row: usize, len: usize) -> Result<KvCache, EngineError> {
        self.cache().gathered(
            len.max(1).next_multiple_of(CAPACITY_STEP),
            &[Some((src, row, len))],
        )
    }

    /// Makes room in every batch row for `total` positions (see [`KvCache::reserve`]).
    pub fn rows_reserve(&mut self, total: usize) -> Result<(), EngineError> {
        let rows = self.rows.rows();
        self.rows.reserve(rows, total)
    }

    /// Prefills `prompt` in the solo cache as [`DraftSession::prefill`] does (so the result
    /// depends on the prompt only, and a common prefix is reused across requests), then copies
    /// its keys and values into `seq`'s own parked cache.
    pub fn rows_prefill(
        &mut self,
        seq: u64,
        prompt: &[u32],
        gone: &dyn Fn() -> bool,
    ) -> Result<PositionOutput, EngineError> {
        let out = self.prefill(prompt, gone)?;
        let own = self.own_copy(&self.kv, 0, prompt.len())?;
        self.parked.insert(seq, own);
        Ok(out)
    }

    /// Lays the batch out anew (see `super::batch::Rows::arrange`).
    pub fn rows_arrange(
        &mut self,
        members: &[Member],
        park: &[Member],
        capacity: usize,
    ) -> Result<(), EngineError> {
        for p in park {
            let row = p
                .row
                .ok_or_else(|| EngineError::Draft("parking a sequence with no row".into()))?;
            let own = self.own_copy(&self.rows, row, p.len)?;
            self.parked.insert(p.seq, own);
        }
        // The parked caches of the members coming back, taken out first so that every row's
        // source can be borrowed at once.
        let mut back = HashMap::new();
        for m in members.iter().filter(|m| m.row.is_none()) {
            let own = self
                .parked
                .remove(&m.seq)
                .ok_or_else(|| EngineError::Draft(format!("sequence {} has no cache", m.seq)))?;
            back.insert(m.seq, own);
        }
        let sources: Vec<Source<'_>> = members
            .iter()
            .map(|m| match m.row {
                Some(row) => Some((&self.rows, row, m.len)),
                None => back.get(&m.seq).map(|own| (own, 0, m.len)),
            })
            .collect();
        let capacity = if members.is_empty() { 0 } else { capacity };
        let fresh = self.rows.gathered(capacity, &sources)?;
        self.rows_bound.release();
        self.rows = fresh;
        Ok(())
    }

    /// Frees `seq`'s parked cache.
    pub fn rows_forget(&mut self, seq: u64) {
        self.parked.remove(&seq);
    }

    /// Frees the batch's cache and every parked one.
    pub fn rows_clear(&mut self) {
        self.rows_bound.release();
        self.rows = self.cache();
        self.parked.clear();
    }

    /// One forward pass over every row of the batch (see [`RowsStep`]); the wanted outputs,
    /// per row. The caller has reserved room for every row's `past + s` positions.
    pub fn rows_step(
        &mut self,
        step: &RowsStep<'_>,
    ) -> Result<Vec<Vec<PositionOutput>>, EngineError> {
        forward(
            &mut self.session,
            &self.kv_names,
            &mut self.rows_bound,
            &mut self.rows,
            step,
            self.meta.hidden_size,
        )
    }

    /// Forgets everything: an empty cache and token list, nothing aligned. After a failed step
    /// (the cache was moved into the run's inputs and not put back) the next prefill starts over.
    pub fn reset(&mut self) {
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
        let past = self.tokens.len();
        self.kv.reserve(1, past + chunk.len())?;
        let s = chunk.len();
        let want = if all { 0..s } else { s - 1..s };
        let step = RowsStep {
            ids: chunk,
            s,
            past: &[past],
            want: &[want],
        };
        let outs = forward(
            &mut self.session,
            &self.kv_names,
            &mut self.solo,
            &mut self.kv,
            &step,
            self.meta.hidden_size,
        )?
        .pop()
        .unwrap_or_default();
        self.tokens.extend_from_slice(chunk);
        self.last = None;
        Ok(outs)
    }
}

/// One forward pass of `session` over `step`, with `kv`'s buffers as the past and the
/// present (see `super::kv`).
fn forward(
    session: &mut Session,
    kv_names: &[(String, String, String, String)],
    bound: &mut Bound,
    kv: &mut KvCache,
    step: &RowsStep<'_>,
    hidden_size: usize,
) -> Result<Vec<Vec<PositionOutput>>, EngineError> {
    let rows = kv.rows();
    let s = step.s;
    if s == 0 || step.ids.len() != rows * s || step.past.len() != rows || step.want.len() != rows {
        return Err(EngineError::Draft(format!(
            "a step of {} tokens in {s} columns does not fit {rows} rows",
            step.ids.len()
        )));
    }
    let total = step.past.iter().map(|p| p + s).max().unwrap_or(s);
    if total > kv.capacity() {
        return Err(EngineError::Draft(format!(
            "a step to {total} positions in a cache of {}",
            kv.capacity()
        )));
    }
    if bound.generation != Some(kv.generation()) {
        // New buffers: each layer's one buffer is both the past input and the present
        // output, so the model appends in place.
        for ((k, v), (kn, vn, pk, pv)) in kv.buffers_mut().iter_mut().zip(kv_names) {
            bound.binding.bind_input(kn.as_str(), &*k)?;
            bound.binding.bind_input(vn.as_str(), &*v)?;
            bound.binding.bind_output(pk.as_str(), k)?;
            bound.binding.bind_output(pv.as_str(), v)?;
        }
        bound.generation = Some(kv.generation());
    }
    let ids: Vec<i64> = step.ids.iter().map(|&t| i64::from(t)).collect();
    bound.binding.bind_input(
        "input_ids",
        &Tensor::from_array((vec![rows as i64, s as i64], ids))?,
    )?;
    // Each row's count of ones is what tells the model how many of its cached positions are
    // real (and where its new keys and values go); the mask's width is the longest row's.
    let mask: Vec<i64> = step
        .past
        .iter()
        .flat_map(|&p| (0..total).map(move |i| i64::from(i < p + s)))
        .collect();
    bound.binding.bind_input(
        "attention_mask",
        &Tensor::from_array((vec![rows as i64, total as i64], mask))?,
    )?;
    // Their shapes change with the step, so they are bound afresh each run (a bound output
    // otherwise keeps the previous run's buffer and shape).
    let cpu = ort::memory::MemoryInfo::default();
    bound.binding.bind_output_to_device("logits", &cpu)?;
    bound.binding.bind_output_to_device("hidden_states", &cpu)?;
    let outputs = session.run_binding(&bound.binding)?;
    let (lshape, logits) = outputs["logits"].try_extract_tensor::<f32>()?;
    let (_, hidden) = outputs["hidden_states"].try_extract_tensor::<f32>()?;
    let vocab =
        usize::try_from(lshape[2]).map_err(|_| EngineError::Draft("bad logits shape".into()))?;
    let outs = step
        .want
        .iter()
        .enumerate()
        .map(|(r, want)| {
            want.clone()
                .filter(|&p| p < s)
                .map(|p| {
                    let at = r * s + p;
                    PositionOutput::new(
                        logits[at * vocab..(at + 1) * vocab].to_vec(),
                        hidden[at * hidden_size..(at + 1) * hidden_size].into(),
                    )
                })
                .collect()
        })
        .collect();
    Ok(outs)
}

impl Rows for DraftSession {
    fn shape(&self) -> (usize, usize) {
        self.rows_shape()
    }
    fn prefill(
        &mut self,
        seq: SeqId,
        prompt: &[u32],
        gone: &dyn Fn() -> bool,
    ) -> Result<PositionOutput, EngineError> {
        self.rows_prefill(seq, prompt, gone)
    }
    fn arrange(
        &mut self,
        members: &[Member],
        park: &[Member],
        capacity: usize,
    ) -> Result<(), EngineError> {
        self.rows_arrange(members, park, capacity)
    }
    fn reserve(&mut self, total: usize) -> Result<(), EngineError> {
        self.rows_reserve(total)
    }
    fn step(&mut self, step: &RowsStep<'_>) -> Result<Vec<Vec<PositionOutput>>, EngineError> {
        self.rows_step(step)
    }
    fn forget(&mut self, seq: SeqId) {
        self.rows_forget(seq);
    }
    fn trim_solo(&mut self, keep: usize) {
        self.trim(keep);
    }
    fn reset(&mut self) {
        DraftSession::reset(self);
        self.rows_clear();
    }
}
