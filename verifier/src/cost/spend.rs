//! What a generation has spent, in tokens, and what that costs against sending the request to
//! the target directly.
//!
//! The estimate: with approxy the target is paid for every call's input (the prefix is re-sent
//! each time; the part the previous call already sent is priced as cached input, because a
//! prompt cache can reuse it) and for every token it generates, including tokens a cancelled
//! stream produced that were not used. Sent directly, the prompt is paid once and every output
//! token at the output price.

use serde::{Deserialize, Serialize};

use super::pricing::Pricing;
use super::tariff::Tariff;

/// Tokens a target generates, on average, after approxy closes its stream before the end (a
/// span that resynced, an answer that hit a stop string): it notices only at its next write,
/// and those tokens are paid for though never seen. Two is what llama-server's own counters
/// (`llamacpp:tokens_predicted_total`) showed per closed stream against the tokens that reached
/// approxy (see tests/README.md, "What a span's calls ask for").
pub const TOKENS_IN_FLIGHT_AT_CLOSE: u64 = 2;

/// What a generation has spent so far, in tokens: all the cost model reads (the decode loop
/// fills it from its own counters, so this module depends on nothing of the loop's).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Spend {
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// Tokens of the answer so far.
    pub completion_tokens: u64,
    /// Tokens the target generated, used or not (a cancelled stream's are paid all the same).
    pub target_output_tokens: u64,
    /// Input tokens sent to the target over all calls (each call re-sends the prefix).
    pub target_input_tokens: u64,
    /// Of those, the tokens served from a prompt cache: what the target reported when every
    /// call reported it, else the estimate under the cache rules.
    pub cached_input_tokens: u64,
    /// Calls made to the target.
    pub target_calls: u64,
}

/// How a provider's prompt cache reuses a re-sent prefix: not below `min_tokens`, and in
/// whole blocks of `block` tokens (OpenAI: 1,024 and 128; vLLM: 16-token blocks; llama.cpp:
/// any length).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheRules {
    /// Shortest prefix the cache serves.
    pub min_tokens: u64,
    /// Granularity of a hit.
    pub block: u64,
}

impl Default for CacheRules {
    fn default() -> Self {
        Self {
            min_tokens: 0,
            block: 1,
        }
    }
}

impl CacheRules {
    /// Of a prefix whose first `common` tokens an earlier call sent, the tokens the cache serves.
    pub fn cacheable(&self, common: u64) -> u64 {
        if common < self.min_tokens {
            return 0;
        }
        common / self.block.max(1) * self.block.max(1)
    }
}

/// What the approximate answer and the same answer straight from the target cost, in the
/// unit of the model's price class (USD, or seconds of the target's time).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CostEstimate {
    /// With approxy.
    pub approxy: f64,
    /// Sending the request to the target directly.
    pub passthrough: f64,
}

/// Costs of a generation's spend (passthrough is one call).
pub fn estimate(s: &Spend, p: &Pricing) -> CostEstimate {
    CostEstimate {
        approxy: p.input_cost(s.target_input_tokens, s.cached_input_tokens)
            + p.output_cost(s.target_output_tokens)
            + s.target_calls as f64 * p.call_cost(),
        passthrough: p.call_cost()
            + p.input_cost(s.prompt_tokens, 0)
            + p.output_cost(s.completion_tokens),
    }
}

/// What an answer cost in its price class. A price list prices its spend; the target's own
/// time is `measured`, both sides at the rates learned so far: the comparison the guard's
/// ledger keeps must not set the target's own figures against rates that may still be the
/// prior's.
pub fn answer_cost(s: &Spend, p: &Pricing, measured: CostEstimate) -> CostEstimate {
    match p {
        Pricing::Busy(_) => measured,
        p => estimate(s, p),
    }
}

/// Where a generation stands when a target call is about to be made.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CallPlan {
    /// Prefix tokens the call sends.
    pub prefix: u64,
    /// Of those, the tokens the previous call sent or received (a prompt cache can reuse them).
    pub cacheable: u64,
    /// Most tokens the call can bring back.
    pub max_output: u64,
    /// Whether calls like this one read the target's prompt cache (a window call to vLLM does
    /// not): the budget guard prices the prefixes later such calls re-send by it.
    pub reads_cache: bool,
    /// Whether the answer may end at a stop string: a hand-off is then closed at once, with
    /// [`TOKENS_IN_FLIGHT_AT_CLOSE`] generated after it that passthrough, stopped by the
    /// target itself, never generates. Without one a hand-off runs to the target's own end.
    pub stops: bool,
}
