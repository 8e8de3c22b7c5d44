//! `approxy bench calls`: the engine's call structure against target-only. On a HumanEval
//! sample (pass@1) or on held-out chat prompts (agreement with the target-only answer), per
//! core layout and per injected per-call delay (a remote API's round trip), it runs:
//! - `target-only`: the gateway in passthrough;
//! - `default`: the shipped policy's `"*"` model as it is (spans, its guard: budget);
//! - `strict`: the same with `guard = "strict"` (the earlier default, kept to compare with);
//! - `span`: the same with the cost guard off, so the spans themselves are measured;
//! - `span-overlap`: `span` with drafting while the target works;
//! - `vllm-target-only`, `vllm-exact`, `vllm-exact-overlap`: vLLM serving the draft's float32
//!   checkpoint, passthrough and exact windows (guard off), without and with overlap.
//!
//! Costs are reported under every price class in [`super::prices`], relative to target-only
//! on the same sample, layout and delay. Each finished run is saved under `raw/` and reused
//! by a rerun over the same prompts.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use approxy_gateway::policy::raw::{
    RawBailout, RawCorrection, RawDraft, RawGateway, RawModel, RawPolicy, RawPricing,
    RawStructuredThreshold, RawTarget,
};
use approxy_gateway::policy::{GuardPolicy, ModelPolicy, Policy};
use approxy_setup::Home;
use approxy_training::corpus::load_human_eval;
use approxy_verifier::template::{ChatMessage, ChatTemplate};
use serde::{Deserialize, Serialize};

use super::chat_sample::{held_out_chat, rouge_l};
use super::client::{self, ApproxyUsage, Ask, Generation};
use super::delay;
use super::gpu_projection::{self, ProjectedCall, Shape};
use super::humaneval::{self, Sandbox, Verdict};
use super::instructions::{InstructionPrompt, InstructionScores, score_instructions};
use super::prices::{CLASSES, PriceClass, cost};
use super::servers::{self, Layout, Server};
use super::target_account::{self, TargetAccount, Tokens, difference_pct};

/// Which prompts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
#[value(rename_all = "lowercase")]
pub enum Sample {
    /// HumanEval problems, spread evenly; pass@1.
    HumanEval,
    /// Held-out chat prompts; agreement with target-only.
    Chat,
    /// The instruction-following set (`tests/bench/instructions/`); IFEval's checkers.
    Instructions,
    /// The copy-heavy set (`tests/bench/copy/`): functions rewritten with one small change,
    /// passages quoted; agreement with target-only. Where prompt lookup should pay.
    Copy,
}

impl Sample {
    /// Its name in file names and reports.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::HumanEval => "humaneval",
            Self::Chat => "chat",
            Self::Instructions => "instructions",
            Self::Copy => "copy",
        }
    }
}

/// Options for `approxy bench calls`.
#[derive(Debug, Clone, clap::Args)]
pub struct CallsOptions {
    /// `humaneval` (pass@1) or `chat` (held-out chat prompts; agreement with target-only).
    #[arg(long, value_enum, default_value = "humaneval")]
    pub sample: Sample,
    /// Prompts: HumanEval problems spread over the 164, or the last N chat prompts.
    #[arg(long, default_value_t = 24)]
    pub prompts: usize,
    /// Core layouts, comma-separated: shared, pinned.
    #[arg(long, value_enum, default_value = "shared", value_delimiter = ',')]
    pub layouts: Vec<Layout>,
    /// Delay injected before every target call, milliseconds, comma-separated.
    #[arg(
        long = "target-delay",
        value_name = "TARGET_DELAY",
        default_value = "0",
        value_delimiter = ','
    )]
    pub delays_ms: Vec<u64>,
    /// Only these configurations (default: the llama.cpp ones but default-streamed):
    /// target-only, default, default-lookup, default-streamed, strict, span, span-overlap,
    /// vllm-target-only, vllm-exact, vllm-exact-overlap, vllm-relaxed, vllm-approximate,
    /// vllm-default.
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// Results directory.
    #[arg(long, default_value = "tests/bench/results/calls")]
    pub out: PathBuf,
    /// Output limit per prompt.
    #[arg(long, default_value_t = 384)]
    pub max_tokens: u32,
    /// Seconds a HumanEval problem's tests may run.
    #[arg(skip = Duration::from_secs(10))]
    pub exec_timeout: Duration,
    /// Policy whose "*" model is the default configuration.
    #[arg(long, default_value = "policies/default.toml")]
    pub base_policy: PathBuf,
    /// The training corpus (chat prompts).
    #[arg(long, default_value = "training/data/prompts.jsonl")]
    pub corpus: PathBuf,
    /// The instruction-following set (its prompts and scorer).
    #[arg(long, default_value = "tests/bench/instructions")]
    pub instructions_dir: PathBuf,
    /// The copy-heavy set (its prompts).
    #[arg(long, default_value = "tests/bench/copy")]
    pub copy_dir: PathBuf,
    /// Ignore saved runs.
    #[arg(long)]
    pub fresh: bool,
    /// The checkpoint the vLLM configurations serve: the 1.5B target (the real pair) or the
    /// draft itself (faster). Use another `--out` for each: saved runs do not record it.
    #[arg(long, value_enum, default_value = "target")]
    pub vllm_model: servers::VllmModel,
    /// The rule `vllm-relaxed` keeps a draft token by (an acceptance rule: `ratio:0.5`,
    /// `typical:0.09,0.3`, ...). Use another `--out` for each.
    #[arg(long, default_value = "ratio:0.5")]
    pub relaxed_rule: String,
}

/// The rule `vllm-relaxed` runs with in this process (`--relaxed-rule`).
static RELAXED_RULE: std::sync::OnceLock<String> = std::sync::OnceLock::new();

fn relaxed_rule() -> &'static str {
    RELAXED_RULE.get().map_or("ratio:0.5", String::as_str)
}

/// The most tokens prompt lookup proposes in the `default-lookup` configuration.
pub const LOOKUP_TOKENS: u32 = 8;

