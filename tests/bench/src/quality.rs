//! `approxy bench quality`: HumanEval through every configuration a user would weigh
//! approxy against, on this machine's cores shared and pinned.
//!
//! Configurations, per layout:
//! - (a) target only, through the gateway in passthrough mode;
//! - (b) approxy with the learned verifier at the calibration's economy/default/strict levels;
//! - (c) approxy with the draft-confidence baseline at the accept rates (b) has;
//! - (d) draft only (threshold 0);
//! - (e) llama-server's own speculative decoding with the same draft GGUF, called directly.
//!
//! Every call is a greedy streaming `/v1/completions` request; pass@1 is checked after a
//! configuration's generations are done, so test execution never competes with timing. Each
//! (layout, configuration) result is saved as soon as it is complete and reused by a rerun
//! over the same problems, so an interrupted benchmark resumes.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use approxy_training::corpus::{HumanEvalProblem, load_human_eval};
use futures::StreamExt;
use serde::{Deserialize, Serialize};

use super::client::{self, Ask, Generation};
use super::humaneval::{self, Sandbox, Verdict};
use super::levels::{self, Level};
use super::servers::{self, Layout, Server};
use super::stats::{mean, quantile};
use approxy_gateway::policy::raw::{RawBailout, RawDraft, RawGateway, RawModel, RawPolicy, RawPrice, RawTarget};
use approxy_gateway::policy::{ModelPolicy, Policy, Price};
use approxy_setup::Home;

/// Options for `approxy bench quality`.
#[derive(Debug, Clone)]
pub struct QualityOptions {
    /// Problems to run (0 = all 164), spread evenly over the set.
    pub problems: usize,
    /// Core layouts to run.
    pub layouts: Vec<Layout>,
    /// Only these configuration ids (empty = all).
    pub only: Vec<String>,
    /// Results directory (JSON, Markdown, PNG; raw per-configuration files under `raw/`).
    pub out: PathBuf,
    /// Output limit per problem.
    pub max_tokens: u32,
    /// Test execution limit per problem.
    pub exec_timeout: Duration,
    /// Generation limit per problem.
    pub request_timeout: Duration,
    /// Calibration naming the levels.
    pub calibration: PathBuf,
    /// Learned verifier artifact.
    pub learned: PathBuf,
    /// Policy whose `"*"` entry supplies bail-out, correction tokens and prices.
    pub base_policy: PathBuf,
    /// Ignore saved results.
    pub fresh: bool,
}

/// How a configuration is served.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Route {
    /// approxy, passthrough mode.
    Passthrough,
    /// approxy, approximate mode.
    Approximate,
    /// llama-server with `-md`, directly.
    LlamaSpeculative,
}

/// One configuration.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Config {
    /// Stable id (file names, `--only`).
    pub id: String,
    /// Table label.
    pub label: String,
    /// The letter: a..e.
    pub family: char,
    /// How it is served.
    pub route: Route,
    /// Verifier (`learned`, `confidence`) in approximate mode.
    pub verifier: Option<String>,
    /// Threshold in approximate mode.
    pub threshold: Option<f32>,
    /// What the calibration expects at that threshold: accept rate and false-accept rate.
    pub calibrated_accept_rate: Option<f32>,
    /// See `calibrated_accept_rate`.
    pub calibrated_false_accept_rate: Option<f32>,
}

impl Config {
    fn model(&self) -> &'static str {
        match (self.route, self.verifier.as_deref()) {
            (Route::Passthrough, _) => "bench-passthrough",
            (Route::Approximate, Some("learned")) => "bench-learned",
            (Route::Approximate, _) => "bench-confidence",
            (Route::LlamaSpeculative, _) => "target",
        }
    }

}

