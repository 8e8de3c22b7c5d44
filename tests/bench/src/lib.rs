//! `approxy bench`: speed, quality and cost measurements that anyone can rerun. Goals live
//! here, never in timed tests.
//!
//! Layout:
//! - `draft`: decode speed of the ONNX draft alone.
//! - `quality`: HumanEval through every configuration (target only, approxy at the calibrated
//!   levels, the confidence baseline at matching accept rates, draft only, llama.cpp's own
//!   speculative decoding), on shared and on pinned cores.
//! - `calls`: the engine's call structure (spans, overlap, exact windows on vLLM) against
//!   target-only, on HumanEval or held-out chat, per core layout and per-call delay (`delay`:
//!   the proxy that injects it), with costs under each provider class in `prices`.
//! - `oracle`: what each acceptance rule allows, the target's probabilities deciding at every
//!   position (target share, pass@1, the target's likelihood of the answers), and what the
//!   cheapest call plan for those answers would cost (`call_floor`).
//! - `gpu_projection`: approxy's calls and passthrough's priced in a GPU target's time, a
//!   projection from a measured table (`tests/bench/gpu/window_cost.json`).
//! - `structured`: structured output (JSON Schemas, JSON mode) through approxy against
//!   target-only: validity, field agreement, who wrote the tokens, and compile times.
//! - `overhead`: what passthrough adds over calling a fast stub upstream directly.
//! - `soak`: long passthrough and approximate runs with clients leaving, for leaks and hangs;
//!   `attack`: the gateway under idle, slow-body and normal clients at once; `soak_cmd`:
//!   `approxy bench soak`'s flags, which name a soak or the attack mix.
//! - `report`: the results section in tests/README.md, from the results and Markdown the
//!   others wrote; it imports the benchmarks, none of them imports it.
//! - `configs`, `summary`: the configurations the quality benchmark runs, and their results.
//! - `levels`: the quality levels, resolved through the calibration file.
//! - `servers`: llama-server and `approxy serve` started per core layout.
//! - `client`, `humaneval`, `instructions`, `stats`, `chart`: requests, sandboxed test runs, the
//!   instruction-following set and its checkers, statistics, charts.
//! - `machine`: the machine a benchmark ran on and the time it finished, for every result file.

pub mod attack;
mod call_floor;
pub mod calls;
mod chart;
mod chat_sample;
mod client;
pub mod concurrency;
pub mod configs;
mod delay;
pub mod draft;
pub mod fidelity;
pub mod gpu_projection;
use approxy_training::humaneval;
use approxy_training::instructions;
mod levels;
pub mod machine;
pub mod oracle;
pub mod overhead;
mod prices;
pub mod quality;
pub mod report;
pub mod servers;
pub mod soak;
pub mod soak_cmd;
mod stats;
pub mod streams;
pub mod structured;
pub mod summary;
mod target_account;

pub use draft::{DraftBenchOptions, draft};
