//! The calibration record of a fit: what was chosen, on which data, and every comparison the
//! report shows.

use std::time::Instant;

use approxy_verifier::calibration::{
    AucReport, BudgetComparison, ByKind, Calibration, DataSummary, FORMAT, KindGrids, OtherHead,
    PromptSourceReport,
};
use approxy_verifier::home::DRAFT_GGUF_SHA256;
use approxy_verifier::verify::learned::Artifact;

use super::budgets::{POLICY_BUDGETS, budgets};
use super::heads::{Candidate, Fitted, Split, overall_auc};
use super::scoring::{by_prompt_source, by_source};
use crate::dataset::Rows;
use crate::report::{Scored, grid, standard_thresholds};

/// The best head on the other side of the context from `best` (with it when the best has
/// none, and the other way round), so the budget comparison shows what the context adds.
fn other_side<'a>(best: &Candidate, others: &'a [Candidate]) -> Option<(&'a str, &'a Scored)> {
    let reads_context = |a: &Artifact| !a.features.context.is_empty();
    others
        .iter()
        .find(|c| reads_context(&c.artifact) != reads_context(&best.artifact))
        .map(|c| (c.name, &c.scores))
}

/// Whether the best head replaces the confidence baseline.
fn learned_wins(fitted: &Fitted, budgets: &[BudgetComparison]) -> bool {
    // What a user pays for is target calls at the quality they asked for: a learned head
    // replaces the baseline only when, besides a higher AUC, it makes fewer calls than the
    // baseline at the default policy's budget on both kinds of prompt.
    let fewer_calls_at_default = budgets
        .iter()
        .filter(|b| b.policy == POLICY_BUDGETS[0].0)
        .all(|b| match (b.verifiers.first(), b.verifiers.get(1)) {
            (Some(base), Some(learned)) => {
                learned.target_calls_per_100_tokens < base.target_calls_per_100_tokens
            }
            _ => false,
        });
    overall_auc(&fitted.best.auc) > overall_auc(&fitted.base_auc) && fewer_calls_at_default
}

/// The calibration record of a fit: what was chosen, on which data, and every comparison the
/// report shows.
pub(super) fn calibration(
    (corpus, seed): (&std::path::Path, u64),
    rows: &Rows,
    split: &Split,
    fitted: &Fitted,
    started: Instant,
) -> Calibration {
    let (base, best) = (&fitted.base, &fitted.best);
    let budgets = budgets(
        base,
        (best.name, &best.scores),
        other_side(best, &fitted.others),
    );
    let learned_wins = learned_wins(fitted, &budgets);
    let chosen = if learned_wins {
        best.name
    } else {
        "confidence"
    };
    let chosen_scores = if learned_wins { &best.scores } else { base };
    let by_prompt_source = prompt_source_report(corpus, rows, split, fitted, &budgets);
    let th = standard_thresholds();
    let by_kind_of = |s: &Scored, k: u8| grid(s, |i| s.kinds[i] == k, &th);
    let by_kind = |k: u8| KindGrids {
        learned: by_kind_of(&best.scores, k),
        confidence: by_kind_of(base, k),
    };
    Calibration {
        format: FORMAT.to_string(),
        rule: best.artifact.rule.clone(),
        chosen_verifier: chosen.to_string(),
        artifact: learned_wins.then(|| "default.json".to_string()),
        draft_sha256: DRAFT_GGUF_SHA256.to_string(),
        draft_build: Some(rows.draft_build.clone()),
        data: data_summary(rows, split, base, seed),
        auc: auc_report(fitted),
        thresholds: grid(chosen_scores, |_| true, &th),
        learned_thresholds: grid(&best.scores, |_| true, &th),
        confidence_thresholds: grid(base, |_| true, &th),
        by_kind: ByKind {
            code: by_kind(0),
            chat: by_kind(1),
        },
        budgets,
        by_source: by_source(base, &best.scores),
        by_prompt_source,
        rules: crate::rule_study::study(rows, &split.held),
        fit_seconds: started.elapsed().as_secs_f64(),
    }
}

/// The held-out rows by the corpus source of their prompt; empty, with a warning, when the
/// corpus cannot be read.
fn prompt_source_report(
    corpus: &std::path::Path,
    rows: &Rows,
    split: &Split,
    fitted: &Fitted,
    budgets: &[BudgetComparison],
) -> Vec<PromptSourceReport> {
    match crate::corpus::load(corpus) {
        Ok(corpus) => by_prompt_source(
            &corpus,
            rows,
            &split.held,
            &fitted.base,
            (fitted.best.name, &fitted.best.scores),
            budgets,
        ),
        Err(e) => {
            eprintln!("warning: no report by corpus source: {e}");
            Vec::new()
        }
    }
}

/// How many rows the fit used and how they split.
fn data_summary(rows: &Rows, split: &Split, base: &Scored, seed: u64) -> DataSummary {
    DataSummary {
        rows: rows.len(),
        train_rows: split.train.len(),
        held_out_rows: split.held.len(),
        held_out_code_rows: base.kinds.iter().filter(|k| **k == 0).count(),
        held_out_chat_rows: base.kinds.iter().filter(|k| **k == 1).count(),
        held_out_agreement: base.labels.iter().filter(|l| **l).count() as f64
            / base.labels.len().max(1) as f64,
        live_rows: rows.live_rows(),
        seed,
    }
}

/// Every verifier's held-out AUC.
fn auc_report(fitted: &Fitted) -> AucReport {
    AucReport {
        learned: fitted.best.auc,
        learned_kind: fitted.best.name.to_string(),
        confidence: fitted.base_auc,
        other_learned: fitted
            .others
            .iter()
            .map(|c| OtherHead {
                kind: c.name.to_string(),
                auc: c.auc,
            })
            .collect(),
    }
}
