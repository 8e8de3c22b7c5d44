//! Choosing a token from logits: greedy (temperature 0) or temperature + top-p sampling with
//! a seeded generator, so a seed makes the output repeatable; and the pieces of speculative
//! sampling's acceptance rule (the distributions drawn from, the correction after a rejection).

use rand::{Rng, SeedableRng, rngs::StdRng};
use serde::{Deserialize, Serialize};

use crate::draft::PositionOutput;

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

    /// The distribution [`Sampler::pick`] draws from: (token, probability) at the temperature,
    /// summing to 1; cut to the top-p nucleus, most likely first, when top_p < 1, and the
    /// whole vocabulary in token order when it is 1 (no sort: an order does not change a draw).
    /// Greedy: the argmax alone.
    pub fn distribution(&self, logits: &[f32]) -> Vec<(u32, f32)> {
        nucleus(
            logits.iter().enumerate().map(|(i, &l)| (i as u32, l)),
            &self.params,
        )
    }

    /// Picks a token id at a draft position: greedy reads the top token of the position's one
    /// scan (which the verifier's features then reuse).
    pub fn pick_at(&mut self, out: &PositionOutput) -> u32 {
        if self.params.is_greedy() {
            return out.top1();
        }
        self.pick(&out.logits)
    }

    /// Picks a token id.
    pub fn pick(&mut self, logits: &[f32]) -> u32 {
        if self.params.is_greedy() {
            return argmax(logits).0 as u32;
        }
        let d = self.distribution(logits);
        self.pick_from(&d)
    }

    /// Draws a token from a distribution (weights need not sum to 1).
    pub fn pick_from(&mut self, dist: &[(u32, f32)]) -> u32 {
        let mass: f32 = dist.iter().map(|p| p.1).sum();
        let mut r = self.rng.random::<f32>() * mass;
        for &(i, p) in dist {
            if r < p {
                return i;
            }
            r -= p;
        }
        dist.last().map(|p| p.0).unwrap_or(0)
    }

    /// A uniform draw in [0, 1), for an acceptance test.
    pub fn uniform(&mut self) -> f32 {
        self.rng.random::<f32>()
    }
}

/// Probabilities at the params' temperature from log-weights (logits, or log-probabilities a
/// target reported), renormalised. Cut to the top-p nucleus, most likely first, when top_p < 1;
/// all of them, in the order given, when it is 1. Greedy: the largest alone, with probability 1.
pub fn nucleus(
    scores: impl Iterator<Item = (u32, f32)>,
    params: &SamplingParams,
) -> Vec<(u32, f32)> {
    let scores: Vec<(u32, f32)> = scores.collect();
    let max = scores.iter().map(|s| s.1).fold(f32::NEG_INFINITY, f32::max);
    if params.is_greedy() {
        let best = scores.iter().find(|s| s.1 == max).map_or(0, |s| s.0);
        return vec![(best, 1.0)];
    }
    let t = params.temperature;
    let mut probs: Vec<(u32, f32)> = scores
        .into_iter()
        .map(|(i, l)| (i, ((l - max) / t).exp()))
        .collect();
    let z: f32 = probs.iter().map(|p| p.1).sum();
    if params.top_p < 1.0 {
        probs = top_p_cut(probs, z, params.top_p);
    }
    let mass: f32 = probs.iter().map(|p| p.1).sum();
    for p in &mut probs {
        p.1 /= mass;
    }
    probs
}

/// The most likely entries whose share of `z` first reaches `top_p`, most likely first. A
/// partial selection finds a head of the vocabulary that holds that mass (a nucleus is small:
/// the head starts at 64 entries and grows fourfold until it is enough) and only the head is
/// sorted, not the 151,936 entries of a vocabulary.
fn top_p_cut(mut probs: Vec<(u32, f32)>, z: f32, top_p: f32) -> Vec<(u32, f32)> {
    let likelier = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1);
    let n = probs.len();
    let mut head = n.min(64);
    loop {
        if head < n {
            probs.select_nth_unstable_by(head - 1, likelier);
        }
        probs[..head].sort_unstable_by(likelier);
        let mut kept = 0.0;
        for (i, p) in probs[..head].iter().enumerate() {
            kept += p.1 / z;
            if kept >= top_p {
                probs.truncate(i + 1);
                return probs;
            }
        }
        if head == n {
            return probs;
        }
        head = n.min(head * 4);
    }
}

/// Probability of `token` in a distribution (0 when it is not there). A whole-vocabulary
/// distribution in token order is looked up by index.
pub fn prob_of(dist: &[(u32, f32)], token: u32) -> f32 {
    if let Some(&(t, p)) = dist.get(token as usize)
        && t == token
    {
        return p;
    }
    dist.iter().find(|p| p.0 == token).map_or(0.0, |p| p.1)
}

/// Speculative sampling's correction distribution after a rejected draft token: the target's
/// probability mass the draft under-weights, max(0, p − q), renormalised (by the caller's
/// draw). When the two agree everywhere (nothing left), the target's own distribution.
pub fn residual(target: &[(u32, f32)], draft: &[(u32, f32)]) -> Vec<(u32, f32)> {
    let r: Vec<(u32, f32)> = target
        .iter()
        .map(|&(t, p)| (t, (p - prob_of(draft, t)).max(0.0)))
        .filter(|p| p.1 > 0.0)
        .collect();
    if r.is_empty() { target.to_vec() } else { r }
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
    fn the_nucleus_is_renormalised_and_the_residual_is_what_the_draft_underweights() {
        let p = SamplingParams {
            temperature: 1.0,
            top_p: 0.75,
            seed: Some(1),
        };
        // Probabilities 0.5, 0.3, 0.2: the nucleus at 0.75 keeps the first two.
        let d = nucleus(
            [(7, 0.5f32.ln()), (8, 0.3f32.ln()), (9, 0.2f32.ln())].into_iter(),
            &p,
        );
        assert_eq!(d.iter().map(|x| x.0).collect::<Vec<_>>(), vec![7, 8]);
        assert!((prob_of(&d, 7) - 0.625).abs() < 1e-5 && (prob_of(&d, 8) - 0.375).abs() < 1e-5);
        assert_eq!(prob_of(&d, 9), 0.0);
        // Temperature 0.5 squares and renormalises: 0.25 : 0.09.
        let half = SamplingParams {
            temperature: 0.5,
            top_p: 1.0,
            seed: None,
        };
        let d = nucleus([(1, 0.5f32.ln()), (2, 0.3f32.ln())].into_iter(), &half);
        assert!((prob_of(&d, 1) - 0.25 / 0.34).abs() < 1e-5);
        let r = residual(&[(1, 0.6), (2, 0.4)], &[(1, 0.9), (2, 0.1)]);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].0, 2);
        assert!((r[0].1 - 0.3).abs() < 1e-6);
        assert_eq!(residual(&[(1, 1.0)], &[(1, 1.0)]), vec![(1, 1.0)]);
        assert_eq!(
            nucleus(
                [(4, -3.0), (5, -1.0)].into_iter(),
                &SamplingParams::default()
            ),
            vec![(5, 1.0)]
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
