//! Choosing a token from logits: greedy (temperature 0) or temperature + top-p sampling with
//! a seeded generator, so a seed makes the output repeatable.

use rand::{Rng, SeedableRng, rngs::StdRng};
use serde::{Deserialize, Serialize};

/// Sampling parameters, applied identically to draft and target.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SamplingParams {
    /// 0 means greedy.
    pub temperature: f32,
    /// Nucleus mass in (0, 1].
    pub top_p: f32,
    /// Seed for repeatable sampling; `None` draws one.
    pub seed: Option<u64>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_p: 1.0,
            seed: None,
        }
    }
}

impl SamplingParams {
    /// True for greedy decoding.
    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0
    }
}

/// A sampler with its own random state.
#[derive(Debug)]
pub struct Sampler {
    params: SamplingParams,
    rng: StdRng,
}

impl Sampler {
    /// A sampler seeded from the params (or from entropy when no seed is given).
    pub fn new(params: SamplingParams) -> Self {
        let rng = match params.seed {
            Some(s) => StdRng::seed_from_u64(s),
            None => StdRng::from_os_rng(),
        };
        Self { params, rng }
    }

    /// Picks a token id.
    pub fn pick(&mut self, logits: &[f32]) -> u32 {
        if self.params.is_greedy() {
            return argmax(logits).0 as u32;
        }
        let t = self.params.temperature;
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut probs: Vec<(usize, f32)> = logits
            .iter()
            .enumerate()
            .map(|(i, &l)| (i, ((l - max) / t).exp()))
            .collect();
        let z: f32 = probs.iter().map(|p| p.1).sum();
        probs.sort_unstable_by(|a, b| b.1.total_cmp(&a.1));
        let mut kept = 0.0;
        let mut cut = probs.len();
        for (i, p) in probs.iter().enumerate() {
            kept += p.1 / z;
            if kept >= self.params.top_p {
                cut = i + 1;
                break;
            }
        }
        let nucleus = &probs[..cut];
        let mass: f32 = nucleus.iter().map(|p| p.1).sum();
        let mut r = self.rng.random::<f32>() * mass;
        for &(i, p) in nucleus {
            if r < p {
                return i as u32;
            }
            r -= p;
        }
        nucleus.last().map(|p| p.0 as u32).unwrap_or(0)
    }
}

/// Index and value of the largest logit (first one on ties, like llama.cpp's greedy).
pub fn argmax(xs: &[f32]) -> (usize, f32) {
    xs.iter()
        .enumerate()
        .fold((0, f32::NEG_INFINITY), |best, (i, &x)| {
            if x > best.1 { (i, x) } else { best }
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_takes_argmax() {
        let mut s = Sampler::new(SamplingParams::default());
        assert_eq!(s.pick(&[0.1, 3.0, 2.9, -1.0]), 1);
    }

    #[test]
    fn seed_repeats() {
        let p = SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            seed: Some(7),
        };
        let logits: Vec<f32> = (0..50).map(|i| (i % 7) as f32 * 0.3).collect();
        let a: Vec<u32> = {
            let mut s = Sampler::new(p);
            (0..20).map(|_| s.pick(&logits)).collect()
        };
        let b: Vec<u32> = {
            let mut s = Sampler::new(p);
            (0..20).map(|_| s.pick(&logits)).collect()
        };
        assert_eq!(a, b);
        assert!(
            a.iter().any(|&x| x != a[0]),
            "temperature 1 should not be constant"
        );
    }

    #[test]
    fn tiny_top_p_is_greedy() {
        let p = SamplingParams {
            temperature: 1.0,
            top_p: 1e-6,
            seed: Some(1),
        };
        let mut s = Sampler::new(p);
        for _ in 0..10 {
            assert_eq!(s.pick(&[0.0, 5.0, 1.0]), 1);
        }
    }
}
