//! What a fit writes: the head, the calibration, the report and its charts.

use approxy_verifier::calibration::Calibration;

use super::heads::Fitted;
use super::markdown::markdown;
use super::scoring::of_kind;
use crate::report::{Scored, grid, roc_auc, standard_thresholds};

/// Writes the best head (`default.json`, even when the baseline is chosen), the calibration,
/// the report and its charts into `out_dir`.
pub(super) fn write_fit(
    out_dir: &std::path::Path,
    fitted: &Fitted,
    calibration: &Calibration,
) -> anyhow::Result<()> {
    let th = standard_thresholds();
    std::fs::create_dir_all(out_dir)?;
    charts(
        out_dir,
        fitted.best.name,
        &fitted.best.scores,
        &fitted.base,
        &th,
    );
    std::fs::write(
        out_dir.join("default.json"),
        serde_json::to_vec(&fitted.best.artifact)?,
    )?;
    std::fs::write(
        out_dir.join("calibration.json"),
        calibration.to_json_pretty()?,
    )?;
    std::fs::write(out_dir.join("report.md"), markdown(calibration))?;
    eprintln!(
        "wrote {}/{{default.json,calibration.json,report.md,roc.png,thresholds.png}}; chosen: {}",
        out_dir.display(),
        calibration.chosen_verifier
    );
    Ok(())
}

/// ROC and threshold charts, split by prompt kind; skipped with a warning when no font exists.
fn charts(dir: &std::path::Path, learned: &str, l: &Scored, b: &Scored, th: &[f32]) {
    use crate::charts;
    use crate::report::roc_curve;
    if !charts::register_font() {
        eprintln!("warning: no DejaVu Sans font found; PNG charts skipped");
        return;
    }
    let mut curves = Vec::new();
    let mut grids = Vec::new();
    for (kname, k) in [("code", 0u8), ("chat", 1u8)] {
        for (vname, s) in [(learned, l), ("confidence", b)] {
            let (sc, lb) = of_kind(s, Some(k));
            curves.push((
                format!(
                    "{vname}, {kname} (AUC {:.3})",
                    roc_auc(&sc, &lb).unwrap_or(f64::NAN)
                ),
                roc_curve(&sc, &lb),
            ));
            grids.push((
                format!("{vname}, {kname}"),
                grid(s, |i| s.kinds[i] == k, th),
            ));
        }
    }
    if let Err(e) = charts::roc(
        &dir.join("roc.png"),
        "Verifier ROC on held-out prompts",
        &curves,
    ) {
        eprintln!("warning: roc.png: {e}");
    }
    if let Err(e) = charts::thresholds(
        &dir.join("thresholds.png"),
        "False-accept rate and target calls against threshold",
        &grids,
    ) {
        eprintln!("warning: thresholds.png: {e}");
    }
}