/// One configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CallConfig {
    /// Passthrough to llama-server.
    TargetOnly,
    /// The shipped policy.
    Default,
    /// The shipped policy with prompt lookup proposing up to [`LOOKUP_TOKENS`] tokens.
    DefaultLookup,
    /// The shipped policy with each span asked for in one streamed call, closed where the
    /// span ends (`correction.ask = "all"`, the earlier default on llama-server, kept to compare
    /// with: see tests/README.md, "What a span's calls ask for").
    DefaultStreamed,
    /// The shipped policy with the strict guard (the earlier default, kept to compare with).
    Strict,
    /// Spans, no cost guard.
    Span,
    /// Spans, no cost guard, overlap on.
    SpanOverlap,
    /// Passthrough to vLLM.
    VllmTargetOnly,
    /// Exact windows on vLLM.
    VllmExact,
    /// Exact windows on vLLM, overlap on.
    VllmExactOverlap,
    /// Every token through windows on vLLM, a draft token kept where the relaxed rule
    /// (`--relaxed-rule`) accepts it on the target's probabilities; no cost guard.
    VllmRelaxed,
    /// The default verification on vLLM (windows scored where the verifier rejects), no cost
    /// guard.
    VllmApproximate,
    /// The shipped policy on vLLM (windows where the verifier rejects, the budget guard).
    VllmDefault,
}

/// Every configuration, in report order.
pub const ALL: [CallConfig; 13] = [
    CallConfig::TargetOnly,
    CallConfig::Default,
    CallConfig::DefaultLookup,
    CallConfig::DefaultStreamed,
    CallConfig::Strict,
    CallConfig::Span,
    CallConfig::SpanOverlap,
    CallConfig::VllmTargetOnly,
    CallConfig::VllmExact,
    CallConfig::VllmExactOverlap,
    CallConfig::VllmRelaxed,
    CallConfig::VllmApproximate,
    CallConfig::VllmDefault,
];

impl CallConfig {
    /// Its id (`--only`, file names).
    pub fn id(self) -> &'static str {
        match self {
            Self::TargetOnly => "target-only",
            Self::Default => "default",
            Self::DefaultLookup => "default-lookup",
            Self::DefaultStreamed => "default-streamed",
            Self::Strict => "strict",
            Self::Span => "span",
            Self::SpanOverlap => "span-overlap",
            Self::VllmTargetOnly => "vllm-target-only",
            Self::VllmExact => "vllm-exact",
            Self::VllmExactOverlap => "vllm-exact-overlap",
            Self::VllmRelaxed => "vllm-relaxed",
            Self::VllmApproximate => "vllm-approximate",
            Self::VllmDefault => "vllm-default",
        }
    }

    fn vllm(self) -> bool {
        matches!(
            self,
            Self::VllmTargetOnly
                | Self::VllmExact
                | Self::VllmExactOverlap
                | Self::VllmRelaxed
                | Self::VllmApproximate
                | Self::VllmDefault
        )
    }

    fn passthrough(self) -> bool {
        matches!(self, Self::TargetOnly | Self::VllmTargetOnly)
    }

    /// The target-only run it is compared with.
    fn baseline(self) -> Self {
        if self.vllm() {
            Self::VllmTargetOnly
        } else {
            Self::TargetOnly
        }
    }

    fn label(self) -> &'static str {
        match self {
            Self::TargetOnly => "target only (passthrough)",
            Self::Default => "default policy (spans, budget guard)",
            Self::DefaultLookup => "default policy with prompt lookup (8 tokens)",
            Self::DefaultStreamed => "default policy, one streamed call a span",
            Self::Strict => "default policy, strict guard",
            Self::Span => "spans, no cost guard",
            Self::SpanOverlap => "spans, no cost guard, overlap",
            Self::VllmTargetOnly => "vLLM target only (passthrough)",
            Self::VllmExact => "vLLM exact windows",
            Self::VllmExactOverlap => "vLLM exact windows, overlap",
            Self::VllmRelaxed => {
                "vLLM relaxed windows (--relaxed-rule on the target's probabilities)"
            }
            Self::VllmApproximate => {
                "vLLM approximate (windows where the verifier rejects), no cost guard"
            }
            Self::VllmDefault => {
                "vLLM, default policy (windows where the verifier rejects, budget guard)"
            }
        }
    }
}

/// One prompt's outcome.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PromptRun {
    /// HumanEval task id or `chat/<corpus id>`.
    pub id: String,
    /// HumanEval only.
    pub verdict: Option<Verdict>,
    /// The timed generation.
    pub generation: Generation,
}

/// One configuration's run at one layout and delay.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CallsRun {
    /// Which prompts.
    pub sample: Sample,
    /// Layout name.
    pub layout: String,
    /// Injected per-call delay.
    pub delay_ms: u64,
    /// Output limit per prompt.
    pub max_tokens: u32,
    /// Configuration.
    pub config: CallConfig,
    /// When it finished (UTC).
    pub finished_at: String,
    /// Per prompt.
    pub prompts: Vec<PromptRun>,
    /// What the target counted while the prompts ran (its `/metrics`; none for runs saved
    /// before the bench read it).
    #[serde(default)]
    pub target_account: Option<TargetAccount>,
    /// The machine it ran on (runs saved before the bench recorded it have none).
    #[serde(default)]
    pub machine: Option<String>,
    /// The instruction-following sample: IFEval's scores of the answers.
    #[serde(default)]
    pub instructions: Option<InstructionScores>,
}

pub(crate) struct Task {
    pub(crate) id: String,
    pub(crate) prompt: String,
    pub(crate) problem: Option<approxy_training::corpus::HumanEvalProblem>,
}

