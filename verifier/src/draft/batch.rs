//! Continuous batching of one worker's sequences. Every sequence a worker drafts for owns one
//! row of the batch's cache; the rows of live sequences are `0..live`, in no particular
//! order, and the cache holds a power of two of rows at least that many, so the shapes a
//! step runs in (and with them ONNX Runtime's kernels and numbers) change only when the
//! count of sequences crosses a power of two. One alone runs exactly as a solo session does.
//!
//! A step feeds the same number of tokens to every row: the sequences with work get theirs
//! (padded with filler when shorter than the step), the others only filler, whose keys and
//! values land beyond their valid length and are written over later. A sequence that leaves
//! hands its row to the last row's sequence, so rows stay packed. A prompt is prefilled
//! alone in the solo cache (its numbers then depend on the prompt only, and a prefix shared
//! with the previous prompt is reused) and its keys and values are copied into the row.

use std::collections::HashMap;
use std::ops::Range;

use super::PositionOutput;
use super::session::{DraftSession, RowsStep};
use crate::error::EngineError;

/// What the batch needs of a model: a cache of rows it steps together, and a solo prefill
/// copied into a row. [`DraftSession`] is the real one; tests script one.
pub trait Rows {
    /// Rows and positions per row the cache holds.
    fn shape(&self) -> (usize, usize);
    /// Makes room for `rows` rows of `total` positions, keeping what is cached.
    fn reserve(&mut self, rows: usize, total: usize) -> Result<(), EngineError>;
    /// Makes the cache exactly `rows` rows of `capacity` positions, keeping the first rows.
    fn resize(&mut self, rows: usize, capacity: usize) -> Result<(), EngineError>;
    /// Prefills `prompt` and puts its keys and values in row `row`; the output at its last
    /// position.
    fn prefill(
        &mut self,
        row: usize,
        prompt: &[u32],
        gone: &dyn Fn() -> bool,
    ) -> Result<PositionOutput, EngineError>;
    /// One forward pass over every row.
    fn step(&mut self, step: &RowsStep<'_>) -> Result<Vec<Vec<PositionOutput>>, EngineError>;
    /// Moves row `from`'s first `len` positions into row `to`.
    fn move_row(&mut self, from: usize, to: usize, len: usize) -> Result<(), EngineError>;
    /// Bounds what the solo cache keeps while the worker is idle.
    fn trim_solo(&mut self, keep: usize);
    /// Forgets everything (after a failure left the caches unknown).
    fn reset(&mut self);
}

impl Rows for DraftSession {
    fn shape(&self) -> (usize, usize) {
        self.rows_shape()
    }
    fn reserve(&mut self, rows: usize, total: usize) -> Result<(), EngineError> {
        self.rows_reserve(rows, total)
    }
    fn resize(&mut self, rows: usize, capacity: usize) -> Result<(), EngineError> {
        self.rows_resize(rows, capacity)
    }
    fn prefill(
        &mut self,
        row: usize,
        prompt: &[u32],
        gone: &dyn Fn() -> bool,
    ) -> Result<PositionOutput, EngineError> {
        self.rows_prefill(row, prompt, gone)
    }
    fn step(&mut self, step: &RowsStep<'_>) -> Result<Vec<Vec<PositionOutput>>, EngineError> {
        self.rows_step(step)
    }
    fn move_row(&mut self, from: usize, to: usize, len: usize) -> Result<(), EngineError> {
        self.rows_move(from, to, len)
    }
    fn trim_solo(&mut self, keep: usize) {
        self.trim(keep);
    }
    fn reset(&mut self) {
        DraftSession::reset(self);
        if let Err(e) = self.rows_resize(0, 0) {
            tracing::warn!(error = %e, "could not free the draft's batch cache");
        }
    }
}

/// A sequence's name within its worker.
pub type SeqId = u64;

/// Tokens fed in one step at most: prompts and the target's text run in chunks of this,
/// as a solo session's do.
pub const STEP_TOKENS: usize = 64;

/// What rows with nothing to feed are fed (any id in the vocabulary).
const FILLER: u32 = 0;

/// One sequence's work in a step: append `tokens`, outputs at every one (`all`) or the last.
#[derive(Debug)]
pub struct Extend<'a> {
    /// Whose.
    pub seq: SeqId,
    /// The tokens.
    pub tokens: &'a [u32],
    /// Outputs at every new position, or at the last only.
    pub all: bool,
}

