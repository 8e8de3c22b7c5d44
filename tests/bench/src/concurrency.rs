//! `approxy bench concurrency`: how many users one target serves through approxy.
//! C concurrent clients share a sample's prompts (each takes the next one free) against one
//! llama-server with 16 slots, through approxy's shipped policy and through approxy in
//! passthrough, in each core layout. Per run: answers a minute, tokens a second overall, each
//! answer's tokens a second (p50, p10), time to first token (p50, p99), the share passed
//! through because the draft was saturated, the target's counted time per answer, the
//! gateway's resident memory, and quality (pass@1, or the instruction checks). Every run is
//! saved as it ends (`raw/`) and skipped when found again, so a long sweep resumes.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::{Deserialize, Serialize};

use approxy_gateway::policy::Policy;
use approxy_setup::Home;

use super::calls::{self, CallConfig, CallsOptions, Sample, Task};
use super::client::{self, Ask, Generation};
use super::humaneval::{self, Sandbox, Verdict};
use super::instructions::{InstructionScores, score_run};
use super::servers::{self, Layout};
use super::stats::quantile;
use super::target_account::{self, TargetAccount};

/// Slots the target serves at once in every run (`-np`): the most clients asked.
const SLOTS: usize = 16;

/// Options for `approxy bench concurrency`.
#[derive(Debug, Clone, clap::Args)]
pub struct ConcurrencyOptions {
    /// `humaneval` (pass@1) or `instructions` (chat prompts with code-checked instructions).
    #[arg(long, value_enum, default_value = "humaneval")]
    pub sample: Sample,
    /// Prompts per run.
    #[arg(long, default_value_t = 16)]
    pub prompts: usize,
    /// Concurrent clients, comma-separated.
    #[arg(long, default_value = "1,2,4,8,16", value_delimiter = ',')]
    pub clients: Vec<usize>,
    /// Core layouts, comma-separated: pinned, shared.
    #[arg(long, value_enum, default_value = "pinned", value_delimiter = ',')]
    pub layouts: Vec<Layout>,
    /// Output limit per prompt.
    #[arg(long, default_value_t = 256)]
    pub max_tokens: u32,
    /// Results directory.
    #[arg(long, default_value = "tests/bench/results/concurrency")]
    pub out: PathBuf,
    /// Policy whose "*" model is approxy's configuration.
    #[arg(long, default_value = "policies/default.toml")]
    pub base_policy: PathBuf,
    /// Ignore saved runs.
    #[arg(long)]
    pub fresh: bool,
}

/// One run: a mode at a client count in a layout.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ConcurrencyRun {
    /// Which prompts.
    pub sample: Sample,
    /// Layout name.
    pub layout: String,
    /// `approxy` (the shipped policy) or `passthrough`.
    pub mode: String,
    /// Concurrent clients.
    pub clients: usize,
    /// Output limit.
    pub max_tokens: u32,
    /// First request to last answer.
    pub wall_seconds: f64,
    /// Per prompt, in the sample's order.
    pub answers: Vec<Answer>,
    /// What the target counted during the run.
    pub target_account: Option<TargetAccount>,
    /// CPU seconds the target's process used during the run: its busy time, where its slots'
    /// seconds overlap (absent in runs saved before 2026-11-29 21:00 UTC).
    #[serde(default)]
    pub target_cpu_seconds: Option<f64>,
    /// The same for the gateway's process (the draft, the verifier and the proxy).
    #[serde(default)]
    pub gateway_cpu_seconds: Option<f64>,
    /// The gateway's resident memory at the end, and its peak, MiB.
    pub gateway_rss_mib: f64,
    /// Peak resident memory of the gateway, MiB.
    pub gateway_peak_mib: f64,
    /// The instruction checks, for that sample.
    pub instructions: Option<InstructionScores>,
    /// When it finished (UTC) and where.
    pub finished_at: String,
    /// The machine.
    pub machine: String,
}

/// One answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Answer {
    /// Prompt id.
    pub id: String,
    /// HumanEval only.
    pub verdict: Option<Verdict>,
    /// The timed generation.
    pub generation: Generation,
}

