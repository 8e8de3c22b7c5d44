//! Sequential approximate verification: draft a token, score it, emit it when the verifier
//! accepts; on rejection ask the target to continue the exact token prefix, emit its tokens
//! and feed them to the draft's KV cache. A correction is either a fixed number of target
//! tokens or a streamed span that ends as soon as the draft, following the target, predicts
//! it again with confidence. The target writes the rest of the answer in one call when
//! rejections exceed the policy's budget, or when another call could make the request cost
//! more than passing it through (the cost guard).

mod calls;
mod cursor;
mod engine;
mod lookup;
mod pacing;
mod repeats;
mod request;
mod run;
mod stats;
mod warm;

pub use crate::cost::TOKENS_IN_FLIGHT_AT_CLOSE;
pub use calls::{CallKind, CallRecord, TargetTime, target_time};
pub use cursor::OVERLAP_MAX_AHEAD;
pub use engine::{Engine, TIE_MARGIN};
pub use pacing::{BailoutBudget, WINDOW_MAX, WINDOW_MAX_LIMIT, WINDOW_MIN, WindowSize};
pub use request::{
    Correction, DecodeSettings, FinishReason, GenerateRequest, JsonThresholds, Source, SpanAsk,
    SpanClose, TokenEvent, Verification,
};
pub use stats::Stats;

// What the tests below (`use super::*`) read beside the engine's own names.
#[cfg(test)]
use crate::{cost::Guard, draft::Draft, error::EngineError, targets::TargetClient};
#[cfg(test)]
mod context_tests;
#[cfg(test)]
mod grammar_tests;
#[cfg(test)]
mod lookup_tests;
#[cfg(test)]
mod overlap_tests;
#[cfg(test)]
mod sampled_tests;
#[cfg(test)]
mod scripted_tests;
#[cfg(test)]
mod warm_tests;
