//! Resolving a quality target ("at most this false-accept rate") to a verifier threshold,
//! using the calibration JSON written by `approxy train report`.

use std::path::Path;

use serde::Deserialize;

/// One row of the calibration grid.
#[derive(Debug, Clone, Deserialize)]
pub struct CalibrationPoint {
    /// Threshold.
    pub threshold: f32,
    /// Fraction of draft tokens accepted, on held-out data.
    #[serde(default)]
    pub accept_rate: f32,
    /// Fraction of accepted draft tokens that disagree with the target, on held-out data.
    pub false_accept_rate: f32,
}

/// The part of the calibration file the gateway reads.
#[derive(Debug, Deserialize)]
pub struct Calibration {
    /// Grid of the chosen verifier, any order.
    pub thresholds: Vec<CalibrationPoint>,
    /// Grid of the learned verifier (the benchmark compares both).
    #[serde(default)]
    pub learned_thresholds: Vec<CalibrationPoint>,
    /// Grid of the draft-confidence baseline.
    #[serde(default)]
    pub confidence_thresholds: Vec<CalibrationPoint>,
}

impl Calibration {
    /// Reads a calibration file.
    pub fn load(path: &Path) -> Result<Self, String> {
        let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
        serde_json::from_slice(&bytes).map_err(|e| format!("{}: {e}", path.display()))
    }
}

/// The lowest threshold (the one that accepts most, so costs least) whose measured
/// false-accept rate is within `max_far`.
pub fn threshold_for(path: &Path, max_far: f32) -> Result<f32, String> {
    if !(0.0..=1.0).contains(&max_far) {
        return Err(format!("max_false_accept_rate {max_far} is outside [0, 1]"));
    }
    let c = Calibration::load(path)?;
    pick(&c.thresholds, max_far)
        .map(|p| p.threshold)
        .ok_or_else(|| format!("{}: no threshold reaches a false-accept rate of {max_far}", path.display()))
}

/// The grid point with the lowest threshold whose false-accept rate is within `max_far`.
pub fn pick<'a>(grid: impl IntoIterator<Item = &'a CalibrationPoint>, max_far: f32) -> Option<&'a CalibrationPoint> {
    grid.into_iter().filter(|p| p.false_accept_rate <= max_far).min_by(|a, b| a.threshold.total_cmp(&b.threshold))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_cheapest_threshold_within_target() {
        let p = |threshold, false_accept_rate| CalibrationPoint { threshold, accept_rate: 0.0, false_accept_rate };
        let grid = [p(0.3, 0.05), p(0.5, 0.01), p(0.9, 0.001)];
        let t = |far| pick(&grid, far).map(|p| p.threshold);
        assert_eq!(t(0.02), Some(0.5));
        assert_eq!(t(0.1), Some(0.3));
        assert_eq!(t(0.0001), None);
    }
}