/// The configuration list for the resolved levels.
pub fn configs(levels: &[Level]) -> Vec<Config> {
    let mut v = vec![Config {
        id: "target-only".into(),
        label: "(a) target only (passthrough)".into(),
        family: 'a',
        route: Route::Passthrough,
        verifier: None,
        threshold: None,
        calibrated_accept_rate: None,
        calibrated_false_accept_rate: None,
    }];
    for (family, verifier) in [('b', "learned"), ('c', "confidence")] {
        for l in levels {
            let Some(o) = (if verifier == "learned" { l.learned } else { l.confidence }) else { continue };
            v.push(Config {
                id: format!("{verifier}-{}", l.name),
                label: format!("({family}) approxy {verifier}, {} (t={:.2})", l.name, o.threshold),
                family,
                route: Route::Approximate,
                verifier: Some(verifier.into()),
                threshold: Some(o.threshold),
                calibrated_accept_rate: Some(o.accept_rate),
                calibrated_false_accept_rate: Some(o.false_accept_rate),
            });
        }
    }
    v.push(Config {
        id: "draft-only".into(),
        label: "(d) draft only (t=0)".into(),
        family: 'd',
        route: Route::Approximate,
        verifier: Some("confidence".into()),
        threshold: Some(0.0),
        calibrated_accept_rate: Some(1.0),
        calibrated_false_accept_rate: None,
    });
    v.push(Config {
        id: "llama-speculative".into(),
        label: "(e) llama.cpp speculative (-md)".into(),
        family: 'e',
        route: Route::LlamaSpeculative,
        verifier: None,
        threshold: None,
        calibrated_accept_rate: None,
        calibrated_false_accept_rate: None,
    });
    v
}

/// One problem's outcome.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProblemRun {
    /// HumanEval task id.
    pub task_id: String,
    /// pass@1 check.
    pub verdict: Verdict,
    /// The timed generation.
    pub generation: Generation,
}

/// Aggregates of one (layout, configuration) run.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Summary {
    /// Problems run.
    pub problems: usize,
    /// Problems whose tests passed.
    pub passed: usize,
    /// passed / problems, in percent.
    pub pass_at_1: f64,
    /// Calls that failed (counted as not passed).
    pub errors: usize,
    /// Output tokens over all problems.
    pub output_tokens: u64,
    /// Output tokens per second of generation wall time (TTFT included).
    pub tokens_per_second: f64,
    /// Generation wall time over all problems, seconds (test runs and server starts excluded).
    #[serde(default)]
    pub generation_seconds: f64,
    /// Median time to first token, seconds.
    pub ttft_p50: f64,
    /// Mean time to first token, seconds.
    pub ttft_mean: f64,
    /// Target calls per 100 output tokens.
    pub target_calls_per_100: f64,
    /// Output tokens the target generated, per 100 output tokens.
    pub target_tokens_per_100: f64,
    /// Every token the target was sent or generated (re-sent prefixes included).
    pub target_processed_tokens: u64,
    /// Of the input sent to the target, the part a prompt cache could reuse.
    pub target_cacheable_input_tokens: u64,
    /// Answers the target finished after too many rejections.
    pub bailouts: usize,
    /// USD for the run, every input token at the input price.
    pub cost_usd: f64,
    /// USD for the run, re-sent input at the cached-input price.
    pub cost_usd_cached: f64,
    /// llama.cpp's speculative decoding: accepted / drafted.
    pub llama_draft_acceptance: Option<f64>,
}

/// A finished (layout, configuration) run, as saved under `raw/`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ConfigRun {
    /// Layout name.
    pub layout: String,
    /// The configuration.
    pub config: Config,
    /// Aggregates.
    pub summary: Summary,
    /// Per problem.
    pub problems: Vec<ProblemRun>,
}

