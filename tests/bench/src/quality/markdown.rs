//! The Markdown for `quality.md`: a table per core layout with its goals, the levels, and the
//! prices and settings.

use super::results::QualityReport;
use crate::configs::Route;
use crate::humaneval::Sandbox;
use crate::summary::RunSummary;
use crate::summary::per_1k;

fn layout_note(layout: &str) -> &'static str {
    match layout {
        "pinned" => "target on core 0, draft and gateway on core 1, one thread each",
        _ => "draft, gateway and target all share both cores",
    }
}

/// The Markdown for `quality.md`.
pub fn quality_markdown(r: &QualityReport) -> String {
    let mut s = intro(r);
    let layouts: Vec<&str> = {
        let mut v: Vec<&str> = r.runs.iter().map(|x| x.layout.as_str()).collect();
        v.dedup();
        v
    };
    for layout in layouts {
        let rows: Vec<&RunSummary> = r.runs.iter().filter(|x| x.layout == layout).collect();
        s.push_str(&layout_section(layout, &rows));
    }
    s.push_str(&levels_section(r));
    s.push_str(&prices_note(r));
    s
}

/// What was run, how it was checked, and where.
fn intro(r: &QualityReport) -> String {
    let mut s = String::new();
    s.push_str(&format!(
        "HumanEval, {} of {} problems{}, greedy, at most {} output tokens, stops {:?}; pass@1 = the completion passes the problem's tests \
         (each run in its own `python3` subprocess, {:.0} s timeout, {}). Report assembled {} from the runs saved under `raw/`, on {}.\n\n",
        r.problems,
        r.problems_total,
        if r.problems < r.problems_total { " spread evenly over the set" } else { "" },
        r.max_tokens,
        r.stop,
        r.exec_timeout_secs,
        match r.sandbox {
            Sandbox::NetworkNamespace => "no network",
            Sandbox::SubprocessOnly => "network not isolated on this machine",
        },
        r.generated_at,
        r.machine.line(),
    ));
    s.push_str(
        "The draft and the target share this one machine, unlike a deployment where the target is a remote GPU server: \
         every target call here competes with the draft for the same two cores. Each layout is reported separately.\n\n",
    );
    s
}

/// One core layout's table of configurations, its generation time and its goals.
fn layout_section(layout: &str, rows: &[&RunSummary]) -> String {
    let mut s = String::new();
    s.push_str(&format!("#### Cores {layout}: {}\n\n", layout_note(layout)));
    s.push_str("| configuration | pass@1 | output tok/s | TTFT p50 | target calls / 100 tok | target-generated / 100 tok | tokens the target processed | USD / 1k problems | USD / 1k, prompt cache |\n");
    s.push_str("|---|---|---|---|---|---|---|---|---|\n");
    for x in rows {
        let m = &x.summary;
        let errors = match m.errors {
            0 => String::new(),
            1 => " (1 failed call)".to_string(),
            n => format!(" ({n} failed calls)"),
        };
        s.push_str(&format!(
            "| {} | {:.1} %{errors} | {:.2} | {:.2} s | {:.1} | {:.1} | {} | {:.4} | {:.4} |\n",
            x.config.label,
            m.pass_at_1,
            m.tokens_per_second,
            m.ttft_p50,
            m.target_calls_per_100,
            m.target_tokens_per_100,
            m.target_processed_tokens,
            per_1k(m.cost_usd, m.problems),
            per_1k(m.cost_usd_cached, m.problems),
        ));
    }
    let minutes: f64 = rows
        .iter()
        .map(|x| x.summary.generation_seconds)
        .sum::<f64>()
        / 60.0;
    s.push_str(&format!(
        "\nGeneration time for these {} configurations: {minutes:.0} min.\n\n",
        rows.len()
    ));
    s.push_str(&goals(rows));
    s
}