pub(crate) fn tasks(home: &Home, opts: &CallsOptions) -> anyhow::Result<Vec<Task>> {
    let (sample, n, corpus) = (opts.sample, opts.prompts, opts.corpus.as_path());
    let render = |content: &str| -> anyhow::Result<String> {
        let template = ChatTemplate::from_file(&home.draft_onnx_dir().join("chat_template.jinja"))?;
        Ok(template.render(&[ChatMessage::new("user".into(), content.to_string())])?)
    };
    Ok(match sample {
        Sample::Instructions | Sample::Copy => {
            let dir = if sample == Sample::Copy {
                &opts.copy_dir
            } else {
                &opts.instructions_dir
            };
            let path = dir.join("prompts.jsonl");
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("reading {}", path.display()))?;
            text.lines()
                .filter(|l| !l.trim().is_empty())
                .take(n)
                .map(|l| {
                    let p: InstructionPrompt = serde_json::from_str(l)?;
                    Ok(Task {
                        prompt: render(&p.prompt)?,
                        id: p.id,
                        problem: None,
                    })
                })
                .collect::<anyhow::Result<_>>()?
        }
        Sample::HumanEval => {
            let all =
                load_human_eval(&home.human_eval()).context("HumanEval (run `approxy setup`)")?;
            humaneval::sample(all, n)
                .into_iter()
                .map(|p| Task {
                    id: p.task_id.clone(),
                    prompt: p.prompt.clone(),
                    problem: Some(p),
                })
                .collect()
        }
        Sample::Chat => {
            let corpus = approxy_training::corpus::load(corpus)?;
            let template =
                ChatTemplate::from_file(&home.draft_onnx_dir().join("chat_template.jinja"))?;
            held_out_chat(&corpus, n)
                .into_iter()
                .map(|p| {
                    let prompt =
                        template.render(&[ChatMessage::new("user".into(), p.prompt.clone())])?;
                    Ok(Task {
                        id: format!("chat/{}", p.id),
                        prompt,
                        problem: None,
                    })
                })
                .collect::<anyhow::Result<_>>()?
        }
    })
}

/// The base policy's correction, as a configuration runs it: what a span's calls ask for is
/// left to the target's kind on vLLM (the base was resolved for llama-server), and is one
/// streamed call in `default-streamed`.
fn correction(base: &ModelPolicy, c: CallConfig) -> RawCorrection {
    let mut raw = super::quality::raw_correction(base.correction);
    match c {
        CallConfig::DefaultStreamed if raw.mode == "span" => raw.ask = Some("all".into()),
        _ if c.vllm() => raw.ask = None,
        _ => {}
    }
    raw
}

fn raw_model(base: &ModelPolicy, c: CallConfig) -> RawModel {
    if c.passthrough() {
        return RawModel {
            mode: "passthrough".into(),
            ..RawModel::default()
        };
    }
    RawModel {
        mode: "approximate".into(),
        verifier: Some("confidence".into()),
        threshold: Some(base.threshold.raw()),
        correction: Some(correction(base, c)),
        verification: match c {
            CallConfig::VllmExact | CallConfig::VllmExactOverlap => Some("exact".into()),
            CallConfig::VllmRelaxed => Some(format!("relaxed:{}", relaxed_rule())),
            _ => None,
        },
        // The guard is off except in the policy's own configurations: elsewhere the calls
        // themselves are what is measured.
        max_cost_ratio: Some(base.max_cost_ratio),
        guard: Some(
            match c {
                CallConfig::Default
                | CallConfig::DefaultLookup
                | CallConfig::DefaultStreamed
                | CallConfig::VllmDefault => base.guard.name(),
                CallConfig::Strict => "strict",
                _ => "off",
            }
            .into(),
        ),
        hard_cost_cap: match (c, base.guard) {
            (
                CallConfig::Default
                | CallConfig::DefaultLookup
                | CallConfig::DefaultStreamed
                | CallConfig::VllmDefault,
                GuardPolicy::Budget { hard_cap, .. },
            ) => Some(hard_cap),
            _ => None,
        },
        budget_window: match (c, base.guard) {
            (
                CallConfig::Default
                | CallConfig::DefaultLookup
                | CallConfig::DefaultStreamed
                | CallConfig::VllmDefault,
                GuardPolicy::Budget { window, .. },
            ) => Some(format!("{}ms", window.as_millis())),
            _ => None,
        },
        overlap: Some(matches!(
            c,
            CallConfig::SpanOverlap | CallConfig::VllmExactOverlap
        )),
        max_target_calls: base.max_target_calls,
        prompt_lookup: Some(if c == CallConfig::DefaultLookup {
            LOOKUP_TOKENS
        } else {
            base.prompt_lookup as u32
        }),
        bailout: base.bailout.map(|b| RawBailout {
            window: b.window,
            max_rejection_rate: b.max_rejection_rate,
        }),
        price: Some(RawPricing::from(&base.price)),
        structured_threshold: base.structured_threshold.map(|t| RawStructuredThreshold {
            value: t.value,
            text: t.text,
        }),
        json_layout: Some(base.json_layout.name().into()),
        json_fence: Some(base.json_fence.name().into()),
        ..RawModel::default()
    }
}

/// The model a configuration's requests name: its id on llama-server, vLLM's served name on
/// vLLM.
pub(crate) fn model_name(c: CallConfig) -> &'static str {
    if c.vllm() {
        servers::vllm_model().served_name()
    } else {
        c.id()
    }
}

fn policy_text(
    target_url: &str,
    vllm: bool,
    layout: Layout,
    base: &ModelPolicy,
    configs: &[CallConfig],
) -> anyhow::Result<String> {
    let policy = raw_policy(target_url, vllm, layout, base, configs);
    Ok(format!(
        "# Written by `approxy bench calls`.\n{}",
        toml::to_string(&policy)?
    ))
}

/// The policy of a benchmark's gateway: `configs` as models in front of the target at
/// `target_url`, one draft worker with the layout's threads.
pub(crate) fn raw_policy(
    target_url: &str,
    vllm: bool,
    layout: Layout,
    base: &ModelPolicy,
    configs: &[CallConfig],
) -> RawPolicy {
    RawPolicy {
        passthrough: None,
        target: RawTarget {
            kind: if vllm { "vllm" } else { "llama_cpp" }.into(),
            base_url: if vllm {
                format!("{target_url}/v1")
            } else {
                target_url.into()
            },
            model: Some(if vllm {
                servers::vllm_model().served_name().into()
            } else {
                approxy_verifier::verify::learned::DEFAULT_CALIBRATION_TARGET.into()
            }),
            timeout: Some("600s".into()),
            retries: Some(2),
            backoff: Some("200ms".into()),
            ..RawTarget::default()
        },
        gateway: RawGateway {
            auth: Some("none".into()),
            max_concurrent_requests: Some(4),
            request_timeout: Some("1800s".into()),
            ..RawGateway::default()
        },
        draft: RawDraft {
            workers: Some(1),
            threads_per_worker: Some(layout.draft_threads()),
            spin_wait: Some(false),
            ..RawDraft::default()
        },
        models: configs
            .iter()
            .map(|&c| (model_name(c).to_string(), raw_model(base, c)))
            .collect(),
    }
}

