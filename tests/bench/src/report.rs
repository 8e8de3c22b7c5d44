//! Benchmark write-ups: the Markdown tables and the README's results section, regenerated
//! from `quality.json` and `overhead.json` so the README never carries a number no command
//! produced.

use std::path::Path;

use anyhow::Context;

use super::overhead::{OverheadReport, overhead_markdown};
use super::quality::{QualityReport, Route};
use super::summary::{RunSummary, per_1k};

fn layout_note(layout: &str) -> &'static str {
    match layout {
        "pinned" => "target on core 0, draft and gateway on core 1, one thread each",
        _ => "draft, gateway and target all share both cores",
    }
}

/// The Markdown for `quality.md`.
pub fn quality_markdown(r: &QualityReport) -> String {
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
            super::humaneval::Sandbox::NetworkNamespace => "no network",
            super::humaneval::Sandbox::SubprocessOnly => "network not isolated on this machine",
        },
        r.generated_at,
        r.machine.line(),
    ));
    s.push_str(
        "The draft and the target share this one machine, unlike a deployment where the target is a remote GPU server: \
         every target call here competes with the draft for the same two cores. Each layout is reported separately.\n\n",
    );
    let layouts: Vec<&str> = {
        let mut v: Vec<&str> = r.runs.iter().map(|x| x.layout.as_str()).collect();
        v.dedup();
        v
    };
    for layout in layouts {
        let rows: Vec<&RunSummary> = r.runs.iter().filter(|x| x.layout == layout).collect();
        s.push_str(&format!("#### Cores {layout}: {}\n\n", layout_note(layout)));
        s.push_str("| configuration | pass@1 | output tok/s | TTFT p50 | target calls / 100 tok | target-generated / 100 tok | tokens the target processed | USD / 1k problems | USD / 1k, prompt cache |\n");
        s.push_str("|---|---|---|---|---|---|---|---|---|\n");
        for x in &rows {
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
        s.push_str(&goals(&rows));
    }
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

const BEGIN: &str =
    "<!-- bench-results:begin (generated by `approxy bench report`; do not edit) -->";
const END: &str = "<!-- bench-results:end -->";

/// Rewrites the README's results section from the reports under `out`.
pub fn update_readme(out: &Path, readme: &Path) -> anyhow::Result<()> {
    let mut section = String::from("\n");
    match std::fs::read(out.join("quality.json")) {
        Ok(b) => {
            let q: QualityReport = serde_json::from_slice(&b).context("quality.json")?;
            section
                .push_str("### Quality, speed and cost on HumanEval (`approxy bench quality`)\n\n");
            section.push_str(&quality_markdown(&q));
            section.push_str(&format!(
                "\n![pass@1 against cost, Pareto front marked]({}/quality.png)\n\n",
                relative(out, readme.parent().unwrap_or(Path::new("")))
            ));
        }
        Err(_) => section.push_str("No quality results yet: run `./deploy/bench.sh`.\n\n"),
    }
    match std::fs::read(out.join("overhead.json")) {
        Ok(b) => {
            let o: OverheadReport = serde_json::from_slice(&b).context("overhead.json")?;
            section.push_str("### Gateway overhead in passthrough (`approxy bench overhead`)\n\n");
            section.push_str(&overhead_markdown(&o));
        }
        Err(_) => section.push_str("No overhead results yet: run `./deploy/bench.sh`.\n"),
    }
    // Written by `approxy bench calls` (deploy/bench-calls.sh) from its saved runs.
    if let Ok(calls) = std::fs::read_to_string(out.join("calls").join("calls.md")) {
        section.push_str("\n### The engine's call structure (`approxy bench calls`)\n\n");
        section.push_str(&calls);
    }
    // Written by `approxy bench draft-fidelity` (deploy/bench-draft-fidelity.sh).
    if let Some(f) = super::fidelity::load_markdown(&out.join("draft-fidelity")) {
        section.push_str(
            "\n### The draft's fidelity by conversion (`approxy bench draft-fidelity`)\n\n",
        );
        section.push_str(&f);
    }
    let text = std::fs::read_to_string(readme).with_context(|| format!("{}", readme.display()))?;
    let (Some(a), Some(b)) = (text.find(BEGIN), text.find(END)) else {
        anyhow::bail!("{} has no `{BEGIN}` … `{END}` block", readme.display());
    };
    anyhow::ensure!(a < b, "{}: results markers out of order", readme.display());
    let new = format!("{}{BEGIN}\n{section}{}", &text[..a], &text[b..]);
    std::fs::write(readme, new)?;
    Ok(())
}

/// `path` as a link from a file in `from` (both taken from the working directory when
/// relative), so that the Markdown file's links resolve wherever it lives.
fn relative(path: &Path, from: &Path) -> String {
    let absolute = |p: &Path| {
        std::env::current_dir()
            .map(|cwd| cwd.join(p))
            .unwrap_or_else(|_| p.to_path_buf())
    };
    let (to, from) = (absolute(path), absolute(from));
    let (to, from): (Vec<_>, Vec<_>) = (to.components().collect(), from.components().collect());
    let common = to.iter().zip(&from).take_while(|(a, b)| a == b).count();
    let mut out = std::path::PathBuf::new();
    for _ in common..from.len() {
        out.push("..");
    }
    for c in &to[common..] {
        out.push(c);
    }
    if out.as_os_str().is_empty() {
        out.push(".");
    }
    out.display().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_are_relative_to_the_file_they_are_written_into() {
        assert_eq!(
            relative(Path::new("deploy/results"), Path::new("tests")),
            "../deploy/results"
        );
        assert_eq!(
            relative(Path::new("deploy/results"), Path::new("")),
            "deploy/results"
        );
        assert_eq!(relative(Path::new("/a/b/c"), Path::new("/a/d")), "../b/c");
        assert_eq!(relative(Path::new("/a/b"), Path::new("/a/b")), ".");
    }

    #[test]
    fn readme_block_is_replaced_in_place() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let readme = dir.path().join("README.md");
        std::fs::write(&readme, format!("# x\n\n{BEGIN}\nold\n{END}\n\nafter\n"))
            .unwrap_or_else(|e| panic!("{e}"));
        update_readme(dir.path(), &readme).unwrap_or_else(|e| panic!("{e}"));
        let t = std::fs::read_to_string(&readme).unwrap_or_else(|e| panic!("{e}"));
        assert!(!t.contains("old"));
        assert!(t.contains("No quality results yet"));
        assert!(t.starts_with("# x\n\n") && t.ends_with(&format!("{END}\n\nafter\n")));
        std::fs::write(&readme, "no markers").unwrap_or_else(|e| panic!("{e}"));
        assert!(update_readme(dir.path(), &readme).is_err());
    }
}
