//! `approxy train fit`: every head fitted on the collected rows, the best chosen against the
//! confidence baseline, and the artifact, calibration and report written.

use std::path::PathBuf;
use std::time::Instant;

use approxy_verifier::verify::AcceptanceRule;
use approxy_verifier::verify::learned::DEFAULT_CALIBRATION_TARGET;

use super::calibration::calibration;
use super::data_dir::data_dir;
use super::heads::{Split, fit_heads};
use super::output::write_fit;
use crate::dataset::{Rows, load_dir};

/// `approxy train fit` options.
#[derive(Debug, Clone, clap::Args)]
pub struct FitArgs {
    /// Shard directory (default: $APPROXY_HOME/training/rows).
    #[arg(long = "data", value_name = "DATA")]
    pub data_flag: Option<PathBuf>,
    /// The shard directory read: `--data`, or the default ([`FitArgs::with_data_dir`]).
    #[arg(skip)]
    pub data: PathBuf,
    /// Output directory.
    #[arg(long, default_value = "policies/verifier")]
    pub out_dir: PathBuf,
    /// Seed.
    // Of the split, the initialisation and the shuffling.
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    /// The target model the rows came from (what a policy's `target.model` must say to use
    /// the head).
    #[arg(long, default_value = DEFAULT_CALIBRATION_TARGET)]
    pub target: String,
    /// The corpus the rows' prompts come from (for the report by source).
    // Left out of the report when the file cannot be read.
    #[arg(long, default_value = "training/data/prompts.jsonl")]
    pub corpus: PathBuf,
    /// The acceptance rule the head learns and is calibrated against: `identical` (the
    /// draft's token is the target's), `sprinter`, `sprinter-hard`, `ratio:R`,
    /// `typical:EPS,DELTA` (see "Acceptance rules" in training/README.md). Other than `identical`,
    /// it needs rows that carry the target's probabilities.
    #[arg(long, default_value = "identical", value_parser = parse_rule)]
    pub rule: AcceptanceRule,
}

impl FitArgs {
    /// These options with [`FitArgs::data`] filled in.
    pub fn with_data_dir(self) -> anyhow::Result<Self> {
        let data = data_dir(self.data_flag.clone())?;
        Ok(Self { data, ..self })
    }
}

/// An acceptance rule as `--rule` takes it (`typical`'s two parameters with a comma or, as
/// `approxy bench oracle --rules` takes them, a semicolon).
pub fn parse_rule(s: &str) -> Result<AcceptanceRule, String> {
    AcceptanceRule::parse(&s.replace(';', ","))
}

/// Fits both heads, picks the better on held-out AUC, writes artifact + calibration + report.
pub fn run_fit(a: &FitArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    let rows = labelled_rows(a)?;
    let split = Split::new(&rows, a.seed);
    eprintln!(
        "{} rows: {} train, {} held out",
        rows.len(),
        split.train.len(),
        split.held.len()
    );
    let mut fitted = fit_heads(&rows, &split, a.seed)?;
    // Named only when it is not the shipped pair's target, so the committed artifact
    // regenerates byte for byte.
    fitted.best.artifact.target =
        (a.target != DEFAULT_CALIBRATION_TARGET).then(|| a.target.clone());
    fitted.best.artifact.rule = (a.rule != AcceptanceRule::Identical).then(|| a.rule.to_string());
    let calibration = calibration((&a.corpus, a.seed), &rows, &split, &fitted, started);
    write_fit(&a.out_dir, &fitted, &calibration)
}

/// The rows under `--data` labelled by `--rule`: those that carry what the rule is computed
/// from.
fn labelled_rows(a: &FitArgs) -> anyhow::Result<Rows> {
    let all = load_dir(&a.data)?;
    let rows = all.labelled_by(&a.rule);
    if rows.is_empty() {
        anyhow::bail!(
            "none of the {} rows in {} carries the target's probabilities, which the rule {} is computed from; collect again with a target that returns them (llama.cpp)",
            all.len(),
            a.data.display(),
            a.rule
        );
    }
    if rows.len() < all.len() {
        eprintln!(
            "rule {}: {} of {} rows carry the target's probabilities and are used",
            a.rule,
            rows.len(),
            all.len()
        );
    }
    Ok(rows)
}