/// The figures of a run.
#[derive(Debug, Clone, Serialize)]
pub struct Figures {
    /// Answers a minute, first request to last answer.
    pub answers_per_minute: f64,
    /// Output tokens a second over all answers.
    pub tokens_per_second: f64,
    /// Each answer's output tokens over its time: the median.
    pub stream_tokens_per_second_p50: f64,
    /// The same, tenth percentile (the slow answers).
    pub stream_tokens_per_second_p10: f64,
    /// Time to the first text, median, seconds.
    pub ttft_p50: f64,
    /// The same, 99th percentile.
    pub ttft_p99: f64,
    /// Share of answers passed through because no draft stream was free.
    pub saturated_share: f64,
    /// The target's counted prompt and generation seconds, per answer (its slots' time summed).
    pub target_seconds_per_answer: Option<f64>,
    /// The target's CPU seconds over the run's wall seconds: the cores it kept busy (at most 1
    /// pinned).
    pub target_cores_busy: Option<f64>,
    /// The same for the gateway.
    pub gateway_cores_busy: Option<f64>,
    /// HumanEval answers that passed.
    pub passed: Option<usize>,
    /// Requests that failed.
    pub failed_requests: usize,
}

impl ConcurrencyRun {
    /// Its figures.
    pub fn figures(&self) -> Figures {
        let n = self.answers.len().max(1) as f64;
        let gens = || self.answers.iter().map(|a| &a.generation);
        let tokens: u64 = gens().map(|g| g.completion_tokens).sum();
        let rates: Vec<f64> = gens()
            .filter(|g| g.seconds > 0.0)
            .map(|g| g.completion_tokens as f64 / g.seconds)
            .collect();
        let ttfts: Vec<f64> = gens().filter_map(|g| g.ttft).collect();
        let saturated = gens()
            .filter(|g| g.passthrough_reason.as_deref() == Some("draft_saturated"))
            .count();
        Figures {
            answers_per_minute: n * 60.0 / self.wall_seconds.max(1e-9),
            tokens_per_second: tokens as f64 / self.wall_seconds.max(1e-9),
            stream_tokens_per_second_p50: quantile(&rates, 0.5).unwrap_or(0.0),
            stream_tokens_per_second_p10: quantile(&rates, 0.1).unwrap_or(0.0),
            ttft_p50: quantile(&ttfts, 0.5).unwrap_or(0.0),
            ttft_p99: quantile(&ttfts, 0.99).unwrap_or(0.0),
            saturated_share: saturated as f64 / n,
            target_seconds_per_answer: self
                .target_account
                .as_ref()
                .map(|a| (a.prompt_seconds + a.predicted_seconds) / n),
            target_cores_busy: self
                .target_cpu_seconds
                .map(|s| s / self.wall_seconds.max(1e-9)),
            gateway_cores_busy: self
                .gateway_cpu_seconds
                .map(|s| s / self.wall_seconds.max(1e-9)),
            passed: (self.sample == Sample::HumanEval).then(|| {
                self.answers
                    .iter()
                    .filter(|a| a.verdict == Some(Verdict::Passed))
                    .count()
            }),
            failed_requests: gens().filter(|g| g.error.is_some()).count(),
        }
    }
}

fn raw_path(out: &Path, sample: Sample, layout: Layout, mode: &str, clients: usize) -> PathBuf {
    out.join("raw").join(format!(
        "{}-{}-{mode}-c{clients}.json",
        sample.name(),
        layout.name()
    ))
}

/// The mode's configuration and the model its requests name.
fn config(mode: &str) -> CallConfig {
    if mode == "passthrough" {
        CallConfig::TargetOnly
    } else {
        CallConfig::Default
    }
}

struct Ctx<'a> {
    home: &'a Home,
    http: reqwest::Client,
    opts: &'a ConcurrencyOptions,
    tasks: &'a [Task],
    sandbox: Sandbox,
    scratch: PathBuf,
    instructions_dir: PathBuf,
}

