//! The tools in the `approxy` command besides serving: set-up, verifier training and the
//! benchmarks. Built with the `tools` feature (on by default); a server build leaves it off
//! (`cargo build -p approxy --no-default-features`, as the container image does), so it links
//! none of the crates they need (the installer's archive readers, plotting, the trainer).

use std::path::PathBuf;
use std::time::Duration;

use clap::Subcommand;

use approxy_bench as bench;
use approxy_gateway::telemetry;
use approxy_setup as setup;
use approxy_training::cli as train;

use crate::cli::block_on;

#[derive(Subcommand)]
pub(crate) enum ToolCmd {
    /// Provide every model, binary and library approxy needs, under $APPROXY_HOME.
    Setup {
        /// Keep the (large) conversion venv after converting the draft model.
        #[arg(long)]
        keep_convert_env: bool,
        /// Also provide the vLLM test target (about 8.5 GB more; the test command uses it).
        #[arg(long)]
        vllm: bool,
        /// Also build the draft at other precisions, for `approxy bench draft-fidelity`.
        #[arg(long)]
        draft_variants: bool,
    },
    /// Benchmarks.
    Bench {
        #[command(subcommand)]
        what: BenchCmd,
    },
    /// Verifier training: collect labels from a real target, then fit and calibrate.
    Train {
        #[command(subcommand)]
        what: TrainCmd,
    },
}

#[derive(Subcommand)]
pub(crate) enum TrainCmd {
    /// Target answers + teacher-forced draft features, stored as safetensors shards (resumable).
    Collect {
        /// The target's URL: llama-server's root, or a base URL ending in `/v1` for the
        /// OpenAI-style kinds.
        #[arg(long, default_value = "http://127.0.0.1:8081")]
        target_url: String,
        /// Target kind, as in a policy: llama_cpp, vllm, openai_text or chat_prefix.
        #[arg(long, default_value = "llama_cpp", value_parser = approxy_verifier::TargetKind::parse)]
        target_kind: approxy_verifier::TargetKind,
        /// How a chat_prefix target continues an answer: prefix, continue_final_message or prefill.
        #[arg(long, default_value = "prefix", value_parser = approxy_verifier::targets::PrefixStyle::parse)]
        prefix_style: approxy_verifier::targets::PrefixStyle,
        /// Model id named in calls to OpenAI-style targets.
        #[arg(long, default_value = "")]
        target_model: String,
        /// Environment variable holding the target's API key.
        #[arg(long)]
        target_api_key_env: Option<String>,
        /// Prompt corpus (JSONL).
        #[arg(long, default_value = "training/data/prompts.jsonl")]
        corpus: PathBuf,
        /// Shard directory (default: $APPROXY_HOME/training/rows).
        #[arg(long)]
        data: Option<PathBuf>,
        /// Prompts to use, half code and half chat.
        #[arg(long, default_value_t = 240)]
        prompts: usize,
        /// Longest answer per prompt.
        #[arg(long, default_value_t = 48)]
        max_answer_tokens: u32,
        /// Instead of teacher forcing on the target's answer, record the positions the live
        /// decode loop visits at this threshold (confidence verifier), each labelled with the
        /// target's greedy token after that prefix. Written as live-*.safetensors beside the
        /// teacher-forced shards; `train fit` reads both.
        #[arg(long)]
        live_threshold: Option<f32>,
    },
    /// Fit logistic and MLP heads, keep the better, write artifact, calibration and report.
    Fit {
        /// Shard directory (default: $APPROXY_HOME/training/rows).
        #[arg(long)]
        data: Option<PathBuf>,
        /// Output directory.
        #[arg(long, default_value = "policies/verifier")]
        out_dir: PathBuf,
        /// Seed.
        #[arg(long, default_value_t = 7)]
        seed: u64,
        /// The target model the rows came from (what a policy's `target.model` must say to use
        /// the head).
        #[arg(long, default_value = approxy_verifier::verify::learned::DEFAULT_CALIBRATION_TARGET)]
        target: String,
        /// The corpus the rows' prompts come from (for the report by source).
        #[arg(long, default_value = "training/data/prompts.jsonl")]
        corpus: PathBuf,
        /// The acceptance rule the head learns and is calibrated against: `identical` (the
        /// draft's token is the target's), `sprinter`, `sprinter-hard`, `ratio:R`,
        /// `typical:EPS,DELTA` (see "Acceptance rules" in training/README.md). Other than `identical`,
        /// it needs rows that carry the target's probabilities.
        #[arg(long, default_value = "identical", value_parser = parse_rule)]
        rule: approxy_verifier::verify::AcceptanceRule,
    },
}

