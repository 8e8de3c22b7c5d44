//! The goals each configuration is judged against, one line per configuration.

use std::path::Path;

use approxy_gateway::policy::{GuardPolicy, ModelPolicy};

use super::aggregate::{Aggregates, aggregate, class_cost};
use super::config::CallConfig;
use super::options::Sample;
use super::saved::CallsRun;
use crate::gpu_projection::{self, Shape};
use crate::prices::{CLASSES, PriceClass};
use crate::target_account::difference_pct;

/// The shape the GPU goals are judged on: a 32B model serving 8 streams at once.
const GPU_GOAL_SHAPE: Shape = Shape::new("qwen2.5-32b", 8, 1024);

/// The committed H200 table, when it can be read (the report says so when not).
pub(super) fn gpu_table() -> anyhow::Result<gpu_projection::Table> {
    // Relative to the repository root, where the benchmarks run (as their other paths are).
    gpu_projection::Table::load(Path::new(gpu_projection::TABLE_FILE))
}

/// The savings goals for API-priced targets, per llama.cpp configuration and sample, on the runs with
/// 0 ms per call (speed: also at 200 ms): cost at DeepSeek's prices with its cache at most 0.6x
/// target-only on HumanEval and 0.75x on chat; HumanEval pass@1 at most one problem below
/// target-only; at 200 ms per call at least target-only's speed. And the guard's own bounds at
/// the policy's prices: the run's aggregate at or below `max_cost_ratio`, no request above the
/// hard cap.
pub(super) fn goals(runs: &[CallsRun], base: &ModelPolicy) -> String {
    let deepseek = CLASSES
        .iter()
        .find(|c| c.name == "DeepSeek")
        .unwrap_or(&CLASSES[0]);
    let mut s = String::new();
    let mut groups: Vec<(Sample, String)> = runs
        .iter()
        .filter(|r| r.delay_ms == 0 && !r.config.vllm())
        .map(|r| (r.sample, r.layout.clone()))
        .collect();
    groups.dedup();
    for (sample, layout) in groups {
        let find = |delay: u64, c: CallConfig| find_run(runs, sample, &layout, delay, c);
        let Some(target) = find(0, CallConfig::TargetOnly) else {
            continue;
        };
        let (name, cost_bound, busy_bound, gpu_bound) = match sample {
            Sample::HumanEval => ("HumanEval", 0.6, 0.6, 0.3),
            Sample::Chat => ("held-out chat", 0.75, 0.75, 0.5),
            Sample::Instructions => ("instruction following", 0.75, 0.75, 0.5),
            Sample::Copy => ("copy-heavy", 0.75, 0.75, 0.5),
        };
        let group = GoalGroup {
            runs,
            sample,
            layout: &layout,
            base,
            deepseek,
            target: aggregate(target),
            cost_bound,
            busy_bound,
            gpu_bound,
        };
        let mut lines = String::new();
        for c in [
            CallConfig::Default,
            CallConfig::DefaultLookup,
            CallConfig::DefaultStreamed,
            CallConfig::Strict,
            CallConfig::Span,
            CallConfig::SpanOverlap,
        ] {
            let Some(r) = find(0, c) else { continue };
            lines.push_str(&group.line(c, &aggregate(r)));
            if c == CallConfig::DefaultLookup
                && let Some(d) = find(0, CallConfig::Default)
            {
                lines.push_str(&lookup_goal(r, d));
            }
            lines.push('\n');
        }
        if !lines.is_empty() {
            s.push_str(&format!(
                "\nGoals ({name}, cores {layout}; cost at {} prices with its cache):\n\n{lines}",
                deepseek.name
            ));
        }
    }
    s
}

