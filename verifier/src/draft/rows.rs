//! What a draft worker's batch needs of a model (`super::batch`), with the shapes of its
//! calls: a leaf, so that the batch and the ONNX session both depend on it and not on each
//! other.

use std::ops::Range;

use super::PositionOutput;
use crate::error::EngineError;

/// A sequence's name within its worker.
pub type SeqId = u64;

/// One batched forward pass: `ids` holds `s` tokens for each row of the cache, run after that
/// row's first `past[r]` positions; `want[r]` is the range of those `s` positions whose
/// outputs come back. Rows with nothing to feed carry filler tokens whose keys and values
/// land beyond their valid length, where they are later written over.
pub struct RowsStep<'a> {
    /// `rows x s` token ids, row by row.
    pub ids: &'a [u32],
    /// Tokens per row.
    pub s: usize,
    /// Valid positions of each row before the step.
    pub past: &'a [usize],
    /// Per row, the step positions whose outputs are wanted.
    pub want: &'a [Range<usize>],
}

/// A sequence of the batch's new layout: where its keys and values are now (a row of the old
/// layout, or its parked cache), and how many positions are valid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Member {
    /// Whose.
    pub seq: SeqId,
    /// Its row in the old layout, if it has one.
    pub row: Option<usize>,
    /// Valid positions.
    pub len: usize,
}

/// What the batch needs of a model: a cache of rows it steps together, caches of their own for
/// the sequences parked, and a solo prefill. [`DraftSession`] is the real one; tests script one.
///
/// [`DraftSession`]: super::session::DraftSession
pub trait Rows {
    /// Rows and positions per row the batch's cache holds.
    fn shape(&self) -> (usize, usize);
    /// Prefills `prompt` alone and keeps its keys and values as `seq`'s parked cache; the
    /// output at its last position.
    fn prefill(
        &mut self,
        seq: SeqId,
        prompt: &[u32],
        gone: &dyn Fn() -> bool,
    ) -> Result<PositionOutput, EngineError>;
    /// Lays the batch's cache out anew: first each of `park` is copied out of its old row to a
    /// parked cache of its own, then row `i` of a cache of `capacity` positions gets
    /// `members[i]`'s valid positions, from its old row or its parked cache (which is freed).
    /// No members: the batch's cache is freed.
    fn arrange(
        &mut self,
        members: &[Member],
        park: &[Member],
        capacity: usize,
    ) -> Result<(), EngineError>;
    /// Makes room for `total` positions in every row, keeping what is cached.
    fn reserve(&mut self, total: usize) -> Result<(), EngineError>;
    /// One forward pass over every row.
    fn step(&mut self, step: &RowsStep<'_>) -> Result<Vec<Vec<PositionOutput>>, EngineError>;
    /// Frees `seq`'s parked cache, if it has one.
    fn forget(&mut self, seq: SeqId);
    /// Bounds what the solo cache keeps while the worker is idle.
    fn trim_solo(&mut self, keep: usize);
    /// Forgets everything (after a failure left the caches unknown).
    fn reset(&mut self);
}
