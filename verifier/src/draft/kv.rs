//! The draft model's KV cache, preallocated and written in place.
//!
//! The draft's graph (`model-grouped.onnx`, made by `verifier/scripts/regroup_attention.py`)
//! writes each step's new keys and values into its cache with TensorScatter, in place when the
//! `past_key_values.*` input and the `present.*` output are the same buffer, and then attends
//! over that buffer. So each layer's key and value live in one ONNX Runtime tensor of shape
//! `[rows, kv_heads, capacity, head_dim]`, bound as both input and output; each row is one
//! sequence, and the attention mask's row says how many of its positions are real. The graph
//! masks the rest out, which must then hold finite numbers (a weight of zero times a NaN is a
//! NaN): buffers start as zeros and later hold only what the model wrote. A step copies nothing,
//! and a rollback only shortens a valid length, which the owner keeps (a solo session's token
//! list, the batch's per-row lengths). A solo cache doubles when its sequence outgrows it, a
//! batch's rows grow by a sixteenth (rows copied once), and caches shrink when an idle worker is
//! trimmed. Rows are the outermost dimension, so one row's positions are a contiguous block that
//! moves between caches with plain copies.

use std::sync::atomic::{AtomicU64, Ordering};

use ort::memory::Allocator;
use ort::value::Tensor;

use crate::error::EngineError;

/// Capacities are multiples of this (and at least this), so small prompts never reallocate.
pub const CAPACITY_STEP: usize = 256;

/// A batch's rows grow in steps this fine: each row's room is memory every stream pays for.
const ROW_STEP: usize = 64;

/// Positions to give each of a batch's rows when the longest needs `total`: a sixteenth to
/// spare and at least `ROW_STEP`, so the next steps do not copy every row again: a stream
/// that outgrows its row copies the batch (216 MiB for eight rows of 1,152 positions) at most
/// every 64 steps. The coarser spare before (an eighth, rounded to 256) cost each stream 11 %
/// more memory at a 1,024-token context (1,280 positions against 1,152).
pub fn batch_capacity(total: usize) -> usize {
    (total + (total / 16).max(ROW_STEP)).next_multiple_of(ROW_STEP)
}

/// Where a gathered cache's row comes from: the first `len` positions of `cache`'s row `row`,
/// or nothing (zeros).
pub type Source<'a> = Option<(&'a KvCache, usize, usize)>;

/// Generations are unique across caches: a binding that held one cache's buffers is never
/// taken to hold another's.
static GENERATIONS: AtomicU64 = AtomicU64::new(1);

/// The cache buffers of one or more sequences.
#[derive(Debug)]
pub struct KvCache {
    layers: usize,
    heads: usize,
    head_dim: usize,
    /// Sequences the buffers hold room for.
    rows: usize,
    /// Positions each row has room for.
    capacity: usize,
    /// Per layer, the key and the value buffer; empty until the first run.
    buffers: Vec<(Tensor<f32>, Tensor<f32>)>,
    /// Bumped whenever the buffers are replaced, so the session knows to bind them again.
    generation: u64,
}