/// Prompt lookup against the default without it: its single-stream speed (at least 1.5x),
/// end to end and the draft's own, and how many answers it left unchanged.
fn lookup_goal(lookup: &CallsRun, default: &CallsRun) -> String {
    let (l, d) = (aggregate(lookup), aggregate(default));
    let speed = l.tok_s / d.tok_s.max(1e-9);
    // The draft's own speed: its core-seconds for the run (the same answers are the same
    // tokens, so time alone compares them).
    let draft = |r: &CallsRun| -> f64 {
        r.prompts
            .iter()
            .filter_map(|p| p.generation.approxy.as_ref())
            .map(|u| u.draft_core_seconds)
            .sum()
    };
    let draft_speed = draft(default) / draft(lookup).max(1e-9);
    let same = lookup
        .prompts
        .iter()
        .zip(&default.prompts)
        .filter(|(a, b)| a.generation.text == b.generation.text)
        .count();
    format!(
        "; against the default without lookup: {speed:.2}x its speed end to end (≥ 1.5x: {}), the draft's own {draft_speed:.2}x (its core-seconds; ≥ 1.5x: {}), answers identical {same} of {}, draft tokens proposed {} and used {}",
        mark(speed >= 1.5),
        mark(draft_speed >= 1.5),
        lookup.prompts.len(),
        l.lookup.0,
        l.lookup.1
    )
}

fn mark(ok: bool) -> &'static str {
    if ok { "met" } else { "not met" }
}

/// The run of `c` on `sample` and `layout` at `delay` ms per call, if any.
fn find_run<'a>(
    runs: &'a [CallsRun],
    sample: Sample,
    layout: &str,
    delay: u64,
    c: CallConfig,
) -> Option<&'a CallsRun> {
    runs.iter()
        .find(|r| r.sample == sample && r.layout == layout && r.delay_ms == delay && r.config == c)
}

/// One sample and layout's goals: the runs, the target-only run they are judged against
/// (at 0 ms per call), and the bounds.
struct GoalGroup<'a> {
    runs: &'a [CallsRun],
    sample: Sample,
    layout: &'a str,
    base: &'a ModelPolicy,
    /// The price class the cost goal is judged at.
    deepseek: &'a PriceClass,
    target: Aggregates,
    cost_bound: f64,
    busy_bound: f64,
    /// The most the run's calls may cost on [`GPU_GOAL_SHAPE`], projected, relative to
    /// target-only's.
    gpu_bound: f64,
}

