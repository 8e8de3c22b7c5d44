//! The calibration file (`policies/verifier/calibration.json`): one typed schema, written by
//! `approxy train fit` and read by the policy loader (a quality target such as "at most 5 %
//! false accepts" becomes a threshold) and by the benchmark (its quality levels).

use std::path::Path;

use serde::{Deserialize, Serialize};

/// The `format` value this schema reads and writes.
pub const FORMAT: &str = "approxy-calibration/1";

/// One threshold on held-out data.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CalibrationPoint {
    /// Threshold.
    pub threshold: f32,
    /// Share of draft tokens accepted.
    pub accept_rate: f32,
    /// Share of accepted draft tokens the target would not have produced (0 when nothing is
    /// accepted).
    pub false_accept_rate: f32,
    /// Target calls per 100 output tokens with one correction token per rejection.
    #[serde(default)]
    pub target_calls_per_100_tokens: f32,
}

/// ROC AUC of one verifier; `None` where a split lacks one of the two classes.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Auc {
    /// Every held-out row.
    pub all: Option<f64>,
    /// Code prompts.
    pub code: Option<f64>,
    /// Chat prompts.
    pub chat: Option<f64>,
}

impl std::fmt::Display for Auc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let v = |x: Option<f64>| x.map_or("n/a".to_string(), |x| format!("{x:.4}"));
        write!(
            f,
            "all {}, code {}, chat {}",
            v(self.all),
            v(self.code),
            v(self.chat)
        )
    }
}

/// A learned head that was fitted but not chosen.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OtherHead {
    /// Head name (`logistic`, `mlp-stats`, ...).
    pub kind: String,
    /// Its held-out AUC.
    pub auc: Auc,
}

/// The AUC comparison.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AucReport {
    /// The best learned head.
    pub learned: Auc,
    /// Its name.
    pub learned_kind: String,
    /// The draft-confidence baseline.
    pub confidence: Auc,
    /// The other heads, best first.
    pub other_learned: Vec<OtherHead>,
}

/// Grids of both verifiers on one kind of prompt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KindGrids {
    /// The best learned head.
    pub learned: Vec<CalibrationPoint>,
    /// The draft-confidence baseline.
    pub confidence: Vec<CalibrationPoint>,
}

/// Grids split by prompt kind.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ByKind {
    /// Code prompts.
    pub code: KindGrids,
    /// Chat prompts.
    pub chat: KindGrids,
}

/// One verifier at a false-accept budget: the lowest threshold (over the held-out scores) whose
/// false-accept rate stays within it, and what that threshold gives.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AtBudget {
    /// `confidence` or a learned head's name.
    pub verifier: String,
    /// The threshold.
    pub threshold: f32,
    /// Share of draft tokens accepted.
    pub accept_rate: f32,
    /// Share of accepted tokens the target would not have produced.
    pub false_accept_rate: f32,
    /// Target calls per 100 output tokens (one correction token per rejection).
    pub target_calls_per_100_tokens: f32,
}

/// The verifiers compared at one policy's false-accept budget on one kind of prompt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BudgetComparison {
    /// The policy that names the budget (`default`, `strict`, ...).
    pub policy: String,
    /// How the budget comes from the policy (a false-accept rate, or the confidence
    /// verifier's at the policy's threshold).
    pub source: String,
    /// `code` or `chat`.
    pub kind: String,
    /// The budget: the highest false-accept rate allowed.
    pub budget: f32,
    /// Each verifier there, the confidence baseline first.
    pub verifiers: Vec<AtBudget>,
}

/// The held-out rows of one collection source: how often the draft agrees there, and each
/// verifier's AUC.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SourceReport {
    /// `teacher-forced` or `live`.
    pub source: String,
    /// Held-out rows.
    pub rows: usize,
    /// Share of them where the draft's top-1 is the target's token.
    pub agreement: f64,
    /// The draft-confidence baseline's AUC.
    pub confidence: Auc,
    /// The best learned head's AUC.
    pub learned: Auc,
}

/// One corpus source's held-out rows (`training/scripts/build_corpus.py` names the sources),
/// so a user sees how the dial behaves on prompts like theirs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PromptSourceReport {
    /// The corpus source (`python-faq`, `topic-templates`, ...).
    pub source: String,
    /// `code` or `chat`: the kind whose thresholds apply.
    pub kind: String,
    /// Held-out prompts of the source.
    pub prompts: usize,
    /// Held-out rows of the source.
    pub rows: usize,
    /// Share of them where the draft's top-1 is the target's token.
    pub agreement: f64,
    /// The draft-confidence baseline's AUC on them.
    pub confidence_auc: Option<f64>,
    /// The best learned head's AUC on them.
    pub learned_auc: Option<f64>,
    /// At each policy's budget, each verifier at the threshold its kind's held-out rows give
    /// (`budgets`), applied to this source's rows.
    pub budgets: Vec<SourceAtBudget>,
}

/// One policy's budget applied to one source's rows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SourceAtBudget {
    /// The policy that names the budget.
    pub policy: String,
    /// Each verifier at its kind's threshold, the confidence baseline first.
    pub verifiers: Vec<AtBudget>,
}

