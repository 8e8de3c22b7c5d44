//! The tools in the `approxy` command besides serving: set-up, verifier training and the
//! benchmarks. Built with the `tools` feature (on by default); a server build leaves it off
//! (`cargo build -p approxy --no-default-features`, as the container image does), so it links
//! none of the crates they need (the installer's archive readers, plotting, the trainer).

use std::path::PathBuf;

use clap::Subcommand;

use approxy_bench as bench;
use approxy_gateway::telemetry;
use approxy_setup as setup;
use approxy_training::cli as train;

use crate::runtime::block_on;

#[derive(Subcommand)]
pub(crate) enum ToolCmd {
    /// Provide every model, binary and library approxy needs, under $APPROXY_HOME.
    Setup(setup::SetupOptions),
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
    Collect(train::CollectArgs),
    /// Fit logistic and MLP heads, keep the better, write artifact, calibration and report.
    Fit(train::FitArgs),
    /// Importance labels on HumanEval: does the draft's token, where it differs from the
    /// target's, change the tests' verdict once the target finishes? (resumable shards)
    Importance(approxy_training::importance_cli::ImportanceArgs),
    /// Rows for an importance router: the draft's features along every labelled answer,
    /// labelled acceptable unless the position is important.
    ImportanceRows(approxy_training::importance_cli::ImportanceRowsArgs),
}

#[derive(Subcommand)]
pub(crate) enum BenchCmd {
    /// Draft decode speed (prefill and ms per token) on this machine.
    Draft(bench::DraftBenchOptions),
    /// The draft's batched decode across concurrent streams in one worker: throughput, each
    /// stream's speed and the memory each adds.
    Streams(bench::streams::StreamsOptions),
    /// How many users one target serves through approxy: C concurrent clients through the
    /// shipped policy and through passthrough, per core layout (resumable).
    Concurrency(bench::concurrency::ConcurrencyOptions),
    /// Structured output (JSON Schemas, JSON mode) through the shipped policy against
    /// target-only: validity, field agreement, forced and target tokens, compile times.
    Structured(bench::structured::StructuredOptions),
    /// Target calls, speed and cost of the engine's call structures (spans, overlap, exact
    /// windows on vLLM) against target-only, per core layout and injected per-call delay.
    Calls(bench::calls::CallsOptions),
    /// Top-1 agreement with the target, speed, memory and size of each conversion of the draft
    /// (the shipped int4 and those `approxy setup --draft-variants` builds).
    DraftFidelity(bench::fidelity::FidelityOptions),
    /// What each acceptance rule allows: the target's own top-20 probabilities decide at every
    /// position (an oracle verifier); target share, pass@1 and the target's likelihood.
    // Boxed: its lists make it the largest variant by far.
    Oracle(Box<bench::oracle::OracleOptions>),
    /// One variant's measurement, in a process of its own (started by draft-fidelity).
    #[command(hide = true)]
    DraftFidelityMeasure(bench::fidelity::MeasureOptions),
    /// HumanEval pass@1, speed and cost of every configuration (starts its own servers).
    Quality(bench::quality::QualityOptions),
    /// Latency the gateway adds in passthrough mode over a fast stub upstream, under load.
    Overhead(bench::overhead::OverheadOptions),
    /// Long runs with clients leaving mid-request: no failed or hung request, memory, file
    /// descriptors and slots flat, nothing left running (passthrough over a stub upstream, or
    /// the approximate path over the real llama-server).
    Soak(bench::soak_cmd::SoakArgs),
    /// Rewrite the results section of tests/README.md from the JSON the benchmarks wrote.
    Report {
        /// Results directory.
        #[arg(long, default_value = "tests/bench/results")]
        out: PathBuf,
        /// Markdown file to update (between its bench-results markers): the tests' and
        /// benchmarks' reference.
        #[arg(long, default_value = "tests/README.md")]
        readme: PathBuf,
    },
}

/// Runs a tool command.
pub(crate) fn dispatch(cmd: ToolCmd) -> anyhow::Result<()> {
    if matches!(
        cmd,
        ToolCmd::Train { .. }
            | ToolCmd::Bench {
                what: BenchCmd::Quality(_)
                    | BenchCmd::Calls(_)
                    | BenchCmd::Structured(_)
                    | BenchCmd::DraftFidelity(_)
                    | BenchCmd::Oracle(_)
                    | BenchCmd::Overhead(_)
                    | BenchCmd::Soak(_)
            }
    ) {
        telemetry::install_logging();
    }
    match cmd {
        ToolCmd::Setup(opts) => setup::Home::from_env().and_then(|home| setup::run(&home, &opts)),
        ToolCmd::Train { what } => match what {
            TrainCmd::Collect(a) => a.with_data_dir().and_then(|a| train::run_collect(&a)),
            TrainCmd::Fit(a) => a.with_data_dir().and_then(|a| train::run_fit(&a)),
            TrainCmd::Importance(a) => approxy_training::importance_cli::run_importance(&a),
            TrainCmd::ImportanceRows(a) => {
                approxy_training::importance_cli::run_importance_rows(&a)
            }
        },
        ToolCmd::Bench { what } => match what {
            BenchCmd::Draft(opts) => bench::draft(&opts),
            BenchCmd::Streams(opts) => bench::streams::streams(&opts),
            BenchCmd::Concurrency(opts) => block_on(bench::concurrency::run(&opts)),
            BenchCmd::Structured(opts) => block_on(bench::structured::run(&opts)),
            BenchCmd::DraftFidelity(opts) => block_on(bench::fidelity::run(&opts)),
            BenchCmd::Oracle(opts) => {
                let opts = (*opts).parse_lists()?;
                block_on(bench::oracle::run(&opts))
            }
            BenchCmd::DraftFidelityMeasure(opts) => bench::fidelity::measure(&opts),
            BenchCmd::Calls(opts) => block_on(bench::calls::run(&opts)),
            BenchCmd::Quality(opts) => block_on(bench::quality::run(&opts)),
            BenchCmd::Overhead(opts) => block_on(bench::overhead::run(&opts)),
            BenchCmd::Soak(args) => block_on(args.run()),
            BenchCmd::Report { out, readme } => bench::report::update_readme(&out, &readme),
        },
    }
}