/// Aggregates a run's problems at `price`.
pub fn summarize(route: Route, runs: &[ProblemRun], price: &Price) -> Summary {
    let n = runs.len();
    let gens: Vec<&Generation> = runs.iter().map(|r| &r.generation).collect();
    let passed = runs.iter().filter(|r| r.verdict == Verdict::Passed).count();
    let tokens: u64 = gens.iter().map(|g| g.completion_tokens).sum();
    let seconds: f64 = gens.iter().map(|g| g.seconds).sum();
    let ttfts: Vec<f64> = gens.iter().filter_map(|g| g.ttft).collect();
    let ok: Vec<&&Generation> = gens.iter().filter(|g| g.error.is_none()).collect();
    let per100 = |x: u64| if tokens == 0 { 0.0 } else { 100.0 * x as f64 / tokens as f64 };
    let m = 1e6;
    let mut s = Summary {
        problems: n,
        passed,
        pass_at_1: if n == 0 { 0.0 } else { 100.0 * passed as f64 / n as f64 },
        errors: n - ok.len(),
        output_tokens: tokens,
        tokens_per_second: if seconds > 0.0 { tokens as f64 / seconds } else { 0.0 },
        generation_seconds: seconds,
        ttft_p50: quantile(&ttfts, 0.5).unwrap_or(0.0),
        ttft_mean: mean(&ttfts).unwrap_or(0.0),
        ..Summary::default()
    };
    match route {
        Route::Passthrough | Route::LlamaSpeculative => {
            // The target reads the prompt once and produces every output token.
            let prompt: u64 = ok.iter().map(|g| g.prompt_tokens).sum();
            s.target_calls_per_100 = per100(ok.len() as u64);
            s.target_tokens_per_100 = per100(tokens);
            s.target_processed_tokens = prompt + tokens;
            s.cost_usd = (prompt as f64 * price.input + tokens as f64 * price.output) / m;
            s.cost_usd_cached = s.cost_usd;
            let drafted: u64 = gens.iter().filter_map(|g| g.draft_n).sum();
            let accepted: u64 = gens.iter().filter_map(|g| g.draft_n_accepted).sum();
            if route == Route::LlamaSpeculative && drafted > 0 {
                s.llama_draft_acceptance = Some(accepted as f64 / drafted as f64);
            }
        }
        Route::Approximate => {
            let a: Vec<_> = gens.iter().filter_map(|g| g.approxy.as_ref()).collect();
            let calls: u64 = a.iter().map(|u| u.target_calls).sum();
            let generated: u64 = a.iter().map(|u| u.target_tokens).sum();
            let input: u64 = a.iter().map(|u| u.target_input_tokens).sum();
            let cacheable: u64 = a.iter().map(|u| u.target_cacheable_input_tokens).sum();
            s.target_calls_per_100 = per100(calls);
            s.target_tokens_per_100 = per100(generated);
            s.target_processed_tokens = input + generated;
            s.target_cacheable_input_tokens = cacheable;
            s.bailouts = a.iter().filter(|u| u.bailed_out).count();
            s.cost_usd = (input as f64 * price.input + generated as f64 * price.output) / m;
            s.cost_usd_cached = ((input - cacheable.min(input)) as f64 * price.input + cacheable as f64 * price.cached_input + generated as f64 * price.output) / m;
        }
    }
    s
}

/// Everything `quality.json` holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct QualityReport {
    /// When the report was assembled (UTC).
    pub generated_at: String,
    /// CPU, cores, memory.
    pub machine: super::report::Machine,
    /// HumanEval problems per configuration.
    pub problems: usize,
    /// Of HumanEval's 164.
    pub problems_total: usize,
    /// Output limit.
    pub max_tokens: u32,
    /// Stop strings.
    pub stop: Vec<String>,
    /// How generated code was isolated.
    pub sandbox: Sandbox,
    /// Test timeout, seconds.
    pub exec_timeout_secs: f64,
    /// The calibrated levels.
    pub levels: Vec<Level>,
    /// Prices (USD per million tokens).
    pub price: PriceTable,
    /// Bail-out and correction settings used for approxy.
    pub approxy_settings: ApproxySettings,
    /// llama.cpp speculative settings.
    pub llama_speculative_args: Vec<String>,
    /// Summaries per layout and configuration (problem details stay in `raw/`).
    pub runs: Vec<RunSummary>,
}

/// The approximate-mode settings besides the threshold, from the base policy.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ApproxySettings {
    /// Target tokens taken after each rejection.
    pub correction_tokens: u32,
    /// Bail-out window (decisions).
    pub bailout_window: Option<usize>,
    /// Bail-out when more than this share of the window was rejected.
    pub bailout_max_rejection_rate: Option<f32>,
    /// The policy file they come from.
    pub from: PathBuf,
}

/// A price table.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PriceTable {
    /// Input.
    pub input: f64,
    /// Re-sent input with a prompt cache.
    pub cached_input: f64,
    /// Output.
    pub output: f64,
}

/// One row of `quality.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunSummary {
    /// Layout name.
    pub layout: String,
    /// Configuration.
    pub config: Config,
    /// Aggregates.
    pub summary: Summary,
}

