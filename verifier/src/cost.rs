//! What a generation costs at the target's prices, and the guard that keeps it from costing
//! more than sending the request to the target directly.
//!
//! The estimate: with approxy the target is paid for every call's input (the prefix is re-sent
//! each time; the part the previous call already sent is priced as cached input, because a
//! prompt cache can reuse it) and for every token it generates, including tokens a cancelled
//! stream produced that were not used. Sent directly, the prompt is paid once and every output
//! token at the output price.

use serde::{Deserialize, Serialize};

pub mod budget;
pub mod busy;
pub mod guard;
pub mod ledger;
pub mod meter;
pub mod price;
pub mod pricing;
pub mod tariff;

pub use budget::{BudgetGuard, Rates};
pub use busy::BusyRates;
pub use guard::Guard;
pub use ledger::{Ledger, LedgerView, Segment};
pub use meter::BusyMeter;
pub use price::Price;
pub use pricing::Pricing;
pub use tariff::{Tariff, Unit};

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

/// Hands the rest of an answer to the target in one call before approxy would cost more than
/// `max_cost_ratio` times passing the request through.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CostGuard {
    /// How the target's work is priced.
    pub price: Pricing,
    /// Largest allowed ratio of approxy's cost to passthrough's (1.0: never dearer).
    pub max_cost_ratio: f64,
    /// How the provider's cache serves re-sent prefixes.
    pub cache: CacheRules,
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

impl CostGuard {
    /// True when making `call` could let the request end up dearer than `max_cost_ratio` times
    /// passthrough. Counted on the approxy side: everything spent so far, this call, and a
    /// reserve for one more re-send of the prefix (the hand-off a later check may need), in
    /// which only this call's own prefix counts as cached, and only as far as the cache rules
    /// serve it: the tokens the call brings back are new input to a provider whose cache
    /// holds prompts only, and a prefix below the cache's minimum is not served at all. On the
    /// passthrough side: the answer only as far as it is known (emitted tokens plus this
    /// call's), since its final length is not. Every later token costs both sides the same
    /// output price or nothing (a draft token), so a request whose every call passed this check
    /// stays within the ratio whatever follows, as long as the prices hold: the re-sent prefix
    /// is really served from the cache at `cached_input`, and output costs at least as much as
    /// input.
    pub fn trips(&self, s: &Spend, call: CallPlan) -> bool {
        if self.price.is_free() {
            return false;
        }
        let p = &self.price;
        let so_far = estimate(s, p).approxy;
        let this_call = p.call_cost()
            + p.input_cost(call.prefix, call.cacheable)
            + p.output_cost(call.max_output);
        let next = call.prefix + call.max_output;
        let in_flight = if call.stops {
            TOKENS_IN_FLIGHT_AT_CLOSE
        } else {
            0
        };
        let reserve = p.call_cost()
            + p.input_cost(next, self.cache.cacheable(call.prefix))
            + p.output_cost(in_flight);
        let passthrough = p.call_cost()
            + p.input_cost(s.prompt_tokens, 0)
            + p.output_cost(s.completion_tokens + call.max_output);
        so_far + this_call + reserve > self.max_cost_ratio * passthrough
    }
}

/// Why a guard handed the rest of an answer to the target instead of making a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GuardReason {
    /// The strict guard: the call could make this request dearer than `max_cost_ratio` times
    /// passthrough.
    Strict,
    /// The budget guard's per-request hard cap: the call could make this request dearer than
    /// the cap times passthrough.
    HardCap,
    /// The budget guard: the model's traffic is above `max_cost_ratio` over the window, and
    /// the call could make this request dearer than that too.
    OverBudget,
    /// The budget guard: the call is not expected to pay for itself (the rest of the answer is
    /// expected to cost more with approxy's calls than written by the target in one).
    NotWorthIt,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn price() -> Price {
        Price {
            input: 1.0,
            cached_input: 0.1,
            output: 2.0,
        }
    }

    #[test]
    fn cost_counts_resent_prefixes_cache_discount_and_discarded_tokens() {
        let s = Spend {
            prompt_tokens: 100,
            completion_tokens: 50,
            target_output_tokens: 7,
            target_input_tokens: 1000,
            cached_input_tokens: 800,
            target_calls: 3,
        };
        let c = estimate(&s, &price().into());
        assert!((c.approxy - (200.0 + 80.0 + 14.0) / 1e6).abs() < 1e-12);
        assert!((c.passthrough - (100.0 + 100.0) / 1e6).abs() < 1e-12);
    }

    #[test]
    fn guard_allows_a_call_the_draft_has_paid_for_and_refuses_one_it_has_not() {
        let g = CostGuard {
            price: price().into(),
            max_cost_ratio: 1.0,
            cache: CacheRules::default(),
        };
        // 100-token prompt, nothing spent yet. After 3 draft tokens a one-token call costs
        // 103 input + 2 output + a reserve re-sending 104 tokens, the call's own 103 cached
        // (10.3 + 1) = 116.3 against passthrough 100 + 4 tokens * 2 = 108: refused. After 20:
        // 120 + 2 + 13 = 135 vs 142: allowed. With stop strings the hand-off may be closed
        // with 2 tokens in flight (4 more): after 16 drafted tokens 116 + 2 + 12.6 + 4 = 134.6
        // against 134 is refused (130.6 without stop strings: allowed), after 17 135.7 against
        // 136 allowed.
        let mut s = Spend {
            prompt_tokens: 100,
            completion_tokens: 3,
            ..Spend::default()
        };
        assert!(g.trips(
            &s,
            CallPlan {
                reads_cache: true,
                prefix: 103,
                cacheable: 0,
                max_output: 1,
                stops: false
            }
        ));
        s.completion_tokens = 20;
        assert!(!g.trips(
            &s,
            CallPlan {
                reads_cache: true,
                prefix: 120,
                cacheable: 0,
                max_output: 1,
                stops: false
            }
        ));
        for (k, stops, refused) in [(16, true, true), (16, false, false), (17, true, false)] {
            s.completion_tokens = k;
            let call = CallPlan {
                reads_cache: true,
                prefix: 100 + k,
                cacheable: 0,
                max_output: 1,
                stops,
            };
            assert_eq!(
                g.trips(&s, call),
                refused,
                "{k} drafted, stop strings {stops}"
            );
        }
        // A target that costs nothing is never guarded.
        let free = CostGuard {
            price: Price::default().into(),
            max_cost_ratio: 1.0,
            cache: CacheRules::default(),
        };
        assert!(!free.trips(
            &s,
            CallPlan {
                reads_cache: true,
                prefix: 100_000,
                cacheable: 0,
                max_output: 100,
                stops: false
            }
        ));
    }

    #[test]
    fn cache_rules_round_down_to_blocks_above_a_minimum() {
        let openai = CacheRules {
            min_tokens: 1024,
            block: 128,
        };
        assert_eq!(openai.cacheable(1000), 0);
        assert_eq!(openai.cacheable(1100), 1024);
        assert_eq!(openai.cacheable(1300), 1280);
        assert_eq!(
            CacheRules {
                min_tokens: 0,
                block: 16
            }
            .cacheable(40),
            32
        );
        assert_eq!(CacheRules::default().cacheable(7), 7);
    }
}
