//! Continuous batching of one worker's sequences. The sequences a step runs for each own one
//! row of the batch's cache, and a step feeds every row the same number of tokens: the
//! sequences with work get theirs (padded with filler when shorter than the step), the others
//! only filler, whose keys and values land beyond their valid length and are written over
//! later. On this machine's CPUs a row costs about as much compute as any other, filler or
//! not, so a sequence that has sat out [`PARK_AFTER`] steps (it is waiting on the target) is
//! parked: its keys and values are copied out to a cache of its own, and the batch is laid out
//! anew without it; it is copied back in when it next asks for a step. One sequence alone runs
//! exactly as a solo session does. A prompt is prefilled alone in the solo cache (its numbers
//! then depend on the prompt only, and a prefix shared with the previous prompt is reused) and
//! its keys and values become the sequence's parked cache.

use std::collections::HashMap;
use std::ops::Range;

use super::PositionOutput;
pub use super::rows::{Member, Rows, RowsStep, SeqId};
use crate::error::EngineError;

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

/// Steps a sequence may sit out before it is parked: one that is only verifying its last
/// token is back within the worker's gather window, one waiting on the target is not.
pub const PARK_AFTER: usize = 2;

/// A live sequence: its valid positions, and the steps it has sat out in a row.
#[derive(Debug, Clone, Copy)]
struct Seq {
    len: usize,
    missed: usize,
}

/// The batch of one worker.
pub struct Batch<M: Rows> {
    model: M,
    /// The sequence in each row of the model's batch cache (`None`: one that left).
    layout: Vec<Option<SeqId>>,
    /// Every live sequence, in the batch or parked.
    seqs: HashMap<SeqId, Seq>,
    /// The most sequences it holds.
    max_seqs: usize,
}

impl<M: Rows> Batch<M> {
    /// A batch of at most `max_seqs` sequences, none yet.
    pub fn new(model: M, max_seqs: usize) -> Self {
        Self {
            model,
            layout: Vec::new(),
            seqs: HashMap::new(),
            max_seqs: max_seqs.max(1),
        }
    }

    /// Live sequences, in the batch or parked.
    pub fn live(&self) -> usize {
        self.seqs.len()
    }

    /// Whether `seq` is live.
    pub fn holds(&self, seq: SeqId) -> bool {
        self.seqs.contains_key(&seq)
    }

    /// Rows a step runs: the batch cache's.
    pub fn width(&self) -> usize {
        self.layout.len()
    }

    /// The model (its caches, for the worker's reports).
    pub fn model(&self) -> &M {
        &self.model
    }

    /// Forgets every sequence and everything cached: their next calls fail.
    pub fn reset(&mut self) {
        self.layout.clear();
        self.seqs.clear();
        self.model.reset();
    }

    /// Makes `seq` hold exactly `prompt` (parked until its first step); the output at the
    /// prompt's last position.
    pub fn prefill(
        &mut self,
        seq: SeqId,
        prompt: &[u32],
        gone: &dyn Fn() -> bool,
    ) -> Result<PositionOutput, EngineError> {
        if !self.seqs.contains_key(&seq) && self.seqs.len() >= self.max_seqs {
            return Err(EngineError::Saturated);
        }
        self.leave_row(seq);
        let out = self.model.prefill(seq, prompt, gone);
        match &out {
            Ok(_) => {
                self.seqs.insert(
                    seq,
                    Seq {
                        len: prompt.len(),
                        missed: 0,
                    },
                );
            }
            Err(_) => {
                // What it holds is unknown: it is gone, and its next call fails.
                self.seqs.remove(&seq);
                self.model.forget(seq);
            }
        }
        out
    }

    /// Drops the newest `n` positions of `seq`. A sequence not yet prefilled has nothing to
    /// drop; its rollback empties the worker's prompt cache instead, so that its prefill runs
    /// from scratch (as timing it, or a reference computation, wants).
    pub fn rollback(&mut self, seq: SeqId, n: usize) -> Result<(), EngineError> {
        match self.seqs.get_mut(&seq) {
            Some(s) => s.len = s.len.saturating_sub(n),
            None => self.model.trim_solo(0),
        }
        Ok(())
    }

