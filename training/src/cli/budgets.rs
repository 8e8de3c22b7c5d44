//! The false-accept budgets the shipped policies name, and each verifier at each of them.

use approxy_verifier::calibration::{AtBudget, BudgetComparison};

use crate::report::{Scored, at_budget, grid};

/// A false-accept budget a shipped policy names.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum PolicyBudget {
    /// `max_false_accept_rate = x`.
    FalseAcceptRate(f32),
    /// `threshold = t` with the confidence verifier: the budget is the false-accept rate that
    /// threshold gives on the kind's held-out rows.
    ConfidenceThreshold(f32),
    /// `threshold = { code = c, chat = t }` with the confidence verifier: each kind's budget is
    /// the false-accept rate its own threshold gives on its held-out rows.
    ConfidenceByKind {
        /// On code prompts.
        code: f32,
        /// On chat prompts.
        chat: f32,
    },
}

impl PolicyBudget {
    /// The confidence threshold for prompts of `kind` (`"code"` or `"chat"`), when the policy
    /// names one.
    fn threshold(self, kind: &str) -> Option<f32> {
        match self {
            PolicyBudget::FalseAcceptRate(_) => None,
            PolicyBudget::ConfidenceThreshold(t) => Some(t),
            PolicyBudget::ConfidenceByKind { code, chat } => {
                Some(if kind == "code" { code } else { chat })
            }
        }
    }
}

/// The shipped policies' budgets (`policies/*.toml`; a test keeps the two in step).
pub const POLICY_BUDGETS: [(&str, PolicyBudget); 3] = [
    (
        "default",
        PolicyBudget::ConfidenceByKind {
            code: 0.85,
            chat: 0.9,
        },
    ),
    ("economy", PolicyBudget::ConfidenceThreshold(0.5)),
    ("strict", PolicyBudget::FalseAcceptRate(0.01)),
];

/// Each verifier at each policy's budget, by prompt kind: the baseline, the best learned
/// head, and the best on the other side of the context.
pub(super) fn budgets(
    base: &Scored,
    learned: (&str, &Scored),
    other_side: Option<(&str, &Scored)>,
) -> Vec<BudgetComparison> {
    fn in_kind(s: &Scored, k: u8) -> impl Fn(usize) -> bool + '_ {
        move |i| s.kinds[i] == k
    }
    let mut out = Vec::new();
    for (policy, b) in POLICY_BUDGETS {
        for (kind, k) in [("code", 0u8), ("chat", 1u8)] {
            let (budget, source) = match (b, b.threshold(kind)) {
                (PolicyBudget::FalseAcceptRate(x), _) => (x, format!("max_false_accept_rate {x}")),
                (_, Some(t)) => (
                    grid(base, in_kind(base, k), &[t])[0].false_accept_rate,
                    format!("confidence at threshold {t}"),
                ),
                (_, None) => continue,
            };
            let verifiers = std::iter::once(("confidence", base))
                .chain(std::iter::once(learned))
                .chain(other_side)
                .map(|(name, s)| {
                    let p = at_budget(s, in_kind(s, k), budget);
                    AtBudget {
                        verifier: name.to_string(),
                        threshold: p.threshold,
                        accept_rate: p.accept_rate,
                        false_accept_rate: p.false_accept_rate,
                        target_calls_per_100_tokens: p.target_calls_per_100_tokens,
                    }
                })
                .collect();
            out.push(BudgetComparison {
                policy: policy.to_string(),
                source,
                kind: kind.to_string(),
                budget,
                verifiers,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    /// The budgets the report compares at are the ones the shipped policies name.
    #[test]
    fn policy_budgets_match_the_policy_files() -> Result<(), String> {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies");
        for (policy, budget) in POLICY_BUDGETS {
            let text = std::fs::read_to_string(dir.join(format!("{policy}.toml")))
                .map_err(|e| e.to_string())?;
            let v: toml::Value = toml::from_str(&text).map_err(|e| e.to_string())?;
            let m = &v["models"]["*"];
            let num = |k: &str| m.get(k).and_then(toml::Value::as_float).map(|x| x as f32);
            match budget {
                PolicyBudget::FalseAcceptRate(x) => {
                    assert_eq!(num("max_false_accept_rate"), Some(x), "{policy}")
                }
                PolicyBudget::ConfidenceThreshold(_) | PolicyBudget::ConfidenceByKind { .. } => {
                    for kind in ["code", "chat"] {
                        // One number for every kind, or a table per kind.
                        let t = num("threshold").or_else(|| {
                            m.get("threshold")
                                .and_then(|t| t.get(kind))
                                .and_then(toml::Value::as_float)
                                .map(|x| x as f32)
                        });
                        assert_eq!(t, budget.threshold(kind), "{policy} {kind}");
                    }
                    assert_eq!(
                        m.get("verifier").and_then(toml::Value::as_str),
                        Some("confidence"),
                        "{policy}"
                    );
                }
            }
        }
        Ok(())
    }
}