/// The quality levels' thresholds from the calibration, and the levels none reaches.
fn levels_section(r: &QualityReport) -> String {
    let mut s = String::new();
    s.push_str("#### Levels\n\nThe calibration (`policies/verifier/calibration.json`) names the thresholds; the confidence baseline runs at the accept rate the learned verifier has.\n\n");
    s.push_str("| level | max false-accept rate | learned threshold | learned accept / FAR | confidence threshold | confidence accept / FAR |\n|---|---|---|---|---|---|\n");
    let cell = |o: Option<approxy_verifier::calibration::CalibrationPoint>| {
        o.map_or_else(
            || ("unreachable".to_string(), "–".to_string()),
            |o| {
                (
                    format!("{:.2}", o.threshold),
                    format!("{:.3} / {:.3}", o.accept_rate, o.false_accept_rate),
                )
            },
        )
    };
    for l in &r.levels {
        let (lt, la) = cell(l.learned);
        let (ct, ca) = cell(l.confidence);
        s.push_str(&format!(
            "| {} | {:.2} | {lt} | {la} | {ct} | {ca} |\n",
            l.name, l.max_false_accept_rate
        ));
    }
    for l in r.levels.iter().filter(|l| l.learned.is_none()) {
        s.push_str(&format!(
            "\n{}: no learned-verifier threshold below 1 reaches a false-accept rate of {:.2} on the held-out data, so the level is not run \
             (at threshold 1 the target decides every token, one call each, which passthrough does better).\n",
            l.name, l.max_false_accept_rate
        ));
    }
    s
}

/// The prices, approxy's settings and llama.cpp's speculative flags the run used.
fn prices_note(r: &QualityReport) -> String {
    let mut s = String::new();
    s.push_str(&format!(
        "\nPrices (USD per million tokens, from `{}`): input {}, re-sent input with a prompt cache {}, output {}. \
         approxy takes {}{}{}. llama.cpp speculative: `{}`. \
         Tokens the target processed = every input token sent (approxy re-sends the growing prefix on each call) plus every token it generated.\n",
        r.approxy_settings.from.display(),
        r.price.input,
        r.price.cached_input,
        r.price.output,
        match (&r.approxy_settings.correction_tokens, r.approxy_settings.correction.is_empty()) {
            (Some(n), true) => format!("{n} target token(s) per rejection"),
            _ => r.approxy_settings.correction.clone(),
        },
        match (r.approxy_settings.bailout_window, r.approxy_settings.bailout_max_rejection_rate) {
            (Some(w), Some(m)) => format!(" and hands the rest of an answer to the target once more than {:.0} % of the last {w} decisions were rejections", 100.0 * m),
            _ => String::new(),
        },
        match r.approxy_settings.max_cost_ratio {
            Some(x) => format!(", and before a call could make a request cost more than {x} times passthrough at these prices, hands the rest to the target in one call"),
            None => String::new(),
        },
        r.llama_speculative_args.join(" "),
    ));
    s
}

/// Where the run stands against the project's goals (reported, never tuned for).
fn goals(rows: &[&RunSummary]) -> String {
    let find = |id: &str| rows.iter().find(|x| x.config.id == id).map(|x| &x.summary);
    let (Some(target), spec) = (find("target-only"), find("llama-speculative")) else {
        return String::new();
    };
    let mut s = String::from(
        "Goals (pass@1 within 2 points of target only while the target generates at most 10 % of output tokens; output tok/s at least 2x target only and 2x llama.cpp speculative):\n\n",
    );
    for x in rows.iter().filter(|x| x.config.route == Route::Approximate) {
        let m = &x.summary;
        let quality = m.pass_at_1 >= target.pass_at_1 - 2.0 && m.target_tokens_per_100 <= 10.0;
        let vs_target = m.tokens_per_second / target.tokens_per_second.max(1e-9);
        let vs_spec = spec.map_or(f64::NAN, |sp| {
            m.tokens_per_second / sp.tokens_per_second.max(1e-9)
        });
        s.push_str(&format!(
            "- {}: pass@1 {:+.1} points, target generated {:.1} % → quality goal {}; speed {:.2}x target only, {:.2}x llama.cpp speculative → speed goal {}\n",
            x.config.id,
            m.pass_at_1 - target.pass_at_1,
            m.target_tokens_per_100,
            if quality { "met" } else { "not met" },
            vs_target,
            vs_spec,
            if vs_target >= 2.0 && vs_spec >= 2.0 { "met" } else { "not met" },
        ));
    }
    if let Some(a) = spec.and_then(|sp| sp.llama_draft_acceptance) {
        s.push_str(&format!(
            "- llama.cpp's own draft acceptance: {:.1} %\n",
            100.0 * a
        ));
    }
    s.push('\n');
    s
}
