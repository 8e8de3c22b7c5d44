//! The Markdown report: a table per sample, layout and delay, the target's own account, the
//! GPU projection, then the goals.

use approxy_gateway::policy::ModelPolicy;

use super::aggregate::{Aggregates, aggregate, agreement, class_cost};
use super::goals::{goals, gpu_table};
use super::options::Sample;
use super::saved::CallsRun;
use crate::gpu_projection;
use crate::prices::CLASSES;
use crate::target_account::{TargetAccount, Tokens, difference_pct};

/// The Markdown report.
pub fn markdown(
    runs: &[CallsRun],
    base: &ModelPolicy,
    machine: &crate::machine::Machine,
) -> String {
    let mut s = String::new();
    s.push_str(&format!(
        "Calls benchmark (`approxy bench calls`), report assembled {} on {}. Costs are the target's bill relative to the target-only run of the same prompts, layout and delay, under each price class: with the provider's prompt cache / without it. The default policy: confidence verifier at threshold {:.2}, {}, {} guard at max_cost_ratio {}.\n",
        crate::machine::utc_now(),
        machine.line(),
        base.threshold,
        crate::quality::correction_words(base.correction),
        base.guard.name(),
        base.max_cost_ratio
    ));
    let key = |r: &CallsRun| TableKey {
        sample: r.sample,
        layout: r.layout.clone(),
        delay: r.delay_ms,
        n: r.prompts.len(),
        max_tokens: r.max_tokens,
        vllm: r.config.vllm(),
    };
    let mut groups: Vec<_> = runs.iter().map(key).collect();
    groups.dedup();
    for g in groups {
        let here: Vec<&CallsRun> = runs.iter().filter(|r| key(r) == g).collect();
        s.push_str(&runs_table(&g, &here));
        s.push_str(&account_table(&here, base));
        s.push_str(&projection_section(&here));
    }
    s.push_str(&goals(runs, base));
    s.push_str("\nPrice classes (USD per million tokens: input / cached input / output):\n\n");
    for p in &CLASSES {
        s.push_str(&format!(
            "- {}: {} / {} / {} ({}; {}; source: {})\n",
            p.name, p.input, p.cached_input, p.output, p.what, p.date, p.source
        ));
    }
    s
}

/// What the runs of one table share: the prompts, the layout and the delay (and whether the
/// target is vLLM, whose runs get a table of their own).
#[derive(Debug, Clone, PartialEq, Eq)]
struct TableKey {
    sample: Sample,
    layout: String,
    delay: u64,
    n: usize,
    max_tokens: u32,
    vllm: bool,
}

/// One table of the report: its heading, where its runs come from, and a row per run.
fn runs_table(g: &TableKey, here: &[&CallsRun]) -> String {
    let TableKey {
        sample,
        layout,
        delay,
        n,
        max_tokens,
        ..
    } = g;
    let mut s = format!(
        "\n#### {}, {n} prompts, at most {max_tokens} tokens, cores {layout}, {delay} ms per target call\n\n",
        match sample {
            Sample::HumanEval => "HumanEval",
            Sample::Chat => "Held-out chat",
            Sample::Instructions => "Instruction following",
            Sample::Copy => "Copy-heavy (functions rewritten, passages quoted)",
        }
    );
    // Runs of one table can come from different days and machines: each says its own.
    let mut provenance: Vec<String> = here
        .iter()
        .map(|r| {
            format!(
                "{} on {}",
                r.finished_at.get(..10).unwrap_or(&r.finished_at),
                r.machine.as_deref().unwrap_or("a machine not recorded")
            )
        })
        .collect();
    provenance.dedup();
    s.push_str(&format!("Run {}.\n\n", provenance.join("; ")));
    let quality = match sample {
        Sample::HumanEval => "pass@1",
        Sample::Chat | Sample::Copy => "same as target / ROUGE-L",
        Sample::Instructions => "instructions followed (prompt / instruction, strict)",
    };
    s.push_str(&format!("| configuration | {quality} | tok/s | speed vs target | TTFT p50 | calls / 100 tok | target tok / 100 | windows (mean k) | overlap guesses used |"));
    for p in &CLASSES {
        s.push_str(&format!(" cost {} |", p.name));
    }
    s.push_str("\n|---|---|---|---|---|---|---|---|---|");
    s.push_str(&"---|".repeat(CLASSES.len()));
    s.push('\n');
    for r in here {
        s.push_str(&run_row(r, here, *sample));
    }
    s
}

