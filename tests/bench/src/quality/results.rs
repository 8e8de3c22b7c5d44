//! What `quality.json` holds: every run's summary, the levels, the prices and the settings.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::humaneval::Sandbox;
use crate::levels::Level;
use crate::summary::RunSummary;

/// Everything `quality.json` holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct QualityReport {
    /// When the report was assembled (UTC).
    pub generated_at: String,
    /// CPU, cores, memory.
    pub machine: crate::machine::Machine,
    /// HumanEval problems per configuration.
    pub problems: usize,
    /// Of HumanEval's 164.
    pub problems_total: usize,
    /// Output limit.
    pub max_tokens: u32,
    /// Stop strings.
    pub stop: Vec<String>,
    /// How generated code was isolated.
    pub sandbox: Sandbox,
    /// Test timeout, seconds.
    pub exec_timeout_secs: f64,
    /// The calibrated levels.
    pub levels: Vec<Level>,
    /// Prices (USD per million tokens).
    pub price: PriceTable,
    /// Bail-out and correction settings used for approxy.
    pub approxy_settings: ApproxySettings,
    /// llama.cpp speculative settings.
    pub llama_speculative_args: Vec<String>,
    /// Summaries per layout and configuration (problem details stay in `raw/`).
    pub runs: Vec<RunSummary>,
}

/// The approximate-mode settings besides the threshold, from the base policy.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ApproxySettings {
    /// What a rejection asks the target for, in words ("1 target token", "a streamed span
    /// of up to 32 tokens, ended after 3 the draft predicts").
    #[serde(default)]
    pub correction: String,
    /// Target tokens taken after each rejection (results written before spans existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub correction_tokens: Option<u32>,
    /// The cost guard's ratio (results written before the guard existed have none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cost_ratio: Option<f64>,
    /// Bail-out window (decisions).
    pub bailout_window: Option<usize>,
    /// Bail-out when more than this share of the window was rejected.
    pub bailout_max_rejection_rate: Option<f32>,
    /// The policy file they come from.
    pub from: PathBuf,
}

/// A price table.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PriceTable {
    /// Input.
    pub input: f64,
    /// Re-sent input with a prompt cache.
    pub cached_input: f64,
    /// Output.
    pub output: f64,
}
