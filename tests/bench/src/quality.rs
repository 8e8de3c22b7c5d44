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
use clap::builder::TypedValueParser as _;
use futures::StreamExt;
use serde::{Deserialize, Serialize};

use super::client::{self, Ask};
use super::humaneval::{self, Sandbox, Verdict};
use super::levels::{self, Level};
use super::servers::{self, Layout, Server};
use super::summary::per_1k;
use approxy_gateway::policy::raw::{
    RawBailout, RawCorrection, RawDraft, RawGateway, RawModel, RawPerKind, RawPolicy, RawPricing,
    RawTarget,
};
use approxy_gateway::policy::{ModelPolicy, Policy, Price, Pricing};
use approxy_setup::Home;
use approxy_verifier::{Correction, SpanAsk, SpanClose};

pub use super::configs::{Config, Route, configs};
pub use super::summary::{ConfigRun, ProblemRun, RunSummary, Summary, summarize};

/// Options for `approxy bench quality`.
#[derive(Debug, Clone, clap::Args)]
pub struct QualityOptions {
    /// Problems per configuration, spread evenly over HumanEval (0 = all 164).
    #[arg(long, default_value_t = 0)]
    pub problems: usize,
    /// Only the 41 problems importance training never sees (every fourth; `--problems`
    /// then spreads over those).
    #[arg(long)]
    pub held_out: bool,
    /// Core layouts, comma-separated: shared, pinned.
    #[arg(
        long,
        value_enum,
        default_value = "shared,pinned",
        value_delimiter = ','
    )]
    pub layouts: Vec<Layout>,
    /// Only these configuration ids, comma-separated (default: all).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// Results directory.
    // JSON, Markdown, PNG; raw per-configuration files under `raw/`.
    #[arg(long, default_value = "tests/bench/results")]
    pub out: PathBuf,
    /// Output limit per problem.
    #[arg(long, default_value_t = 384)]
    pub max_tokens: u32,
    /// Seconds a problem's tests may run.
    #[arg(long, default_value = "10", value_parser = clap::value_parser!(u64).map(Duration::from_secs))]
    pub exec_timeout: Duration,
    /// Generation limit per problem.
    #[arg(skip = Duration::from_secs(900))]
    pub request_timeout: Duration,
    /// Calibration that names the levels.
    #[arg(long, default_value = "policies/verifier/calibration.json")]
    pub calibration: PathBuf,
    /// Learned verifier artifact.
    #[arg(long, default_value = "policies/verifier/default.json")]
    pub learned: PathBuf,
    /// Policy whose "*" entry gives bail-out, correction tokens and prices.
    #[arg(long, default_value = "policies/default.toml")]
    pub base_policy: PathBuf,
    /// Ignore results saved by an earlier, interrupted run.
    #[arg(long)]
    pub fresh: bool,
}

/// Everything `quality.json` holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct QualityReport {
    /// When the report was assembled (UTC).
    pub generated_at: String,
    /// CPU, cores, memory.
    pub machine: super::machine::Machine,
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
    /// What a rejection asks the target for, in words ("1 target token", "a streamed span
    /// of up to 32 tokens, ended after 3 the draft predicts").
    #[serde(default)]
    pub correction: String,
    /// Target tokens taken after each rejection (results written before spans existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub correction_tokens: Option<u32>,
    /// The cost guard's ratio (results written before the guard existed have none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cost_ratio: Option<f64>,
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

/// A correction as a policy file writes it.
pub(crate) fn raw_correction(c: Correction) -> RawCorrection {
    match c {
        Correction::Fixed { tokens } => RawCorrection {
            mode: "fixed".into(),
            tokens: Some(tokens),
            ..RawCorrection::default()
        },
        Correction::Span {
            max_span,
            resync,
            end,
            ask,
        } => RawCorrection {
            mode: "span".into(),
            max_span: Some(max_span),
            resync: Some(resync),
            end: Some(
                match end {
                    SpanClose::Expected => "expected",
                    SpanClose::Resync => "resync",
                }
                .into(),
            ),
            ask: Some(
                match ask {
                    SpanAsk::Fewest => "fewest",
                    SpanAsk::All => "all",
                }
                .into(),
            ),
            ..RawCorrection::default()
        },
    }
}

/// The correction in words, for the report.
pub fn correction_words(c: Correction) -> String {
    match c {
        Correction::Fixed { tokens: 1 } => "1 target token per rejection".into(),
        Correction::Fixed { tokens } => format!("{tokens} target tokens per rejection"),
        Correction::Span {
            max_span,
            resync,
            end,
            ask,
        } => {
            let mut words = format!(
                "a streamed span of up to {max_span} target tokens per rejection, ended once the draft predicts {resync} in a row"
            );
            if end == SpanClose::Expected {
                words += " if the cost guard would make the next call";
            }
            if ask == SpanAsk::Fewest {
                words += ", each call asking for the fewest tokens that could end it";
            }
            words
        }
    }
}

