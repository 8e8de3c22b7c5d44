//! Running the configurations: per layout and target, per delay, each prompt in turn, then
//! the answers checked.

use std::path::{Path, PathBuf};
use std::time::Duration;

use approxy_gateway::policy::{ModelPolicy, Policy};
use approxy_setup::Home;

use super::config::{ALL, CallConfig};
use super::markdown::markdown;
use super::options::{CallsOptions, RELAXED_RULE, Sample};
use super::policy::{model_name, policy_text};
use super::saved::{CallsRun, PromptRun, load_all, load_saved, raw_path};
use super::tasks::{Task, tasks};
use crate::client::{self, Ask};
use crate::delay;
use crate::humaneval::{self, Sandbox, Verdict};
use crate::instructions::{InstructionScores, score_run};
use crate::servers::{self, Layout, Server};
use crate::target_account;

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
    check_answers(ctx, &mut prompts).await?;
    let instructions = instruction_scores(ctx, c, &prompts).await?;
    Ok(CallsRun {
        instructions,
        sample: ctx.opts.sample,
        layout: layout.name().into(),
        delay_ms: delay,
        max_tokens: ctx.opts.max_tokens,
        config: c,
        finished_at: crate::machine::utc_now(),
        prompts,
        target_account,
        machine: Some(crate::machine::Machine::read().line()),
    })
}

/// Each HumanEval answer's verdict from its problem's tests (a failed generation fails).
async fn check_answers(ctx: &Ctx<'_>, prompts: &mut [PromptRun]) -> anyhow::Result<()> {
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
    Ok(())
}

/// The instruction checkers' scores of configuration `c`'s answers, on the instruction sample.
async fn instruction_scores(
    ctx: &Ctx<'_>,
    c: CallConfig,
    prompts: &[PromptRun],
) -> anyhow::Result<Option<InstructionScores>> {
    if ctx.opts.sample != Sample::Instructions {
        return Ok(None);
    }
    let answers = prompts
        .iter()
        .map(|p| (p.id.clone(), p.generation.text.clone()))
        .collect();
    score_run(
        ctx.home,
        &ctx.opts.instructions_dir,
        &ctx.scratch,
        c.id(),
        answers,
    )
    .await
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
    let md = markdown(&runs, &base_model, &crate::machine::Machine::read());
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