fn raw_path(out: &Path, sample: Sample, layout: Layout, delay: u64, c: CallConfig) -> PathBuf {
    out.join("raw").join(format!(
        "{}-{}-d{delay}-{}.json",
        sample.name(),
        layout.name(),
        c.id()
    ))
}

fn load_saved(path: &Path, tasks: &[Task], max_tokens: u32) -> Option<CallsRun> {
    let run: CallsRun = serde_json::from_slice(&std::fs::read(path).ok()?).ok()?;
    let same = run.prompts.len() == tasks.len()
        && run.max_tokens == max_tokens
        && run.prompts.iter().zip(tasks).all(|(r, t)| r.id == t.id);
    same.then_some(run)
}

struct Ctx<'a> {
    home: &'a Home,
    http: reqwest::Client,
    opts: &'a CallsOptions,
    tasks: &'a [Task],
    sandbox: Sandbox,
    scratch: PathBuf,
}

/// How long the target may take to release a cancelled stream's slot before its counters are
/// read all the same.
const SETTLE: Duration = Duration::from_secs(10);

async fn run_config(
    ctx: &Ctx<'_>,
    url: &str,
    account_url: Option<&str>,
    layout: Layout,
    delay: u64,
    c: CallConfig,
) -> anyhow::Result<CallsRun> {
    let completions = format!("{url}/v1/completions");
    let stop: &[&str] = match ctx.opts.sample {
        Sample::HumanEval => &humaneval::STOP,
        Sample::Chat | Sample::Instructions | Sample::Copy => &[],
    };
    let before = match account_url {
        Some(u) => Some(target_account::read(&ctx.http, u, SETTLE).await?),
        None => None,
    };
    let mut prompts = Vec::with_capacity(ctx.tasks.len());
    for (i, t) in ctx.tasks.iter().enumerate() {
        let ask = Ask {
            url: &completions,
            model: model_name(c),
            prompt: &t.prompt,
            max_tokens: ctx.opts.max_tokens,
            stop,
            threshold: None,
            timeout: Duration::from_secs(1800),
        };
        let g = client::complete(&ctx.http, &ask).await;
        if let Some(e) = &g.error {
            tracing::warn!(task = %t.id, config = c.id(), error = %e, "generation failed");
        }
        tracing::info!(
            layout = layout.name(),
            delay,
            config = c.id(),
            done = i + 1,
            of = ctx.tasks.len(),
            tokens = g.completion_tokens,
            secs = format!("{:.1}", g.seconds),
            "prompt"
        );
        prompts.push(PromptRun {
            id: t.id.clone(),
            verdict: None,
            generation: g,
        });
    }
    let target_account = match (account_url, before) {
        (Some(u), Some(b)) => Some(target_account::read(&ctx.http, u, SETTLE).await?.since(&b)),
        _ => None,
    };
    // Tests run after the timed part, so they never compete with it.
    for (r, t) in prompts.iter_mut().zip(ctx.tasks) {
        if let Some(p) = &t.problem {
            r.verdict = Some(if r.generation.error.is_some() {
                Verdict::Failed
            } else {
                humaneval::check(
                    ctx.sandbox,
                    p,
                    &r.generation.text,
                    &ctx.scratch,
                    ctx.opts.exec_timeout,
                )
                .await?
            });
        }
    }
    let instructions = if ctx.opts.sample == Sample::Instructions {
        let answers = prompts
            .iter()
            .map(|p| (p.id.clone(), p.generation.text.clone()))
            .collect();
        let runs = [(c.id().to_string(), answers)];
        let scores =
            score_instructions(ctx.home, &ctx.opts.instructions_dir, &ctx.scratch, &runs).await?;
        scores.get(c.id()).copied()
    } else {
        None
    };
    Ok(CallsRun {
        instructions,
        sample: ctx.opts.sample,
        layout: layout.name().into(),
        delay_ms: delay,
        max_tokens: ctx.opts.max_tokens,
        config: c,
        finished_at: super::machine::utc_now(),
        prompts,
        target_account,
        machine: Some(super::machine::Machine::read().line()),
    })
}

/// Runs the configurations one target at a time and writes `calls.json` and `calls.md`.
pub async fn run(opts: &CallsOptions) -> anyhow::Result<()> {
    servers::set_vllm_model(opts.vllm_model)?;
    let rule = RELAXED_RULE.get_or_init(|| opts.relaxed_rule.clone());
    anyhow::ensure!(
        *rule == opts.relaxed_rule,
        "the relaxed rule is already {rule}"
    );
    let home = Home::from_env()?;
    let exe = std::env::current_exe()?;
    let base = Policy::load(&opts.base_policy)
        .map_err(|e| anyhow::anyhow!("{}: {}", e.path, e.problems.join("; ")))?;
    let base_model = base
        .models
        .get("*")
        .ok_or_else(|| anyhow::anyhow!("{} has no \"*\" model", opts.base_policy.display()))?
        .clone();
    let tasks = tasks(&home, opts)?;
    let wanted = wanted_configs(opts)?;
    let logs = home.log("bench-calls").with_extension("d");
    let ctx = Ctx {
        home: &home,
        http: reqwest::Client::builder()
            .pool_idle_timeout(approxy_verifier::targets::POOL_IDLE_TIMEOUT)
            .build()?,
        opts,
        tasks: &tasks,
        sandbox: Sandbox::detect().await,
        scratch: home.work("bench-exec"),
    };
    std::fs::create_dir_all(opts.out.join("raw"))?;
    std::fs::create_dir_all(home.work("bench"))?;
    let setup = Setup {
        home: &home,
        exe: &exe,
        logs: &logs,
        base_model: &base_model,
    };
    for &layout in &opts.layouts {
        for vllm in [false, true] {
            run_group(&ctx, &setup, Group { layout, vllm }, &wanted).await?;
        }
    }
    let runs = load_all(&opts.out)?;
    let md = markdown(&runs, &base_model, &super::machine::Machine::read());
    std::fs::write(opts.out.join("calls.md"), &md)?;
    std::fs::write(
        opts.out.join("calls.json"),
        serde_json::to_vec_pretty(&runs)?,
    )?;
    println!("{}", opts.out.join("calls.md").display());
    Ok(())
}

