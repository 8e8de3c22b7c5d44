//! `approxy bench oracle`'s flags: the sample, the rules, the verifiers and the judged
//! windows it compares.

use std::path::PathBuf;

use approxy_training::cli::parse_rule;
use approxy_verifier::verify::AcceptanceRule;

use super::decide::{JudgedConfig, VerifierConfig};

/// The target's top entries asked for at each position (as label collection keeps).
pub(super) const TOP_K: u32 = 20;

/// What to run.
#[derive(Debug, Clone, clap::Args)]
pub struct OracleOptions {
    /// HumanEval problems, spread evenly (0: none).
    #[arg(long, default_value_t = 24)]
    pub problems: usize,
    /// Held-out chat prompts (0: none).
    #[arg(long, default_value_t = 40)]
    pub chat: usize,
    /// Output limit per code answer.
    #[arg(long, default_value_t = 256)]
    pub max_tokens: u32,
    /// Output limit per chat answer.
    #[arg(long, default_value_t = 128)]
    pub chat_max_tokens: u32,
    /// Instruction-following prompts (0: none), from `tests/bench/instructions/`.
    // The first of the set.
    #[arg(long, default_value_t = 40)]
    pub instructions: usize,
    /// Output limit per instruction-following answer.
    #[arg(long, default_value_t = 160)]
    pub instructions_max_tokens: u32,
    /// The instruction-following set.
    // `prompts.jsonl`, `score.py`, `requirements.txt`.
    #[arg(long, default_value = "tests/bench/instructions")]
    pub instructions_dir: PathBuf,
    /// Rules compared, comma-separated (`identical`, `sprinter`, `sprinter-hard`,
    /// `ratio:R`, `typical:EPS;DELTA` with a semicolon here).
    #[arg(
        long = "rules",
        value_name = "RULES",
        default_value = "identical,sprinter,ratio:0.8,ratio:0.5,ratio:0.2,typical:0.09;0.3",
        value_delimiter = ','
    )]
    pub rule_names: Vec<String>,
    /// The rules compared (besides target-only and draft-only): `--rules` parsed by
    /// [`OracleOptions::parse_lists`].
    #[arg(skip)]
    pub rules: Vec<AcceptanceRule>,
    /// Local verifiers run under the same oracle, comma-separated: `confidence:T` (the
    /// draft's confidence at threshold T) or `CALIBRATION@FAR` (the confidence thresholds
    /// per kind that a rule's calibration file gives at that false-accept budget).
    #[arg(long = "verifiers", value_name = "VERIFIERS", value_delimiter = ',')]
    pub verifier_names: Vec<String>,
    /// The local verifiers: `--verifiers` parsed by [`OracleOptions::parse_lists`].
    #[arg(skip)]
    pub verifiers: Vec<VerifierConfig>,
    /// Judged windows run under the same oracle, comma-separated: `T` or `T@K` (the draft's
    /// confidence at threshold T judges the differences, windows of at most K draft tokens,
    /// 16 when not given).
    #[arg(long = "judged", value_name = "JUDGED", value_delimiter = ',')]
    pub judged_names: Vec<String>,
    /// The judged windows: `--judged` parsed by [`OracleOptions::parse_lists`].
    #[arg(skip)]
    pub judged: Vec<JudgedConfig>,
    /// Ask the target again at every position instead of reusing what an earlier run on
    /// this machine was told (kept under $APPROXY_HOME/work/bench-oracle-asked).
    #[arg(long)]
    pub fresh: bool,
    /// The training corpus (the chat sample's source).
    #[arg(long, default_value = "training/data/prompts.jsonl")]
    pub corpus: PathBuf,
    /// Results directory.
    #[arg(long, default_value = "tests/bench/results/oracle")]
    pub out: PathBuf,
    /// An `approxy bench calls` result whose pinned target-only runs give the target's
    /// milliseconds per prompt and per generated token, for the cheapest plans' busy time.
    // None: no busy time (the flag always gives one).
    #[arg(long, default_value = "tests/bench/results/calls/calls.json")]
    pub busy_from: Option<PathBuf>,
}

impl OracleOptions {
    /// These options with [`OracleOptions::rules`] and [`OracleOptions::verifiers`] parsed
    /// from their flags' text.
    // Not clap's value parsers: a bad rule or verifier is the run's error, not a usage error.
    pub fn parse_lists(self) -> anyhow::Result<Self> {
        let rules = self
            .rule_names
            .iter()
            .map(|r| parse_rule(r))
            .collect::<Result<Vec<_>, String>>()
            .map_err(anyhow::Error::msg)?;
        let verifiers = self
            .verifier_names
            .iter()
            .map(|v| VerifierConfig::parse(v))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let judged = self
            .judged_names
            .iter()
            .map(|v| JudgedConfig::parse(v))
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(Self {
            rules,
            verifiers,
            judged,
            ..self
        })
    }
}
