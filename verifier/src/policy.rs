//! The building blocks a policy file names, for a server that reads and validates its own
//! policies into these: how a model verifies (threshold curves, acceptance rules, windows,
//! spans, corrections, bail-outs), which verifier judges, what its target is and can do
//! (kinds and their abilities, prefix styles, cache hints and rules), how structured output
//! is fenced and laid out, and how the target is priced and guarded.
//!
//! A face: it only names the pieces, which live where they are used.

pub use crate::calibration::{Curve, threshold_for, threshold_for_kind};
pub use crate::cost::{BusyRates, CacheRules, Price, Pricing, Tariff};
pub use crate::decode::{
    BailoutBudget, Correction, JsonThresholds, SpanAsk, SpanClose, Verification, WINDOW_MAX,
    WINDOW_MAX_LIMIT, WINDOW_MIN,
};
pub use crate::grammar::{Fence, JsonLayout};
pub use crate::targets::kind::{Abilities, kinds_that};
pub use crate::targets::{CacheHints, PrefixStyle, TargetKind};
pub use crate::verify::{AcceptanceRule, VerifierChoice};