impl GoalGroup<'_> {
    /// The goals' line for configuration `c`, whose run at 0 ms per call is `a`.
    fn line(&self, c: CallConfig, a: &Aggregates) -> String {
        let (b, base, deepseek) = (&self.target, self.base, self.deepseek);
        let ratio = class_cost(a, deepseek, true) / class_cost(b, deepseek, true).max(1e-12);
        let mut line = format!(
            "- {}: cost {:.0} % (≤ {:.0} %: {})",
            c.label(),
            100.0 * ratio,
            100.0 * self.cost_bound,
            mark(ratio <= self.cost_bound)
        );
        line.push_str(&self.account_goals(a));
        line.push_str(&self.gpu_goals(a));
        line.push_str(&self.quality_goals(a));
        line.push_str(&self.delay_goal(c));
        if let Some((agg, worst)) = a.policy_ratio {
            line.push_str(&policy_goal(c, base, agg, worst));
        }
        if !a.guard_reasons.is_empty() {
            line.push_str(&format!(
                "; handed to the target for cost: {}",
                a.guard_reasons.join(", ")
            ));
        }
        line
    }

    /// Against the target's own counters, where both runs read them: its busy time, and how
    /// far approxy's estimates of the cost and the time are from them.
    fn account_goals(&self, a: &Aggregates) -> String {
        let (b, base) = (&self.target, self.base);
        let mut s = String::new();
        if let (Some(t), Some(bt)) = (a.account, b.account) {
            let busy = t.busy_seconds() / bt.busy_seconds().max(1e-9);
            s.push_str(&format!(
                "; target busy time {:.2}x target-only's (≤ {}x: {})",
                busy,
                self.busy_bound,
                mark(busy <= self.busy_bound)
            ));
            if let Some(e) = a.estimated_usd {
                let d = difference_pct(e, base.price.cost_of(&t.tokens()));
                s.push_str(&format!(
                    "; approxy's estimate {d:+.1} % from the target's counts (within 3 %: {})",
                    mark(d.abs() <= 3.0)
                ));
            }
            if let Some((spent, untimed)) = a.approxy_seconds {
                let d = difference_pct(spent, t.busy_seconds());
                s.push_str(&format!(
                    "; approxy's account of the target's time {spent:.1} s ({untimed} calls untimed, at the learned rates) {d:+.1} % from its counters (within 5 %: {})",
                    mark(d.abs() <= 5.0)
                ));
            }
        }
        s
    }

    /// The calls projected on a GPU target from the measured table (and, for windowed runs,
    /// as a radix cache would serve them).
    fn gpu_goals(&self, a: &Aggregates) -> String {
        let b = &self.target;
        let mut s = String::new();
        let projected = gpu_table()
            .and_then(|table| gpu_projection::compare(&table, GPU_GOAL_SHAPE, &a.calls, &b.calls));
        if a.windowed
            && let Ok(Some(x)) = gpu_table()
                .and_then(|t| gpu_projection::compare(&t, GPU_GOAL_SHAPE, &a.radix_calls, &b.calls))
                .map(|c| c.ratio())
        {
            s.push_str(&format!(
                "; its windows served from a radix cache as SGLang would (a what-if) {x:.2}x"
            ));
        }
        if let Ok(Some(x)) = projected.map(|c| c.ratio()) {
            s.push_str(&format!(
                "; projected on one H200 (32B, batch 8; from a measured table) {x:.2}x target-only's (≤ {}x: {})",
                self.gpu_bound,
                mark(x <= self.gpu_bound)
            ));
        }
        s
    }

    /// The answers' quality against target-only's: pass@1 on HumanEval, instructions followed.
    fn quality_goals(&self, a: &Aggregates) -> String {
        let b = &self.target;
        let mut s = String::new();
        if self.sample == Sample::HumanEval {
            s.push_str(&format!(
                "; pass@1 {}/{} against {}/{} ({})",
                a.passed,
                a.n,
                b.passed,
                b.n,
                mark(a.passed + 1 >= b.passed)
            ));
        }
        if let (Some(i), Some(bi)) = (a.instructions, b.instructions) {
            let points = 100.0 * (i.prompt_level_strict - bi.prompt_level_strict);
            s.push_str(&format!(
                "; instructions followed {:.1} % of prompts against {:.1} % ({points:+.1} points; within 2: {})",
                100.0 * i.prompt_level_strict,
                100.0 * bi.prompt_level_strict,
                mark(points >= -2.0)
            ));
        }
        s
    }

    /// Configuration `c`'s speed against target-only's at 200 ms per call.
    fn delay_goal(&self, c: CallConfig) -> String {
        let mut s = String::new();
        let find = |c: CallConfig| find_run(self.runs, self.sample, self.layout, 200, c);
        match (find(c), find(CallConfig::TargetOnly)) {
            (Some(r2), Some(b2)) => {
                let x = aggregate(r2).tok_s / aggregate(b2).tok_s.max(1e-9);
                s.push_str(&format!(
                    "; {:.2}x target-only's speed at 200 ms per call (≥ 1x: {})",
                    x,
                    mark(x >= 1.0)
                ));
            }
            _ => s.push_str("; 200 ms per call: not run"),
        }
        s
    }
}

/// The guard's own bounds at the policy's prices: the run's aggregate cost ratio `agg` (for
/// the default configuration, at most `max_cost_ratio`) and its dearest request's `worst`
/// (at most the hard cap, where the configuration has one).
fn policy_goal(c: CallConfig, base: &ModelPolicy, agg: f64, worst: f64) -> String {
    let cap = match (c, base.guard) {
        (CallConfig::Default, GuardPolicy::Budget { hard_cap, .. }) => Some(hard_cap),
        (CallConfig::Strict, _) => Some(base.max_cost_ratio),
        _ => None,
    };
    format!(
        "; at the policy's prices the run costs {:.0} % of passthrough by approxy's estimate{}, its dearest request {:.0} %{}",
        100.0 * agg,
        if c == CallConfig::Default {
            format!(
                " (≤ {:.0} %: {})",
                100.0 * base.max_cost_ratio,
                mark(agg <= base.max_cost_ratio + 1e-9)
            )
        } else {
            String::new()
        },
        100.0 * worst,
        cap.map_or(String::new(), |cap| format!(
            " (≤ {:.0} %: {})",
            100.0 * cap,
            mark(worst <= cap + 1e-9)
        ))
    )
}
