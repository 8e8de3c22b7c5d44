//! Resolving a quality target ("at most this false-accept rate") to a verifier threshold,
//! using the calibration JSON written by `approxy train report`.

use std::path::Path;

use serde::Deserialize;

/// One row of the calibration grid.
#[derive(Debug, Deserialize)]
pub struct CalibrationPoint {
    /// Threshold.
    pub threshold: f32,
    /// Fraction of accepted draft tokens that disagree with the target, on held-out data.
    pub false_accept_rate: f32,
}

/// The part of the calibration file the gateway reads.
#[derive(Debug, Deserialize)]
pub struct Calibration {
    /// Grid, any order.
    pub thresholds: Vec<CalibrationPoint>,
}

/// The lowest threshold (the one that accepts most, so costs least) whose measured
/// false-accept rate is within `max_far`.
pub fn threshold_for(path: &Path, max_far: f32) -> Result<f32, String> {
    if !(0.0..=1.0).contains(&max_far) {
        return Err(format!("max_false_accept_rate {max_far} is outside [0, 1]"));
    }
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let c: Calibration = serde_json::from_slice(&bytes).map_err(|e| format!("{}: {e}", path.display()))?;
    pick(&c, max_far).ok_or_else(|| format!("{}: no threshold reaches a false-accept rate of {max_far}", path.display()))
}

fn pick(c: &Calibration, max_far: f32) -> Option<f32> {
    c.thresholds
        .iter()
        .filter(|p| p.false_accept_rate <= max_far)
        .map(|p| p.threshold)
        .min_by(f32::total_cmp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_cheapest_threshold_within_target() {
        let c = Calibration {
            thresholds: vec![
                CalibrationPoint { threshold: 0.3, false_accept_rate: 0.05 },
                CalibrationPoint { threshold: 0.5, false_accept_rate: 0.01 },
                CalibrationPoint { threshold: 0.9, false_accept_rate: 0.001 },
            ],
        };
        assert_eq!(pick(&c, 0.02), Some(0.5));
        assert_eq!(pick(&c, 0.1), Some(0.3));
        assert_eq!(pick(&c, 0.0001), None);
    }
}