/// The configurations `--only` names (by default every one but vLLM's and `default-streamed`,
/// which only `tests/bench/scripts/bench-span-ask.sh` compares); an error when none.
fn wanted_configs(opts: &CallsOptions) -> anyhow::Result<Vec<CallConfig>> {
    let wanted: Vec<CallConfig> = ALL
        .into_iter()
        .filter(|c| {
            if opts.only.is_empty() {
                !c.vllm() && *c != CallConfig::DefaultStreamed
            } else {
                opts.only.iter().any(|o| o == c.id())
            }
        })
        .collect();
    if wanted.is_empty() {
        anyhow::bail!(
            "no configuration selected; ids: {}",
            ALL.map(CallConfig::id).join(", ")
        );
    }
    Ok(wanted)
}

/// What every target and gateway of the run is started from.
struct Setup<'a> {
    home: &'a Home,
    /// This binary, for `approxy serve`.
    exe: &'a Path,
    logs: &'a Path,
    /// The base policy's `"*"` model entry.
    base_model: &'a ModelPolicy,
}

/// The runs one target serves: a layout, and llama-server or vLLM.
#[derive(Debug, Clone, Copy)]
struct Group {
    layout: Layout,
    vllm: bool,
}

/// Runs the group's configurations not saved yet, at every delay, over one target.
async fn run_group(
    ctx: &Ctx<'_>,
    setup: &Setup<'_>,
    g: Group,
    wanted: &[CallConfig],
) -> anyhow::Result<()> {
    let (opts, layout, vllm) = (ctx.opts, g.layout, g.vllm);
    let group: Vec<CallConfig> = wanted
        .iter()
        .copied()
        .filter(|c| c.vllm() == vllm)
        .collect();
    let todo: Vec<(u64, CallConfig)> = opts
        .delays_ms
        .iter()
        .flat_map(|&d| group.iter().map(move |&c| (d, c)))
        .filter(|&(d, c)| {
            opts.fresh
                || load_saved(
                    &raw_path(&opts.out, opts.sample, layout, d, c),
                    ctx.tasks,
                    opts.max_tokens,
                )
                .is_none()
        })
        .collect();
    if todo.is_empty() {
        return Ok(());
    }
    let target: Server = if vllm {
        servers::start_vllm(setup.home, layout, setup.logs).await?
    } else {
        servers::start_llama(setup.home, layout, false, setup.logs).await?
    };
    for &d in &opts.delays_ms {
        let here: Vec<CallConfig> = todo
            .iter()
            .filter(|(dd, _)| *dd == d)
            .map(|&(_, c)| c)
            .collect();
        if here.is_empty() {
            continue;
        }
        run_delay(ctx, setup, g, &target, d, here).await?;
    }
    target.stop().await;
    Ok(())
}

/// Runs `here` behind a proxy that delays every call to `target` by `d` ms, saving each run.
async fn run_delay(
    ctx: &Ctx<'_>,
    setup: &Setup<'_>,
    g: Group,
    target: &Server,
    d: u64,
    here: Vec<CallConfig>,
) -> anyhow::Result<()> {
    let (opts, layout, vllm) = (ctx.opts, g.layout, g.vllm);
    let proxy = delay::start(&target.url, Duration::from_millis(d)).await?;
    // vLLM answers only to its model's name, so each vLLM configuration gets a
    // gateway of its own whose entry for that name is the configuration; on
    // llama-server (which ignores the name) one gateway serves them all by id.
    let sets: Vec<Vec<CallConfig>> = if vllm {
        here.iter().map(|&c| vec![c]).collect()
    } else {
        vec![here]
    };
    for set in sets {
        let policy_path = setup.home.work("bench").join(format!(
            "calls-{}-{}.toml",
            layout.name(),
            u8::from(vllm)
        ));
        std::fs::write(
            &policy_path,
            policy_text(&proxy.url, vllm, layout, setup.base_model, &set)?,
        )?;
        let gateway = servers::start_gateway(setup.exe, &policy_path, layout, setup.logs).await?;
        warm_up(ctx, &gateway.url, &set).await;
        for c in set {
            if vllm {
                servers::reset_vllm_prefix_cache(&ctx.http, &target.url).await?;
            }
            // Both servers count what they computed.
            let account_url = Some(target.url.as_str());
            let run = run_config(ctx, &gateway.url, account_url, layout, d, c).await?;
            std::fs::write(
                raw_path(&opts.out, opts.sample, layout, d, c),
                serde_json::to_vec_pretty(&run)?,
            )?;
        }
        gateway.stop().await;
    }
    drop(proxy);
    Ok(())
}

/// Weights paged in and caches warm before anything is timed: one short request per
/// configuration of `set` to the gateway at `url`.
async fn warm_up(ctx: &Ctx<'_>, url: &str, set: &[CallConfig]) {
    for &c in set {
        let _ = client::complete(
            &ctx.http,
            &Ask {
                url: &format!("{url}/v1/completions"),
                model: model_name(c),
                prompt: "def add(a, b):\n",
                max_tokens: 8,
                stop: &[],
                threshold: None,
                timeout: Duration::from_secs(600),
            },
        )
        .await;
    }
}

/// Every saved run under `out/raw`, in report order.
pub fn load_all(out: &Path) -> anyhow::Result<Vec<CallsRun>> {
    let mut runs = Vec::new();
    let dir = out.join("raw");
    if dir.is_dir() {
        for e in std::fs::read_dir(&dir)? {
            let p = e?.path();
            if p.extension().is_some_and(|x| x == "json") {
                let run: CallsRun = serde_json::from_slice(&std::fs::read(&p)?)
                    .with_context(|| format!("{}", p.display()))?;
                runs.push(run);
            }
        }
    }
    runs.sort_by_key(|r| {
        (
            r.sample.name(),
            r.config.vllm(),
            r.layout.clone(),
            r.delay_ms,
            ALL.iter().position(|c| *c == r.config),
        )
    });
    Ok(runs)
}

