//! `approxy bench quality`: HumanEval through every configuration a user would weigh
//! approxy against, on this machine's cores shared and pinned.
//!
//! Configurations, per layout:
//! - (a) target only, through the gateway in passthrough mode;
//! - (b) approxy with the learned verifier at the calibration's economy/default/strict levels;
//! - (c) approxy with the draft-confidence baseline at the accept rates (b) has;
//! - (d) draft only (threshold 0);
//! - (e) llama-server's own speculative decoding with the same draft GGUF, called directly.
//!
//! Every call is a greedy streaming `/v1/completions` request; pass@1 is checked after a
//! configuration's generations are done, so test execution never competes with timing. Each
//! (layout, configuration) result is saved as soon as it is complete and reused by a rerun
//! over the same problems, so an interrupted benchmark resumes.
//!
//! Layout: `options` (the flags), `policy` (the policy served), `run` (the configurations per
//! layout), `results` (what `quality.json` holds), `markdown` (`quality.md`).

mod markdown;
mod options;
mod policy;
mod results;
mod run;

pub use markdown::quality_markdown;
pub use options::QualityOptions;
pub use policy::correction_words;
pub use results::{ApproxySettings, PriceTable, QualityReport};
pub use run::run;

pub(crate) use policy::raw_correction;

pub use super::configs::{Config, Route, configs};
pub use super::summary::{ConfigRun, ProblemRun, RunSummary, Summary, summarize};