/// `clients` clients taking the prompts in order, each the next one free; the run.
async fn run_one(
    ctx: &Ctx<'_>,
    gateway: &servers::Server,
    target: &servers::Server,
    layout: Layout,
    mode: &str,
    clients: usize,
) -> anyhow::Result<ConcurrencyRun> {
    let url = format!("{}/v1/completions", gateway.url);
    let stop: &[&str] = match ctx.opts.sample {
        Sample::HumanEval => &humaneval::STOP,
        _ => &[],
    };
    let target_url = target.url.as_str();
    let before = target_account::read(&ctx.http, target_url, Duration::from_secs(10)).await?;
    let pids = (
        target.pid().context("the target has no pid")?,
        gateway.pid().context("the gateway has no pid")?,
    );
    let cpu_before = (servers::cpu_seconds(pids.0), servers::cpu_seconds(pids.1));
    let started = Instant::now();
    let model = calls::model_name(config(mode));
    let results = generate(ctx, &url, model, stop, clients).await;
    let wall_seconds = started.elapsed().as_secs_f64();
    // Read at once: the target's counters below may wait for cancelled streams to settle.
    let spent = |pid: u32, before: Option<f64>| Some(servers::cpu_seconds(pid)? - before?);
    let (target_cpu_seconds, gateway_cpu_seconds) =
        (spent(pids.0, cpu_before.0), spent(pids.1, cpu_before.1));
    let after = target_account::read(&ctx.http, target_url, Duration::from_secs(10)).await?;
    let pid = pids.1;
    let mib = |b: Option<u64>| b.unwrap_or(0) as f64 / (1 << 20) as f64;
    let (rss, peak) = (
        mib(servers::rss_bytes(pid)),
        mib(servers::peak_rss_bytes(pid)),
    );
    // Tests run after the timed part, so they never compete with it.
    let answers = checked_answers(ctx, results, mode, clients).await?;
    let instructions = instruction_scores(ctx, mode, &answers).await?;
    Ok(ConcurrencyRun {
        sample: ctx.opts.sample,
        layout: layout.name().into(),
        mode: mode.into(),
        clients,
        max_tokens: ctx.opts.max_tokens,
        wall_seconds,
        answers,
        target_account: Some(after.since(&before)),
        target_cpu_seconds,
        gateway_cpu_seconds,
        gateway_rss_mib: rss,
        gateway_peak_mib: peak,
        instructions,
        finished_at: super::machine::utc_now(),
        machine: super::machine::Machine::read().line(),
    })
}

/// Every task generated by `clients` clients at once, each taking the next task when it is
/// done with one; each client's generations with their task's index.
async fn generate(
    ctx: &Ctx<'_>,
    url: &str,
    model: &str,
    stop: &[&str],
    clients: usize,
) -> Vec<Vec<(usize, Generation)>> {
    let next = Arc::new(AtomicUsize::new(0));
    futures::future::join_all((0..clients).map(|_| {
        let next = Arc::clone(&next);
        let http = ctx.http.clone();
        async move {
            let mut mine = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                let Some(t) = ctx.tasks.get(i) else { break };
                let ask = Ask {
                    url,
                    model,
                    prompt: &t.prompt,
                    max_tokens: ctx.opts.max_tokens,
                    stop,
                    threshold: None,
                    timeout: Duration::from_secs(1800),
                };
                mine.push((i, client::complete(&http, &ask).await));
            }
            mine
        }
    }))
    .await
}

/// The generations in task order, each HumanEval answer checked by its problem's tests (a
/// failed generation fails).
async fn checked_answers(
    ctx: &Ctx<'_>,
    results: Vec<Vec<(usize, Generation)>>,
    mode: &str,
    clients: usize,
) -> anyhow::Result<Vec<Answer>> {
    let mut by_index: Vec<(usize, Generation)> = results.into_iter().flatten().collect();
    by_index.sort_by_key(|(i, _)| *i);
    let mut answers = Vec::with_capacity(by_index.len());
    for (i, g) in by_index {
        let t = &ctx.tasks[i];
        if let Some(e) = &g.error {
            tracing::warn!(task = %t.id, mode, clients, error = %e, "generation failed");
        }
        let verdict = match &t.problem {
            Some(_) if g.error.is_some() => Some(Verdict::Failed),
            Some(p) => Some(
                humaneval::check(
                    ctx.sandbox,
                    p,
                    &g.text,
                    &ctx.scratch,
                    Duration::from_secs(10),
                )
                .await?,
            ),
            None => None,
        };
        answers.push(Answer {
            id: t.id.clone(),
            verdict,
            generation: g,
        });
    }
    Ok(answers)
}