/// A run's aggregates.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Aggregates {
    /// Prompts.
    pub n: usize,
    /// HumanEval problems passed.
    pub passed: usize,
    /// Failed generations.
    pub errors: usize,
    /// Output tokens.
    pub tokens: u64,
    /// Output tokens per second of generation.
    pub tok_s: f64,
    /// Median time to first text.
    pub ttft_p50: f64,
    /// Target calls per 100 output tokens.
    pub calls_per_100: f64,
    /// Target-written tokens per 100 output tokens.
    pub target_per_100: f64,
    /// Requests the cost guard handed to the target.
    pub cost_guard: usize,
    /// Overlap guesses drafted and used.
    pub guesses: (u64, u64),
    /// Prompt lookup's proposals computed and used.
    pub lookup: (u64, u64),
    /// Windows scored and the draft tokens they proposed.
    pub windows: (u64, u64),
    /// Tokens the target was sent, of them cacheable, and tokens it generated (paid for).
    pub input: u64,
    /// See `input`.
    pub cacheable: u64,
    /// See `input`.
    pub output: u64,
    /// approxy's own estimate at the policy's prices: the run's cost relative to passthrough,
    /// and its dearest request's.
    pub policy_ratio: Option<(f64, f64)>,
    /// Requests the guard handed to the target, by reason ("not_worth_it: 3").
    pub guard_reasons: Vec<String>,
    /// What approxy billed the target for (passthrough: the client's usage), in the target's
    /// terms: input it had to compute, input its cache served, output.
    pub billed: Tokens,
    /// approxy's estimate of the run's cost at the policy's prices (approximate runs only).
    pub estimated_usd: Option<f64>,
    /// What the target itself counted, when the run read it.
    pub account: Option<TargetAccount>,
    /// Tokens approxy billed as generated after it closed a stream early (its allowance per
    /// closed stream), included in `output`.
    pub inflight_billed: u64,
    /// approxy's account of the target's time (`usage.approxy.target_seconds`: measured where
    /// the target reported, at the learned rates elsewhere), and the calls it did not time.
    pub approxy_seconds: Option<(f64, u64)>,
    /// Every target call, in the projection's terms (passthrough: one per answer).
    pub calls: Vec<ProjectedCall>,
    /// The instruction-following sample's scores.
    pub instructions: Option<InstructionScores>,
    /// Whether any call scored a window.
    pub windowed: bool,
    /// The same calls as a radix cache (SGLang's) would serve them: see [`radix_served`].
    pub radix_calls: Vec<ProjectedCall>,
}

/// An approximate run's account of the target's time and its calls, in the projection's terms.
fn target_time(a: &mut Aggregates, us: &[&ApproxyUsage]) {
    if us.iter().any(|u| !u.target_call_records.is_empty()) {
        a.approxy_seconds = Some((
            us.iter().map(|u| u.target_seconds).sum(),
            us.iter().map(|u| u.target_calls_untimed).sum(),
        ));
    }
    a.calls = us
        .iter()
        .flat_map(|u| &u.target_call_records)
        .map(|c| ProjectedCall {
            cached: c.cached.min(c.sent),
            prefilled: c.sent.saturating_sub(c.cached),
            generated: c.generated,
        })
        .collect();
    a.windowed = us
        .iter()
        .any(|u| u.target_call_records.iter().any(|c| c.kind == "window"));
    a.radix_calls = us
        .iter()
        .flat_map(|u| radix_served(&u.target_call_records))
        .collect();
}

/// One request's calls as a server whose cache holds every token it has seen in the
/// request would serve them, and that starts a window's scoring one token before the window
/// (SGLang's `/generate` with `logprob_start_len`): each call computes what is new since the
/// previous call's prompt and answer, plus one token. What the same calls would cost an
/// SGLang target, where vLLM's windows recompute their whole prefix.
pub fn radix_served(records: &[super::client::CallRecord]) -> Vec<ProjectedCall> {
    let mut seen = 0u64;
    records
        .iter()
        .map(|c| {
            let cached = seen.min(c.sent.saturating_sub(1));
            seen = c.sent + c.generated;
            ProjectedCall {
                cached,
                prefilled: c.sent - cached,
                generated: c.generated,
            }
        })
        .collect()
}

