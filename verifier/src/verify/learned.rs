//! The learned verifier head, loaded from a JSON training artifact: logistic regression or a
//! one-hidden-layer MLP over normalised [logit statistics, context values, syntax values, hidden state]. The artifact names
//! the sha256 of the draft model it was trained for; any other draft is refused at load.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::context::CONTEXT_NAMES;
use super::features::{Features, STAT_NAMES};
use super::judge::Verifier;
use super::syntax::SYNTAX_NAMES;
use crate::draft::{DraftMeta, LEGACY_DRAFT_BUILD};
use crate::error::EngineError;

/// Artifact format tag.
pub const FORMAT: &str = "approxy-verifier/1";

/// Which inputs the head reads.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FeatureSpec {
    /// Logit statistics by name, a subset of [`STAT_NAMES`], in input order.
    pub stats: Vec<String>,
    /// Context values by name, a subset of [`CONTEXT_NAMES`], after the statistics; absent in
    /// artifacts from before the context existed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub context: Vec<String>,
    /// Syntax values by name, a subset of [`SYNTAX_NAMES`], after the context; absent in
    /// artifacts from before they existed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub syntax: Vec<String>,
    /// Whether the hidden-state row follows the statistics.
    pub hidden: bool,
    /// Width of the hidden-state row when `hidden`.
    pub hidden_size: usize,
}

/// A dense layer: `out = W x + b`, `W` row-major `[out][in]`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Dense {
    /// Weights, one row per output.
    pub weights: Vec<Vec<f32>>,
    /// Biases.
    pub bias: Vec<f32>,
}

/// The target of the shipped calibration (the local llama-server's model): the pair an
/// artifact that names no target was calibrated on.
pub const DEFAULT_CALIBRATION_TARGET: &str = "qwen2.5-coder-1.5b-instruct";

/// The artifact as stored.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Artifact {
    /// Must be [`FORMAT`].
    pub format: String,
    /// `logistic` (one layer) or `mlp` (hidden ReLU layer, then output).
    pub kind: String,
    /// sha256 of the draft model the head was trained on.
    pub draft_sha256: String,
    /// How that draft was converted to ONNX ([`DraftMeta::build`]); absent in artifacts from
    /// before it was recorded, which were trained on [`LEGACY_DRAFT_BUILD`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draft_build: Option<String>,
    /// The target model its labels came from (a head is calibrated for one draft–target
    /// pair); absent: [`DEFAULT_CALIBRATION_TARGET`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// The acceptance rule its labels follow ([`crate::verify::AcceptanceRule`]'s name): what
    /// `p_accept` estimates, and what a false accept means for it; absent: `identical`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    /// Inputs.
    pub features: FeatureSpec,
    /// Per-input mean subtracted before the head.
    pub mean: Vec<f32>,
    /// Per-input standard deviation divided by before the head.
    pub std: Vec<f32>,
    /// Layers; the last has one output, squashed by a sigmoid.
    pub layers: Vec<Dense>,
}

/// A validated, ready-to-score head.
#[derive(Debug, Clone)]
pub struct LearnedVerifier {
    artifact: Artifact,
    stat_idx: Vec<usize>,
    context_idx: Vec<usize>,
    syntax_idx: Vec<usize>,
}

/// Where each of `names` sits in `known` (the order the verifier computes them in).
fn positions(names: &[String], known: &[&str], what: &str) -> Result<Vec<usize>, EngineError> {
    names
        .iter()
        .map(|s| {
            known
                .iter()
                .position(|n| n == s)
                .ok_or_else(|| EngineError::Artifact(format!("unknown {what} {s:?}")))
        })
        .collect()
}

/// Each layer takes the previous one's outputs (the first, `width` inputs), and the last gives
/// one.
fn check_layers(layers: &[Dense], width: usize) -> Result<(), EngineError> {
    let bad = |m: String| Err(EngineError::Artifact(m));
    let mut fan_in = width;
    for (i, l) in layers.iter().enumerate() {
        if l.weights.is_empty()
            || l.weights.len() != l.bias.len()
            || l.weights.iter().any(|r| r.len() != fan_in)
        {
            return bad(format!("layer {i} does not take {fan_in} inputs"));
        }
        fan_in = l.weights.len();
    }
    if fan_in != 1 {
        return bad(format!("last layer has {fan_in} outputs, expected 1"));
    }
    Ok(())
}

