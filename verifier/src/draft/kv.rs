//! The draft model's KV cache: per layer, a key and a value tensor of shape
//! `[1, kv_heads, len, head_dim]`, kept as flat row-major buffers so they can be handed to
//! ONNX Runtime without conversion. Appending happens by adopting the model's `present.*`
//! outputs (which hold past + new positions); rolling back drops the newest positions.

use crate::error::EngineError;

/// The cache for one sequence.
#[derive(Debug, Clone)]
pub struct KvCache {
    layers: usize,
    heads: usize,
    head_dim: usize,
    len: usize,
    /// `layers` entries of (key, value), each `heads * len * head_dim` floats.
    data: Vec<(Vec<f32>, Vec<f32>)>,
}

impl KvCache {
    /// An empty cache for a model of this shape.
    pub fn new(layers: usize, heads: usize, head_dim: usize) -> Self {
        Self {
            layers,
            heads,
            head_dim,
            len: 0,
            data: vec![(Vec::new(), Vec::new()); layers],
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

    /// Number of layers.
    pub fn layers(&self) -> usize {
        self.layers
    }

    /// Shape `[1, heads, len, head_dim]` as ONNX wants it.
    pub fn shape(&self) -> [i64; 4] {
        [1, self.heads as i64, self.len as i64, self.head_dim as i64]
    }

    /// Takes the buffers out (to move them into input tensors without copying); the cache
    /// is left empty until [`KvCache::adopt`] puts the model's outputs back.
    pub fn take(&mut self) -> Vec<(Vec<f32>, Vec<f32>)> {
        self.len = 0;
        std::mem::replace(&mut self.data, vec![(Vec::new(), Vec::new()); self.layers])
    }

    /// Appends by adopting `present` buffers that hold `new_len` positions, which must be
    /// the old length plus what was just run.
    pub fn adopt(
        &mut self,
        present: Vec<(Vec<f32>, Vec<f32>)>,
        new_len: usize,
    ) -> Result<(), EngineError> {
        let want = self.heads * new_len * self.head_dim;
        if present.len() != self.layers
            || present
                .iter()
                .any(|(k, v)| k.len() != want || v.len() != want)
        {
            return Err(EngineError::Draft(format!(
                "present KV has the wrong shape: {} layers, expected {} layers of {want} floats",
                present.len(),
                self.layers
            )));
        }
        self.data = present;
        self.len = new_len;
        Ok(())
    }

    /// Drops the newest `n` positions (all of them when `n >= len`).
    pub fn rollback(&mut self, n: usize) {
        let keep = self.len.saturating_sub(n);
        if keep == self.len {
            return;
        }
        let (heads, hd, old) = (self.heads, self.head_dim, self.len);
        for (k, v) in &mut self.data {
            for buf in [k, v] {
                // Each head's rows are contiguous: move the kept rows of head h to their new home.
                for h in 0..heads {
                    let src = h * old * hd;
                    let dst = h * keep * hd;
                    buf.copy_within(src..src + keep * hd, dst);
                }
                buf.truncate(heads * keep * hd);
            }
        }
        self.len = keep;
    }

    /// Empties the cache.
    pub fn clear(&mut self) {
        self.rollback(self.len);
    }

    /// Gives back memory beyond what the cache holds now (a rollback keeps its buffers' size).
    pub fn shrink(&mut self) {
        for (k, v) in &mut self.data {
            k.shrink_to_fit();
            v.shrink_to_fit();
        }
    }

    /// Bytes the buffers hold.
    pub fn capacity_bytes(&self) -> usize {
        self.data
            .iter()
            .map(|(k, v)| (k.capacity() + v.capacity()) * std::mem::size_of::<f32>())
            .sum()
    }

    /// Key buffer of one layer (for tests and diagnostics).
    pub fn key(&self, layer: usize) -> &[f32] {
        self.data
            .get(layer)
            .map(|(k, _)| k.as_slice())
            .unwrap_or(&[])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Builds present buffers whose value encodes (layer, head, pos, dim), so any misplaced
    /// row shows up in an equality check.
    fn present(layers: usize, heads: usize, len: usize, hd: usize) -> Vec<(Vec<f32>, Vec<f32>)> {
        (0..layers)
            .map(|l| {
                let mut k = Vec::new();
                for h in 0..heads {
                    for p in 0..len {
                        for d in 0..hd {
                            k.push((l * 1000 + h * 100 + p * 10 + d) as f32);
                        }
                    }
                }
                let v = k.iter().map(|x| -x).collect();
                (k, v)
            })
            .collect()
    }

    #[test]
    fn append_then_rollback_equals_shorter_run() -> Result<(), EngineError> {
        let mut c = KvCache::new(2, 2, 3);
        c.adopt(present(2, 2, 5, 3), 5)?;
        assert_eq!(c.len(), 5);
        c.rollback(2);
        assert_eq!(c.len(), 3);
        let expect = present(2, 2, 3, 3);
        for (l, (ek, _)) in expect.iter().enumerate() {
            assert_eq!(c.key(l), ek.as_slice(), "layer {l}");
        }
        assert_eq!(c.data[1].1, expect[1].1);
        assert_eq!(c.shape(), [1, 2, 3, 3]);
        Ok(())
    }

    #[test]
    fn rollback_past_start_empties() -> Result<(), EngineError> {
        let mut c = KvCache::new(1, 2, 2);
        c.adopt(present(1, 2, 4, 2), 4)?;
        c.rollback(10);
        assert!(c.is_empty());
        assert!(c.key(0).is_empty());
        c.rollback(1);
        assert!(c.is_empty());
        Ok(())
    }

    #[test]
    fn adopt_rejects_wrong_shape() {
        let mut c = KvCache::new(2, 2, 3);
        assert!(c.adopt(present(2, 2, 4, 3), 5).is_err());
        assert!(c.adopt(present(1, 2, 5, 3), 5).is_err());
    }

    #[test]
    fn take_then_adopt_extends() -> Result<(), EngineError> {
        let mut c = KvCache::new(1, 1, 2);
        c.adopt(present(1, 1, 2, 2), 2)?;
        let taken = c.take();
        assert_eq!(taken[0].0.len(), 4);
        assert!(c.is_empty());
        c.adopt(present(1, 1, 3, 2), 3)?;
        assert_eq!(c.len(), 3);
        Ok(())
    }
}