/// Sums a run's prompts.
pub fn aggregate(run: &CallsRun) -> Aggregates {
    let gens: Vec<&Generation> = run.prompts.iter().map(|p| &p.generation).collect();
    let tokens: u64 = gens.iter().map(|g| g.completion_tokens).sum();
    let seconds: f64 = gens.iter().map(|g| g.seconds).sum();
    let ttfts: Vec<f64> = gens.iter().filter_map(|g| g.ttft).collect();
    let per100 = |x: u64| 100.0 * x as f64 / tokens.max(1) as f64;
    let mut a = Aggregates {
        n: run.prompts.len(),
        passed: run
            .prompts
            .iter()
            .filter(|p| p.verdict == Some(Verdict::Passed))
            .count(),
        errors: gens.iter().filter(|g| g.error.is_some()).count(),
        tokens,
        tok_s: tokens as f64 / seconds.max(1e-9),
        ttft_p50: super::stats::quantile(&ttfts, 0.5).unwrap_or(0.0),
        account: run.target_account,
        instructions: run.instructions,
        ..Aggregates::default()
    };
    if run.config.passthrough() {
        a.calls_per_100 = per100(gens.iter().filter(|g| g.error.is_none()).count() as u64);
        a.target_per_100 = 100.0;
        a.input = gens.iter().map(|g| g.prompt_tokens).sum();
        a.output = tokens;
        a.billed = Tokens {
            uncached_input: a.input,
            cached_input: 0,
            output: a.output,
        };
        a.calls = gens
            .iter()
            .filter(|g| g.error.is_none())
            .map(|g| ProjectedCall::passthrough(g.prompt_tokens, g.completion_tokens))
            .collect();
    } else {
        let us: Vec<_> = gens.iter().filter_map(|g| g.approxy.as_ref()).collect();
        a.calls_per_100 = per100(us.iter().map(|u| u.target_calls).sum());
        let generated: u64 = us.iter().map(|u| u.target_tokens).sum();
        a.target_per_100 = per100(generated);
        a.cost_guard = us.iter().filter(|u| u.cost_guard).count();
        a.lookup = (
            us.iter().map(|u| u.lookup_tokens).sum(),
            us.iter().map(|u| u.lookup_tokens_used).sum(),
        );
        a.guesses = (
            us.iter().map(|u| u.overlap_guesses).sum(),
            us.iter().map(|u| u.overlap_guesses_used).sum(),
        );
        a.windows = (
            us.iter().map(|u| u.windows).sum(),
            us.iter().map(|u| u.window_tokens).sum(),
        );
        a.input = us.iter().map(|u| u.target_input_tokens).sum();
        a.cacheable = us.iter().map(|u| u.target_cacheable_input_tokens).sum();
        a.inflight_billed = us.iter().map(|u| u.target_inflight_tokens).sum();
        a.output = generated
            + a.inflight_billed
            + us.iter().map(|u| u.target_discarded_tokens).sum::<u64>();
        // What the estimate priced as cached: the target's own figure where every call gave
        // one, else the cache rules' (as the engine does).
        let cached: u64 = us
            .iter()
            .map(|u| {
                u.target_reported_cached_tokens
                    .unwrap_or(u.target_cacheable_input_tokens)
                    .min(u.target_input_tokens)
            })
            .sum();
        a.billed = Tokens {
            uncached_input: a.input - cached,
            cached_input: cached,
            output: a.output,
        };
        // In the policy's unit (runs saved before the unit was reported are in USD).
        let cost = |u: &ApproxyUsage| u.estimated_cost.unwrap_or(u.estimated_cost_usd);
        let direct = |u: &ApproxyUsage| {
            u.estimated_passthrough_cost
                .unwrap_or(u.estimated_passthrough_cost_usd)
        };
        let spent: f64 = us.iter().map(|u| cost(u)).sum();
        a.estimated_usd = us
            .iter()
            .all(|u| u.cost_unit.as_deref().is_none_or(|x| x == "usd"))
            .then_some(spent);
        let passthrough: f64 = us.iter().map(|u| direct(u)).sum();
        if passthrough > 0.0 {
            let worst = us
                .iter()
                .filter(|u| direct(u) > 0.0)
                .map(|u| cost(u) / direct(u))
                .fold(0.0, f64::max);
            a.policy_ratio = Some((spent / passthrough, worst));
        }
        target_time(&mut a, &us);
        let mut reasons: std::collections::BTreeMap<&str, usize> = Default::default();
        for u in &us {
            if let Some(r) = &u.cost_guard_reason {
                *reasons.entry(r.as_str()).or_default() += 1;
            }
        }
        a.guard_reasons = reasons.iter().map(|(r, n)| format!("{r} {n}")).collect();
    }
    a
}

/// The run's bill under a price class: from the target's own counts where the run read them
/// (what it really computed, cancelled streams included), else from approxy's.
fn class_cost(a: &Aggregates, p: &PriceClass, cache: bool) -> f64 {
    let t = a.account.map_or(
        Tokens {
            uncached_input: a.input - a.cacheable.min(a.input),
            cached_input: a.cacheable.min(a.input),
            output: a.output,
        },
        |x| x.tokens(),
    );
    let input = t.uncached_input + t.cached_input;
    cost(p, input, if cache { t.cached_input } else { 0 }, t.output)
}

/// Chat agreement with the target-only run: exact-match share and mean ROUGE-L.
pub fn agreement(run: &CallsRun, baseline: &CallsRun) -> (f64, f64) {
    let pairs: Vec<(&str, &str)> = run
        .prompts
        .iter()
        .zip(&baseline.prompts)
        .map(|(a, b)| (a.generation.text.as_str(), b.generation.text.as_str()))
        .collect();
    let n = pairs.len().max(1) as f64;
    let exact = pairs.iter().filter(|(a, b)| a == b).count() as f64 / n;
    let rouge = pairs.iter().map(|(a, b)| rouge_l(a, b)).sum::<f64>() / n;
    (exact, rouge)
}

