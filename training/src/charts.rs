//! PNG charts for the calibration report: ROC curves of the learned verifier and the
//! draft-confidence baseline, and false-accept rate and target calls against threshold.
//! Text needs a TrueType font; the system's DejaVu Sans is used, and without it the charts
//! are skipped (the JSON and Markdown report carry the same numbers).

use std::path::Path;

use plotters::prelude::*;

use approxy_verifier::calibration::CalibrationPoint;

const FONT_PATHS: [&str; 3] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
];

/// Registers a system font for chart text; false when none is found.
pub fn register_font() -> bool {
    for p in FONT_PATHS {
        if let Ok(bytes) = std::fs::read(p) {
            // plotters keeps the font for the life of the process.
            let leaked: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            if plotters::style::register_font("sans-serif", FontStyle::Normal, leaked).is_ok() {
                return true;
            }
        }
    }
    false
}

type Err = Box<dyn std::error::Error>;

/// One panel of the threshold chart: y-axis label, y maximum, and the value plotted.
type Panel = (&'static str, f64, fn(&CalibrationPoint) -> f64);

/// ROC curves, one series per (name, points).
pub fn roc(path: &Path, title: &str, curves: &[(String, Vec<(f64, f64)>)]) -> Result<(), Err> {
    let root = BitMapBackend::new(path, (720, 640)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(0f64..1f64, 0f64..1f64)?;
    chart
        .configure_mesh()
        .x_desc("false-positive rate (accepted, target disagrees)")
        .y_desc("true-positive rate")
        .draw()?;
    chart.draw_series(LineSeries::new([(0.0, 0.0), (1.0, 1.0)], BLACK.mix(0.3)))?;
    for (i, (name, pts)) in curves.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))?
            .label(name.clone())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::LowerRight)
        .draw()?;
    root.present()?;
    Ok(())
}

/// False-accept rate (left) and target calls per 100 tokens (right) against threshold.
pub fn thresholds(
    path: &Path,
    title: &str,
    grids: &[(String, Vec<CalibrationPoint>)],
) -> Result<(), Err> {
    let root = BitMapBackend::new(path, (1200, 520)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(title, ("sans-serif", 22))?;
    let (left, right) = root.split_horizontally(600);
    let max_far = grids
        .iter()
        .flat_map(|g| g.1.iter().map(|p| f64::from(p.false_accept_rate)))
        .fold(0.01, f64::max);
    let panels: [Panel; 2] = [
        ("false-accept rate", max_far * 1.05, |p| {
            f64::from(p.false_accept_rate)
        }),
        ("target calls per 100 output tokens", 100.0, |p| {
            f64::from(p.target_calls_per_100_tokens)
        }),
    ];
    for (area, (label, ymax, get)) in [&left, &right].into_iter().zip(panels) {
        let mut chart = ChartBuilder::on(area)
            .margin(16)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(0f64..1f64, 0f64..ymax)?;
        chart
            .configure_mesh()
            .x_desc("threshold")
            .y_desc(label)
            .draw()?;
        for (i, (name, pts)) in grids.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            chart
                .draw_series(LineSeries::new(
                    pts.iter().map(|p| (f64::from(p.threshold), get(p))),
                    color.stroke_width(2),
                ))?
                .label(name.clone())
                .legend(move |(x, y)| {
                    PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2))
                });
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
    }
    root.present()?;
    Ok(())
}
