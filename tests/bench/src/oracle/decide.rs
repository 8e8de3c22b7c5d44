//! How a configuration decides at each position: by a rule on the target's probabilities, by
//! a verifier's threshold on the draft's confidence, or in judged windows.

use anyhow::Context;
use approxy_verifier::calibration::{Calibration, Curve, threshold_for_kind};
use approxy_verifier::decode::{WINDOW_MAX, WINDOW_MAX_LIMIT, WINDOW_MIN};
use approxy_verifier::verify::{AcceptanceRule, TargetProbs, accepts};

/// A local verifier the oracle runs beside the rules: the draft's confidence against a
/// threshold per kind, either fixed (`confidence:T`, as a policy's `threshold = T`) or the one a
/// rule's calibration gives at a false-accept budget (`PATH@FAR`, as a policy's
/// `max_false_accept_rate` with `calibration = PATH`). Run under the same oracle, it shows what
/// share of a rule's saving a verifier realises, at what quality.
#[derive(Debug, Clone, PartialEq)]
pub struct VerifierConfig {
    /// The name the report shows.
    pub name: String,
    /// Threshold on code prompts.
    pub code: f32,
    /// Threshold on chat prompts.
    pub chat: f32,
}

impl VerifierConfig {
    /// Parses `confidence:T` or `PATH@FAR`.
    pub fn parse(s: &str) -> anyhow::Result<Self> {
        if let Some(t) = s.strip_prefix("confidence:") {
            let t: f32 = t.parse().with_context(|| format!("{s:?}: a threshold"))?;
            return Ok(Self {
                name: format!("confidence {t}"),
                code: t,
                chat: t,
            });
        }
        let (path, far) = s
            .rsplit_once('@')
            .with_context(|| format!("{s:?}: confidence:T or CALIBRATION@FAR"))?;
        let far: f32 = far
            .parse()
            .with_context(|| format!("{s:?}: a false-accept rate"))?;
        let path = std::path::Path::new(path);
        let at = |kind| {
            threshold_for_kind(path, kind, far, Curve::Confidence).map_err(anyhow::Error::msg)
        };
        let (code, chat) = (at("code")?, at("chat")?);
        let c = Calibration::load(path).map_err(anyhow::Error::msg)?;
        let rule = c.rule.as_deref().unwrap_or("identical");
        Ok(Self {
            name: format!(
                "confidence, {rule} at {:.0} % (code {code:.2}, chat {chat:.2})",
                100.0 * far
            ),
            code,
            chat,
        })
    }
}

/// Judged windows: the draft's confidence at a threshold keeps the differences it is sure of,
/// in windows of at most `window_max` draft tokens; with no threshold, exact windows (no
/// difference kept).
#[derive(Debug, Clone, PartialEq)]
pub struct JudgedConfig {
    /// The confidence threshold (both kinds); `None`: exact windows.
    pub threshold: Option<f32>,
    /// The longest window, in draft tokens.
    pub window_max: u32,
}

impl JudgedConfig {
    /// Parses `T` or `T@K`, where T is a threshold or `exact`.
    pub fn parse(s: &str) -> anyhow::Result<Self> {
        let (t, k) = match s.split_once('@') {
            Some((t, k)) => (
                t,
                k.parse()
                    .with_context(|| format!("{s:?}: a window length after @"))?,
            ),
            None => (s, WINDOW_MAX),
        };
        let threshold = if t == "exact" {
            None
        } else {
            let t: f32 = t
                .parse()
                .with_context(|| format!("{s:?}: a threshold or `exact`"))?;
            anyhow::ensure!(
                (0.0..=1.0).contains(&t),
                "{s:?}: the threshold is outside [0, 1]"
            );
            Some(t)
        };
        anyhow::ensure!(
            (WINDOW_MIN..=WINDOW_MAX_LIMIT).contains(&k),
            "{s:?}: windows of {WINDOW_MIN} to {WINDOW_MAX_LIMIT} tokens, as a policy's `window_max`"
        );
        Ok(Self {
            threshold,
            window_max: k,
        })
    }

    pub(super) fn name(&self) -> String {
        match self.threshold {
            Some(t) => format!("judged windows, confidence {t} (up to {})", self.window_max),
            None => format!("exact windows (up to {})", self.window_max),
        }
    }
}

/// A configuration: the oracle's decision at every position.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Decide {
    TargetOnly,
    DraftOnly,
    Rule(AcceptanceRule),
    Verifier(VerifierConfig),
    Judged(JudgedConfig),
}

impl Decide {
    pub(super) fn name(&self) -> String {
        match self {
            Self::TargetOnly => "target-only".into(),
            Self::DraftOnly => "draft-only".into(),
            Self::Rule(r) => r.to_string(),
            Self::Verifier(v) => v.name.clone(),
            Self::Judged(j) => j.name(),
        }
    }

    /// The longest window, where every token is scored in windows.
    pub(super) fn window_max(&self) -> Option<u32> {
        match self {
            Self::Judged(j) => Some(j.window_max),
            _ => None,
        }
    }

    /// Whether the draft's token `token`, of probability `q` under the draft, is emitted on a
    /// prompt of `kind` where the target's probabilities are `target`.
    pub(super) fn accepts(&self, kind: &str, token: u32, q: f32, target: &TargetProbs) -> bool {
        match self {
            Self::TargetOnly => false,
            Self::DraftOnly => true,
            Self::Rule(r) => r.accepts(token, q, target),
            Self::Verifier(v) => accepts(q, if kind == "code" { v.code } else { v.chat }),
            // A difference the confidence keeps; where the draft's token is the target's own,
            // `decode` keeps it anyway.
            Self::Judged(j) => j.threshold.is_some_and(|t| accepts(q, t)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A verifier configuration reads its thresholds per kind from a rule's calibration at a
    /// budget (the lowest threshold within it on that kind's confidence grid), or takes one
    /// fixed threshold; it then decides by the draft's confidence alone.
    #[test]
    fn verifier_configurations_resolve_thresholds_and_decide_by_confidence() -> anyhow::Result<()> {
        let committed = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../policies/verifier/calibration.json");
        let c = Calibration::load(&committed).map_err(anyhow::Error::msg)?;
        let v = VerifierConfig::parse(&format!("{}@0.05", committed.display()))?;
        let want = |g: &[approxy_verifier::calibration::CalibrationPoint]| {
            approxy_verifier::calibration::pick(g, 0.05).map(|p| p.threshold)
        };
        assert_eq!(Some(v.code), want(&c.by_kind.code.confidence));
        assert_eq!(Some(v.chat), want(&c.by_kind.chat.confidence));
        assert!(
            v.name.starts_with("confidence, identical at 5 %"),
            "{}",
            v.name
        );
        let fixed = VerifierConfig::parse("confidence:0.7")?;
        assert_eq!((fixed.code, fixed.chat), (0.7, 0.7));
        assert!(VerifierConfig::parse("nonsense").is_err());
        assert!(VerifierConfig::parse(&format!("{}@0", committed.display())).is_ok());
        let d = Decide::Verifier(VerifierConfig {
            name: "v".into(),
            code: 0.5,
            chat: 0.9,
        });
        // The target's probabilities play no part: only the draft's confidence and the kind.
        let t = TargetProbs {
            top: vec![(2, 0.0)],
        };
        assert!(d.accepts("code", 1, 0.6, &t));
        assert!(!d.accepts("chat", 1, 0.6, &t));
        assert!(!d.accepts("instructions", 1, 0.6, &t));
        assert!(d.accepts("instructions", 1, 0.95, &t));
        Ok(())
    }
}