/// The batch of one worker.
pub struct Batch<M: Rows> {
    model: M,
    /// The sequence in each live row.
    rows: Vec<SeqId>,
    /// Each live sequence's row and valid length.
    seqs: HashMap<SeqId, (usize, usize)>,
    /// The most rows the cache may hold.
    max_rows: usize,
}

impl<M: Rows> Batch<M> {
    /// A batch of at most `max_rows` sequences, none yet.
    pub fn new(model: M, max_rows: usize) -> Self {
        Self {
            model,
            rows: Vec::new(),
            seqs: HashMap::new(),
            max_rows: max_rows.max(1),
        }
    }

    /// Sequences with a row.
    pub fn live(&self) -> usize {
        self.rows.len()
    }

    /// Whether `seq` has a row.
    pub fn holds(&self, seq: SeqId) -> bool {
        self.seqs.contains_key(&seq)
    }

    /// Forgets every sequence and everything cached: their next calls fail.
    pub fn reset(&mut self) {
        self.rows.clear();
        self.seqs.clear();
        self.model.reset();
    }

    /// Rows a step runs: the cache's.
    pub fn width(&self) -> usize {
        self.model.shape().0
    }

    /// The model (its cache's size, for the worker's reports).
    pub fn model(&self) -> &M {
        &self.model
    }

    /// Makes `seq`'s row hold exactly `prompt`; the output at its last position.
    pub fn prefill(
        &mut self,
        seq: SeqId,
        prompt: &[u32],
        gone: &dyn Fn() -> bool,
    ) -> Result<PositionOutput, EngineError> {
        let row = match self.seqs.get(&seq) {
            Some(&(row, _)) => row,
            None if self.rows.len() >= self.max_rows => return Err(EngineError::Saturated),
            None => {
                let row = self.rows.len();
                let (_, capacity) = self.model.shape();
                self.model
                    .reserve(rows_for(row + 1), capacity.max(prompt.len()))?;
                self.rows.push(seq);
                self.seqs.insert(seq, (row, 0));
                row
            }
        };
        let out = self.model.prefill(row, prompt, gone);
        match &out {
            Ok(_) => self.set_len(seq, prompt.len()),
            // What the row holds is unknown: nothing valid.
            Err(_) => self.set_len(seq, 0),
        }
        out
    }

    /// Drops the newest `n` positions of `seq`. A sequence not yet prefilled has nothing to
    /// drop; its rollback empties the worker's prompt cache instead, so that its prefill runs
    /// from scratch (as timing it, or a reference computation, wants).
    pub fn rollback(&mut self, seq: SeqId, n: usize) -> Result<(), EngineError> {
        match self.seqs.get(&seq) {
            Some(&(_, len)) => self.set_len(seq, len.saturating_sub(n)),
            None => self.model.trim_solo(0),
        }
        Ok(())
    }

    /// `seq` is done: its row goes to the last row's sequence, and the cache shrinks when far
    /// fewer rows are live than it holds (all of it when none is).
    pub fn close(&mut self, seq: SeqId) -> Result<(), EngineError> {
        let Some((row, _)) = self.seqs.remove(&seq) else {
            return Ok(());
        };
        let last = self.rows.len() - 1;
        if row != last {
            let moved = self.rows[last];
            let len = self.seqs.get(&moved).map_or(0, |&(_, l)| l);
            if let Err(e) = self.model.move_row(last, row, len) {
                // No row holds anything known any more: every sequence's next call fails.
                self.rows.clear();
                self.seqs.clear();
                let _ = self.model.resize(0, 0);
                return Err(e);
            }
            self.rows[row] = moved;
            self.seqs.insert(moved, (row, len));
        }
        self.rows.pop();
        let (held, capacity) = self.model.shape();
        if self.rows.is_empty() {
            self.model.resize(0, 0)?;
        } else if rows_for(self.rows.len()) * 4 <= held {
            self.model.resize(rows_for(self.rows.len()), capacity)?;
        }
        Ok(())
    }