/// A run's row, against its baseline among `here` (the same table's runs).
fn run_row(r: &CallsRun, here: &[&CallsRun], sample: Sample) -> String {
    let a = aggregate(r);
    let base_run = here.iter().find(|b| b.config == r.config.baseline());
    let b = base_run.map(|b| aggregate(b));
    let q = match sample {
        Sample::HumanEval => format!(
            "{:.1} % ({}/{})",
            100.0 * a.passed as f64 / a.n.max(1) as f64,
            a.passed,
            a.n
        ),
        Sample::Chat | Sample::Copy => match base_run {
            Some(b) => {
                let (e, rl) = agreement(r, b);
                format!("{:.0} % / {:.2}", 100.0 * e, rl)
            }
            None => "–".into(),
        },
        Sample::Instructions => r.instructions.map_or("–".into(), |i| {
            format!(
                "{:.1} % / {:.1} %",
                100.0 * i.prompt_level_strict,
                100.0 * i.instruction_level_strict
            )
        }),
    };
    let speed = b.as_ref().map_or("–".into(), |b| {
        format!("{:.2}x", a.tok_s / b.tok_s.max(1e-9))
    });
    let windows = if a.windows.0 > 0 {
        format!(
            "{} ({:.1})",
            a.windows.0,
            a.windows.1 as f64 / a.windows.0 as f64
        )
    } else {
        "–".into()
    };
    let guesses = if a.guesses.0 > 0 {
        format!("{} of {}", a.guesses.1, a.guesses.0)
    } else {
        "–".into()
    };
    let mut s = format!(
        "| {}{} | {q} | {:.2} | {speed} | {:.2} s | {:.1} | {:.1} | {windows} | {guesses} |",
        r.config.label(),
        if a.errors > 0 {
            format!(" ({} failed)", a.errors)
        } else {
            String::new()
        },
        a.tok_s,
        a.ttft_p50,
        a.calls_per_100,
        a.target_per_100,
    );
    for p in &CLASSES {
        match &b {
            Some(b) => s.push_str(&format!(
                " {:.0} % / {:.0} % |",
                100.0 * class_cost(&a, p, true) / class_cost(b, p, true).max(1e-12),
                100.0 * class_cost(&a, p, false) / class_cost(b, p, false).max(1e-12)
            )),
            None => s.push_str(" – |"),
        }
    }
    s.push('\n');
    s
}

/// The target's own account beside approxy's bill, for the runs that read it: how long the
/// target computed against target-only, and each of approxy's token counts and its cost
/// estimate against what the target counted.
fn account_table(here: &[&CallsRun], base: &ModelPolicy) -> String {
    let rows: Vec<(&CallsRun, Aggregates, TargetAccount)> = here
        .iter()
        .filter_map(|r| {
            let a = aggregate(r);
            a.account.map(|t| (*r, a, t))
        })
        .collect();
    if rows.is_empty() {
        return String::new();
    }
    let baseline = rows
        .iter()
        .find(|(r, ..)| r.config.passthrough())
        .map(|(_, _, t)| t.busy_seconds());
    let mut s = String::from(
        "\nThe target's own account (its `/metrics` counters: llama-server's, or vLLM's, read before and after each run; billed = approxy's `usage.approxy`, or the client's usage in passthrough; vLLM's busy time is the prefill and decode time of the requests it finished, so a request whose stream the client closed, which vLLM aborts, is missing from it, while its token counts include it):\n\n\
         | configuration | target busy (prompt + generation) | busy vs target only | output tokens billed / counted | tokens in flight per stream closed early, measured | uncached input billed / counted | cached input billed / counted | cost at the policy's prices, estimate / from the target's counts |\n\
         |---|---|---|---|---|---|---|---|\n",
    );
    for (r, a, t) in rows {
        let counted = t.tokens();
        let pair =
            |b: u64, c: u64| format!("{b} / {c} ({:+.1} %)", difference_pct(b as f64, c as f64));
        let estimate = a.estimated_usd.map_or("–".into(), |e| {
            let from_counts = base.price.cost_of(&counted);
            format!(
                "{:.5} / {:.5} USD ({:+.1} %)",
                e,
                from_counts,
                difference_pct(e, from_counts)
            )
        });
        s.push_str(&format!(
            "| {} | {:.1} s ({:.1} + {:.1}) | {} | {} | {} | {} | {} | {estimate} |\n",
            r.config.label(),
            t.busy_seconds(),
            t.prompt_seconds,
            t.predicted_seconds,
            baseline.map_or("–".into(), |b| format!(
                "{:.2}x",
                t.busy_seconds() / b.max(1e-9)
            )),
            pair(a.billed.output, counted.output),
            inflight_per_close(&a, &counted),
            pair(a.billed.uncached_input, counted.uncached_input),
            pair(a.billed.cached_input, counted.cached_input),
        ));
    }
    s.push_str(&window_prompts(here));
    s
}