    /// `seq` is done: its row is dropped at the next layout, its parked cache now; with no
    /// sequence left the batch's cache is freed.
    pub fn close(&mut self, seq: SeqId) -> Result<(), EngineError> {
        self.seqs.remove(&seq);
        self.leave_row(seq);
        self.model.forget(seq);
        if self.seqs.is_empty() && !self.layout.is_empty() {
            self.layout.clear();
            self.model.arrange(&[], &[], 0)?;
        }
        Ok(())
    }

    /// Bounds what an idle worker keeps for the next prompt.
    pub fn trim(&mut self, keep: usize) {
        self.model.trim_solo(keep);
    }

    fn leave_row(&mut self, seq: SeqId) {
        for r in &mut self.layout {
            if *r == Some(seq) {
                *r = None;
            }
        }
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
        let first = work
            .iter()
            .map(|w| w.tokens.len().min(STEP_TOKENS))
            .max()
            .unwrap_or(0);
        if first > 0
            && let Err(e) = self.lay_out(work, first)
        {
            let e = e.to_string();
            for r in &mut results {
                *r = Err(EngineError::Draft(e.clone()));
            }
            return results;
        }
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

    /// Before a step of `s` tokens for `work`: the sequences that sat out too long are parked,
    /// the parked ones with work come back, rows of sequences gone are dropped, and every row
    /// has room for the step.
    fn lay_out(&mut self, work: &[Extend<'_>], s: usize) -> Result<(), EngineError> {
        let asked = |seq: SeqId| work.iter().any(|w| w.seq == seq);
        let mut park = Vec::new();
        let mut members = Vec::new();
        for (row, slot) in self.layout.iter().enumerate() {
            let Some(seq) = *slot else { continue };
            let Some(st) = self.seqs.get_mut(&seq) else {
                continue;
            };
            let m = Member {
                seq,
                row: Some(row),
                len: st.len,
            };
            if asked(seq) {
                st.missed = 0;
                members.push(m);
            } else {
                st.missed += 1;
                if st.missed >= PARK_AFTER {
                    park.push(m);
                } else {
                    members.push(m);
                }
            }
        }
        for w in work {
            let fresh =
                !self.layout.contains(&Some(w.seq)) && !members.iter().any(|m| m.seq == w.seq);
            if fresh && let Some(st) = self.seqs.get_mut(&w.seq) {
                st.missed = 0;
                members.push(Member {
                    seq: w.seq,
                    row: None,
                    len: st.len,
                });
            }
        }
        let total = members.iter().map(|m| m.len).max().unwrap_or(0) + s;
        let same = park.is_empty()
            && members.len() == self.layout.len()
            && members.iter().all(|m| m.row.is_some());
        if same {
            return self.model.reserve(total);
        }
        let capacity = super::kv::batch_capacity(total);
        let r = self.model.arrange(&members, &park, capacity);
        if r.is_err() {
            // Nothing cached is known any more: every sequence's next call fails.
            self.layout.clear();
            self.seqs.clear();
            self.model.reset();
        } else {
            self.layout = members.iter().map(|m| Some(m.seq)).collect();
        }
        r
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
        let width = self.layout.len();
        let mut ids = vec![FILLER; width * s];
        let mut past = vec![0usize; width];
        let mut want: Vec<Range<usize>> = vec![0..0; width];
        for (r, seq) in self.layout.iter().enumerate() {
            past[r] = seq.and_then(|q| self.seqs.get(&q)).map_or(0, |st| st.len);
        }
        let mut fed = Vec::with_capacity(left.len());
        for &i in left {
            let w = &work[i];
            let row = self
                .layout
                .iter()
                .position(|r| *r == Some(w.seq))
                .ok_or_else(not_prefilled)?;
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
        self.model.reserve(total)?;
        let step = RowsStep {
            ids: &ids,
            s,
            past: &past,
            want: &want,
        };
        let mut outs = self.model.step(&step)?;
        let mut taken = Vec::with_capacity(fed.len());
        for (seq, row, n) in fed {
            if let Some(st) = self.seqs.get_mut(&seq) {
                st.len = past[row] + n;
            }
            taken.push(std::mem::take(&mut outs[row]));
        }
        Ok(taken)
    }
}

fn not_prefilled() -> EngineError {
    EngineError::Draft("extend or rollback before any prefill".into())
}

#[cfg(test)]
#[path = "batch_tests.rs"]
pub(crate) mod tests;