/// An acceptance rule as `--rule` takes it (`typical`'s two parameters with a comma or, as
/// the oracle's list takes them, a semicolon).
fn parse_rule(s: &str) -> Result<approxy_verifier::verify::AcceptanceRule, String> {
    approxy_verifier::verify::AcceptanceRule::parse(&s.replace(';', ","))
}

#[derive(Subcommand)]
pub(crate) enum BenchCmd {
    /// Draft decode speed (prefill and ms per token) on this machine.
    Draft {
        /// Tokens decoded per run.
        #[arg(long, default_value_t = 128)]
        tokens: usize,
        /// Runs (plus one warm-up).
        #[arg(long, default_value_t = 3)]
        runs: usize,
        /// Intra-op threads.
        #[arg(long, default_value_t = 2)]
        threads: usize,
        /// Let idle draft threads spin-wait (as with `spin_wait = true` in a policy).
        #[arg(long)]
        spin: bool,
        /// Tokens of earlier conversation before the prompt: decode speed at a long context.
        #[arg(long, default_value_t = 0)]
        context: usize,
        /// Root URL of a running llama-server with the target model: its decode speed calibrates
        /// this machine against the one the reference figures come from.
        #[arg(long)]
        target_url: Option<String>,
    },
    /// Target calls, speed and cost of the engine's call structures (spans, overlap, exact
    /// windows on vLLM) against target-only, per core layout and injected per-call delay.
    Calls {
        /// `humaneval` (pass@1) or `chat` (held-out chat prompts; agreement with target-only).
        #[arg(long, value_enum, default_value = "humaneval")]
        sample: bench::calls::Sample,
        /// Prompts: HumanEval problems spread over the 164, or the last N chat prompts.
        #[arg(long, default_value_t = 24)]
        prompts: usize,
        /// Core layouts, comma-separated: shared, pinned.
        #[arg(long, value_enum, default_value = "shared", value_delimiter = ',')]
        layouts: Vec<bench::servers::Layout>,
        /// Delay injected before every target call, milliseconds, comma-separated.
        #[arg(long = "target-delay", default_value = "0", value_delimiter = ',')]
        target_delay: Vec<u64>,
        /// Only these configurations (default: the llama.cpp ones): target-only, default,
        /// strict, span, span-overlap, vllm-target-only, vllm-exact, vllm-exact-overlap,
        /// vllm-approximate, vllm-default.
        #[arg(long, value_delimiter = ',')]
        only: Vec<String>,
        /// Results directory.
        #[arg(long, default_value = "deploy/results/calls")]
        out: PathBuf,
        /// Output limit per prompt.
        #[arg(long, default_value_t = 384)]
        max_tokens: u32,
        /// Policy whose "*" model is the default configuration.
        #[arg(long, default_value = "policies/default.toml")]
        base_policy: PathBuf,
        /// The training corpus (chat prompts).
        #[arg(long, default_value = "training/data/prompts.jsonl")]
        corpus: PathBuf,
        /// Ignore saved runs.
        #[arg(long)]
        fresh: bool,
    },
    /// Top-1 agreement with the target, speed, memory and size of each conversion of the draft
    /// (the shipped int4 and those `approxy setup --draft-variants` builds).
    DraftFidelity {
        /// Held-out calibration prompts per kind (code, chat).
        #[arg(long, default_value_t = 12)]
        per_kind: usize,
        /// Longest target answer per prompt.
        #[arg(long, default_value_t = 96)]
        max_answer_tokens: u32,
        /// Thread counts the decode speed is measured with.
        #[arg(long, default_value = "1,2", value_delimiter = ',')]
        threads: Vec<usize>,
        /// Decode steps per speed run.
        #[arg(long, default_value_t = 64)]
        decode_tokens: usize,
        /// Speed runs (after one warm-up).
        #[arg(long, default_value_t = 3)]
        runs: usize,
        /// The training corpus (its held-out prompts are the sample).
        #[arg(long, default_value = "training/data/prompts.jsonl")]
        corpus: PathBuf,
        /// Results directory.
        #[arg(long, default_value = "deploy/results/draft-fidelity")]
        out: PathBuf,
        /// Ignore saved answers and measurements.
        #[arg(long)]
        fresh: bool,
        /// Only these variants, comma-separated (default: all): int4-b128-acc4 (shipped), fp32,
        /// int4-b32-acc4, int4-b32-acc1, int8.
        #[arg(long, value_delimiter = ',')]
        only: Vec<String>,
    },
    /// What each acceptance rule allows: the target's own top-20 probabilities decide at every
    /// position (an oracle verifier); target share, pass@1 and the target's likelihood.
    Oracle {
        /// HumanEval problems, spread evenly (0: none).
        #[arg(long, default_value_t = 24)]
        problems: usize,
        /// Held-out chat prompts (0: none).
        #[arg(long, default_value_t = 40)]
        chat: usize,
        /// Output limit per code answer.
        #[arg(long, default_value_t = 256)]
        max_tokens: u32,
        /// Output limit per chat answer.
        #[arg(long, default_value_t = 128)]
        chat_max_tokens: u32,
        /// Instruction-following prompts (0: none), from `tests/bench/instructions/`.
        #[arg(long, default_value_t = 40)]
        instructions: usize,
        /// Output limit per instruction-following answer.
        #[arg(long, default_value_t = 160)]
        instructions_max_tokens: u32,
        /// The instruction-following set.
        #[arg(long, default_value = "tests/bench/instructions")]
        instructions_dir: PathBuf,
        /// Rules compared, comma-separated (`identical`, `sprinter`, `sprinter-hard`,
        /// `ratio:R`, `typical:EPS;DELTA` with a semicolon here).
        #[arg(
            long,
            default_value = "identical,sprinter,ratio:0.8,ratio:0.5,ratio:0.2,typical:0.09;0.3",
            value_delimiter = ','
        )]
        rules: Vec<String>,
        /// Local verifiers run under the same oracle, comma-separated: `confidence:T` (the
        /// draft's confidence at threshold T) or `CALIBRATION@FAR` (the confidence thresholds
        /// per kind that a rule's calibration file gives at that false-accept budget).
        #[arg(long, value_delimiter = ',')]
        verifiers: Vec<String>,
        /// Ask the target again at every position instead of reusing what an earlier run on
        /// this machine was told (kept under $APPROXY_HOME/work/bench-oracle-asked).
        #[arg(long)]
        fresh: bool,
        /// The training corpus (the chat sample's source).
        #[arg(long, default_value = "training/data/prompts.jsonl")]
        corpus: PathBuf,
        /// Results directory.
        #[arg(long, default_value = "deploy/results/oracle")]
        out: PathBuf,
        /// An `approxy bench calls` result whose pinned target-only runs give the target's
        /// milliseconds per prompt and per generated token, for the cheapest plans' busy time.
        #[arg(long, default_value = "deploy/results/calls/calls.json")]
        busy_from: PathBuf,
    },
    /// One variant's measurement, in a process of its own (started by draft-fidelity).
    #[command(hide = true)]
    DraftFidelityMeasure {
        #[arg(long)]
        model_dir: PathBuf,
        #[arg(long)]
        answers: PathBuf,
        #[arg(long)]
        result: PathBuf,
        #[arg(long, value_delimiter = ',')]
        threads: Vec<usize>,
        #[arg(long)]
        decode_tokens: usize,
        #[arg(long)]
        runs: usize,
    },
    /// HumanEval pass@1, speed and cost of every configuration (starts its own servers).
    Quality {
        /// Problems per configuration, spread evenly over HumanEval (0 = all 164).
        #[arg(long, default_value_t = 0)]
        problems: usize,
        /// Core layouts, comma-separated: shared, pinned.
        #[arg(
            long,
            value_enum,
            default_value = "shared,pinned",
            value_delimiter = ','
        )]
        layouts: Vec<bench::servers::Layout>,
        /// Only these configuration ids, comma-separated (default: all).
        #[arg(long, value_delimiter = ',')]
        only: Vec<String>,
        /// Results directory.
        #[arg(long, default_value = "deploy/results")]
        out: PathBuf,
        /// Output limit per problem.
        #[arg(long, default_value_t = 384)]
        max_tokens: u32,
        /// Seconds a problem's tests may run.
        #[arg(long, default_value_t = 10)]
        exec_timeout: u64,
        /// Calibration that names the levels.
        #[arg(long, default_value = "policies/verifier/calibration.json")]
        calibration: PathBuf,
        /// Learned verifier artifact.
        #[arg(long, default_value = "policies/verifier/default.json")]
        learned: PathBuf,
        /// Policy whose "*" entry gives bail-out, correction tokens and prices.
        #[arg(long, default_value = "policies/default.toml")]
        base_policy: PathBuf,
        /// Ignore results saved by an earlier, interrupted run.
        #[arg(long)]
        fresh: bool,
    },
    /// Latency the gateway adds in passthrough mode over a fast stub upstream, under load.
    Overhead {
        /// Offered request rates, comma-separated.
        #[arg(long, default_value = "100,500,1000,2000", value_delimiter = ',')]
        rates: Vec<u32>,
        /// Seconds per rate.
        #[arg(long, default_value_t = 10)]
        seconds: u32,
        /// Concurrent connections.
        #[arg(long, default_value_t = 50)]
        connections: u32,
        /// Results directory.
        #[arg(long, default_value = "deploy/results")]
        out: PathBuf,
    },
    /// Long runs with clients leaving mid-request: no failed or hung request, memory, file
    /// descriptors and slots flat, nothing left running (passthrough over a stub upstream, or
    /// the approximate path over the real llama-server).
    Soak {
        /// "passthrough", "approximate" or "attack" (500 idle connections, 64 slow-body
        /// clients and 20 normal streaming clients at once, over a stub upstream).
        #[arg(long, value_enum, default_value = "passthrough")]
        phase: SoakChoice,
        /// Passthrough: requests in all.
        #[arg(long, default_value_t = 100_000)]
        requests: u64,
        /// Passthrough: offered requests per second.
        #[arg(long, default_value_t = 500)]
        rate: u32,
        /// Approximate and attack: minutes.
        #[arg(long, default_value_t = 30.0)]
        minutes: f64,
        /// Approximate: concurrent clients (one draft worker each).
        #[arg(long, default_value_t = 2)]
        concurrency: usize,
        /// Share of clients that leave at a random moment mid-request.
        #[arg(long, default_value_t = 0.1)]
        disconnect_share: f64,
        /// Seconds after which an open request counts as hung.
        #[arg(long, default_value_t = 120)]
        hang_after: u64,
        /// Results directory.
        #[arg(long, default_value = "deploy/results")]
        out: PathBuf,
    },
    /// Rewrite the results section of tests/README.md from the JSON the benchmarks wrote.
    Report {
        /// Results directory.
        #[arg(long, default_value = "deploy/results")]
        out: PathBuf,
        /// Markdown file to update (between its bench-results markers): the tests' and
        /// benchmarks' reference.
        #[arg(long, default_value = "tests/README.md")]
        readme: PathBuf,
    },
}