/// What the calibration was computed on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DataSummary {
    /// Rows collected.
    pub rows: usize,
    /// Rows the heads were fitted on.
    pub train_rows: usize,
    /// Rows held out by prompt.
    pub held_out_rows: usize,
    /// Of those, from code prompts.
    pub held_out_code_rows: usize,
    /// Of those, from chat prompts.
    pub held_out_chat_rows: usize,
    /// Share of held-out positions where the draft's top-1 equals the target's token.
    pub held_out_agreement: f64,
    /// Of all rows, those collected along live decodes (the rest are teacher-forced).
    #[serde(default)]
    pub live_rows: usize,
    /// Split seed.
    pub seed: u64,
}

/// The whole file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Calibration {
    /// [`FORMAT`].
    pub format: String,
    /// The acceptance rule the labels follow: every false-accept rate here counts accepted
    /// tokens that rule rejects (`crate::verify::AcceptanceRule`); absent: `identical`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    /// `confidence` or the learned head that beat it.
    pub chosen_verifier: String,
    /// The learned artifact beside this file when the learned head was chosen.
    pub artifact: Option<String>,
    /// Draft the rows were collected with.
    pub draft_sha256: String,
    /// How that draft was converted to ONNX (absent in files from before it was recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draft_build: Option<String>,
    /// Row counts.
    pub data: DataSummary,
    /// AUC comparison.
    pub auc: AucReport,
    /// Grid of the chosen verifier: what a policy's `max_false_accept_rate` resolves through.
    pub thresholds: Vec<CalibrationPoint>,
    /// Grid of the best learned head.
    pub learned_thresholds: Vec<CalibrationPoint>,
    /// Grid of the draft-confidence baseline.
    pub confidence_thresholds: Vec<CalibrationPoint>,
    /// Grids by prompt kind.
    pub by_kind: ByKind,
    /// Each verifier at the false-accept budgets the shipped policies name, by prompt kind.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub budgets: Vec<BudgetComparison>,
    /// The held-out rows by how they were collected.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub by_source: Vec<SourceReport>,
    /// The held-out rows by the corpus source of their prompt.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub by_prompt_source: Vec<PromptSourceReport>,
    /// What each acceptance rule accepts on the held-out rows that carry the target's
    /// probabilities, by prompt kind (empty when none do).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<RuleReport>,
    /// Time the fit took.
    pub fit_seconds: f64,
}

/// One acceptance rule on one kind's held-out rows (`crate::verify::rule`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RuleReport {
    /// The rule's name (`identical`, `ratio:0.2`, ...).
    pub rule: String,
    /// `code` or `chat`.
    pub kind: String,
    /// Held-out rows of the kind with the target's probabilities.
    pub rows: usize,
    /// Share of them the rule accepts (for `sprinter`, the mean acceptance chance).
    pub positive: f64,
    /// ROC AUC of the draft's confidence against the rule's accept/reject.
    pub confidence_auc: Option<f64>,
    /// Share of positions the draft's confidence can accept with at most 5 % of the accepted
    /// rejected by the rule.
    pub confidence_accept_at_5_percent: f64,
}

impl Calibration {
    /// Reads a calibration file.
    pub fn load(path: &Path) -> Result<Self, String> {
        let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let c: Self =
            serde_json::from_slice(&bytes).map_err(|e| format!("{}: {e}", path.display()))?;
        if c.format != FORMAT {
            return Err(format!(
                "{}: format {:?}, expected {FORMAT:?}",
                path.display(),
                c.format
            ));
        }
        Ok(c)
    }

    /// The file's text. Written through a JSON value with its keys sorted (serde_json keeps
    /// insertion order here: llguidance turns on `preserve_order`), which also widens each
    /// `f32` to `f64`, so a refit on the same rows reproduces the committed file byte for byte.
    pub fn to_json_pretty(&self) -> Result<Vec<u8>, serde_json::Error> {
        serde_json::to_vec_pretty(&sorted(serde_json::to_value(self)?))
    }
}

/// `v` with every object's keys in order.
fn sorted(v: serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match v {
        Value::Object(m) => {
            let by_key: std::collections::BTreeMap<String, Value> =
                m.into_iter().map(|(k, x)| (k, sorted(x))).collect();
            Value::Object(by_key.into_iter().collect())
        }
        Value::Array(a) => Value::Array(a.into_iter().map(sorted).collect()),
        other => other,
    }
}

/// Which verifier's curve a budget is resolved on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Curve {
    /// The verifier the file chose (`chosen_verifier`).
    Chosen,
    /// The draft's confidence, whatever the file chose: what a policy with
    /// `verifier = "confidence"` runs.
    Confidence,
    /// The best learned head (the `default.json` written beside the file).
    Learned,
}

/// The lowest threshold (the one that accepts most, so costs least) whose measured
/// false-accept rate is within `max_far`, on all held-out prompts, on `curve`.
pub fn threshold_for(path: &Path, max_far: f32, curve: Curve) -> Result<f32, String> {
    resolve(path, max_far, None, curve)
}

