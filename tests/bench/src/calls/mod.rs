//! `approxy bench calls`: the engine's call structure against target-only. On a HumanEval
//! sample (pass@1) or on held-out chat prompts (agreement with the target-only answer), per
//! core layout and per injected per-call delay (a remote API's round trip), it runs:
//! - `target-only`: the gateway in passthrough;
//! - `default`: the shipped policy's `"*"` model as it is (spans, its guard: budget);
//! - `strict`: the same with `guard = "strict"` (the earlier default, kept to compare with);
//! - `span`: the same with the cost guard off, so the spans themselves are measured;
//! - `span-overlap`: `span` with drafting while the target works;
//! - `vllm-target-only`, `vllm-exact`, `vllm-exact-overlap`: vLLM serving the draft's float32
//!   checkpoint, passthrough and exact windows (guard off), without and with overlap.
//!
//! Costs are reported under every price class in [`crate::prices`], relative to target-only
//! on the same sample, layout and delay. Each finished run is saved under `raw/` and reused
//! by a rerun over the same prompts.
//!
//! Layout:
//! - `options`, `config`: the flags, and the configurations they name.
//! - `tasks`, `policy`: the sample's prompts, and the policy that serves each configuration.
//! - `run`: the runs, per layout, target and delay; `saved`: each run as saved and reused.
//! - `aggregate`: a run summed; `markdown`, `goals`: the report and the goals it judges.

mod aggregate;
mod config;
mod goals;
mod markdown;
mod options;
mod policy;
mod run;
mod saved;
mod tasks;

pub use aggregate::{Aggregates, aggregate, agreement, radix_served};
pub use config::{ALL, CallConfig, LOOKUP_TOKENS};
pub use markdown::markdown;
pub use options::{CallsOptions, Sample};
pub use run::run;
pub use saved::{CallsRun, PromptRun, load_all};

pub(crate) use policy::{model_name, raw_policy};
pub(crate) use tasks::{Task, tasks};
