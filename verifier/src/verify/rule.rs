//! Acceptance rules: whether the target would accept the draft's token at a position, computed
//! from the target's probabilities there. The verifier is trained to predict one of them, and
//! its false-accept rate is measured against it. From strictest to most lenient on this model
//! pair (`shared/FACTS.md`, "Acceptance rules"):
//! - `identical`: the draft's token is the target's top token (greedy agreement);
//! - `sprinter`: speculative sampling's acceptance probability min(1, p(x)/q(x)), a soft label;
//!   `sprinter-hard` is SPRINTER's reference label p(x) >= q(x) (stricter than identity with a
//!   greedy draft, which is usually more confident than the target on the tokens both pick);
//! - `ratio:R`: p(x) >= R * max p (speculative cascades' deferral rule);
//! - `typical:EPS,DELTA`: Medusa's typical acceptance, p(x) > min(EPS, DELTA * exp(-H(p))).
//!
//! The target's distribution is known only through its top-k log-probabilities (what a
//! llama-server `n_probs` or an OpenAI-style `logprobs` answer gives). A draft token outside the
//! top-k has probability at most the k-th's; every rule here treats it as not acceptable, so a
//! label is never more lenient than the rule.

use std::fmt;

/// The target's probabilities at one position, as far as its top-k tells them.
#[derive(Debug, Clone, PartialEq)]
pub struct TargetProbs {
    /// (token, natural-log probability at temperature 1), most likely first.
    pub top: Vec<(u32, f32)>,
}

impl TargetProbs {
    /// log p(token), when the token is in the top-k.
    pub fn logprob(&self, token: u32) -> Option<f32> {
        self.top.iter().find(|t| t.0 == token).map(|t| t.1)
    }

    /// The entropy of the target's distribution in nats, with the probability mass beyond the
    /// top-k counted as one outcome: a lower bound, exact when the top-k holds all the mass.
    pub fn entropy(&self) -> f32 {
        let mut h = 0.0f64;
        let mut mass = 0.0f64;
        for &(_, lp) in &self.top {
            let p = f64::from(lp).exp();
            mass += p;
            if p > 0.0 {
                h -= p * f64::from(lp);
            }
        }
        let rest = (1.0 - mass).max(0.0);
        if rest > 0.0 {
            h -= rest * rest.ln();
        }
        h as f32
    }
}

/// A rule that says whether the target accepts the draft's token.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum AcceptanceRule {
    /// The draft's token is the target's top token.
    Identical,
    /// min(1, p(x) / q(x)): the chance speculative sampling accepts x.
    Sprinter,
    /// p(x) >= q(x).
    SprinterHard,
    /// p(x) >= ratio * max p.
    Ratio(f32),
    /// p(x) > min(epsilon, delta * exp(-H(p))).
    Typical {
        /// Hard floor on the probability needed.
        epsilon: f32,
        /// Scale of the entropy-dependent threshold.
        delta: f32,
    },
}

impl AcceptanceRule {
    /// Medusa's published typical-acceptance parameters.
    pub const MEDUSA_TYPICAL: Self = Self::Typical {
        epsilon: 0.09,
        delta: 0.3,
    };

    /// The rules compared in reports: each named kind, at published parameters.
    pub const COMPARED: [Self; 6] = [
        Self::Identical,
        Self::SprinterHard,
        Self::Sprinter,
        Self::Ratio(0.5),
        Self::Ratio(0.2),
        Self::MEDUSA_TYPICAL,
    ];

    /// Parses a rule's name as [`fmt::Display`] writes it (`identical`, `sprinter`,
    /// `sprinter-hard`, `ratio:0.2`, `typical:0.09,0.3`).
    pub fn parse(s: &str) -> Result<Self, String> {
        let bad = |why: &str| format!("acceptance rule {s:?}: {why}");
        let prob = |v: &str| -> Result<f32, String> {
            let x: f32 = v.trim().parse().map_err(|_| bad("not a number"))?;
            if (0.0..=1.0).contains(&x) && x.is_finite() {
                Ok(x)
            } else {
                Err(bad("parameters lie in [0, 1]"))
            }
        };
        match s.split_once(':') {
            None => match s {
                "identical" => Ok(Self::Identical),
                "sprinter" => Ok(Self::Sprinter),
                "sprinter-hard" => Ok(Self::SprinterHard),
                _ => Err(bad(
                    "one of identical, sprinter, sprinter-hard, ratio:R, typical:EPS,DELTA",
                )),
            },
            Some(("ratio", r)) => Ok(Self::Ratio(prob(r)?)),
            Some(("typical", p)) => {
                let (e, d) = p.split_once(',').ok_or_else(|| bad("typical:EPS,DELTA"))?;
                Ok(Self::Typical {
                    epsilon: prob(e)?,
                    delta: prob(d)?,
                })
            }
            Some(_) => Err(bad("unknown rule")),
        }
    }