impl LearnedVerifier {
    /// Loads and validates an artifact for the draft whose sha256 is `draft_sha256`, converted
    /// as `draft` says.
    pub fn load(path: &Path, draft_sha256: &str, draft: &DraftMeta) -> Result<Self, EngineError> {
        let bytes = std::fs::read(path)
            .map_err(|e| EngineError::Artifact(format!("{}: {e}", path.display())))?;
        let a: Artifact = serde_json::from_slice(&bytes)
            .map_err(|e| EngineError::Artifact(format!("{}: {e}", path.display())))?;
        Self::from_artifact(a, draft_sha256)
            .and_then(|v| v.check_build(&draft.build()).map(|()| v))
            .map_err(|e| match e {
                EngineError::Artifact(m) => {
                    EngineError::Artifact(format!("{}: {m}", path.display()))
                }
                other => other,
            })
    }

    /// Validates an in-memory artifact.
    pub fn from_artifact(a: Artifact, draft_sha256: &str) -> Result<Self, EngineError> {
        let bad = |m: String| Err(EngineError::Artifact(m));
        if a.format != FORMAT {
            return bad(format!("format {:?}, expected {FORMAT:?}", a.format));
        }
        if !a.draft_sha256.eq_ignore_ascii_case(draft_sha256) {
            return bad(format!(
                "trained for draft model sha256 {}, but the configured draft is {draft_sha256}; retrain with `approxy train` or use the confidence verifier",
                a.draft_sha256
            ));
        }
        let stat_idx = positions(&a.features.stats, &STAT_NAMES, "feature")?;
        let context_idx = positions(&a.features.context, &CONTEXT_NAMES, "context value")?;
        let syntax_idx = positions(&a.features.syntax, &SYNTAX_NAMES, "syntax value")?;
        let width = stat_idx.len()
            + context_idx.len()
            + syntax_idx.len()
            + if a.features.hidden {
                a.features.hidden_size
            } else {
                0
            };
        if a.mean.len() != width || a.std.len() != width {
            return bad(format!(
                "normalisation has {} / {} entries, inputs are {width}",
                a.mean.len(),
                a.std.len()
            ));
        }
        let expected_layers = match a.kind.as_str() {
            "logistic" => 1,
            "mlp" => 2,
            k => return bad(format!("unknown kind {k:?}")),
        };
        if a.layers.len() != expected_layers {
            return bad(format!(
                "{} needs {expected_layers} layers, has {}",
                a.kind,
                a.layers.len()
            ));
        }
        check_layers(&a.layers, width)?;
        Ok(Self {
            artifact: a,
            stat_idx,
            context_idx,
            syntax_idx,
        })
    }

    /// Refuses a draft converted otherwise than the one the head was trained on: the same GGUF
    /// at another precision or block size gives other logits and hidden states.
    pub fn check_build(&self, build: &str) -> Result<(), EngineError> {
        let trained = self
            .artifact
            .draft_build
            .as_deref()
            .unwrap_or(LEGACY_DRAFT_BUILD);
        if trained == build {
            Ok(())
        } else {
            Err(EngineError::Artifact(format!(
                "trained on the draft converted as {trained:?}, but the configured draft was converted as {build:?}; retrain with `approxy train` or use the confidence verifier"
            )))
        }
    }

    /// The target model this head was calibrated against.
    pub fn target(&self) -> &str {
        self.artifact
            .target
            .as_deref()
            .unwrap_or(DEFAULT_CALIBRATION_TARGET)
    }

    /// The acceptance rule the head was trained for (`identical` when the artifact names none).
    pub fn rule(&self) -> &str {
        self.artifact.rule.as_deref().unwrap_or("identical")
    }

    /// True when the head reads the answer's context or syntax (the decode loop then keeps
    /// one).
    pub fn reads_context(&self) -> bool {
        !self.context_idx.is_empty() || !self.syntax_idx.is_empty()
    }

    /// The artifact (for reports).
    pub fn artifact(&self) -> &Artifact {
        &self.artifact
    }

