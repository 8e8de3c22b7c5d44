//! Verifiers' scores on the held-out rows and their AUCs: overall, per kind, per collection
//! source and per prompt source.

use approxy_verifier::calibration::{
    AtBudget, Auc, BudgetComparison, PromptSourceReport, SourceAtBudget, SourceReport,
};
use approxy_verifier::verify::Verifier;

use crate::dataset::Rows;
use crate::report::{Scored, baseline, grid, roc_auc};

pub(super) fn scored(v: &dyn Verifier, rows: &Rows, idx: &[usize]) -> Scored {
    let mut b = baseline(rows, idx);
    b.scores = idx
        .iter()
        .map(|&i| v.p_accept(&rows.features_of(i)))
        .collect();
    b
}

/// Scores and labels of the rows `keep` selects.
fn selected(s: &Scored, keep: impl Fn(usize) -> bool) -> (Vec<f32>, Vec<bool>) {
    (0..s.scores.len())
        .filter(|&i| keep(i))
        .map(|i| (s.scores[i], s.labels[i]))
        .unzip()
}

/// Scores and labels of one prompt kind (`None`: all).
pub(super) fn of_kind(s: &Scored, k: Option<u8>) -> (Vec<f32>, Vec<bool>) {
    selected(s, |i| k.is_none_or(|k| s.kinds[i] == k))
}

/// AUC overall and per kind, over the rows `keep` selects.
fn aucs_where(s: &Scored, keep: impl Fn(usize) -> bool) -> Auc {
    let sub = |k: Option<u8>| {
        let (sc, lb) = selected(s, |i| keep(i) && k.is_none_or(|k| s.kinds[i] == k));
        roc_auc(&sc, &lb)
    };
    Auc {
        all: sub(None),
        code: sub(Some(0)),
        chat: sub(Some(1)),
    }
}

pub(super) fn aucs(s: &Scored) -> Auc {
    aucs_where(s, |_| true)
}

/// The held-out rows split by how they were collected (empty sources left out).
pub(super) fn by_source(base: &Scored, learned: &Scored) -> Vec<SourceReport> {
    [("teacher-forced", false), ("live", true)]
        .into_iter()
        .filter_map(|(name, live)| {
            let keep = |i: usize| base.live[i] == live;
            let (_, labels) = selected(base, keep);
            (!labels.is_empty()).then(|| SourceReport {
                source: name.to_string(),
                rows: labels.len(),
                agreement: labels.iter().filter(|l| **l).count() as f64 / labels.len() as f64,
                confidence: aucs_where(base, keep),
                learned: aucs_where(learned, keep),
            })
        })
        .collect()
}

/// The held-out rows by the corpus source of their prompt (`held` gives each scored row's
/// index in `rows`), code sources first, each kind's sources in corpus order; every policy's
/// budget applies each verifier's threshold for the source's kind (from `budgets`).
pub(super) fn by_prompt_source(
    corpus: &[crate::corpus::CorpusPrompt],
    rows: &Rows,
    held: &[usize],
    base: &Scored,
    learned: (&str, &Scored),
    budgets: &[BudgetComparison],
) -> Vec<PromptSourceReport> {
    let src = held_sources(corpus, rows, held);
    ["code", "chat"]
        .into_iter()
        .flat_map(|kind| {
            crate::corpus::sources(corpus, kind)
                .into_iter()
                .map(move |s| (s, kind))
        })
        .filter_map(|(source, kind)| {
            let keep = |j: usize| src[j] == source;
            let (_, labels) = selected(base, keep);
            if labels.is_empty() {
                return None;
            }
            let prompts: std::collections::HashSet<u32> = (0..held.len())
                .filter(|&j| keep(j))
                .map(|j| rows.prompt_ids[held[j]])
                .collect();
            let auc = |s: &Scored| {
                let (sc, lb) = selected(s, keep);
                roc_auc(&sc, &lb)
            };
            Some(PromptSourceReport {
                source: source.to_string(),
                kind: kind.to_string(),
                prompts: prompts.len(),
                rows: labels.len(),
                agreement: labels.iter().filter(|l| **l).count() as f64 / labels.len() as f64,
                confidence_auc: auc(base),
                learned_auc: auc(learned.1),
                budgets: source_budgets(budgets, kind, base, learned, keep),
            })
        })
        .collect()
}

/// The corpus source of each held-out row's prompt (`unknown` for a prompt not in the corpus).
fn held_sources<'a>(
    corpus: &'a [crate::corpus::CorpusPrompt],
    rows: &Rows,
    held: &[usize],
) -> Vec<&'a str> {
    let source_of: std::collections::HashMap<u32, &str> =
        corpus.iter().map(|p| (p.id, p.source.as_str())).collect();
    held.iter()
        .map(|&i| {
            source_of
                .get(&rows.prompt_ids[i])
                .copied()
                .unwrap_or("unknown")
        })
        .collect()
}

