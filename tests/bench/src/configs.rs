//! The configurations `approxy bench quality` runs: what each one is, how it is served, and
//! at which threshold.

use serde::{Deserialize, Serialize};

use super::levels::Level;

/// How a configuration is served.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Route {
    /// approxy, passthrough mode.
    Passthrough,
    /// approxy, approximate mode.
    Approximate,
    /// llama-server with `-md`, directly.
    LlamaSpeculative,
}

/// One configuration.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Config {
    /// Stable id (file names, `--only`).
    pub id: String,
    /// Table label.
    pub label: String,
    /// The configuration's letter in the quality table: a..e.
    pub family: char,
    /// How it is served.
    pub route: Route,
    /// Verifier (`learned`, `confidence`) in approximate mode.
    pub verifier: Option<String>,
    /// Threshold in approximate mode.
    pub threshold: Option<f32>,
    /// What the calibration expects at that threshold: accept rate and false-accept rate.
    pub calibrated_accept_rate: Option<f32>,
    /// See `calibrated_accept_rate`.
    pub calibrated_false_accept_rate: Option<f32>,
}

impl Config {
    /// The model id the bench policy gives this configuration.
    pub fn model(&self) -> &'static str {
        match (self.route, self.verifier.as_deref()) {
            (Route::Passthrough, _) => "bench-passthrough",
            (Route::Approximate, Some("learned")) => "bench-learned",
            (Route::Approximate, _) => "bench-confidence",
            (Route::LlamaSpeculative, _) => "target",
        }
    }
}

/// The configuration list for the resolved levels.
pub fn configs(levels: &[Level]) -> Vec<Config> {
    let mut v = vec![Config {
        id: "target-only".into(),
        label: "(a) target only (passthrough)".into(),
        family: 'a',
        route: Route::Passthrough,
        verifier: None,
        threshold: None,
        calibrated_accept_rate: None,
        calibrated_false_accept_rate: None,
    }];
    for (family, verifier) in [('b', "learned"), ('c', "confidence")] {
        for l in levels {
            let Some(o) = (if verifier == "learned" {
                l.learned
            } else {
                l.confidence
            }) else {
                continue;
            };
            v.push(Config {
                id: format!("{verifier}-{}", l.name),
                label: format!(
                    "({family}) approxy {verifier}, {} (t={:.2})",
                    l.name, o.threshold
                ),
                family,
                route: Route::Approximate,
                verifier: Some(verifier.into()),
                threshold: Some(o.threshold),
                calibrated_accept_rate: Some(o.accept_rate),
                calibrated_false_accept_rate: Some(o.false_accept_rate),
            });
        }
    }
    v.push(Config {
        id: "draft-only".into(),
        label: "(d) draft only (t=0)".into(),
        family: 'd',
        route: Route::Approximate,
        verifier: Some("confidence".into()),
        threshold: Some(0.0),
        calibrated_accept_rate: Some(1.0),
        calibrated_false_accept_rate: None,
    });
    v.push(Config {
        id: "llama-speculative".into(),
        label: "(e) llama.cpp speculative (-md)".into(),
        family: 'e',
        route: Route::LlamaSpeculative,
        verifier: None,
        threshold: None,
        calibrated_accept_rate: None,
        calibrated_false_accept_rate: None,
    });
    v
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::levels;

    #[test]
    fn every_family_is_configured_and_unreachable_levels_are_not() {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../policies/verifier/calibration.json");
        let levels = levels::resolve(&path).unwrap_or_else(|e| panic!("{e}"));
        let cs = configs(&levels);
        let mut families: Vec<char> = cs.iter().map(|c| c.family).collect();
        families.dedup();
        assert_eq!(families, vec!['a', 'b', 'c', 'd', 'e']);
        let reachable = levels.iter().filter(|l| l.learned.is_some()).count();
        assert_eq!(cs.len(), 3 + 2 * reachable);
        assert!(cs.iter().all(|c| c.threshold.is_none_or(|t| t < 1.0)));
        let ids: std::collections::HashSet<&str> = cs.iter().map(|c| c.id.as_str()).collect();
        assert_eq!(
            ids.len(),
            cs.len(),
            "ids name result files, so they are unique"
        );
    }
}
