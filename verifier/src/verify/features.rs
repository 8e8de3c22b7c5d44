//! Features of the draft at one position. This one function is used by serving and by
//! training, so the two cannot drift apart.

use serde::{Deserialize, Serialize};

use crate::draft::PositionOutput;

/// Names of the logit statistics, in the order [`Features::stats`] holds them.
pub const STAT_NAMES: [&str; 4] = ["top1_prob", "margin", "entropy", "top1_logit"];

/// Features at one position.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Features {
    /// Draft's most likely token.
    pub top1: u32,
    /// Softmax probability of `top1` (temperature 1).
    pub top1_prob: f32,
    /// Logit statistics in [`STAT_NAMES`] order: top-1 prob, top-1 minus top-2 prob,
    /// entropy (nats), raw top-1 logit.
    pub stats: [f32; 4],
    /// The hidden-state row.
    pub hidden: Vec<f32>,
}

impl Features {
    /// Computes the features from the draft's output at a position.
    pub fn from_output(out: &PositionOutput) -> Self {
        let l = &out.logits;
        let (mut i1, mut v1, mut v2) = (0usize, f32::NEG_INFINITY, f32::NEG_INFINITY);
        for (i, &x) in l.iter().enumerate() {
            if x > v1 {
                v2 = v1;
                v1 = x;
                i1 = i;
            } else if x > v2 {
                v2 = x;
            }
        }
        let z: f64 = l.iter().map(|&x| f64::from(x - v1).exp()).sum();
        let log_z = z.ln();
        let entropy: f64 = l
            .iter()
            .map(|&x| {
                let lp = f64::from(x - v1) - log_z;
                -lp.exp() * lp
            })
            .sum();
        let p1 = (1.0 / z) as f32;
        let p2 = (f64::from(v2 - v1).exp() / z) as f32;
        Self {
            top1: i1 as u32,
            top1_prob: p1,
            stats: [p1, p1 - p2, entropy as f32, v1],
            hidden: out.hidden.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_of_known_distribution() {
        // logits ln(0.5), ln(0.3), ln(0.2): probs 0.5/0.3/0.2.
        let out = PositionOutput {
            logits: vec![0.3f32.ln(), 0.5f32.ln(), 0.2f32.ln()],
            hidden: vec![1.0, 2.0],
        };
        let f = Features::from_output(&out);
        assert_eq!(f.top1, 1);
        assert!((f.top1_prob - 0.5).abs() < 1e-5);
        assert!((f.stats[1] - 0.2).abs() < 1e-5);
        let h = -(0.5f32 * 0.5f32.ln() + 0.3 * 0.3f32.ln() + 0.2 * 0.2f32.ln());
        assert!((f.stats[2] - h).abs() < 1e-4);
        assert_eq!(f.hidden, vec![1.0, 2.0]);
    }
}
