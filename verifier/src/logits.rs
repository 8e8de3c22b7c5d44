//! One pass over a position's logits for what the decode loop reads there: the draft's top
//! token and the softmax statistics the verifier's features and the answer's context use.
//! [`PositionOutput::scan`](crate::draft::PositionOutput::scan) takes it once per position.

/// Below this many nats under the largest logit a token's exponential is left out of the sums:
/// e^-30 ≈ 9e-14, so the whole vocabulary's worth of them (151,936 · 9e-14 ≈ 1.4e-8) is below
/// the f32 resolution of a normaliser that is at least 1: their exponentials are not taken.
const NEGLIGIBLE: f32 = -30.0;

/// What one pass over a position's logits gives: the largest and its index, the second largest,
/// and the softmax's normaliser and entropy. The one computation of these, so a context's
/// entropies and the features' are the same numbers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LogitScan {
    /// Index of the largest logit (the first one on ties).
    pub top1: usize,
    /// The largest logit.
    pub max: f32,
    /// The second largest (equal to `max` on a tie).
    pub second: f32,
    /// Σ exp(x − max).
    pub z: f64,
    /// The entropy in nats.
    pub entropy: f32,
}

impl LogitScan {
    /// One pass, one exponential per token that is not negligible (this runs for every drafted
    /// token, over 151,936 entries). With d = x − max, e = exp(d), z = Σe and s = Σe·d, the
    /// entropy −Σ(e/z)(d − ln z) is ln z − s/z. The sums are kept relative to the largest logit
    /// seen so far; when a larger one comes, they are rescaled to it: with δ the rise,
    /// z' = z·e^−δ and s' = e^−δ·(s − δ·z).
    pub fn of(logits: &[f32]) -> Self {
        let (mut top1, mut max, mut second) = (0usize, f32::NEG_INFINITY, f32::NEG_INFINITY);
        let (mut z, mut s) = (0.0f64, 0.0f64);
        for (i, &x) in logits.iter().enumerate() {
            if x > max {
                if z > 0.0 {
                    let rise = f64::from(x - max);
                    let r = (-rise).exp();
                    s = r * (s - rise * z);
                    z *= r;
                }
                second = max;
                max = x;
                top1 = i;
                // The new largest itself: e = 1, d = 0.
                z += 1.0;
            } else {
                second = second.max(x);
                let d = x - max;
                // A masked token (-inf) is negligible too, where 0 * -inf would be NaN.
                if d > NEGLIGIBLE {
                    let e = f64::from(d.exp());
                    z += e;
                    s += e * f64::from(d);
                }
            }
        }
        let entropy = if z > 0.0 {
            (z.ln() - s / z) as f32
        } else {
            0.0
        };
        Self {
            top1,
            max,
            second,
            z,
            entropy,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_one_pass_entropy_is_the_definition_s() {
        // Logits spread like a language model's: a few large, a long tail.
        let logits: Vec<f32> = (0..50_000u32)
            .map(|i| {
                ((i.wrapping_mul(2_654_435_761) % 1000) as f32 / 50.0) - 10.0
                    + if i % 997 == 0 { 12.0 } else { 0.0 }
            })
            .collect();
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let LogitScan { z, entropy: h, .. } = LogitScan::of(&logits);
        let z2: f64 = logits.iter().map(|&x| f64::from(x - max).exp()).sum();
        let h2: f64 = logits
            .iter()
            .map(|&x| {
                let lp = f64::from(x - max) - z2.ln();
                -lp.exp() * lp
            })
            .sum();
        assert!((z - z2).abs() / z2 < 1e-7, "{z} against {z2}");
        assert!((f64::from(h) - h2).abs() < 1e-5, "{h} against {h2}");
    }
}
