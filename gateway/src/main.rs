//! The `approxy` binary: `serve`, `setup`, `check`.

mod approx;
mod bench;
mod calibration;
mod error;
mod middleware;
mod openai;
mod passthrough;
mod policy;
mod server;
mod setup;
mod state;
mod telemetry;
mod template;
mod train;

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "approxy", version, about = "Approximate-verification gateway for OpenAI-compatible LLM APIs")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Serve the OpenAI-compatible API.
    Serve {
        /// Policy file.
        #[arg(long, default_value = "policies/default.toml", env = "APPROXY_POLICY")]
        policy: PathBuf,
        /// Address to listen on (port 0 picks a free port).
        #[arg(long, default_value = "127.0.0.1:8080", env = "APPROXY_LISTEN")]
        listen: SocketAddr,
        /// Draft workers (overrides the policy).
        #[arg(long)]
        workers: Option<usize>,
    },
    /// Provide every model, binary and library approxy needs, under $APPROXY_HOME.
    Setup {
        /// Keep the (large) conversion venv after converting the draft model.
        #[arg(long)]
        keep_convert_env: bool,
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
    /// Validate a policy file; exits non-zero listing every problem.
    Check {
        /// Policy file.
        #[arg(long)]
        policy: PathBuf,
    },
}

#[derive(Subcommand)]
enum TrainCmd {
    /// Target answers + teacher-forced draft features, stored as safetensors shards (resumable).
    Collect {
        /// Root URL of the llama-server target.
        #[arg(long, default_value = "http://127.0.0.1:8081")]
        target_url: String,
        /// Prompt corpus (JSONL).
        #[arg(long, default_value = "training/data/prompts.jsonl")]
        corpus: PathBuf,
        /// Shard directory (default: $APPROXY_HOME/training/rows).
        #[arg(long)]
        data: Option<PathBuf>,
        /// Prompts to use, half code and half chat.
        #[arg(long, default_value_t = 240)]
        prompts: usize,
        /// Longest target answer per prompt.
        #[arg(long, default_value_t = 48)]
        max_answer_tokens: u32,
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
    },
}

#[derive(Subcommand)]
enum BenchCmd {
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
        /// Root URL of a running llama-server with the target model: its decode speed calibrates
        /// this machine against the one the reference figures come from.
        #[arg(long)]
        target_url: Option<String>,
    },
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    if matches!(cli.command, Cmd::Train { .. }) {
        telemetry::install_logging();
    }
    let result = match cli.command {
        Cmd::Setup { keep_convert_env } => setup::Home::from_env()
            .and_then(|home| setup::run(&home, &setup::SetupOptions { keep_convert_env })),
        Cmd::Check { policy } => check(&policy),
        Cmd::Train { what: TrainCmd::Collect { target_url, corpus, data, prompts, max_answer_tokens } } => train::default_data_dir()
            .and_then(|d| train::run_collect(&train::CollectArgs { target_url, corpus, data: data.unwrap_or(d), prompts, max_answer_tokens })),
        Cmd::Train { what: TrainCmd::Fit { data, out_dir, seed } } => {
            train::default_data_dir().and_then(|d| train::run_fit(&train::FitArgs { data: data.unwrap_or(d), out_dir, seed }))
        }
        Cmd::Bench { what: BenchCmd::Draft { tokens, runs, threads, spin, target_url } } => {
            bench::draft(&bench::DraftBenchOptions { tokens, runs: runs + 1, threads, spin, target_url })
        }
        Cmd::Serve { policy, listen, workers } => {
            telemetry::install_logging();
            tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .map_err(anyhow::Error::from)
                .and_then(|rt| rt.block_on(server::serve(server::ServeOptions { policy, listen, workers })))
        }
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn check(path: &std::path::Path) -> anyhow::Result<()> {
    match policy::Policy::load(path) {
        Ok(p) => {
            println!("{}: ok ({} model entries, target {})", path.display(), p.models.len(), p.target.base_url);
            Ok(())
        }
        Err(e) => {
            eprintln!("{}: {} problem(s)", e.path, e.problems.len());
            for p in &e.problems {
                eprintln!("  - {p}");
            }
            anyhow::bail!("invalid policy")
        }
    }
}
