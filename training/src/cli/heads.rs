//! The heads fitted and ranked: the split by prompt, each head's weight decay picked on
//! validation rows, and every head scored on the held-out rows.

use approxy_verifier::calibration::Auc;
use approxy_verifier::home::DRAFT_GGUF_SHA256;
use approxy_verifier::verify::LearnedVerifier;
use approxy_verifier::verify::learned::Artifact;

use super::scoring::{aucs, scored};
use crate::dataset::Rows;
use crate::fit::{FitOptions, HeadKind, fit, is_held_out};
use crate::report::{Scored, baseline};

/// The rows split by prompt, so no prompt's rows sit on both sides of a split.
pub(super) struct Split {
    /// Rows the heads are fitted on.
    pub(super) train: Vec<usize>,
    /// Rows that judge the chosen head, and nothing else.
    pub(super) held: Vec<usize>,
    /// The training rows a head is fitted on while its weight decay is picked.
    pub(super) fit: Vec<usize>,
    /// The training rows that pick the weight decay.
    pub(super) validation: Vec<usize>,
}

impl Split {
    pub(super) fn new(rows: &Rows, seed: u64) -> Self {
        let (held, train): (Vec<usize>, Vec<usize>) =
            (0..rows.len()).partition(|&i| is_held_out(rows.prompt_ids[i], seed));
        // Weight decay is picked on a validation fifth of the training prompts (never the
        // held-out split), then the head is refitted on all training rows.
        let (validation, fit): (Vec<usize>, Vec<usize>) = train
            .iter()
            .partition(|&&i| is_held_out(rows.prompt_ids[i], seed.wrapping_add(1)));
        Self {
            train,
            held,
            fit,
            validation,
        }
    }
}

/// One fitted head.
pub(super) struct Candidate {
    /// Its kind, as the report names it.
    pub(super) name: &'static str,
    /// The head, as written to `default.json`.
    pub(super) artifact: Artifact,
    /// Its scores on the held-out rows.
    pub(super) scores: Scored,
    /// Its held-out AUC.
    pub(super) auc: Auc,
    /// Its validation AUC, which ranks the heads.
    pub(super) validation_auc: f64,
}

/// The confidence baseline and every fitted head, scored on the held-out rows.
pub(super) struct Fitted {
    /// The confidence verifier's scores.
    pub(super) base: Scored,
    /// The confidence verifier's AUC.
    pub(super) base_auc: Auc,
    /// The head with the best validation AUC.
    pub(super) best: Candidate,
    /// The other heads.
    pub(super) others: Vec<Candidate>,
}

/// The AUC that ranks verifiers: over all rows, 0 where undefined.
pub(super) fn overall_auc(a: &Auc) -> f64 {
    a.all.unwrap_or(0.0)
}

/// Fits every head and ranks them against each other and the confidence baseline.
pub(super) fn fit_heads(rows: &Rows, split: &Split, seed: u64) -> anyhow::Result<Fitted> {
    let base = baseline(rows, &split.held);
    // Every head with and without the answer's context, so the report shows what the context
    // adds on its own.
    let heads = [
        ("logistic", HeadKind::Logistic, true, false),
        ("mlp", HeadKind::Mlp(4), true, false),
        ("logistic-stats", HeadKind::Logistic, false, false),
        ("mlp-stats", HeadKind::Mlp(8), false, false),
        ("logistic+context", HeadKind::Logistic, true, true),
        ("mlp+context", HeadKind::Mlp(4), true, true),
        ("logistic-stats+context", HeadKind::Logistic, false, true),
        ("mlp-stats+context", HeadKind::Mlp(8), false, true),
    ];
    let mut candidates = Vec::new();
    for (name, kind, use_hidden, use_context) in heads {
        let opts = |wd: f32| FitOptions {
            kind,
            epochs: 20,
            batch: 128,
            learning_rate: 0.003,
            weight_decay: wd,
            seed,
            use_hidden,
            use_context,
        };
        candidates.push(fit_head(rows, split, name, opts)?);
    }
    let base_auc = aucs(&base);
    eprintln!("confidence baseline: held-out AUC {base_auc}");
    // The learned head is chosen on validation AUC; the held-out split only judges it.
    candidates.sort_by(|x, y| y.validation_auc.total_cmp(&x.validation_auc));
    let best = candidates.remove(0);
    Ok(Fitted {
        base,
        base_auc,
        best,
        others: candidates,
    })
}

/// Fits one head: its weight decay picked on the validation rows, then refitted on all
/// training rows and scored on the held-out ones.
fn fit_head(
    rows: &Rows,
    split: &Split,
    name: &'static str,
    opts: impl Fn(f32) -> FitOptions,
) -> anyhow::Result<Candidate> {
    let draft_sha = DRAFT_GGUF_SHA256;
    let mut best = (f64::NEG_INFINITY, 0.0f32);
    for wd in [0.0f32, 1e-3, 1e-2, 1e-1, 0.3, 1.0] {
        let v =
            LearnedVerifier::from_artifact(fit(rows, &split.fit, &opts(wd), draft_sha), draft_sha)?;
        let auc = overall_auc(&aucs(&scored(&v, rows, &split.validation)));
        if auc > best.0 {
            best = (auc, wd);
        }
    }
    let art = fit(rows, &split.train, &opts(best.1), draft_sha);
    let v = LearnedVerifier::from_artifact(art.clone(), draft_sha)?;
    let s = scored(&v, rows, &split.held);
    let auc = aucs(&s);
    eprintln!(
        "{name}: weight decay {} (validation AUC {:.4}); held-out AUC {auc}",
        best.1, best.0
    );
    Ok(Candidate {
        name,
        artifact: art,
        scores: s,
        auc,
        validation_auc: best.0,
    })
}
