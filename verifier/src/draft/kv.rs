//! The draft model's KV cache, preallocated and written in place.
//!
//! The ONNX export uses GroupQueryAttention, which updates its cache in place when the
//! `past_key_values.*` input and the `present.*` output are the same buffer (what
//! onnxruntime-genai calls `past_present_share_buffer`). So each layer's key and value live in
//! one ONNX Runtime tensor of shape `[1, kv_heads, capacity, head_dim]`, bound as both input
//! and output; the attention mask's length tells the model how many positions are real. A step
//! copies nothing, and a rollback only shortens the valid length. The buffers grow by doubling
//! when a sequence outgrows them (rows copied once), and shrink when an idle worker is trimmed.

use ort::memory::Allocator;
use ort::value::Tensor;

use crate::error::EngineError;

/// Capacities are multiples of this (and at least this), so small prompts never reallocate.
const CAPACITY_STEP: usize = 256;

/// The cache for one sequence.
#[derive(Debug)]
pub struct KvCache {
    layers: usize,
    heads: usize,
    head_dim: usize,
    /// Valid positions.
    len: usize,
    /// Positions the buffers hold room for.
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
            len: 0,
            capacity: 0,
            buffers: Vec::new(),
            generation: 0,
        }
    }

    /// Number of cached positions.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Positions the buffers have room for.
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

    /// Makes room for `total` positions, keeping what is cached.
    pub fn reserve(&mut self, total: usize) -> Result<(), EngineError> {
        if total <= self.capacity {
            return Ok(());
        }
        let want = total
            .max(self.capacity * 2)
            .max(CAPACITY_STEP)
            .next_multiple_of(CAPACITY_STEP);
        self.reallocate(want)
    }

    /// Records that a run appended positions up to `total` (the model wrote them in place).
    pub fn set_len(&mut self, total: usize) {
        debug_assert!(total <= self.capacity);
        self.len = total.min(self.capacity);
    }

    /// Drops the newest `n` positions (all of them when `n >= len`); their rows are simply
    /// written over later.
    pub fn rollback(&mut self, n: usize) {
        self.len = self.len.saturating_sub(n);
    }

    /// Empties the cache (keeps the buffers).
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// Gives back room beyond what is cached now, so an idle worker holds no more than it needs.
    pub fn shrink(&mut self) -> Result<(), EngineError> {
        let want = if self.len == 0 {
            0
        } else {
            self.len.next_multiple_of(CAPACITY_STEP)
        };
        if want < self.capacity {
            self.reallocate(want)
        } else {
            Ok(())
        }
    }

    /// Bytes the buffers hold.
    pub fn capacity_bytes(&self) -> usize {
        2 * self.layers * self.heads * self.capacity * self.head_dim * std::mem::size_of::<f32>()
    }

    /// Replaces the buffers with ones of `capacity` positions and copies the valid rows over.
    fn reallocate(&mut self, capacity: usize) -> Result<(), EngineError> {
        let mut fresh = Vec::with_capacity(if capacity == 0 { 0 } else { self.layers });
        if capacity > 0 {
            let allocator = Allocator::default();
            let shape = [1, self.heads as i64, capacity as i64, self.head_dim as i64];
            for _ in 0..self.layers {
                fresh.push((
                    Tensor::<f32>::new(&allocator, shape)?,
                    Tensor::<f32>::new(&allocator, shape)?,
                ));
            }
        }
        let keep = self.len.min(capacity);
        for ((old_k, old_v), (new_k, new_v)) in self.buffers.iter().zip(fresh.iter_mut()) {
            for (old, new) in [(old_k, new_k), (old_v, new_v)] {
                let (_, src) = old.try_extract_tensor::<f32>()?;
                let (_, dst) = new.try_extract_tensor_mut::<f32>()?;
                copy_rows(
                    src,
                    self.capacity,
                    dst,
                    capacity,
                    self.heads,
                    keep,
                    self.head_dim,
                );
            }
        }
        self.buffers = fresh;
        self.capacity = capacity;
        self.len = keep;
        self.generation += 1;
        Ok(())
    }
}

/// Copies the first `len` rows of every head from a `[heads, src_cap, hd]` buffer into a
/// `[heads, dst_cap, hd]` one.
fn copy_rows(
    src: &[f32],
    src_cap: usize,
    dst: &mut [f32],
    dst_cap: usize,
    heads: usize,
    len: usize,
    hd: usize,
) {
    for h in 0..heads {
        let (s, d) = (h * src_cap * hd, h * dst_cap * hd);
        dst[d..d + len * hd].copy_from_slice(&src[s..s + len * hd]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_move_between_capacities_head_by_head() {
        // Two heads, capacity 3, head_dim 2; value = head*100 + pos*10 + dim.
        let src: Vec<f32> = (0..2)
            .flat_map(|h| {
                (0..3).flat_map(move |p| (0..2).map(move |d| (h * 100 + p * 10 + d) as f32))
            })
            .collect();
        let mut dst = vec![-1.0; 2 * 5 * 2];
        copy_rows(&src, 3, &mut dst, 5, 2, 2, 2);
        assert_eq!(&dst[..4], &[0.0, 1.0, 10.0, 11.0]);
        assert_eq!(&dst[4..10], &[-1.0; 6]);
        assert_eq!(&dst[10..14], &[100.0, 101.0, 110.0, 111.0]);
        let mut back = vec![0.0; 2 * 2 * 2];
        copy_rows(&dst, 5, &mut back, 2, 2, 2, 2);
        assert_eq!(back, [0.0, 1.0, 10.0, 11.0, 100.0, 101.0, 110.0, 111.0]);
    }

    #[test]
    fn rollback_only_shortens() {
        let mut c = KvCache::new(2, 2, 3);
        c.len = 5;
        c.capacity = 256;
        c.rollback(2);
        assert_eq!(c.len(), 3);
        c.rollback(10);
        assert!(c.is_empty());
    }
}
