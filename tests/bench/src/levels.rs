//! The three quality levels the benchmark runs approxy at, named by false-accept rate and
//! resolved through the calibration `approxy train fit` wrote: the learned verifier at the
//! cheapest threshold within each level's rate, and the confidence baseline at the threshold
//! whose accept rate is closest to the learned one's (so the two compare at equal cost).
//! A level no threshold below 1 reaches is unreachable: at 1 the target decides every token,
//! which passthrough already does better, so it is reported and not run.

use std::path::Path;

use serde::{Deserialize, Serialize};

use approxy_verifier::calibration::{Calibration, CalibrationPoint, pick};

/// Level name and the largest false-accept rate (share of accepted draft tokens the target
/// would not have produced, on held-out data) it allows.
pub const LEVELS: [(&str, f32); 3] = [("economy", 0.10), ("default", 0.05), ("strict", 0.02)];

/// A level resolved for both verifiers.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Level {
    /// `economy`, `default` or `strict`.
    pub name: String,
    /// The level's false-accept budget.
    pub max_false_accept_rate: f32,
    /// Learned verifier at its threshold, with what the calibration expects of it (`None`:
    /// no threshold below 1 meets the budget).
    pub learned: Option<CalibrationPoint>,
    /// Confidence baseline at the matching accept rate.
    pub confidence: Option<CalibrationPoint>,
}

/// Resolves [`LEVELS`] from a calibration file.
pub fn resolve(calibration: &Path) -> anyhow::Result<Vec<Level>> {
    let c = Calibration::load(calibration).map_err(anyhow::Error::msg)?;
    anyhow::ensure!(
        !c.learned_thresholds.is_empty() && !c.confidence_thresholds.is_empty(),
        "{}: no learned and confidence grids (written by `approxy train fit`)",
        calibration.display()
    );
    Ok(resolve_grid(
        &c.learned_thresholds,
        &c.confidence_thresholds,
    ))
}

fn resolve_grid(
    learned_grid: &[CalibrationPoint],
    confidence_grid: &[CalibrationPoint],
) -> Vec<Level> {
    LEVELS
        .iter()
        .map(|&(name, max_far)| {
            let learned = pick(learned_grid.iter().filter(|p| p.threshold < 1.0), max_far);
            let confidence = learned.and_then(|l| {
                confidence_grid
                    .iter()
                    .filter(|p| p.threshold < 1.0)
                    .min_by(|a, b| {
                        let da = (a.accept_rate - l.accept_rate).abs();
                        let db = (b.accept_rate - l.accept_rate).abs();
                        // On a tie the stricter (higher) threshold.
                        da.total_cmp(&db).then(b.threshold.total_cmp(&a.threshold))
                    })
            });
            Level {
                name: name.to_string(),
                max_false_accept_rate: max_far,
                learned: learned.copied(),
                confidence: confidence.copied(),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gp(threshold: f32, accept_rate: f32, false_accept_rate: f32) -> CalibrationPoint {
        CalibrationPoint {
            threshold,
            accept_rate,
            false_accept_rate,
            target_calls_per_100_tokens: 0.0,
        }
    }

    #[test]
    fn levels_pick_cheapest_learned_and_matching_baseline() {
        let learned = [
            gp(0.5, 0.8, 0.12),
            gp(0.6, 0.7, 0.08),
            gp(0.8, 0.55, 0.04),
            gp(1.0, 0.0, 0.0),
        ];
        let confidence = [
            gp(0.5, 0.72, 0.1),
            gp(0.6, 0.6, 0.05),
            gp(0.7, 0.52, 0.03),
            gp(1.0, 0.0, 0.0),
        ];
        let l = resolve_grid(&learned, &confidence);
        let t = |o: Option<CalibrationPoint>| o.map(|o| o.threshold);
        assert_eq!(l[0].name, "economy");
        assert_eq!(t(l[0].learned), Some(0.6));
        assert_eq!(t(l[0].confidence), Some(0.5));
        assert_eq!(t(l[1].learned), Some(0.8));
        assert_eq!(t(l[1].confidence), Some(0.7));
        // Nothing below 1 meets 2 %: unreachable, not "the target decides every token".
        assert_eq!(t(l[2].learned), None);
        assert_eq!(t(l[2].confidence), None);
    }

    #[test]
    fn committed_calibration_resolves() {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../policies/verifier/calibration.json");
        let l = resolve(&path).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(l.len(), 3);
        let ts: Vec<f32> = l
            .iter()
            .filter_map(|x| x.learned.map(|o| o.threshold))
            .collect();
        assert!(!ts.is_empty());
        assert!(ts.windows(2).all(|w| w[0] <= w[1]));
    }
}
