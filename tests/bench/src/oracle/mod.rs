//! `approxy bench oracle`: what each acceptance rule allows, with the target's own
//! probabilities as a perfect verifier. At every position the draft proposes its greedy token,
//! one single-token call asks the target for its top-20 log-probabilities there, and the rule
//! decides: accept the draft's token, or emit the target's. This separates what a rule permits
//! from what a local verifier achieves: no verifier of that rule can let the draft write more
//! at no more than this quality.
//!
//! Configurations: `target-only` (reject everything: the target's greedy answer),
//! `draft-only` (accept everything) and one per rule. Per kind it reports the share of tokens
//! the target wrote (with one-token corrections, also its calls per 100 tokens), pass@1 on
//! HumanEval, and for every answer the target's mean negative log-likelihood per token (read
//! from the same calls, so every configuration is scored by the same target), as the share of
//! the gap between draft-only and target-only that the configuration closes; on chat also
//! ROUGE-L against the target-only answer and how many answers are identical to it.
//!
//! Judged windows (`--judged T@K`) are `verification = "judged"` simulated at the same
//! positions: every token is scored in windows paced as decoding paces them (the same
//! `WindowSize`, up to K draft tokens), a draft token is kept where the target would pick it or
//! the draft's confidence is at least T, a window ends at the first it does not keep, with the
//! target's token, and a window kept whole ends with the target's next token. At temperature 0
//! that is the answer the real decode gives on a target that agrees with this one; the report
//! adds the tokens per target call. `--judged exact@K` keeps no difference: exact windows
//! (`verification = "exact"`), whose answer is the target's.
//!
//! Layout: `options` (the flags), `decide` (how each configuration decides), `asked` (what the
//! target said, kept per prompt), `decode` (one answer), `summary` (the answers summed and
//! priced), `markdown` (the report), `run` (the study over the sample).

mod asked;
mod decide;
mod decode;
mod markdown;
mod options;
mod run;
mod summary;

pub use decide::{JudgedConfig, VerifierConfig};
pub use markdown::markdown;
pub use options::OracleOptions;
pub use run::run;
pub use summary::{BUSY, ClassRatio, OracleAnswer, OracleReport, OracleSummary, cost_classes};