/// The instruction checkers' scores of mode `mode`'s answers, on the instruction sample.
async fn instruction_scores(
    ctx: &Ctx<'_>,
    mode: &str,
    answers: &[Answer],
) -> anyhow::Result<Option<InstructionScores>> {
    if ctx.opts.sample != Sample::Instructions {
        return Ok(None);
    }
    let list = answers
        .iter()
        .map(|a| (a.id.clone(), a.generation.text.clone()))
        .collect();
    score_run(ctx.home, &ctx.instructions_dir, &ctx.scratch, mode, list).await
}

/// Runs the sweep and writes `concurrency.md` and `concurrency.json`.
pub async fn run(opts: &ConcurrencyOptions) -> anyhow::Result<()> {
    let home = Home::from_env()?;
    let base = Policy::load(&opts.base_policy)
        .map_err(|e| anyhow::anyhow!("{}: {}", e.path, e.problems.join("; ")))?;
    let calls_opts = CallsOptions {
        sample: opts.sample,
        prompts: opts.prompts,
        layouts: opts.layouts.clone(),
        delays_ms: vec![0],
        only: Vec::new(),
        out: opts.out.clone(),
        max_tokens: opts.max_tokens,
        exec_timeout: Duration::from_secs(10),
        base_policy: opts.base_policy.clone(),
        corpus: "training/data/prompts.jsonl".into(),
        instructions_dir: "tests/bench/instructions".into(),
        copy_dir: "tests/bench/copy".into(),
        fresh: opts.fresh,
        // Not used: the sweep runs against llama-server.
        vllm_model: Default::default(),
        relaxed_rule: "ratio:0.5".into(),
    };
    let tasks = calls::tasks(&home, &calls_opts)?;
    std::fs::create_dir_all(opts.out.join("raw"))?;
    let ctx = Ctx {
        home: &home,
        http: reqwest::Client::builder()
            .pool_idle_timeout(approxy_verifier::targets::POOL_IDLE_TIMEOUT)
            .build()?,
        opts,
        tasks: &tasks,
        sandbox: Sandbox::detect().await,
        scratch: home.work("bench-exec"),
        instructions_dir: calls_opts.instructions_dir.clone(),
    };
    for &layout in &opts.layouts {
        run_layout(&ctx, &base, layout).await?;
    }
    let runs = load_all(&opts.out)?;
    std::fs::write(opts.out.join("concurrency.md"), markdown(&runs))?;
    std::fs::write(
        opts.out.join("concurrency.json"),
        serde_json::to_vec_pretty(&runs)?,
    )?;
    println!("{}", opts.out.join("concurrency.md").display());
    Ok(())
}

/// The gateway's policy: the shipped "*" model as `default`, passthrough as `target-only`, and
/// the shipped policy's draft settings (streams, floor, memory) with the layout's threads; the
/// target's address is set per run.
fn policy(
    base: &Policy,
    layout: Layout,
    clients: usize,
) -> anyhow::Result<approxy_gateway::policy::raw::RawPolicy> {
    let base_model = base
        .models
        .get("*")
        .ok_or_else(|| anyhow::anyhow!("the base policy has no \"*\" model"))?;
    let mut policy = calls::raw_policy(
        "",
        false,
        layout,
        base_model,
        &[CallConfig::TargetOnly, CallConfig::Default],
    );
    policy.gateway.max_concurrent_requests = Some(4 * clients.max(SLOTS));
    policy.draft.streams_per_worker = Some(base.draft.streams_per_worker);
    policy.draft.min_stream_speed = Some(base.draft.min_stream_speed);
    policy.draft.kv_memory_mb = Some(base.draft.kv_memory_mb);
    // The target is started with `--cache-ram 0`, as slots need (`servers::start_llama_slots`).
    policy.target.cache = Some(approxy_gateway::policy::raw::RawCache {
        slots: Some(base.target.cache_hints.slots),
        warm: Some(base.target.cache_hints.warm),
        ..Default::default()
    });
    Ok(policy)
}

