//! `approxy bench calls`'s flags: which prompts, layouts, delays and configurations.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::servers::{self, Layout};

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
pub(super) static RELAXED_RULE: std::sync::OnceLock<String> = std::sync::OnceLock::new();

pub(super) fn relaxed_rule() -> &'static str {
    RELAXED_RULE.get().map_or("ratio:0.5", String::as_str)
}