/// The benchmark bills tokens at a price list: the policy's, or DeepSeek's (the first hosted
/// class of `approxy bench calls`) for a policy priced by the target's time, whose time this
/// benchmark does not measure (`approxy bench calls` does).
fn token_prices(p: &Pricing) -> Price {
    match p {
        Pricing::Tokens(t) => *t,
        Pricing::Busy(_) => {
            let d = &super::prices::CLASSES[1];
            Price {
                input: d.input,
                cached_input: d.cached_input,
                output: d.output,
            }
        }
    }
}

fn bench_policy(
    target_url: &str,
    layout: Layout,
    learned: &Path,
    base: &ModelPolicy,
) -> anyhow::Result<String> {
    let approx = |verifier: String| RawModel {
        mode: "approximate".into(),
        verifier: Some(verifier),
        threshold: Some(RawPerKind::All(0.7)),
        correction: Some(raw_correction(base.correction)),
        max_cost_ratio: Some(base.max_cost_ratio),
        threshold_override: Some([0.0, 1.0]),
        bailout: base.bailout.map(|b| RawBailout {
            window: b.window,
            max_rejection_rate: b.max_rejection_rate,
        }),
        price: Some(RawPricing::from(&base.price)),
        ..RawModel::default()
    };
    let policy = RawPolicy {
        passthrough: None,
        target: RawTarget {
            kind: "llama_cpp".into(),
            base_url: target_url.into(),
            // The shipped learned verifier's pair: the benchmark's target is that model.
            model: Some(approxy_verifier::verify::learned::DEFAULT_CALIBRATION_TARGET.into()),
            timeout: Some("300s".into()),
            retries: Some(2),
            backoff: Some("200ms".into()),
            ..RawTarget::default()
        },
        gateway: RawGateway {
            auth: Some("none".into()),
            max_concurrent_requests: Some(4),
            request_timeout: Some("900s".into()),
            ..RawGateway::default()
        },
        draft: RawDraft {
            workers: Some(1),
            threads_per_worker: Some(layout.draft_threads()),
            spin_wait: Some(false),
            ..RawDraft::default()
        },
        models: [
            (
                "bench-passthrough".to_string(),
                RawModel {
                    mode: "passthrough".into(),
                    ..RawModel::default()
                },
            ),
            (
                "bench-learned".to_string(),
                approx(learned.display().to_string()),
            ),
            ("bench-confidence".to_string(), approx("confidence".into())),
        ]
        .into_iter()
        .collect(),
    };
    Ok(format!(
        "# Written by `approxy bench quality`.\n{}",
        toml::to_string(&policy)?
    ))
}

struct Ctx<'a> {
    http: reqwest::Client,
    problems: &'a [HumanEvalProblem],
    opts: &'a QualityOptions,
    sandbox: Sandbox,
    price: Price,
    scratch: PathBuf,
}

