//! Verifiers: given the draft's features at a position, the probability that the target
//! would have produced the draft's token there. Two kinds behind one trait: the baseline
//! "draft top-1 probability" and a small learned head loaded from a training artifact; which
//! one a model runs is a [`VerifierChoice`]. The per-token decision ([`decide`]) is here too.

pub mod choice;
pub mod context;
pub mod features;
mod judge;
pub mod learned;
pub mod rule;
pub mod syntax;

pub use choice::VerifierChoice;
pub use context::{Context, Record};
pub use features::Features;
pub use judge::{ConfidenceVerifier, Verifier, accepts, decide};
pub use learned::LearnedVerifier;
pub use rule::{AcceptanceRule, TargetProbs};