/// What each run's window calls computed of their prompts: the prompt tokens a window call
/// sent less those the target said its cache served (or the cache rules' estimate where it did
/// not say), on average, beside the window tokens it scored.
fn window_prompts(here: &[&CallsRun]) -> String {
    let mut lines = String::new();
    for r in here {
        let (mut calls, mut computed, mut sent) = (0u64, 0u64, 0u64);
        for c in r
            .prompts
            .iter()
            .filter_map(|p| p.generation.approxy.as_ref())
            .flat_map(|u| &u.target_call_records)
            .filter(|c| c.kind == "window")
        {
            calls += 1;
            computed += c.sent.saturating_sub(c.cached);
            sent += c.sent;
        }
        if calls > 0 {
            let a = aggregate(r);
            lines.push_str(&format!(
                "- {}: {calls} window calls, each computing {:.1} of the {:.0} prompt tokens it sent on average ({:.1} window tokens scored)\n",
                r.config.label(),
                computed as f64 / calls as f64,
                sent as f64 / calls as f64,
                a.windows.1 as f64 / a.windows.0.max(1) as f64,
            ));
        }
    }
    if lines.is_empty() {
        return lines;
    }
    format!(
        "\nPrompt tokens the target computed per window call (what it sent less what its prefix cache served, as the target reported):\n\n{lines}"
    )
}

/// What the runs' calls would cost a GPU-hosted target, against the target-only run's: a
/// projection from the measured table, per model shape and batch.
fn projection_section(here: &[&CallsRun]) -> String {
    let Some(base) = here.iter().find(|r| r.config.passthrough()) else {
        return String::new();
    };
    let passthrough = aggregate(base).calls;
    let runs: Vec<gpu_projection::Run> = here
        .iter()
        .filter(|r| !r.config.passthrough())
        .map(|r| (r, aggregate(r).calls))
        .filter(|(_, calls)| !calls.is_empty())
        .map(|(r, approxy)| gpu_projection::Run {
            label: r.config.label().to_string(),
            approxy,
            passthrough: passthrough.clone(),
        })
        .chain(here.iter().filter_map(|r| {
            let a = aggregate(r);
            a.windowed.then(|| gpu_projection::Run {
                label: format!(
                    "{}, its windows served as SGLang would (prefix from the radix cache; a what-if from the same calls)",
                    r.config.label()
                ),
                approxy: a.radix_calls,
                passthrough: passthrough.clone(),
            })
        }))
        .collect();
    if runs.is_empty() {
        return String::new();
    }
    match gpu_table().and_then(|t| gpu_projection::markdown(&t, &gpu_projection::SHAPES, &runs)) {
        // A section of this table's group, not of the document.
        Ok(md) => format!("\n{}", md.replace("## ", "#### ")),
        Err(e) => format!("\nGPU projection: not made ({e:#}).\n"),
    }
}

/// What the target generated beyond what approxy received, per stream approxy closed early
/// (those it billed the allowance for): the measurement the allowance stands for.
fn inflight_per_close(a: &Aggregates, counted: &Tokens) -> String {
    let closed = a.inflight_billed / approxy_verifier::decode::TOKENS_IN_FLIGHT_AT_CLOSE;
    if closed == 0 {
        return "–".into();
    }
    let received = a.billed.output - a.inflight_billed;
    format!(
        "{:.2} over {closed}",
        (counted.output as f64 - received as f64) / closed as f64
    )
}