fn bench_policy(target_url: &str, layout: Layout, learned: &Path, base: &ModelPolicy) -> anyhow::Result<String> {
    let approx = |verifier: String| RawModel {
        mode: "approximate".into(),
        verifier: Some(verifier),
        threshold: Some(0.7),
        correction_tokens: Some(base.correction_tokens),
        threshold_override: Some([0.0, 1.0]),
        bailout: base.bailout.map(|b| RawBailout { window: b.window, max_rejection_rate: b.max_rejection_rate }),
        price: Some(RawPrice { input: base.price.input, cached_input: base.price.cached_input, output: base.price.output }),
        ..RawModel::default()
    };
    let policy = RawPolicy {
        target: RawTarget {
            kind: "llama_cpp".into(),
            base_url: target_url.into(),
            timeout: Some("300s".into()),
            retries: Some(2),
            backoff: Some("200ms".into()),
            ..RawTarget::default()
        },
        gateway: RawGateway { max_concurrent_requests: Some(4), request_timeout: Some("900s".into()), ..RawGateway::default() },
        draft: RawDraft { workers: Some(1), threads_per_worker: Some(layout.draft_threads()), spin_wait: Some(false), ..RawDraft::default() },
        models: [
            ("bench-passthrough".to_string(), RawModel { mode: "passthrough".into(), ..RawModel::default() }),
            ("bench-learned".to_string(), approx(learned.display().to_string())),
            ("bench-confidence".to_string(), approx("confidence".into())),
        ]
        .into_iter()
        .collect(),
    };
    Ok(format!("# Written by `approxy bench quality`.\n{}", toml::to_string(&policy)?))
}

struct Ctx<'a> {
    http: reqwest::Client,
    problems: &'a [HumanEvalProblem],
    opts: &'a QualityOptions,
    sandbox: Sandbox,
    price: Price,
    scratch: PathBuf,
}

async fn run_config(ctx: &Ctx<'_>, url: &str, layout: Layout, c: &Config) -> anyhow::Result<ConfigRun> {
    let completions = format!("{url}/v1/completions");
    let mut gens = Vec::with_capacity(ctx.problems.len());
    for (i, p) in ctx.problems.iter().enumerate() {
        let ask = Ask {
            url: &completions,
            model: c.model(),
            prompt: &p.prompt,
            max_tokens: ctx.opts.max_tokens,
            stop: &humaneval::STOP,
            threshold: c.threshold,
            timeout: ctx.opts.request_timeout,
        };
        let g = client::complete(&ctx.http, &ask).await;
        if let Some(e) = &g.error {
            tracing::warn!(task = %p.task_id, config = %c.id, error = %e, "generation failed");
        }
        tracing::info!(layout = layout.name(), config = %c.id, done = i + 1, of = ctx.problems.len(), tokens = g.completion_tokens, secs = format!("{:.1}", g.seconds), "problem");
        gens.push(g);
    }
    // Tests run after all generations: they must not compete with the timed part.
    let verdicts: Vec<Verdict> = futures::stream::iter(ctx.problems.iter().zip(&gens).map(|(p, g)| async move {
        if g.error.is_some() {
            return Ok(Verdict::Failed);
        }
        humaneval::check(ctx.sandbox, p, &g.text, &ctx.scratch, ctx.opts.exec_timeout).await
    }))
    .buffered(2)
    .collect::<Vec<anyhow::Result<Verdict>>>()
    .await
    .into_iter()
    .collect::<anyhow::Result<_>>()?;
    let problems: Vec<ProblemRun> = ctx
        .problems
        .iter()
        .zip(gens)
        .zip(verdicts)
        .map(|((p, generation), verdict)| ProblemRun { task_id: p.task_id.clone(), verdict, generation })
        .collect();
    let summary = summarize(c.route, &problems, &ctx.price);
    tracing::info!(layout = layout.name(), config = %c.id, pass_at_1 = summary.pass_at_1, tok_s = format!("{:.2}", summary.tokens_per_second), "configuration done");
    Ok(ConfigRun { layout: layout.name().into(), config: c.clone(), summary, problems })
}

fn raw_path(out: &Path, layout: Layout, id: &str) -> PathBuf {
    out.join("raw").join(format!("{}-{id}.json", layout.name()))
}

/// A saved run, when it covers exactly `problems` (a rerun over another sample starts over).
fn load_saved(path: &Path, problems: &[HumanEvalProblem]) -> Option<ConfigRun> {
    let run: ConfigRun = serde_json::from_slice(&std::fs::read(path).ok()?).ok()?;
    let same = run.problems.len() == problems.len() && run.problems.iter().zip(problems).all(|(r, p)| r.task_id == p.task_id);
    same.then_some(run)
}

fn save(path: &Path, run: &ConfigRun) -> anyhow::Result<()> {
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d)?;
    }
    std::fs::write(path, serde_json::to_vec_pretty(run)?)?;
    Ok(())
}