    /// Bounds what an idle worker keeps for the next prompt.
    pub fn trim(&mut self, keep: usize) {
        self.model.trim_solo(keep);
    }

    /// Runs every extend in `work` together, in steps of at most [`STEP_TOKENS`] tokens a
    /// row; each one's outputs, in order.
    pub fn extend(&mut self, work: &[Extend<'_>]) -> Vec<Result<Vec<PositionOutput>, EngineError>> {
        let mut results: Vec<Result<Vec<PositionOutput>, EngineError>> = work
            .iter()
            .map(|w| {
                if self.seqs.contains_key(&w.seq) {
                    Ok(Vec::new())
                } else {
                    Err(not_prefilled())
                }
            })
            .collect();
        let mut done = vec![0usize; work.len()];
        loop {
            let left: Vec<usize> = (0..work.len())
                .filter(|&i| results[i].is_ok() && done[i] < work[i].tokens.len())
                .collect();
            let Some(s) = left
                .iter()
                .map(|&i| work[i].tokens.len() - done[i])
                .max()
                .map(|m| m.min(STEP_TOKENS))
            else {
                break;
            };
            match self.run_step(work, &left, &done, s) {
                Ok(outs) => {
                    for (&i, mut o) in left.iter().zip(outs) {
                        let n = s.min(work[i].tokens.len() - done[i]);
                        done[i] += n;
                        if let Ok(r) = &mut results[i] {
                            if work[i].all {
                                r.append(&mut o);
                            } else if !o.is_empty() {
                                *r = o;
                            }
                        }
                    }
                }
                Err(e) => {
                    // The step's rows hold nothing known beyond what was valid before it, and
                    // the sequences in it are told; the others never noticed.
                    let e = e.to_string();
                    for &i in &left {
                        results[i] = Err(EngineError::Draft(e.clone()));
                    }
                }
            }
        }
        results
    }

    /// One step: `s` tokens from each of `left`'s extends (from `done` on), filler elsewhere.
    /// The outputs of each of `left`, in order.
    fn run_step(
        &mut self,
        work: &[Extend<'_>],
        left: &[usize],
        done: &[usize],
        s: usize,
    ) -> Result<Vec<Vec<PositionOutput>>, EngineError> {
        let width = self.width();
        let mut ids = vec![FILLER; width * s];
        let mut past = vec![0usize; width];
        let mut want: Vec<Range<usize>> = vec![0..0; width];
        for (r, seq) in self.rows.iter().enumerate() {
            past[r] = self.seqs.get(seq).map_or(0, |&(_, l)| l);
        }
        let mut fed = Vec::with_capacity(left.len());
        for &i in left {
            let w = &work[i];
            let &(row, _) = self.seqs.get(&w.seq).ok_or_else(not_prefilled)?;
            let n = s.min(w.tokens.len() - done[i]);
            ids[row * s..row * s + n].copy_from_slice(&w.tokens[done[i]..done[i] + n]);
            let finishes = done[i] + n == w.tokens.len();
            want[row] = if w.all {
                0..n
            } else if finishes {
                n - 1..n
            } else {
                0..0
            };
            fed.push((w.seq, row, n));
        }
        let total = past.iter().max().copied().unwrap_or(0) + s;
        self.model.reserve(width, total)?;
        let step = RowsStep {
            ids: &ids,
            s,
            past: &past,
            want: &want,
        };
        let mut outs = self.model.step(&step)?;
        let mut taken = Vec::with_capacity(fed.len());
        for (seq, row, n) in fed {
            self.set_len(seq, past[row] + n);
            taken.push(std::mem::take(&mut outs[row]));
        }
        Ok(taken)
    }

    fn set_len(&mut self, seq: SeqId, len: usize) {
        if let Some(e) = self.seqs.get_mut(&seq) {
            e.1 = len;
        }
    }
}

/// Rows the cache holds for `live` sequences.
pub fn rows_for(live: usize) -> usize {
    live.max(1).next_power_of_two()
}

fn not_prefilled() -> EngineError {
    EngineError::Draft("extend or rollback before any prefill".into())
}

#[cfg(test)]
#[path = "batch_tests.rs"]
pub(crate) mod tests;
