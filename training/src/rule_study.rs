//! What each acceptance rule would accept on collected rows: the study that separates what a
//! rule allows from what a verifier achieves. On the held-out rows that carry the target's
//! probabilities, per prompt kind: the share the rule accepts, how well the draft's own
//! confidence ranks the rule's accepts above its rejects (ROC AUC), and how much that
//! confidence can accept while at most 5 % of what it accepts breaks the rule.

use approxy_verifier::calibration::RuleReport;
use approxy_verifier::verify::AcceptanceRule;

use crate::dataset::Rows;
use crate::report::{at_budget, confidence_against, roc_auc};

/// The false-accept budget the study reports the confidence baseline at.
const BUDGET: f32 = 0.05;

/// Every rule of [`AcceptanceRule::COMPARED`] on the rows `idx` of each kind that carry the
/// target's probabilities; empty when none do.
pub fn study(rows: &Rows, idx: &[usize]) -> Vec<RuleReport> {
    let mut out = Vec::new();
    for rule in AcceptanceRule::COMPARED {
        for (kind, k) in [("code", 0u8), ("chat", 1u8)] {
            let labelled: Vec<(usize, f32)> = idx
                .iter()
                .filter(|&&i| rows.kinds[i] == k)
                .filter_map(|&i| rows.rule_label(i, &rule).map(|l| (i, l)))
                .collect();
            if labelled.is_empty() {
                continue;
            }
            let idx: Vec<usize> = labelled.iter().map(|&(i, _)| i).collect();
            let scored = confidence_against(rows, &idx, labelled.iter().map(|&(_, l)| l >= 0.5));
            out.push(RuleReport {
                rule: rule.to_string(),
                kind: kind.to_string(),
                rows: labelled.len(),
                positive: labelled.iter().map(|&(_, l)| f64::from(l)).sum::<f64>()
                    / labelled.len() as f64,
                confidence_auc: roc_auc(&scored.scores, &scored.labels),
                confidence_accept_at_5_percent: f64::from(
                    at_budget(&scored, |_| true, BUDGET).accept_rate,
                ),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use approxy_verifier::verify::Features;

    fn features(token: u32, confidence: f32) -> Features {
        Features {
            top1: token,
            token,
            top1_prob: confidence,
            stats: [confidence, 0.0, 0.0, 0.0],
            hidden: vec![0.0].into(),
            context: Default::default(),
            syntax: Default::default(),
        }
    }

    /// Four code rows: the draft proposes token 1 each time; the target agrees at two (its
    /// top token is 1), finds 1 a close second at one and unlikely at the last. Identity
    /// accepts 2 of 4, `ratio:0.5` 3 of 4; a row without the target's probabilities is left out.
    #[test]
    fn each_rule_counts_what_it_accepts_from_the_stored_probabilities() {
        let ln = |p: f64| p.ln() as f32;
        let mut rows = Rows::new(1);
        let cases: [(f32, Vec<(u32, f32)>); 4] = [
            (0.95, vec![(1, ln(0.9)), (2, ln(0.05))]),
            (0.9, vec![(1, ln(0.8)), (2, ln(0.1))]),
            (0.6, vec![(2, ln(0.5)), (1, ln(0.4))]),
            (0.3, vec![(2, ln(0.9)), (1, ln(0.01))]),
        ];
        for (c, top) in &cases {
            let f = features(1, *c);
            rows.push_with_target(&f, top[0].0 == 1, 7, 0, Some(top));
        }
        rows.push(&features(1, 0.99), true, 7, 0);
        assert_eq!(rows.rows_with_target_probs(), 4);
        let idx: Vec<usize> = (0..rows.len()).collect();
        let study = study(&rows, &idx);
        let of = |name: &str| study.iter().find(|r| r.rule == name && r.kind == "code");
        let identical = of("identical").map(|r| (r.rows, r.positive));
        assert_eq!(identical, Some((4, 0.5)));
        assert_eq!(of("ratio:0.5").map(|r| r.positive), Some(0.75));
        // Confidence orders the rows exactly as ratio:0.5 splits them.
        assert_eq!(of("ratio:0.5").and_then(|r| r.confidence_auc), Some(1.0));
        assert_eq!(
            of("ratio:0.5").map(|r| r.confidence_accept_at_5_percent),
            Some(0.75)
        );
        assert!(study.iter().all(|r| r.kind == "code"));
    }
}
