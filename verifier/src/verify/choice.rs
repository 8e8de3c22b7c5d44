//! Which verifier a model runs, as its policy names it, and what each needs: the one place the
//! gateway asks when it loads a policy. Adding a verifier is its file in this folder plus one
//! variant here and its arm in each method below.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::judge::{ConfidenceVerifier, Verifier};
use super::learned::LearnedVerifier;
use crate::calibration::{Calibration, Curve};
use crate::draft::DraftMeta;
use crate::error::EngineError;

/// Which verifier a model uses.
#[derive(Debug, Clone, PartialEq)]
pub enum VerifierChoice {
    /// Draft top-1 probability.
    Confidence,
    /// A learned head from this artifact.
    Learned(PathBuf),
}

impl VerifierChoice {
    /// A policy's `verifier`: `"confidence"` (or nothing), else the path of a learned
    /// artifact, which `resolve` makes absolute.
    pub fn parse(name: Option<&str>, resolve: impl FnOnce(&str) -> PathBuf) -> Self {
        match name {
            None | Some("confidence") => Self::Confidence,
            Some(p) => Self::Learned(resolve(p)),
        }
    }

    /// What must hold before a policy may name it: a learned head's artifact exists.
    pub fn check(&self) -> Result<(), String> {
        match self {
            Self::Confidence => Ok(()),
            Self::Learned(path) if !path.is_file() => {
                Err(format!("artifact {} does not exist", path.display()))
            }
            Self::Learned(_) => Ok(()),
        }
    }

    /// The curve of a calibration file a false-accept budget is read on for this verifier
    /// (which need not be the one the file chose), and why the file does not fit it, if it
    /// does not: a learned head must have been trained for the rule the file calibrates.
    pub fn curve(&self, calibration: &Path) -> (Curve, Option<String>) {
        match self {
            Self::Confidence => (Curve::Confidence, None),
            Self::Learned(artifact) => (Curve::Learned, same_rule(calibration, artifact).err()),
        }
    }

    /// Loads it for the draft whose identity and shape are given (a learned head is checked
    /// against them).
    pub fn load(
        &self,
        draft_sha256: &str,
        draft: &DraftMeta,
    ) -> Result<Arc<dyn Verifier>, EngineError> {
        Ok(match self {
            Self::Confidence => Arc::new(ConfidenceVerifier),
            Self::Learned(p) => Arc::new(LearnedVerifier::load(p, draft_sha256, draft)?),
        })
    }
}

impl std::fmt::Display for VerifierChoice {
    /// As messages name it: `confidence verifier`, `learned verifier PATH`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Confidence => f.write_str("confidence verifier"),
            Self::Learned(p) => write!(f, "learned verifier {}", p.display()),
        }
    }
}

/// Whether a calibration file and a learned head's artifact were made for the same rule.
fn same_rule(calibration: &Path, artifact: &Path) -> Result<(), String> {
    let c = Calibration::load(calibration)?;
    let a: super::learned::Artifact = std::fs::read(artifact)
        .map_err(|e| e.to_string())
        .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()))
        .map_err(|e| format!("{}: {e}", artifact.display()))?;
    let rule = |r: &Option<String>| r.clone().unwrap_or_else(|| "identical".into());
    if rule(&c.rule) == rule(&a.rule) {
        Ok(())
    } else {
        Err(format!(
            "{} calibrates the rule {}, but the verifier {} was trained for {}",
            calibration.display(),
            rule(&c.rule),
            artifact.display(),
            rule(&a.rule)
        ))
    }
}
