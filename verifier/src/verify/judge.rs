//! The verifier's trait, the baseline verifier (the draft's own top-1 probability) and the
//! per-token decision with its threshold rule.

use super::context::Context;
use super::features::Features;
use crate::draft::PositionOutput;

/// Scores draft tokens.
pub trait Verifier: Send + Sync + std::fmt::Debug {
    /// p_accept in [0, 1].
    fn p_accept(&self, f: &Features) -> f32;
    /// A short name for stats and logs.
    fn kind(&self) -> &'static str;
    /// True when it reads [`Features::context`]: only then does the decode loop keep one.
    fn reads_context(&self) -> bool {
        false
    }
    /// The target model its thresholds were calibrated against, when they were (a learned
    /// head's mean something only for that draft-target pair).
    fn calibrated_with(&self) -> Option<&str> {
        None
    }
}

/// The baseline: p_accept is the draft's own top-1 probability.
#[derive(Debug, Clone, Copy, Default)]
pub struct ConfidenceVerifier;

impl Verifier for ConfidenceVerifier {
    fn p_accept(&self, f: &Features) -> f32 {
        f.top1_prob
    }
    fn kind(&self) -> &'static str {
        "confidence"
    }
}

/// Whether the verifier accepts `token` at a position with the draft's output `out`, in the
/// answer's context `ctx` (kept when the verifier reads it); and the draft's entropy there,
/// when it was computed.
pub fn decide(
    verifier: &dyn Verifier,
    out: &PositionOutput,
    token: u32,
    threshold: f32,
    ctx: Option<&Context>,
) -> (bool, Option<f32>) {
    // The dial's ends do not need the verifier (nor the feature computation).
    if threshold <= 0.0 || threshold >= 1.0 {
        return (accepts(0.0, threshold), None);
    }
    let mut f = Features::of_token(out, Some(token));
    if let Some(ctx) = ctx {
        f = f.with_context(ctx);
    }
    (accepts(verifier.p_accept(&f), threshold), Some(f.entropy()))
}

/// The threshold rule, exactly: `threshold <= 0` accepts everything, `threshold >= 1` rejects
/// everything, otherwise accept when `p_accept >= threshold`. The two ends are decided
/// without looking at `p` so that the dial's ends mean "draft only" and "target only" even
/// for a verifier that can output exactly 0 or 1.
pub fn accepts(p_accept: f32, threshold: f32) -> bool {
    if threshold <= 0.0 {
        true
    } else if threshold >= 1.0 {
        false
    } else {
        p_accept >= threshold
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threshold_ends_are_absolute() {
        assert!(accepts(0.0, 0.0));
        assert!(accepts(0.0, -1.0));
        assert!(!accepts(1.0, 1.0));
        assert!(!accepts(1.0, 2.0));
        assert!(accepts(0.5, 0.5));
        assert!(!accepts(0.49, 0.5));
    }

    #[test]
    fn confidence_is_top1_prob() {
        let f = Features {
            top1: 3,
            token: 3,
            top1_prob: 0.8,
            stats: [0.8, 0.5, 0.7, 10.0],
            hidden: vec![].into(),
            context: Default::default(),
            syntax: Default::default(),
        };
        assert_eq!(ConfidenceVerifier.p_accept(&f), 0.8);
    }
}