/// The same on one kind of prompt (`code` or `chat`): that kind's own curve.
pub fn threshold_for_kind(
    path: &Path,
    kind: &str,
    max_far: f32,
    curve: Curve,
) -> Result<f32, String> {
    resolve(path, max_far, Some(kind), curve)
}

fn resolve(path: &Path, max_far: f32, kind: Option<&str>, curve: Curve) -> Result<f32, String> {
    if !(0.0..=1.0).contains(&max_far) {
        return Err(format!("max_false_accept_rate {max_far} is outside [0, 1]"));
    }
    let c = Calibration::load(path)?;
    let learned = match curve {
        Curve::Chosen => c.chosen_verifier != "confidence",
        Curve::Confidence => false,
        Curve::Learned => true,
    };
    let grid = match kind {
        None if learned => &c.learned_thresholds,
        None => &c.confidence_thresholds,
        Some(k) => {
            let grids = match k {
                "code" => &c.by_kind.code,
                "chat" => &c.by_kind.chat,
                other => return Err(format!("no prompt kind {other:?} (code, chat)")),
            };
            if learned {
                &grids.learned
            } else {
                &grids.confidence
            }
        }
    };
    pick(grid, max_far).map(|p| p.threshold).ok_or_else(|| {
        format!(
            "{}: no threshold reaches a false-accept rate of {max_far}{}",
            path.display(),
            kind.map_or(String::new(), |k| format!(" on {k} prompts"))
        )
    })
}

/// The grid point with the lowest threshold whose false-accept rate is within `max_far`.
pub fn pick<'a>(
    grid: impl IntoIterator<Item = &'a CalibrationPoint>,
    max_far: f32,
) -> Option<&'a CalibrationPoint> {
    grid.into_iter()
        .filter(|p| p.false_accept_rate <= max_far)
        .min_by(|a, b| a.threshold.total_cmp(&b.threshold))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(threshold: f32, false_accept_rate: f32) -> CalibrationPoint {
        CalibrationPoint {
            threshold,
            accept_rate: 0.0,
            false_accept_rate,
            target_calls_per_100_tokens: 0.0,
        }
    }

    #[test]
    fn picks_cheapest_threshold_within_target() {
        let grid = [p(0.3, 0.05), p(0.5, 0.01), p(0.9, 0.001)];
        let t = |far| pick(&grid, far).map(|p| p.threshold);
        assert_eq!(t(0.02), Some(0.5));
        assert_eq!(t(0.1), Some(0.3));
        assert_eq!(t(0.0001), None);
    }

    #[test]
    fn a_kind_resolves_through_its_own_curve() -> Result<(), String> {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies/verifier/calibration.json");
        let c = Calibration::load(&path)?;
        for (kind, grids) in [("code", &c.by_kind.code), ("chat", &c.by_kind.chat)] {
            let grid = if c.chosen_verifier == "confidence" {
                &grids.confidence
            } else {
                &grids.learned
            };
            let t = threshold_for_kind(&path, kind, 0.05, Curve::Chosen)?;
            assert_eq!(Some(t), pick(grid, 0.05).map(|p| p.threshold), "{kind}");
            // Each verifier's own curve, whatever the file chose.
            for (curve, grid) in [
                (Curve::Confidence, &grids.confidence),
                (Curve::Learned, &grids.learned),
            ] {
                let t = threshold_for_kind(&path, kind, 0.05, curve)?;
                assert_eq!(Some(t), pick(grid, 0.05).map(|p| p.threshold), "{kind}");
            }
        }
        assert_eq!(
            Some(threshold_for(&path, 0.05, Curve::Learned)?),
            pick(&c.learned_thresholds, 0.05).map(|p| p.threshold)
        );
        assert_eq!(
            Some(threshold_for(&path, 0.05, Curve::Confidence)?),
            pick(&c.confidence_thresholds, 0.05).map(|p| p.threshold)
        );
        // The kinds' curves differ: on the shipped calibration the same budget gives code and
        // chat different thresholds.
        assert_ne!(
            threshold_for_kind(&path, "code", 0.05, Curve::Chosen)?,
            threshold_for_kind(&path, "chat", 0.05, Curve::Chosen)?
        );
        assert!(threshold_for_kind(&path, "prose", 0.05, Curve::Chosen).is_err());
        assert!(threshold_for_kind(&path, "code", 1.5, Curve::Chosen).is_err());
        Ok(())
    }

    #[test]
    fn committed_file_reads_and_writes_back_identically() -> Result<(), String> {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies/verifier/calibration.json");
        let c = Calibration::load(&path)?;
        assert!(
            !c.thresholds.is_empty()
                && !c.learned_thresholds.is_empty()
                && !c.confidence_thresholds.is_empty()
        );
        let written = c.to_json_pretty().map_err(|e| e.to_string())?;
        let committed = std::fs::read(&path).map_err(|e| e.to_string())?;
        assert_eq!(
            String::from_utf8_lossy(&written),
            String::from_utf8_lossy(&committed)
        );
        Ok(())
    }
}
