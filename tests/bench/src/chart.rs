//! The quality-against-cost chart: one point per configuration, the Pareto front (no other
//! configuration is at least as good on both axes and better on one) joined and marked.

use std::path::Path;

use plotters::prelude::*;

use super::summary::{RunSummary, Summary, per_1k};

type Err = Box<dyn std::error::Error>;

/// An x-axis label and the cost it plots.
type CostPanel = (&'static str, fn(&Summary) -> f64);

/// Indices of the points no other point dominates (lower or equal cost, higher or equal
/// quality, one of them strictly), sorted by cost.
pub fn pareto_front(points: &[(f64, f64)]) -> Vec<usize> {
    let dominated = |i: usize| {
        let (ci, qi) = points[i];
        points
            .iter()
            .any(|&(c, q)| c <= ci && q >= qi && (c < ci || q > qi))
    };
    let mut front: Vec<usize> = (0..points.len()).filter(|&i| !dominated(i)).collect();
    front.sort_by(|&a, &b| points[a].0.total_cmp(&points[b].0));
    front
}

/// Draws pass@1 against USD per 1,000 problems, without (left) and with (right) the
/// prompt-cache discount, for the first layout in `runs` (costs and answers do not depend on
/// the layout; speeds do, and the tables carry them); `problems` of `problems_total` were run.
pub fn pareto(
    path: &Path,
    problems: usize,
    problems_total: usize,
    runs: &[RunSummary],
) -> Result<(), Err> {
    if !approxy_training::charts::register_font() {
        return Err("no TrueType font for chart text".into());
    }
    let Some(layout) = runs.first().map(|x| x.layout.clone()) else {
        return Err("no runs".into());
    };
    let rows: Vec<_> = runs.iter().filter(|x| x.layout == layout).collect();
    let root = BitMapBackend::new(path, (1400, 620)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(
        &format!(
            "HumanEval pass@1 against target cost ({problems} of {problems_total} problems, cores {layout})"
        ),
        ("sans-serif", 22),
    )?;
    let (left, right) = root.split_horizontally(700);
    let panels: [CostPanel; 2] = [
        ("USD per 1,000 problems, no prompt-cache discount", |s| {
            s.cost_usd
        }),
        (
            "USD per 1,000 problems, re-sent input at the cached price",
            |s| s.cost_usd_cached,
        ),
    ];
    for (area, panel) in [&left, &right].into_iter().zip(panels) {
        cost_panel(area, panel, &rows)?;
    }
    root.present()?;
    Ok(())
}

/// One panel: pass@1 against the cost `panel` plots, the Pareto front joined, each
/// configuration's point labelled.
fn cost_panel(
    area: &DrawingArea<BitMapBackend<'_>, plotters::coord::Shift>,
    (xlabel, cost): CostPanel,
    rows: &[&RunSummary],
) -> Result<(), Err> {
    let pts: Vec<(f64, f64)> = rows
        .iter()
        .map(|x| {
            (
                per_1k(cost(&x.summary), x.summary.problems),
                x.summary.pass_at_1,
            )
        })
        .collect();
    let xmax = pts.iter().map(|p| p.0).fold(0.0, f64::max) * 1.3 + 1e-9;
    let mut chart = ChartBuilder::on(area)
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(56)
        .build_cartesian_2d(0f64..xmax, 0f64..100f64)?;
    chart
        .configure_mesh()
        .x_desc(xlabel)
        .y_desc("pass@1 (%)")
        .draw()?;
    let front = pareto_front(&pts);
    chart
        .draw_series(LineSeries::new(
            front.iter().map(|&i| pts[i]),
            RED.mix(0.6).stroke_width(2),
        ))?
        .label("Pareto front")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], RED.stroke_width(2)));
    let xspan = xmax;
    let mut placed: Vec<(f64, f64)> = Vec::new();
    for (i, (x, p)) in rows.iter().zip(&pts).enumerate() {
        let on_front = front.contains(&i);
        let color = if on_front {
            RED.to_rgba()
        } else {
            BLUE.mix(0.7)
        };
        chart.draw_series(std::iter::once(Circle::new(
            *p,
            if on_front { 7 } else { 5 },
            color.filled(),
        )))?;
        let label = place_label(&mut placed, *p, xspan);
        chart.draw_series(std::iter::once(Text::new(
            x.config.id.clone(),
            label,
            ("sans-serif", 14),
        )))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::LowerRight)
        .draw()?;
    Ok(())
}

/// Where point `p`'s label goes: above it, or lower while it would overprint one of the
/// `placed` labels (points at nearly the same place stack their labels); the place is kept.
fn place_label(placed: &mut Vec<(f64, f64)>, p: (f64, f64), xspan: f64) -> (f64, f64) {
    let mut label = (p.0, p.1 + 3.5);
    while placed
        .iter()
        .any(|q| (q.0 - label.0).abs() < 0.12 * xspan && (q.1 - label.1).abs() < 3.0)
    {
        label.1 -= 3.5;
    }
    placed.push(label);
    label
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn front_keeps_only_undominated_points() {
        // cheap+bad, expensive+good, dominated (costlier and worse than the second), a tie.
        let pts = [
            (0.0, 40.0),
            (5.0, 70.0),
            (6.0, 65.0),
            (2.0, 60.0),
            (2.0, 60.0),
        ];
        assert_eq!(pareto_front(&pts), vec![0, 3, 4, 1]);
    }
}