/// Every run of one layout not saved yet, each with a fresh target (its slots keep the prompts
/// they processed, which would serve a later run's from cache) and a fresh gateway (its memory
/// figures are the run's own).
async fn run_layout(ctx: &Ctx<'_>, base: &Policy, layout: Layout) -> anyhow::Result<()> {
    let opts = ctx.opts;
    let todo: Vec<(&str, usize)> = ["passthrough", "approxy"]
        .into_iter()
        .flat_map(|m| opts.clients.iter().map(move |&c| (m, c)))
        .filter(|&(m, c)| opts.fresh || !raw_path(&opts.out, opts.sample, layout, m, c).exists())
        .collect();
    if todo.is_empty() {
        return Ok(());
    }
    let exe = std::env::current_exe()?;
    let logs = ctx.home.log("bench-concurrency").with_extension("d");
    std::fs::create_dir_all(&logs)?;
    std::fs::create_dir_all(ctx.home.work("bench"))?;
    let path = ctx
        .home
        .work("bench")
        .join(format!("concurrency-{}.toml", layout.name()));
    let most = opts.clients.iter().copied().max().unwrap_or(1);
    let mut policy = policy(base, layout, most)?;
    for (mode, clients) in todo {
        let target = servers::start_llama_slots(ctx.home, layout, false, SLOTS, &logs).await?;
        policy.target.base_url = target.url.clone();
        std::fs::write(
            &path,
            format!(
                "# Written by `approxy bench concurrency`.\n{}",
                toml::to_string(&policy)?
            ),
        )?;
        let gateway = servers::start_gateway(&exe, &path, layout, &logs).await?;
        // One answer first, so the draft's and the target's first-run costs are not timed.
        let warm = Ask {
            url: &format!("{}/v1/completions", gateway.url),
            model: calls::model_name(config(mode)),
            prompt: &ctx.tasks[0].prompt,
            max_tokens: 16,
            stop: &[],
            threshold: None,
            timeout: Duration::from_secs(600),
        };
        let _ = client::complete(&ctx.http, &warm).await;
        let run = run_one(ctx, &gateway, &target, layout, mode, clients).await?;
        let f = run.figures();
        eprintln!(
            "{} {mode} C={clients}: {:.2} answers/min, {:.1} tokens/s, stream p50 {:.1}, ttft p50 {:.2}s, saturated {:.0}%, passed {:?}",
            layout.name(),
            f.answers_per_minute,
            f.tokens_per_second,
            f.stream_tokens_per_second_p50,
            f.ttft_p50,
            100.0 * f.saturated_share,
            f.passed
        );
        std::fs::write(
            raw_path(&opts.out, opts.sample, layout, mode, clients),
            serde_json::to_vec_pretty(&run)?,
        )?;
    }
    Ok(())
}

/// Every saved run.
pub fn load_all(out: &Path) -> anyhow::Result<Vec<ConcurrencyRun>> {
    let mut runs = Vec::new();
    let Ok(dir) = std::fs::read_dir(out.join("raw")) else {
        return Ok(runs);
    };
    for e in dir {
        let p = e?.path();
        if p.extension().is_some_and(|x| x == "json") {
            runs.push(
                serde_json::from_slice(&std::fs::read(&p)?)
                    .with_context(|| p.display().to_string())?,
            );
        }
    }
    runs.sort_by(|a: &ConcurrencyRun, b| {
        (a.sample.name(), &a.layout, &a.mode, a.clients).cmp(&(
            b.sample.name(),
            &b.layout,
            &b.mode,
            b.clients,
        ))
    });
    Ok(runs)
}