/// Each policy budget of `kind`, its confidence and learned thresholds applied to the rows
/// `keep` selects (other verifiers left out).
fn source_budgets(
    budgets: &[BudgetComparison],
    kind: &str,
    base: &Scored,
    learned: (&str, &Scored),
    keep: impl Fn(usize) -> bool + Copy,
) -> Vec<SourceAtBudget> {
    budgets
        .iter()
        .filter(|b| b.kind == kind)
        .map(|b| SourceAtBudget {
            policy: b.policy.clone(),
            verifiers: b
                .verifiers
                .iter()
                .filter_map(|v| {
                    let s = if v.verifier == "confidence" {
                        base
                    } else if v.verifier == learned.0 {
                        learned.1
                    } else {
                        return None;
                    };
                    let p = grid(s, keep, &[v.threshold])[0];
                    Some(AtBudget {
                        verifier: v.verifier.clone(),
                        threshold: v.threshold,
                        accept_rate: p.accept_rate,
                        false_accept_rate: p.false_accept_rate,
                        target_calls_per_100_tokens: p.target_calls_per_100_tokens,
                    })
                })
                .collect(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use approxy_verifier::calibration::Calibration;

    use super::super::markdown::markdown;
    use super::*;

    #[test]
    fn by_prompt_source_applies_each_kinds_threshold_to_each_source() {
        let p = |id: u32, kind: &str, source: &str| crate::corpus::CorpusPrompt {
            id,
            kind: kind.into(),
            source: source.into(),
            prompt: String::new(),
        };
        let corpus = [
            p(1, "code", "a"),
            p(2, "code", "b"),
            p(3, "chat", "x"),
            p(4, "chat", "y"),
        ];
        let mut rows = Rows::new(0);
        // Row 0 is a training row; rows 1-4 are held out.
        rows.prompt_ids = vec![9, 1, 1, 2, 3];
        let held = [1, 2, 3, 4];
        let scored = |scores: Vec<f32>| Scored {
            scores,
            labels: vec![true, false, true, true],
            kinds: vec![0, 0, 0, 1],
            live: vec![false; 4],
        };
        let (base, learned) = (
            scored(vec![0.9, 0.6, 0.4, 0.8]),
            scored(vec![0.9, 0.2, 0.7, 0.1]),
        );
        let at = |verifier: &str, threshold: f32| AtBudget {
            verifier: verifier.into(),
            threshold,
            accept_rate: 0.0,
            false_accept_rate: 0.0,
            target_calls_per_100_tokens: 0.0,
        };
        let budgets = ["code", "chat"].map(|kind| BudgetComparison {
            policy: "default".into(),
            source: String::new(),
            kind: kind.into(),
            budget: 0.1,
            verifiers: vec![at("confidence", 0.5), at("mlp", 0.5), at("other", 0.5)],
        });
        let r = by_prompt_source(&corpus, &rows, &held, &base, ("mlp", &learned), &budgets);
        // `y` has no held-out row.
        let names: Vec<&str> = r.iter().map(|r| r.source.as_str()).collect();
        assert_eq!(names, ["a", "b", "x"]);
        let a = &r[0];
        assert_eq!((a.kind.as_str(), a.prompts, a.rows), ("code", 1, 2));
        assert_eq!(a.agreement, 0.5);
        assert_eq!((a.confidence_auc, a.learned_auc), (Some(1.0), Some(1.0)));
        // One policy of the code kind, the two verifiers the report compares.
        assert_eq!(a.budgets.len(), 1);
        let v = &a.budgets[0].verifiers;
        assert_eq!(v.len(), 2);
        // At 0.5 the baseline accepts both of a's rows (one wrongly), the head only the right one.
        assert_eq!((v[0].accept_rate, v[0].false_accept_rate), (1.0, 0.5));
        assert_eq!((v[1].accept_rate, v[1].false_accept_rate), (0.5, 0.0));
        assert_eq!(r[1].budgets[0].verifiers[1].accept_rate, 1.0);
        assert_eq!(r[2].kind, "chat");
        assert_eq!(r[2].budgets[0].verifiers[1].accept_rate, 0.0);
        let c = Calibration {
            by_prompt_source: r,
            ..Calibration::load(
                &Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("../policies/verifier/calibration.json"),
            )
            .unwrap_or_else(|e| panic!("{e}"))
        };
        let md = markdown(&c);
        assert!(md.contains("Code prompts come from `a`, `b`, chat prompts from `x`"));
        assert!(
            md.contains("| a | code | 1 | 2 | 50.0 % | 1.0000 | 1.0000 |"),
            "{md}"
        );
        assert!(
            md.contains("| a | default | 0.500, 1.000 / 0.5000 / 0.0 |"),
            "{md}"
        );
    }
}