async fn run_config(
    ctx: &Ctx<'_>,
    url: &str,
    layout: Layout,
    c: &Config,
) -> anyhow::Result<ConfigRun> {
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
    let verdicts: Vec<Verdict> =
        futures::stream::iter(ctx.problems.iter().zip(&gens).map(|(p, g)| async move {
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
        .map(|((p, generation), verdict)| ProblemRun {
            task_id: p.task_id.clone(),
            verdict,
            generation,
        })
        .collect();
    let summary = summarize(c.route, &problems, &ctx.price);
    tracing::info!(layout = layout.name(), config = %c.id, pass_at_1 = summary.pass_at_1, tok_s = format!("{:.2}", summary.tokens_per_second), "configuration done");
    Ok(ConfigRun {
        layout: layout.name().into(),
        config: c.clone(),
        summary,
        problems,
    })
}

fn raw_path(out: &Path, layout: Layout, id: &str) -> PathBuf {
    out.join("raw").join(format!("{}-{id}.json", layout.name()))
}

/// A saved run, when it covers exactly `problems` (a rerun over another sample starts over).
fn load_saved(path: &Path, problems: &[HumanEvalProblem]) -> Option<ConfigRun> {
    let run: ConfigRun = serde_json::from_slice(&std::fs::read(path).ok()?).ok()?;
    let same = run.problems.len() == problems.len()
        && run
            .problems
            .iter()
            .zip(problems)
            .all(|(r, p)| r.task_id == p.task_id);
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
        let ask = Ask {
            url: &format!("{url}/v1/completions"),
            model: m,
            prompt: "def add(a, b):\n",
            max_tokens: 8,
            stop: &[],
            threshold: None,
            timeout: Duration::from_secs(300),
        };
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
    let all = if opts.held_out {
        humaneval::split_held_out(all).1
    } else {
        all
    };
    let total = all.len();
    let problems = humaneval::sample(all, opts.problems);
    let levels = levels::resolve(&opts.calibration)?;
    let base = Policy::load(&opts.base_policy)
        .map_err(|e| anyhow::anyhow!("{}: {}", e.path, e.problems.join("; ")))?;
    let base_model = base
        .models
        .get("*")
        .ok_or_else(|| anyhow::anyhow!("{} has no \"*\" model entry", opts.base_policy.display()))?
        .clone();
    let learned = std::fs::canonicalize(&opts.learned)
        .with_context(|| format!("{}", opts.learned.display()))?;
    let sandbox = Sandbox::detect().await;
    if matches!(sandbox, Sandbox::SubprocessOnly) {
        tracing::warn!(
            "`unshare -rn` is refused here: generated code runs without network isolation (timeout only)"
        );
    }
    let logs = home.log("bench").with_extension("d");
    let scratch = home.work("bench-exec");
    // Idle connections are dropped before the servers' own 5 s keep-alive closes them: a request
    // sent on a connection the server has just closed fails with nothing sent back, which
    // would count as the configuration's failure.
    let http = reqwest::Client::builder()
        .pool_idle_timeout(approxy_verifier::targets::POOL_IDLE_TIMEOUT)
        .build()?;
    let ctx = Ctx {
        http,
        problems: &problems,
        opts,
        sandbox,
        price: token_prices(&base_model.price),
        scratch,
    };
    let setup = Setup {
        home: &home,
        exe: &exe,
        logs: &logs,
        learned: &learned,
        base_model: &base_model,
    };
    let all_configs = configs(&levels);
    let wanted: Vec<&Config> = all_configs
        .iter()
        .filter(|c| opts.only.is_empty() || opts.only.contains(&c.id))
        .collect();
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);

    let mut runs: Vec<ConfigRun> = Vec::new();
    for &layout in &opts.layouts {
        if cores < layout.cores_needed() {
            tracing::warn!(
                layout = layout.name(),
                cores,
                "not enough cores for this layout; skipped"
            );
            continue;
        }
        runs.extend(run_layout(&ctx, &setup, layout, &wanted).await?);
    }

    let report = quality_report(&ctx, total, levels, &base_model, runs);
    write_outputs(opts, &report)
}

/// What every layout's servers are started from.
struct Setup<'a> {
    home: &'a Home,
    /// This binary, for `approxy serve`.
    exe: &'a Path,
    logs: &'a Path,
    /// The learned verifier the approximate configurations use.
    learned: &'a Path,
    /// The base policy's `"*"` model entry.
    base_model: &'a ModelPolicy,
}

/// Runs (or reuses the saved runs of) every wanted configuration on one layout; the runs in
/// the order wanted.
async fn run_layout(
    ctx: &Ctx<'_>,
    setup: &Setup<'_>,
    layout: Layout,
    wanted: &[&Config],
) -> anyhow::Result<Vec<ConfigRun>> {
    let opts = ctx.opts;
    let mut done: HashMap<String, ConfigRun> = HashMap::new();
    let mut todo: Vec<&Config> = Vec::new();
    for c in wanted {
        match (!opts.fresh)
            .then(|| load_saved(&raw_path(&opts.out, layout, &c.id), ctx.problems))
            .flatten()
        {
            Some(r) => {
                done.insert(c.id.clone(), r);
            }
            None => todo.push(c),
        }
    }
    let via_gateway: Vec<&Config> = todo
        .iter()
        .copied()
        .filter(|c| c.route != Route::LlamaSpeculative)
        .collect();
    if !via_gateway.is_empty() {
        run_via_gateway(ctx, setup, layout, &via_gateway, &mut done).await?;
    }
    if let Some(c) = todo.iter().find(|c| c.route == Route::LlamaSpeculative) {
        let spec: Server = servers::start_llama(setup.home, layout, true, setup.logs).await?;
        warm_up(&ctx.http, &spec.url, &["target"]).await;
        let run = run_config(ctx, &spec.url, layout, c).await?;
        save(&raw_path(&opts.out, layout, &c.id), &run)?;
        done.insert(c.id.clone(), run);
        spec.stop().await;
    }
    Ok(wanted.iter().filter_map(|c| done.remove(&c.id)).collect())
}

/// Runs `configs` through one gateway (over its own target) on `layout`, saving each run as
/// soon as it is complete.
async fn run_via_gateway(
    ctx: &Ctx<'_>,
    setup: &Setup<'_>,
    layout: Layout,
    configs: &[&Config],
    done: &mut HashMap<String, ConfigRun>,
) -> anyhow::Result<()> {
    let home = setup.home;
    let target = servers::start_llama(home, layout, false, setup.logs).await?;
    let policy_path = home
        .work("bench")
        .join(format!("policy-{}.toml", layout.name()));
    std::fs::create_dir_all(home.work("bench"))?;
    std::fs::write(
        &policy_path,
        bench_policy(&target.url, layout, setup.learned, setup.base_model)?,
    )?;
    let gateway = servers::start_gateway(setup.exe, &policy_path, layout, setup.logs).await?;
    warm_up(
        &ctx.http,
        &gateway.url,
        &["bench-passthrough", "bench-confidence"],
    )
    .await;
    for &c in configs {
        let run = run_config(ctx, &gateway.url, layout, c).await?;
        save(&raw_path(&ctx.opts.out, layout, &c.id), &run)?;
        done.insert(c.id.clone(), run);
    }
    gateway.stop().await;
    target.stop().await;
    Ok(())
}

/// The report over `runs`: what was asked, the settings compared, and each run's summary.
fn quality_report(
    ctx: &Ctx<'_>,
    problems_total: usize,
    levels: Vec<Level>,
    base_model: &ModelPolicy,
    runs: Vec<ConfigRun>,
) -> QualityReport {
    let opts = ctx.opts;
    QualityReport {
        generated_at: super::machine::utc_now(),
        machine: super::machine::Machine::read(),
        problems: ctx.problems.len(),
        problems_total,
        max_tokens: opts.max_tokens,
        stop: humaneval::STOP.iter().map(|s| s.to_string()).collect(),
        sandbox: ctx.sandbox,
        exec_timeout_secs: opts.exec_timeout.as_secs_f64(),
        levels,
        price: PriceTable {
            input: ctx.price.input,
            cached_input: ctx.price.cached_input,
            output: ctx.price.output,
        },
        approxy_settings: ApproxySettings {
            correction: correction_words(base_model.correction),
            correction_tokens: None,
            max_cost_ratio: Some(base_model.max_cost_ratio),
            bailout_window: base_model.bailout.as_ref().map(|b| b.window),
            bailout_max_rejection_rate: base_model.bailout.as_ref().map(|b| b.max_rejection_rate),
            from: opts.base_policy.clone(),
        },
        llama_speculative_args: servers::LLAMA_SPEC_ARGS
            .iter()
            .map(|s| s.to_string())
            .collect(),
        // Summaries are derived data: recomputed from the saved per-problem records.
        runs: runs
            .into_iter()
            .map(|r| RunSummary {
                summary: summarize(r.config.route, &r.problems, &ctx.price),
                layout: r.layout,
                config: r.config,
            })
            .collect(),
    }
}

/// Writes `quality.json`, `quality.md` and `quality.png` under `opts.out` (a chart that cannot
/// be drawn is only warned about) and prints the Markdown's path.
fn write_outputs(opts: &QualityOptions, report: &QualityReport) -> anyhow::Result<()> {
    std::fs::create_dir_all(&opts.out)?;
    std::fs::write(
        opts.out.join("quality.json"),
        serde_json::to_vec_pretty(report)?,
    )?;
    std::fs::write(opts.out.join("quality.md"), quality_markdown(report))?;
    if let Err(e) = super::chart::pareto(
        &opts.out.join("quality.png"),
        report.problems,
        report.problems_total,
        &report.runs,
    ) {
        tracing::warn!(error = %e, "chart not drawn");
    }
    println!("{}", opts.out.join("quality.md").display());
    Ok(())
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bench_policy_is_a_valid_policy_with_the_base_settings() -> anyhow::Result<()> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../policies");
        let base = Policy::load(&root.join("default.toml"))?;
        let base_model = base
            .model("*")
            .cloned()
            .ok_or_else(|| anyhow::anyhow!("no \"*\" entry"))?;
        let learned = root.join("verifier/default.json");
        let text = bench_policy("http://127.0.0.1:9", Layout::Pinned, &learned, &base_model)?;
        let p = Policy::parse(&text, &root.join("bench.toml"))?;
        let m = p
            .model("bench-learned")
            .ok_or_else(|| anyhow::anyhow!("no bench-learned"))?;
        assert_eq!(
            (m.correction, m.bailout, m.price),
            (base_model.correction, base_model.bailout, base_model.price)
        );
        assert_eq!(m.max_cost_ratio, base_model.max_cost_ratio);
        assert_eq!(p.draft.threads_per_worker, Layout::Pinned.draft_threads());
        assert!(
            p.model("bench-passthrough")
                .is_some_and(|m| m.mode == approxy_gateway::policy::Mode::Passthrough)
        );
        Ok(())
    }
}