    fn inputs(&self, f: &Features) -> Vec<f32> {
        let a = &self.artifact;
        let mut x: Vec<f32> = self.stat_idx.iter().map(|&i| f.stats[i]).collect();
        x.extend(self.context_idx.iter().map(|&i| f.context[i]));
        x.extend(self.syntax_idx.iter().map(|&i| f.syntax[i]));
        if a.features.hidden {
            let before = x.len();
            x.extend(f.hidden.iter().take(a.features.hidden_size));
            x.resize(before + a.features.hidden_size, 0.0);
        }
        for ((v, m), s) in x.iter_mut().zip(&a.mean).zip(&a.std) {
            *v = (*v - m) / if *s > 1e-12 { *s } else { 1.0 };
        }
        x
    }
}

fn dense(l: &Dense, x: &[f32]) -> Vec<f32> {
    l.weights
        .iter()
        .zip(&l.bias)
        .map(|(row, b)| row.iter().zip(x).map(|(w, v)| w * v).sum::<f32>() + b)
        .collect()
}

impl Verifier for LearnedVerifier {
    fn p_accept(&self, f: &Features) -> f32 {
        let mut x = self.inputs(f);
        let n = self.artifact.layers.len();
        for (i, l) in self.artifact.layers.iter().enumerate() {
            x = dense(l, &x);
            if i + 1 < n {
                x.iter_mut().for_each(|v| *v = v.max(0.0));
            }
        }
        let z = x.first().copied().unwrap_or(0.0);
        1.0 / (1.0 + (-z).exp())
    }
    fn kind(&self) -> &'static str {
        "learned"
    }
    fn reads_context(&self) -> bool {
        LearnedVerifier::reads_context(self)
    }
    fn calibrated_with(&self) -> Option<&str> {
        Some(self.target())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn logistic(sha: &str) -> Artifact {
        Artifact {
            format: FORMAT.into(),
            kind: "logistic".into(),
            draft_sha256: sha.into(),
            draft_build: None,
            target: None,
            rule: None,
            features: FeatureSpec {
                stats: vec!["top1_prob".into()],
                context: Vec::new(),
                syntax: Vec::new(),
                hidden: true,
                hidden_size: 2,
            },
            mean: vec![0.5, 0.0, 0.0],
            std: vec![0.5, 1.0, 1.0],
            layers: vec![Dense {
                weights: vec![vec![4.0, 1.0, 0.0]],
                bias: vec![0.0],
            }],
        }
    }

    fn feats(p: f32, hidden: Vec<f32>) -> Features {
        Features {
            top1: 0,
            token: 0,
            top1_prob: p,
            stats: [p, 0.0, 0.0, 0.0],
            hidden: hidden.into(),
            context: [0.0; crate::verify::context::N_CONTEXT],
            syntax: Default::default(),
        }
    }

    #[test]
    fn context_values_sit_between_statistics_and_hidden_state() -> Result<(), EngineError> {
        let mut a = logistic("x");
        a.features.context = vec!["agreed_last".into()];
        // Inputs: [top1_prob, agreed_last, h0, h1]; only agreed_last is weighted.
        a.mean = vec![0.0; 4];
        a.std = vec![1.0; 4];
        a.layers[0].weights = vec![vec![0.0, 3.0, 0.0, 0.0]];
        let v = LearnedVerifier::from_artifact(a.clone(), "x")?;
        assert!(v.reads_context());
        let mut f = feats(0.5, vec![7.0, 7.0]);
        assert!((v.p_accept(&f) - 0.5).abs() < 1e-6);
        f.context[3] = 1.0;
        assert!((v.p_accept(&f) - 1.0 / (1.0 + (-3.0f32).exp())).abs() < 1e-6);
        a.features.context = vec!["nonsense".into()];
        assert!(LearnedVerifier::from_artifact(a, "x").is_err());
        assert!(!LearnedVerifier::from_artifact(logistic("x"), "x")?.reads_context());
        Ok(())
    }

    #[test]
    fn syntax_values_sit_after_the_context() -> Result<(), EngineError> {
        let mut a = logistic("x");
        a.features.context = vec!["agreed_last".into()];
        a.features.syntax = vec!["in_comment".into()];
        // Inputs: [top1_prob, agreed_last, in_comment, h0, h1]; only in_comment is weighted.
        a.mean = vec![0.0; 5];
        a.std = vec![1.0; 5];
        a.layers[0].weights = vec![vec![0.0, 0.0, 2.0, 0.0, 0.0]];
        let v = LearnedVerifier::from_artifact(a.clone(), "x")?;
        assert!(v.reads_context());
        let mut f = feats(0.5, vec![7.0, 7.0]);
        f.context[3] = 1.0;
        assert!((v.p_accept(&f) - 0.5).abs() < 1e-6);
        f.syntax[0] = 1.0;
        assert!((v.p_accept(&f) - 1.0 / (1.0 + (-2.0f32).exp())).abs() < 1e-6);
        a.features.context.clear();
        a.mean.pop();
        a.std.pop();
        a.layers[0].weights = vec![vec![0.0, 2.0, 0.0, 0.0]];
        assert!(LearnedVerifier::from_artifact(a.clone(), "x")?.reads_context());
        a.features.syntax = vec!["nonsense".into()];
        assert!(LearnedVerifier::from_artifact(a, "x").is_err());
        Ok(())
    }

    #[test]
    fn logistic_scores_monotone_in_confidence() -> Result<(), EngineError> {
        let v = LearnedVerifier::from_artifact(logistic("ab"), "AB")?;
        let lo = v.p_accept(&feats(0.1, vec![0.0, 0.0]));
        let hi = v.p_accept(&feats(0.9, vec![0.0, 0.0]));
        assert!(lo < 0.5 && hi > 0.5 && (0.0..=1.0).contains(&lo) && (0.0..=1.0).contains(&hi));
        // x = [(0.5-0.5)/0.5, 2, 0] -> z = 2
        let mid = v.p_accept(&feats(0.5, vec![2.0, 9.0]));
        assert!((mid - 1.0 / (1.0 + (-2.0f32).exp())).abs() < 1e-6);
        Ok(())
    }

    #[test]
    fn refuses_other_draft() {
        let e = LearnedVerifier::from_artifact(logistic("aaaa"), "bbbb")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("trained for draft model sha256 aaaa"), "{e}");
    }

    #[test]
    fn refuses_a_draft_converted_otherwise() -> Result<(), EngineError> {
        let legacy = LearnedVerifier::from_artifact(logistic("x"), "x")?;
        legacy.check_build("int4")?;
        let e = legacy
            .check_build("int4 block_size=128")
            .err()
            .map(|e| e.to_string());
        assert!(
            e.as_deref()
                .is_some_and(|e| e.contains("converted as \"int4\"")),
            "{e:?}"
        );
        let mut a = logistic("x");
        a.draft_build = Some("int4 block_size=128".into());
        let v = LearnedVerifier::from_artifact(a, "x")?;
        v.check_build("int4 block_size=128")?;
        assert!(v.check_build("int4").is_err());
        Ok(())
    }

    #[test]
    fn refuses_shape_errors() {
        let mut a = logistic("x");
        a.layers[0].weights[0].pop();
        assert!(LearnedVerifier::from_artifact(a, "x").is_err());
        let mut a = logistic("x");
        a.features.stats.push("nonsense".into());
        assert!(LearnedVerifier::from_artifact(a, "x").is_err());
        let mut a = logistic("x");
        a.kind = "mlp".into();
        assert!(LearnedVerifier::from_artifact(a, "x").is_err());
    }

    #[test]
    fn mlp_applies_relu() -> Result<(), EngineError> {
        let mut a = logistic("x");
        a.kind = "mlp".into();
        a.layers = vec![
            Dense {
                weights: vec![vec![1.0, 0.0, 0.0], vec![-1.0, 0.0, 0.0]],
                bias: vec![0.0, 0.0],
            },
            Dense {
                weights: vec![vec![1.0, 1.0]],
                bias: vec![0.0],
            },
        ];
        let v = LearnedVerifier::from_artifact(a, "x")?;
        // top1_prob 1.0 -> x0 = 1 -> hidden [1, 0] -> z = 1; 0.0 -> x0 = -1 -> hidden [0, 1] -> z = 1
        let p1 = v.p_accept(&feats(1.0, vec![0.0, 0.0]));
        let p0 = v.p_accept(&feats(0.0, vec![0.0, 0.0]));
        assert!((p1 - p0).abs() < 1e-6 && p1 > 0.7);
        Ok(())
    }
}
