//! Running the configurations, per core layout: through the gateway or llama-server directly,
//! each result saved as soon as it is complete and reused by a rerun.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use approxy_gateway::policy::{ModelPolicy, Policy, Price};
use approxy_setup::Home;
use approxy_training::corpus::{HumanEvalProblem, load_human_eval};
use futures::StreamExt;

use super::markdown::quality_markdown;
use super::options::QualityOptions;
use super::policy::{bench_policy, correction_words, token_prices};
use super::results::{ApproxySettings, PriceTable, QualityReport};
use crate::client::{self, Ask};
use crate::configs::{Config, Route, configs};
use crate::humaneval::{self, Sandbox, Verdict};
use crate::levels::{self, Level};
use crate::servers::{self, Layout, Server};
use crate::summary::{ConfigRun, ProblemRun, RunSummary, summarize};

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
        generated_at: crate::machine::utc_now(),
        machine: crate::machine::Machine::read(),
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
    if let Err(e) = crate::chart::pareto(
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