    /// How much the target accepts `token`, whose draft probability is `q`, in [0, 1]: 0 or 1
    /// for every rule but [`AcceptanceRule::Sprinter`], whose label is the acceptance chance.
    pub fn label(&self, token: u32, q: f32, target: &TargetProbs) -> f32 {
        let Some(top) = target.top.first() else {
            return 0.0;
        };
        if *self == Self::Identical {
            return f32::from(u8::from(top.0 == token));
        }
        let Some(lp) = target.logprob(token) else {
            return 0.0;
        };
        let p = lp.exp();
        let yes = |b: bool| f32::from(u8::from(b));
        match *self {
            Self::Identical => yes(top.0 == token),
            Self::Sprinter => {
                if q <= 0.0 {
                    1.0
                } else {
                    (p / q).min(1.0)
                }
            }
            Self::SprinterHard => yes(p >= q),
            // In log space: p >= r * max p.
            Self::Ratio(r) => yes(r <= 0.0 || lp >= r.ln() + top.1),
            Self::Typical { epsilon, delta } => {
                yes(p > epsilon.min(delta * (-target.entropy()).exp()))
            }
        }
    }

    /// True when the rule reads the draft's probability of its token (SPRINTER's two forms).
    pub fn reads_draft_probability(&self) -> bool {
        matches!(self, Self::Sprinter | Self::SprinterHard)
    }

    /// The label as accept or not: a soft label counts as accepted at 0.5 or more.
    pub fn accepts(&self, token: u32, q: f32, target: &TargetProbs) -> bool {
        self.label(token, q, target) >= 0.5
    }
}

impl fmt::Display for AcceptanceRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Identical => write!(f, "identical"),
            Self::Sprinter => write!(f, "sprinter"),
            Self::SprinterHard => write!(f, "sprinter-hard"),
            Self::Ratio(r) => write!(f, "ratio:{r}"),
            Self::Typical { epsilon, delta } => write!(f, "typical:{epsilon},{delta}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dist(probs: &[(u32, f64)]) -> TargetProbs {
        TargetProbs {
            top: probs.iter().map(|&(t, p)| (t, p.ln() as f32)).collect(),
        }
    }

    /// Labels worked out by hand from the probabilities: the target gives 0.6 to token 1, 0.3
    /// to token 2, 0.08 to token 3 (0.02 beyond its top three); the draft proposes each with
    /// confidence 0.9, and a token outside the top-k.
    #[test]
    fn labels_match_a_reference_computed_by_hand() {
        let t = dist(&[(1, 0.6), (2, 0.3), (3, 0.08)]);
        // H = -(0.6 ln 0.6 + 0.3 ln 0.3 + 0.08 ln 0.08 + 0.02 ln 0.02) = 0.9480
        assert!((t.entropy() - 0.9480).abs() < 1e-3, "{}", t.entropy());
        // typical threshold: min(0.09, 0.3 * e^-0.9480) = min(0.09, 0.1163) = 0.09
        let cases: [(AcceptanceRule, [f32; 4]); 6] = [
            (AcceptanceRule::Identical, [1.0, 0.0, 0.0, 0.0]),
            (AcceptanceRule::SprinterHard, [0.0, 0.0, 0.0, 0.0]),
            (
                AcceptanceRule::Sprinter,
                [0.6 / 0.9, 0.3 / 0.9, 0.08 / 0.9, 0.0],
            ),
            (AcceptanceRule::Ratio(0.5), [1.0, 1.0, 0.0, 0.0]),
            (AcceptanceRule::Ratio(0.1), [1.0, 1.0, 1.0, 0.0]),
            (AcceptanceRule::MEDUSA_TYPICAL, [1.0, 1.0, 0.0, 0.0]),
        ];
        for (rule, want) in cases {
            for (token, w) in [1u32, 2, 3, 99].into_iter().zip(want) {
                let got = rule.label(token, 0.9, &t);
                assert!(
                    (got - w).abs() < 1e-5,
                    "{rule} token {token}: {got} want {w}"
                );
            }
        }
        // p >= q holds when the draft is less sure than the target.
        assert_eq!(AcceptanceRule::SprinterHard.label(1, 0.5, &t), 1.0);
        assert!(AcceptanceRule::Sprinter.accepts(2, 0.5, &t));
    }

    #[test]
    fn a_flat_target_lowers_the_typical_bar() {
        // Ten tokens at 0.1 each: H = ln 10, 0.3 * e^-H = 0.03 < 0.09, so 0.1 passes.
        let flat = dist(&(0..10).map(|t| (t, 0.1)).collect::<Vec<_>>());
        assert_eq!(AcceptanceRule::MEDUSA_TYPICAL.label(7, 0.5, &flat), 1.0);
        // A peaked one raises it to epsilon: 0.05 fails.
        let peaked = dist(&[(0, 0.95), (1, 0.05)]);
        assert_eq!(AcceptanceRule::MEDUSA_TYPICAL.label(1, 0.5, &peaked), 0.0);
    }

    #[test]
    fn names_round_trip_and_bad_ones_are_refused() {
        for rule in AcceptanceRule::COMPARED {
            assert_eq!(AcceptanceRule::parse(&rule.to_string()), Ok(rule));
        }
        for bad in [
            "",
            "ratio",
            "ratio:2",
            "ratio:x",
            "typical:0.1",
            "judge",
            "identical:1",
        ] {
            assert!(AcceptanceRule::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn no_probabilities_accept_nothing() {
        let none = TargetProbs { top: Vec::new() };
        for rule in AcceptanceRule::COMPARED {
            assert_eq!(rule.label(1, 0.5, &none), 0.0, "{rule}");
        }
    }
}
