//! `approxy bench quality`'s flags.

use std::path::PathBuf;
use std::time::Duration;

use clap::builder::TypedValueParser as _;

use crate::servers::Layout;

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