/// What `bench soak --phase` runs: a soak of one path, or the attack mix (its own benchmark).
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub(crate) enum SoakChoice {
    Passthrough,
    Approximate,
    Attack,
}

/// Runs a tool command.
pub(crate) fn dispatch(cmd: ToolCmd) -> anyhow::Result<()> {
    if matches!(
        cmd,
        ToolCmd::Train { .. }
            | ToolCmd::Bench {
                what: BenchCmd::Quality { .. }
                    | BenchCmd::Calls { .. }
                    | BenchCmd::DraftFidelity { .. }
                    | BenchCmd::Oracle { .. }
                    | BenchCmd::Overhead { .. }
                    | BenchCmd::Soak { .. }
            }
    ) {
        telemetry::install_logging();
    }
    match cmd {
        ToolCmd::Setup {
            keep_convert_env,
            vllm,
            draft_variants,
        } => setup::Home::from_env().and_then(|home| {
            setup::run(
                &home,
                &setup::SetupOptions {
                    keep_convert_env,
                    vllm,
                    draft_variants,
                },
            )
        }),
        ToolCmd::Train {
            what:
                TrainCmd::Collect {
                    target_url,
                    target_kind,
                    prefix_style,
                    target_model,
                    target_api_key_env,
                    corpus,
                    data,
                    prompts,
                    max_answer_tokens,
                    live_threshold,
                },
        } => train::default_data_dir().and_then(|d| {
            train::run_collect(&train::CollectArgs {
                target_url,
                target_kind,
                prefix_style,
                target_model,
                target_api_key_env,
                corpus,
                data: data.unwrap_or(d),
                prompts,
                max_answer_tokens,
                live_threshold,
            })
        }),
        ToolCmd::Train {
            what:
                TrainCmd::Fit {
                    data,
                    out_dir,
                    seed,
                    target,
                    corpus,
                    rule,
                },
        } => train::default_data_dir().and_then(|d| {
            train::run_fit(&train::FitArgs {
                data: data.unwrap_or(d),
                out_dir,
                seed,
                target,
                corpus,
                rule,
            })
        }),
        ToolCmd::Bench {
            what:
                BenchCmd::Draft {
                    tokens,
                    runs,
                    threads,
                    spin,
                    context,
                    target_url,
                },
        } => bench::draft(&bench::DraftBenchOptions {
            tokens,
            runs: runs + 1,
            threads,
            spin,
            context,
            target_url,
        }),
        ToolCmd::Bench {
            what:
                BenchCmd::DraftFidelity {
                    per_kind,
                    max_answer_tokens,
                    threads,
                    decode_tokens,
                    runs,
                    corpus,
                    out,
                    fresh,
                    only,
                },
        } => block_on(bench::fidelity::run(&bench::fidelity::FidelityOptions {
            per_kind,
            max_answer_tokens,
            threads,
            decode_tokens,
            runs,
            corpus,
            out,
            fresh,
            only,
        })),
        ToolCmd::Bench {
            what:
                BenchCmd::Oracle {
                    problems,
                    chat,
                    max_tokens,
                    chat_max_tokens,
                    instructions,
                    instructions_max_tokens,
                    instructions_dir,
                    rules,
                    verifiers,
                    fresh,
                    corpus,
                    out,
                    busy_from,
                },
        } => {
            let rules = rules
                .iter()
                .map(|r| parse_rule(r))
                .collect::<Result<Vec<_>, String>>()
                .map_err(anyhow::Error::msg)?;
            let verifiers = verifiers
                .iter()
                .map(|v| bench::oracle::VerifierConfig::parse(v))
                .collect::<anyhow::Result<Vec<_>>>()?;
            block_on(bench::oracle::run(&bench::oracle::OracleOptions {
                problems,
                chat,
                max_tokens,
                chat_max_tokens,
                instructions,
                instructions_max_tokens,
                instructions_dir,
                rules,
                verifiers,
                fresh,
                corpus,
                out,
                busy_from: Some(busy_from),
            }))
        }
        ToolCmd::Bench {
            what:
                BenchCmd::DraftFidelityMeasure {
                    model_dir,
                    answers,
                    result,
                    threads,
                    decode_tokens,
                    runs,
                },
        } => bench::fidelity::measure(&bench::fidelity::MeasureOptions {
            model_dir,
            answers,
            result,
            threads,
            decode_tokens,
            runs,
        }),
        ToolCmd::Bench {
            what:
                BenchCmd::Calls {
                    sample,
                    prompts,
                    layouts,
                    target_delay,
                    only,
                    out,
                    max_tokens,
                    base_policy,
                    corpus,
                    fresh,
                },
        } => block_on(bench::calls::run(&bench::calls::CallsOptions {
            sample,
            prompts,
            layouts,
            delays_ms: target_delay,
            only,
            out,
            max_tokens,
            exec_timeout: Duration::from_secs(10),
            base_policy,
            corpus,
            fresh,
        })),
        ToolCmd::Bench {
            what:
                BenchCmd::Quality {
                    problems,
                    layouts,
                    only,
                    out,
                    max_tokens,
                    exec_timeout,
                    calibration,
                    learned,
                    base_policy,
                    fresh,
                },
        } => block_on(bench::quality::run(&bench::quality::QualityOptions {
            problems,
            layouts,
            only,
            out,
            max_tokens,
            exec_timeout: Duration::from_secs(exec_timeout),
            request_timeout: Duration::from_secs(900),
            calibration,
            learned,
            base_policy,
            fresh,
        })),
        ToolCmd::Bench {
            what:
                BenchCmd::Overhead {
                    rates,
                    seconds,
                    connections,
                    out,
                },
        } => block_on(bench::overhead::run(&bench::overhead::OverheadOptions {
            rates,
            seconds,
            connections,
            out,
        })),
        ToolCmd::Bench {
            what:
                BenchCmd::Soak {
                    phase,
                    requests,
                    rate,
                    minutes,
                    concurrency,
                    disconnect_share,
                    hang_after,
                    out,
                },
        } => {
            let phase = match phase {
                SoakChoice::Passthrough => bench::soak::SoakPhase::Passthrough,
                SoakChoice::Approximate => bench::soak::SoakPhase::Approximate,
                SoakChoice::Attack => {
                    return block_on(bench::attack::run(&bench::attack::AttackOptions {
                        minutes,
                        out,
                    }));
                }
            };
            block_on(bench::soak::run(&bench::soak::SoakOptions {
                phase,
                requests,
                rate,
                minutes,
                concurrency,
                disconnect_share,
                hang_after: std::time::Duration::from_secs(hang_after),
                out,
            }))
        }
        ToolCmd::Bench {
            what: BenchCmd::Report { out, readme },
        } => bench::report::update_readme(&out, &readme),
    }
}