impl KvCache {
    /// An empty cache for a model of this shape; nothing is allocated yet.
    pub fn new(layers: usize, heads: usize, head_dim: usize) -> Self {
        Self {
            layers,
            heads,
            head_dim,
            rows: 0,
            capacity: 0,
            buffers: Vec::new(),
            generation: GENERATIONS.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// Rows the buffers hold.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Positions each row has room for.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Changes whenever the buffers are replaced.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The buffers, per layer (key, value), to bind as input and output alike.
    pub fn buffers_mut(&mut self) -> &mut [(Tensor<f32>, Tensor<f32>)] {
        &mut self.buffers
    }

    /// Makes room for at least `rows` rows of `total` positions, keeping what is cached.
    pub fn reserve(&mut self, rows: usize, total: usize) -> Result<(), EngineError> {
        if total <= self.capacity && rows <= self.rows {
            return Ok(());
        }
        // A solo cache doubles (few copies over a long answer); a batch's copy moves every
        // row, and each row's room is memory every stream pays, so it grows by a little.
        let capacity = if total <= self.capacity {
            self.capacity
        } else if rows > 1 || self.rows > 1 {
            batch_capacity(total)
        } else {
            total
                .max(self.capacity * 2)
                .max(CAPACITY_STEP)
                .next_multiple_of(CAPACITY_STEP)
        };
        self.resize(rows.max(self.rows), capacity)
    }

    /// Replaces the buffers with `rows` rows of `capacity` positions, copying the first rows'
    /// first positions over (as many as both shapes hold; rows or positions beyond the new
    /// shape are dropped, so the owner shrinks only below what is valid).
    pub fn resize(&mut self, rows: usize, capacity: usize) -> Result<(), EngineError> {
        if rows == self.rows && capacity == self.capacity {
            return Ok(());
        }
        let keep = self.capacity.min(capacity);
        let sources: Vec<Source<'_>> = (0..rows)
            .map(|r| (r < self.rows).then_some((&*self, r, keep)))
            .collect();
        let fresh = self.gathered(capacity, &sources)?;
        *self = fresh;
        Ok(())
    }

    /// A new cache of this shape with `sources.len()` rows of `capacity` positions: row `i`
    /// holds the first positions of its source's row, and zeros after them (a row with no
    /// source is all zeros). Each byte is written once: a layout of the batch moves every
    /// row, and a fill before the copies doubled what it wrote.
    pub fn gathered(
        &self,
        capacity: usize,
        sources: &[Source<'_>],
    ) -> Result<KvCache, EngineError> {
        let mut out = KvCache::new(self.layers, self.heads, self.head_dim);
        if sources.is_empty() || capacity == 0 {
            return Ok(out);
        }
        for &(src, row, len) in sources.iter().flatten() {
            let same =
                (src.layers, src.heads, src.head_dim) == (self.layers, self.heads, self.head_dim);
            if !same || row >= src.rows || len > src.capacity.min(capacity) {
                return Err(EngineError::Draft(format!(
                    "cannot copy {len} positions of row {row} into a row of {capacity}"
                )));
            }
        }
        let allocator = Allocator::default();
        let shape = [
            sources.len() as i64,
            self.heads as i64,
            capacity as i64,
            self.head_dim as i64,
        ];
        let to = Block::new(self.heads, capacity, self.head_dim);
        // Layer `layer`'s key (`kind` 0) or value buffer.
        let make = |layer: usize, kind: usize| -> Result<Tensor<f32>, EngineError> {
            let mut t = Tensor::<f32>::new(&allocator, shape)?;
            let (_, dst) = t.try_extract_tensor_mut::<f32>()?;
            for (i, source) in sources.iter().enumerate() {
                let Some((src, row, len)) = *source else {
                    dst[to.at(i, 0)..to.at(i + 1, 0)].fill(0.0);
                    continue;
                };
                let (k, v) = &src.buffers[layer];
                let (_, s) = if kind == 0 { k } else { v }.try_extract_tensor::<f32>()?;
                let from = Block::new(src.heads, src.capacity, src.head_dim);
                fill_row(s, from, row, dst, to, i, len);
            }
            Ok(t)
        };
        for layer in 0..self.layers {
            out.buffers.push((make(layer, 0)?, make(layer, 1)?));
        }
        out.rows = sources.len();
        out.capacity = capacity;
        Ok(out)
    }

    /// Bytes the buffers hold.
    pub fn capacity_bytes(&self) -> usize {
        2 * self.layers
            * self.rows
            * self.heads
            * self.capacity
            * self.head_dim
            * std::mem::size_of::<f32>()
    }
}

/// The layout of one row: `heads` blocks of `capacity` positions of `head_dim` floats.
#[derive(Debug, Clone, Copy)]
struct Block {
    heads: usize,
    capacity: usize,
    head_dim: usize,
}

impl Block {
    fn new(heads: usize, capacity: usize, head_dim: usize) -> Self {
        Self {
            heads,
            capacity,
            head_dim,
        }
    }

    /// Where head `h` of row `row` starts.
    fn at(self, row: usize, h: usize) -> usize {
        (row * self.heads + h) * self.capacity * self.head_dim
    }
}

/// Copies the first `len` positions of every head of `src`'s row `from` into `dst`'s row `to`,
/// and zeros the rest of that row.
fn fill_row(
    src: &[f32],
    sb: Block,
    from: usize,
    dst: &mut [f32],
    db: Block,
    to: usize,
    len: usize,
) {
    let n = len * sb.head_dim;
    let room = db.capacity * db.head_dim;
    for h in 0..sb.heads {
        let (s, d) = (sb.at(from, h), db.at(to, h));
        dst[d..d + n].copy_from_slice(&src[s..s + n]);
        dst[d + n..d + room].fill(0.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Value = row*1000 + head*100 + pos*10 + dim, in a `[rows, heads, cap, hd]` layout.
    fn filled(rows: usize, heads: usize, cap: usize, hd: usize) -> Vec<f32> {
        (0..rows)
            .flat_map(|r| {
                (0..heads).flat_map(move |h| {
                    (0..cap).flat_map(move |p| {
                        (0..hd).map(move |d| (r * 1000 + h * 100 + p * 10 + d) as f32)
                    })
                })
            })
            .collect()
    }

    #[test]
    fn a_batch_row_has_a_little_room_to_spare_in_fine_steps() {
        assert_eq!(batch_capacity(1), 128);
        assert_eq!(batch_capacity(1025), 1152);
        assert_eq!(batch_capacity(8192), 8704);
        for total in [1, 63, 64, 65, 1000, 1025, 4096, 30_000] {
            let c = batch_capacity(total);
            assert!(
                c >= total + ROW_STEP && c.is_multiple_of(ROW_STEP),
                "{total} -> {c}"
            );
        }
    }

    #[test]
    fn rows_move_between_capacities_head_by_head() {
        // Two heads, capacity 3, head_dim 2.
        let src = filled(1, 2, 3, 2);
        let mut dst = vec![-1.0; 2 * 5 * 2];
        fill_row(
            &src,
            Block::new(2, 3, 2),
            0,
            &mut dst,
            Block::new(2, 5, 2),
            0,
            2,
        );
        assert_eq!(&dst[..4], &[0.0, 1.0, 10.0, 11.0]);
        // The rest of the row is zeros, whatever it held.
        assert_eq!(&dst[4..10], &[0.0; 6]);
        assert_eq!(&dst[10..14], &[100.0, 101.0, 110.0, 111.0]);
        let mut back = vec![0.0; 2 * 2 * 2];
        fill_row(
            &dst,
            Block::new(2, 5, 2),
            0,
            &mut back,
            Block::new(2, 2, 2),
            0,
            2,
        );
        assert_eq!(back, [0.0, 1.0, 10.0, 11.0, 100.0, 101.0, 110.0, 111.0]);
    }

    #[test]
    fn a_row_goes_into_another_cache() {
        let src = filled(1, 1, 4, 1);
        let mut dst = vec![0.0; 12];
        fill_row(
            &src,
            Block::new(1, 4, 1),
            0,
            &mut dst,
            Block::new(1, 6, 1),
            1,
            3,
        );
        assert_eq!(&dst[..6], &[0.0; 6]);
        assert_eq!(&dst[6..], &[0.0, 10.0, 20.0, 0.0, 0.0, 0.0]);
    }
}