/// The report: one table per sample and layout, and where the goal stands.
pub fn markdown(runs: &[ConcurrencyRun]) -> String {
    let mut md = String::from(
        "Written by `approxy bench concurrency` (`./tests/bench/scripts/bench-concurrency.sh`). One llama-server \
         with 16 slots; C clients share the prompts, each taking the next one free; approxy runs \
         the shipped policy, passthrough the same gateway with the model passed through. The \
         target's slot-seconds are its own prompt and generation seconds (`/metrics`), summed over \
         its slots: with several clients they overlap, so they grow with C while the target is \
         busy the whole run either way. Cores busy are each process's CPU seconds over the run's \
         wall seconds (`/proc/PID/stat`): pinned, each has one core, so the target's figure is \
         the share of the run it was computing.\n",
    );
    let mut keys: Vec<(Sample, String)> =
        runs.iter().map(|r| (r.sample, r.layout.clone())).collect();
    keys.dedup();
    for (sample, layout) in keys {
        let here: Vec<&ConcurrencyRun> = runs
            .iter()
            .filter(|r| r.sample == sample && r.layout == layout)
            .collect();
        let Some(first) = here.first() else { continue };
        md.push_str(&format!(
            "\n#### {} prompts, {} cores ({} prompts a run, {} tokens at most; {}, finished {})\n\n",
            sample.name(),
            layout,
            first.answers.len(),
            first.max_tokens,
            first.machine,
            here.iter()
                .map(|r| r.finished_at.as_str())
                .max()
                .unwrap_or("")
        ));
        md.push_str("| mode | clients | answers/min | tokens/s | stream tokens/s p50 / p10 | TTFT p50 / p99 (s) | passed through, saturated | target slot-seconds per answer | cores busy, target / gateway | gateway RSS / peak (MiB) | quality |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
        for r in &here {
            md.push_str(&run_row(r));
        }
        if sample == Sample::HumanEval && layout == "pinned" {
            md.push_str(&goal(&here));
        }
    }
    md
}

/// One run's row of the table.
fn run_row(r: &ConcurrencyRun) -> String {
    let f = r.figures();
    let quality = match (f.passed, r.instructions) {
        (Some(p), _) => format!("pass@1 {p}/{}", r.answers.len()),
        (None, Some(i)) => format!("instructions {:.1} %", 100.0 * i.prompt_level_strict),
        _ => "-".into(),
    };
    format!(
        "| {} | {} | {:.2} | {:.1} | {:.1} / {:.1} | {:.2} / {:.2} | {:.0} % | {} | {} | {:.0} / {:.0} | {}{} |\n",
        r.mode,
        r.clients,
        f.answers_per_minute,
        f.tokens_per_second,
        f.stream_tokens_per_second_p50,
        f.stream_tokens_per_second_p10,
        f.ttft_p50,
        f.ttft_p99,
        100.0 * f.saturated_share,
        f.target_seconds_per_answer
            .map_or("-".into(), |s| format!("{s:.1}")),
        match (f.target_cores_busy, f.gateway_cores_busy) {
            (Some(t), Some(g)) => format!("{t:.2} / {g:.2}"),
            _ => "-".into(),
        },
        r.gateway_rss_mib,
        r.gateway_peak_mib,
        quality,
        if f.failed_requests > 0 {
            format!(", {} failed", f.failed_requests)
        } else {
            String::new()
        },
    )
}

/// The goal at 4 clients on code, pinned: approxy's answers a minute against passthrough's,
/// with pass@1 within one problem, when both ran.
fn goal(here: &[&ConcurrencyRun]) -> String {
    let mut md = String::new();
    let at = |mode: &str| here.iter().find(|r| r.mode == mode && r.clients == 4);
    if let (Some(a), Some(p)) = (at("approxy"), at("passthrough")) {
        let (fa, fp) = (a.figures(), p.figures());
        let ratio = fa.answers_per_minute / fp.answers_per_minute.max(1e-9);
        let within = match (fa.passed, fp.passed) {
            (Some(x), Some(y)) => x + 1 >= y,
            _ => false,
        };
        md.push_str(&format!(
            "\nGoal (4 clients, code, pinned): at least 1.5x passthrough's answers a minute at pass@1 within one problem. Measured {ratio:.2}x, pass@1 {} against {}: {}.\n",
            fa.passed.unwrap_or(0),
            fp.passed.unwrap_or(0),
            if ratio >= 1.5 && within { "met" } else { "not met" }
        ));
    }
    md
}