/// One quick request per model so weights are paged in before anything is timed.
async fn warm_up(http: &reqwest::Client, url: &str, models: &[&str]) {
    for m in models {
        let ask = Ask { url: &format!("{url}/v1/completions"), model: m, prompt: "def add(a, b):\n", max_tokens: 8, stop: &[], threshold: None, timeout: Duration::from_secs(300) };
        let g = client::complete(http, &ask).await;
        if let Some(e) = g.error {
            tracing::warn!(model = m, error = %e, "warm-up failed");
        }
    }
}

/// Runs the benchmark and writes `quality.json`, `quality.md` and `quality.png` under `out`.
pub async fn run(opts: &QualityOptions) -> anyhow::Result<()> {
    let home = Home::from_env()?;
    let exe = std::env::current_exe()?;
    let all = load_human_eval(&home.human_eval()).context("HumanEval (run `approxy setup`)")?;
    let total = all.len();
    let problems = humaneval::sample(all, opts.problems);
    let levels = levels::resolve(&opts.calibration)?;
    let base = Policy::load(&opts.base_policy).map_err(|e| anyhow::anyhow!("{}: {}", e.path, e.problems.join("; ")))?;
    let base_model = base.models.get("*").ok_or_else(|| anyhow::anyhow!("{} has no \"*\" model entry", opts.base_policy.display()))?.clone();
    let learned = std::fs::canonicalize(&opts.learned).with_context(|| format!("{}", opts.learned.display()))?;
    let sandbox = Sandbox::detect().await;
    if matches!(sandbox, Sandbox::SubprocessOnly) {
        tracing::warn!("`unshare -rn` is refused here: generated code runs without network isolation (timeout only)");
    }
    let logs = home.log("bench").with_extension("d");
    let scratch = home.work("bench-exec");
    let ctx = Ctx { http: reqwest::Client::new(), problems: &problems, opts, sandbox, price: base_model.price, scratch };
    let all_configs = configs(&levels);
    let wanted: Vec<&Config> = all_configs.iter().filter(|c| opts.only.is_empty() || opts.only.contains(&c.id)).collect();
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);

    let mut runs: Vec<ConfigRun> = Vec::new();
    for &layout in &opts.layouts {
        if cores < layout.cores_needed() {
            tracing::warn!(layout = layout.name(), cores, "not enough cores for this layout; skipped");
            continue;
        }
        let mut done: HashMap<String, ConfigRun> = HashMap::new();
        let mut todo: Vec<&Config> = Vec::new();
        for c in &wanted {
            match (!opts.fresh).then(|| load_saved(&raw_path(&opts.out, layout, &c.id), &problems)).flatten() {
                Some(r) => {
                    done.insert(c.id.clone(), r);
                }
                None => todo.push(c),
            }
        }
        let via_gateway: Vec<&Config> = todo.iter().copied().filter(|c| c.route != Route::LlamaSpeculative).collect();
        if !via_gateway.is_empty() {
            let target = servers::start_llama(&home, layout, false, &logs).await?;
            let policy_path = home.work("bench").join(format!("policy-{}.toml", layout.name()));
            std::fs::create_dir_all(home.work("bench"))?;
            std::fs::write(&policy_path, bench_policy(&target.url, layout, &learned, &base_model)?)?;
            let gateway = servers::start_gateway(&exe, &policy_path, layout, &logs).await?;
            warm_up(&ctx.http, &gateway.url, &["bench-passthrough", "bench-confidence"]).await;
            for c in via_gateway {
                let run = run_config(&ctx, &gateway.url, layout, c).await?;
                save(&raw_path(&opts.out, layout, &c.id), &run)?;
                done.insert(c.id.clone(), run);
            }
            gateway.stop().await;
            target.stop().await;
        }
        if let Some(c) = todo.iter().find(|c| c.route == Route::LlamaSpeculative) {
            let spec: Server = servers::start_llama(&home, layout, true, &logs).await?;
            warm_up(&ctx.http, &spec.url, &["target"]).await;
            let run = run_config(&ctx, &spec.url, layout, c).await?;
            save(&raw_path(&opts.out, layout, &c.id), &run)?;
            done.insert(c.id.clone(), run);
            spec.stop().await;
        }
        for c in &wanted {
            if let Some(r) = done.remove(&c.id) {
                runs.push(r);
            }
        }
    }

    let report = QualityReport {
        generated_at: super::report::utc_now(),
        machine: super::report::Machine::read(),
        problems: problems.len(),
        problems_total: total,
        max_tokens: opts.max_tokens,
        stop: humaneval::STOP.iter().map(|s| s.to_string()).collect(),
        sandbox,
        exec_timeout_secs: opts.exec_timeout.as_secs_f64(),
        levels,
        price: PriceTable { input: ctx.price.input, cached_input: ctx.price.cached_input, output: ctx.price.output },
        approxy_settings: ApproxySettings {
            correction_tokens: base_model.correction_tokens,
            bailout_window: base_model.bailout.as_ref().map(|b| b.window),
            bailout_max_rejection_rate: base_model.bailout.as_ref().map(|b| b.max_rejection_rate),
            from: opts.base_policy.clone(),
        },
        llama_speculative_args: servers::LLAMA_SPEC_ARGS.iter().map(|s| s.to_string()).collect(),
        // Summaries are derived data: recomputed from the saved per-problem records.
        runs: runs.into_iter().map(|r| RunSummary { summary: summarize(r.config.route, &r.problems, &ctx.price), layout: r.layout, config: r.config }).collect(),
    };
    std::fs::create_dir_all(&opts.out)?;
    std::fs::write(opts.out.join("quality.json"), serde_json::to_vec_pretty(&report)?)?;
    std::fs::write(opts.out.join("quality.md"), super::report::quality_markdown(&report))?;
    if let Err(e) = super::chart::pareto(&opts.out.join("quality.png"), &report) {
        tracing::warn!(error = %e, "chart not drawn");
    }
    println!("{}", opts.out.join("quality.md").display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::ApproxyUsage;

    fn run(tokens: u64, prompt: u64, verdict: Verdict, a: Option<ApproxyUsage>) -> ProblemRun {
        ProblemRun {
            task_id: "t".into(),
            verdict,
            generation: Generation { completion_tokens: tokens, prompt_tokens: prompt, seconds: 2.0, ttft: Some(0.5), approxy: a, ..Generation::default() },
        }
    }

    #[test]
    fn summaries_count_target_work_and_cost() {
        let price = Price { input: 1.0, cached_input: 0.1, output: 2.0 };
        let pt = summarize(Route::Passthrough, &[run(10, 100, Verdict::Passed, None), run(30, 50, Verdict::Failed, None)], &price);
        assert_eq!(pt.pass_at_1, 50.0);
        assert_eq!(pt.output_tokens, 40);
        assert_eq!(pt.tokens_per_second, 10.0);
        assert_eq!(pt.generation_seconds, 4.0);
        assert_eq!(pt.target_tokens_per_100, 100.0);
        assert_eq!(pt.target_calls_per_100, 5.0);
        assert_eq!(pt.target_processed_tokens, 190);
        assert!((pt.cost_usd - (150.0 + 80.0) / 1e6).abs() < 1e-12);

        let a = ApproxyUsage { draft_tokens: 15, target_tokens: 5, target_calls: 5, target_input_tokens: 600, target_cacheable_input_tokens: 500, bailed_out: true };
        let ap = summarize(Route::Approximate, &[run(20, 100, Verdict::Passed, Some(a))], &price);
        assert_eq!(ap.target_tokens_per_100, 25.0);
        assert_eq!(ap.target_calls_per_100, 25.0);
        assert_eq!(ap.target_processed_tokens, 605);
        assert_eq!(ap.bailouts, 1);
        assert!((ap.cost_usd - (600.0 + 10.0) / 1e6).abs() < 1e-12);
        assert!((ap.cost_usd_cached - (100.0 + 50.0 + 10.0) / 1e6).abs() < 1e-12);
    }

    #[test]
    fn every_family_is_configured_and_unreachable_levels_are_not() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../policies/verifier/calibration.json");
        let levels = levels::resolve(&path).unwrap_or_else(|e| panic!("{e}"));
        let cs = configs(&levels);
        let mut families: Vec<char> = cs.iter().map(|c| c.family).collect();
        families.dedup();
        assert_eq!(families, vec!['a', 'b', 'c', 'd', 'e']);
        let reachable = levels.iter().filter(|l| l.learned.is_some()).count();
        assert_eq!(cs.len(), 3 + 2 * reachable);
        assert!(cs.iter().all(|c| c.threshold.is_none_or(|t| t < 1.0)));
        let ids: std::collections::HashSet<&str> = cs.iter().map(|c| c.id.as_str()).collect();
        assert_eq!(ids.len(), cs.len(), "ids name result files, so they are unique");
    }
}