/// The Markdown report.
pub fn markdown(
    runs: &[CallsRun],
    base: &ModelPolicy,
    machine: &super::machine::Machine,
) -> String {
    let mut s = String::new();
    s.push_str(&format!(
        "Calls benchmark (`approxy bench calls`), report assembled {} on {}. Costs are the target's bill relative to the target-only run of the same prompts, layout and delay, under each price class: with the provider's prompt cache / without it. The default policy: confidence verifier at threshold {:.2}, {}, {} guard at max_cost_ratio {}.\n",
        super::machine::utc_now(),
        machine.line(),
        base.threshold,
        super::quality::correction_words(base.correction),
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

/// The shape the GPU goals are judged on: a 32B model serving 8 streams at once.
const GPU_GOAL_SHAPE: Shape = Shape::new("qwen2.5-32b", 8, 1024);

/// The committed H200 table, when it can be read (the report says so when not).
fn gpu_table() -> anyhow::Result<gpu_projection::Table> {
    // Relative to the repository root, where the benchmarks run (as their other paths are).
    gpu_projection::Table::load(Path::new(gpu_projection::TABLE_FILE))
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

/// The savings goals for API-priced targets, per llama.cpp configuration and sample, on the runs with
/// 0 ms per call (speed: also at 200 ms): cost at DeepSeek's prices with its cache at most 0.6x
/// target-only on HumanEval and 0.75x on chat; HumanEval pass@1 at most one problem below
/// target-only; at 200 ms per call at least target-only's speed. And the guard's own bounds at
/// the policy's prices: the run's aggregate at or below `max_cost_ratio`, no request above the
/// hard cap.
fn goals(runs: &[CallsRun], base: &ModelPolicy) -> String {
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
        if let (Some(t), Some(bt)) = (a.account, b.account) {
            let busy = t.busy_seconds() / bt.busy_seconds().max(1e-9);
            line.push_str(&format!(
                "; target busy time {:.2}x target-only's (≤ {}x: {})",
                busy,
                self.busy_bound,
                mark(busy <= self.busy_bound)
            ));
            if let Some(e) = a.estimated_usd {
                let d = difference_pct(e, base.price.cost_of(&t.tokens()));
                line.push_str(&format!(
                    "; approxy's estimate {d:+.1} % from the target's counts (within 3 %: {})",
                    mark(d.abs() <= 3.0)
                ));
            }
            if let Some((spent, untimed)) = a.approxy_seconds {
                let d = difference_pct(spent, t.busy_seconds());
                line.push_str(&format!(
                    "; approxy's account of the target's time {spent:.1} s ({untimed} calls untimed, at the learned rates) {d:+.1} % from its counters (within 5 %: {})",
                    mark(d.abs() <= 5.0)
                ));
            }
        }
        let projected = gpu_table()
            .and_then(|table| gpu_projection::compare(&table, GPU_GOAL_SHAPE, &a.calls, &b.calls));
        if a.windowed
            && let Ok(Some(x)) = gpu_table()
                .and_then(|t| gpu_projection::compare(&t, GPU_GOAL_SHAPE, &a.radix_calls, &b.calls))
                .map(|c| c.ratio())
        {
            line.push_str(&format!(
                "; its windows served from a radix cache as SGLang would (a what-if) {x:.2}x"
            ));
        }
        if let Ok(Some(x)) = projected.map(|c| c.ratio()) {
            line.push_str(&format!(
                "; projected on one H200 (32B, batch 8; from a measured table) {x:.2}x target-only's (≤ {}x: {})",
                self.gpu_bound,
                mark(x <= self.gpu_bound)
            ));
        }
        if self.sample == Sample::HumanEval {
            line.push_str(&format!(
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
            line.push_str(&format!(
                "; instructions followed {:.1} % of prompts against {:.1} % ({points:+.1} points; within 2: {})",
                100.0 * i.prompt_level_strict,
                100.0 * bi.prompt_level_strict,
                mark(points >= -2.0)
            ));
        }
        let find = |c: CallConfig| find_run(self.runs, self.sample, self.layout, 200, c);
        match (find(c), find(CallConfig::TargetOnly)) {
            (Some(r2), Some(b2)) => {
                let x = aggregate(r2).tok_s / aggregate(b2).tok_s.max(1e-9);
                line.push_str(&format!(
                    "; {:.2}x target-only's speed at 200 ms per call (≥ 1x: {})",
                    x,
                    mark(x >= 1.0)
                ));
            }
            _ => line.push_str("; 200 ms per call: not run"),
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use approxy_verifier::{Correction, SpanAsk};

    #[test]
    fn by_default_every_llama_cpp_configuration_runs_but_the_streamed_comparison() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            opts: CallsOptions,
        }
        let parse = |args: &[&str]| -> anyhow::Result<Vec<CallConfig>> {
            let cli = <Cli as clap::Parser>::try_parse_from(args)?;
            wanted_configs(&cli.opts)
        };
        let all = parse(&["calls"]).unwrap();
        assert!(all.contains(&CallConfig::Default) && all.contains(&CallConfig::DefaultLookup));
        assert!(!all.contains(&CallConfig::DefaultStreamed));
        assert!(!all.iter().any(|c| c.vllm()), "{all:?}");
        assert_eq!(
            parse(&["calls", "--only", "default,default-streamed"]).unwrap(),
            [CallConfig::Default, CallConfig::DefaultStreamed]
        );
    }

    #[test]
    fn a_radix_cache_serves_everything_a_request_sent_or_received_but_one_token() {
        let rec = |kind: &str, sent, cached, generated| crate::client::CallRecord {
            kind: kind.into(),
            sent,
            cached,
            generated,
        };
        // A prompt of 100, a span after 20 drafted tokens that brought 6, then a window of 8
        // after 30 more (vLLM recomputed its whole prefix: nothing cached).
        let calls = radix_served(&[rec("span", 120, 0, 6), rec("window", 164, 0, 1)]);
        assert_eq!(
            calls,
            [
                ProjectedCall {
                    cached: 0,
                    prefilled: 120,
                    generated: 6
                },
                // 126 seen; the window computes the 38 new tokens and starts one before them.
                ProjectedCall {
                    cached: 126,
                    prefilled: 38,
                    generated: 1
                },
            ]
        );
    }

    #[test]
    fn the_calls_policy_is_valid_and_configures_each_run_as_named() -> anyhow::Result<()> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../policies");
        let base = Policy::load(&root.join("default.toml"))?;
        let m = base
            .model("*")
            .cloned()
            .ok_or_else(|| anyhow::anyhow!("no *"))?;
        // As the benchmark serves them: the llama.cpp ones together, each vLLM one alone.
        let llama: Vec<CallConfig> = ALL.into_iter().filter(|c| !c.vllm()).collect();
        let mut sets = vec![(false, llama)];
        sets.extend(
            ALL.into_iter()
                .filter(|c| c.vllm())
                .map(|c| (true, vec![c])),
        );
        for (vllm, group) in sets {
            let text = policy_text("http://127.0.0.1:9", vllm, Layout::Shared, &m, &group)?;
            let p = Policy::parse(&text, &root.join("calls.toml"))?;
            for c in group {
                let got = p
                    .model(model_name(c))
                    .ok_or_else(|| anyhow::anyhow!("{}", c.id()))?;
                if c.passthrough() {
                    assert_eq!(got.mode, approxy_gateway::policy::Mode::Passthrough);
                    continue;
                }
                assert_eq!(got.overlap, c.id().ends_with("overlap"), "{}", c.id());
                // The shipped policy's spans ask for the fewest tokens on llama-server; on
                // vLLM, and in `default-streamed`, one streamed call a span.
                let want = match m.correction {
                    Correction::Span {
                        max_span,
                        resync,
                        end,
                        ..
                    } if c == CallConfig::DefaultStreamed || c.vllm() => Correction::Span {
                        max_span,
                        resync,
                        end,
                        ask: SpanAsk::All,
                    },
                    other => other,
                };
                assert_eq!(got.correction, want, "{}", c.id());
                let guard = match c {
                    CallConfig::Default
                    | CallConfig::DefaultLookup
                    | CallConfig::DefaultStreamed
                    | CallConfig::VllmDefault => m.guard,
                    CallConfig::Strict => GuardPolicy::Strict,
                    _ => GuardPolicy::Off,
                };
                assert_eq!(
                    (got.guard, got.max_cost_ratio),
                    (guard, m.max_cost_ratio),
                    "{}",
                    c.id()
                );
                assert_eq!(
                    got.verification == approxy_verifier::Verification::Exact,
                    c.id().contains("exact")
                );
            }
        }
        Ok(())
    }
}
