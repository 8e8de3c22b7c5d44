//! `approxy train collect` and `approxy train fit`: the commands, wiring this crate's
//! collection, fitting and report to the draft runtime, the chat template and the cache home.
//! Their flags are declared here, on the options (clap); the `approxy` binary parses them and
//! calls these.
//!
//! Layout:
//! - `collect`, `fit`: the two commands, their flags and their steps.
//! - `heads`: the split by prompt and every head fitted and ranked.
//! - `scoring`: verifiers' scores and AUCs on the held-out rows, by kind and by source.
//! - `budgets`: the false-accept budgets the shipped policies name.
//! - `calibration`: the calibration record of a fit.
//! - `output`, `markdown`: what a fit writes, and its report.
//! - `data_dir`: where collected rows live.

mod budgets;
mod calibration;
mod collect;
mod data_dir;
mod fit;
mod heads;
mod markdown;
mod output;
mod scoring;

pub use budgets::{POLICY_BUDGETS, PolicyBudget};
pub use collect::{CollectArgs, run_collect};
pub use data_dir::default_data_dir;
pub use fit::{FitArgs, parse_rule, run_fit};
pub use markdown::markdown;
