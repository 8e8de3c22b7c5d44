//! The budget guard: a call is made when it is expected to pay for itself, judged from the
//! request's own running rates and the model's (its traffic, or a prior), within a hard cap
//! per request and, while the model's traffic costs more than `max_cost_ratio` times
//! passthrough, within that ratio per request as well.
//!
//! The expected-value model. At a rejection there are two ways on: make the call (a
//! correction, a window) and keep drafting, or let the target write the rest in one call.
//! Both send the prefix once now, so they differ in what each later token costs. Written by
//! the target in one call, every token costs the output price. Continuing, a share `f` of the
//! tokens are the target's (output price), the rest are the draft's, which a later call sends
//! as new input (input price) unless they come after the last call (a run of (1 − f)/c tokens
//! on average, out of the `left` the answer is expected to have), and there are `c` calls per
//! token, each re-sending the prefix (at the cached price as far as the cache rules serve it).
//! So the call pays when `f·output + (1 − f)·(1 − run/left)·input + c·resend < output`. `f` and `c` blend the request's rates so
//! far (counting the call being decided, with the tokens a call brings on average) with the
//! model's rates, worth [`PRIOR_TOKENS`] tokens, so that a request's first rejections are
//! judged mostly by the model's record and its later ones by its own.

use serde::{Deserialize, Serialize};

use super::pricing::Pricing;
use super::spend::{CacheRules, CallPlan, Spend};
use super::strict::{CostGuard, GuardReason};
use super::tariff::Tariff;

/// How many tokens of a request's own record the model's rates weigh as, in the blend.
pub const PRIOR_TOKENS: f64 = 64.0;

/// How far above `max_cost_ratio` the traffic must be before each request is held to it. A
/// request held to the ratio can only hand its answer to the target at its first rejection,
/// and such a hand-off costs about passthrough (a little more when it is closed at a stop
/// string, with the tokens in flight): without a margin, traffic a hair over the ratio would
/// hold every later request to it and never come back under, as one answer handed off early
/// once did to a fresh model (see tests/README.md, "Priced by the target's time").
pub const OVER_BUDGET_MARGIN: f64 = 0.05;

/// A rate over `tokens` tokens that counted `count`, blended with `prior` weighted as `weight`
/// tokens (the prior alone when there is nothing to blend).
pub(crate) fn blend(count: f64, tokens: f64, prior: f64, weight: f64) -> f64 {
    if tokens + weight > 0.0 {
        (count + weight * prior) / (tokens + weight)
    } else {
        prior
    }
}

/// How a model's answers have gone in approximate mode: what the expected-value model reads.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Rates {
    /// Target calls per answer token.
    pub calls_per_token: f64,
    /// Share of the answer's tokens the target generated (those it generated and were not
    /// used count too: they are paid).
    pub target_share: f64,
    /// Mean answer length in tokens, when known.
    pub mean_completion: Option<f64>,
}

impl Rates {
    /// Target tokens one call brings on average (at least 1).
    pub fn tokens_per_call(&self) -> f64 {
        if self.calls_per_token > 0.0 {
            (self.target_share / self.calls_per_token).max(1.0)
        } else {
            1.0
        }
    }
}

/// The budget guard's settings for one request (the model's rates and the state of its
/// traffic are read when the request starts).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BudgetGuard {
    /// How the target's work is priced.
    pub price: Pricing,
    /// How the provider's cache serves re-sent prefixes.
    pub cache: CacheRules,
    /// No request may cost more than this times passthrough (the strict bound at this ratio).
    pub hard_cap: f64,
    /// The ratio the model's traffic is kept at or below.
    pub max_cost_ratio: f64,
    /// The model's rates.
    pub prior: Rates,
    /// The model's traffic's cost relative to passthrough over the ledger's window, when it
    /// has any.
    pub traffic_ratio: Option<f64>,
}

/// What one more token is expected to cost either way, USD.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Expectation {
    /// Making the call and continuing approximately.
    pub continuing: f64,
    /// Letting the target write the rest.
    pub handing_off: f64,
}

impl BudgetGuard {
    fn strict(&self, ratio: f64) -> CostGuard {
        CostGuard {
            price: self.price,
            max_cost_ratio: ratio,
            cache: self.cache,
        }
    }

    /// Why `call` should not be made, if it should not. `remaining` is the most tokens the
    /// answer may still have.
    pub fn judge(&self, s: &Spend, call: CallPlan, remaining: u64) -> Option<GuardReason> {
        if self.price.is_free() {
            return None;
        }
        if self.strict(self.hard_cap).trips(s, call) {
            return Some(GuardReason::HardCap);
        }
        if self
            .traffic_ratio
            .is_some_and(|r| r > self.max_cost_ratio * (1.0 + OVER_BUDGET_MARGIN))
            && self.strict(self.max_cost_ratio).trips(s, call)
        {
            return Some(GuardReason::OverBudget);
        }
        let e = self.expect(s, call, remaining);
        (e.continuing >= e.handing_off).then_some(GuardReason::NotWorthIt)
    }

    /// The expected cost of one more token with and without the call (see the module's
    /// documentation).
    pub fn expect(&self, s: &Spend, call: CallPlan, remaining: u64) -> Expectation {
        let per_call = self
            .prior
            .tokens_per_call()
            .min(call.max_output.max(1) as f64);
        let tokens = s.completion_tokens as f64 + per_call;
        let own = |count: f64, prior: f64| blend(count, tokens, prior, PRIOR_TOKENS);
        let c = own(s.target_calls as f64 + 1.0, self.prior.calls_per_token);
        let f = own(
            s.target_output_tokens as f64 + per_call,
            self.prior.target_share,
        )
        .clamp(0.0, 1.0);
        // The prefix a later call re-sends: on average half-way through the rest.
        let left = match self.prior.mean_completion {
            Some(m) => (m - s.completion_tokens as f64).max(per_call),
            None => remaining as f64,
        }
        .min(remaining as f64)
        .max(1.0);
        let resent = call.prefix + (left / 2.0) as u64;
        let cached = if call.reads_cache {
            self.cache.cacheable(resent)
        } else {
            0
        };
        // A later call also costs its own pass (a self-hosted target's time).
        let resend = self.price.input_cost(resent, cached) + self.price.call_cost();
        // A draft token is sent as new input only when a later call follows it: the run after
        // the last call is not. Between calls the draft writes (1 − f)/c tokens on average.
        let run = if c > 0.0 { (1.0 - f) / c } else { left };
        let resent_share = (1.0 - run / left).clamp(0.0, 1.0);
        let p = &self.price;
        Expectation {
            continuing: f * p.output_cost(1)
                + (1.0 - f) * resent_share * p.input_cost(1, 0)
                + c * resend,
            handing_off: p.output_cost(1),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::Price;

    const DEEPSEEK: Price = Price {
        input: 0.56,
        cached_input: 0.07,
        output: 1.68,
    };

    fn guard(price: Price, prior: Rates) -> BudgetGuard {
        BudgetGuard {
            price: price.into(),
            cache: CacheRules::default(),
            hard_cap: 1.5,
            max_cost_ratio: 1.0,
            prior,
            traffic_ratio: None,
        }
    }

    fn rates(calls_per_100: f64, target_share: f64) -> Rates {
        Rates {
            calls_per_token: calls_per_100 / 100.0,
            target_share,
            mean_completion: Some(200.0),
        }
    }

    fn at(completion: u64, calls: u64, target: u64) -> (Spend, CallPlan) {
        let s = Spend {
            prompt_tokens: 150,
            completion_tokens: completion,
            target_output_tokens: target,
            target_input_tokens: calls * (150 + completion / 2),
            cached_input_tokens: calls.saturating_sub(1) * (150 + completion / 2),
            target_calls: calls,
        };
        let plan = CallPlan {
            reads_cache: true,
            prefix: 150 + completion,
            cacheable: 150,
            max_output: 32,
            stops: false,
        };
        (s, plan)
    }

    #[test]
    fn a_call_pays_when_the_model_drafts_most_of_its_answers_and_not_when_the_target_writes_them() {
        // Worked by hand for the first rejection after 20 drafted tokens, DeepSeek's prices,
        // a model at 3 calls and 10 target tokens per 100: a call brings 3.33 tokens; blended
        // c = (1 + 1.92) / 87.3 = 0.0334, f = (3.33 + 6.4) / 87.3 = 0.111; the rest is 180
        // tokens, so a re-send is 170 + 90 = 260 cached tokens, 18.2e-6 USD, and the draft's
        // last run, 0.889 / 0.0334 = 26.6 tokens, is not re-sent (85.2 % of its tokens are).
        // Continuing costs 0.111 * 1.68 + 0.889 * 0.852 * 0.56 + 0.0334 * 18.2 = 0.187 +
        // 0.424 + 0.608 = 1.22 (per million) against 1.68 handing off.
        let g = guard(DEEPSEEK, rates(3.0, 0.10));
        let (s, plan) = at(20, 0, 0);
        let e = g.expect(&s, plan, 300);
        assert!((e.continuing * 1e6 - 1.22).abs() < 0.01, "{e:?}");
        assert!((e.handing_off * 1e6 - 1.68).abs() < 1e-9);
        assert_eq!(g.judge(&s, plan, 300), None);
        // The same calls to a target whose calls of this kind skip its cache (vLLM's windows):
        // each re-send is 260 tokens at the input price, 145.6e-6 USD, so continuing costs
        // 0.187 + 0.424 + 0.0334 * 145.6 = 5.47 and the call does not pay.
        let uncached = CallPlan {
            reads_cache: false,
            ..plan
        };
        let e = g.expect(&s, uncached, 300);
        assert!((e.continuing * 1e6 - 5.47).abs() < 0.02, "{e:?}");
        assert_eq!(g.judge(&s, uncached, 300), Some(GuardReason::NotWorthIt));
        // A model whose spans leave the target 87 % of the tokens (chat at the shipped
        // threshold) never pays for a call.
        let g = guard(DEEPSEEK, rates(5.8, 0.87));
        assert_eq!(g.judge(&s, plan, 300), Some(GuardReason::NotWorthIt));
    }

    #[test]
    fn the_request_s_own_record_outweighs_the_prior_as_it_grows() {
        let g = guard(DEEPSEEK, rates(3.0, 0.10));
        // 200 tokens in, the target has written 60 of them over 12 calls: this request is
        // not the model's average, and the next call is not worth making.
        let (s, plan) = at(200, 12, 60);
        assert_eq!(g.judge(&s, plan, 200), Some(GuardReason::NotWorthIt));
        // A request that has gone as the model's do goes on.
        let (s, plan) = at(200, 6, 20);
        assert_eq!(g.judge(&s, plan, 200), None);
    }

    #[test]
    fn with_input_priced_like_output_only_a_long_last_run_of_the_draft_pays() {
        // Fireworks' serverless prices: a draft token a later call re-sends costs what the
        // target writing it would, and a re-sent prefix half the input price. At the rates
        // spans reach on code (5.5 calls, 33 target tokens per 100) no call pays.
        let fireworks = Price {
            input: 0.9,
            cached_input: 0.45,
            output: 0.9,
        };
        let g = guard(fireworks, rates(5.5, 0.33));
        let (s, plan) = at(20, 0, 0);
        assert_eq!(g.judge(&s, plan, 300), Some(GuardReason::NotWorthIt));
        // Far into an answer the draft has written alone, for a model that almost never needs
        // the target: the call is likely the answer's last, and the draft's run after it is
        // not re-sent.
        let g = guard(fireworks, rates(0.1, 0.002));
        let (s2, plan2) = at(150, 0, 0);
        assert_eq!(g.judge(&s2, plan2, 300), None);
        // A free target is never guarded.
        assert_eq!(
            guard(Price::default(), rates(50.0, 1.0)).judge(&s, plan, 300),
            None
        );
    }

    #[test]
    fn the_hard_cap_and_an_over_budget_model_bound_each_request() {
        let mut g = guard(DEEPSEEK, rates(3.0, 0.10));
        // Spent far beyond 1.5x already: 30 calls re-sending 250 tokens uncached.
        let s = Spend {
            prompt_tokens: 150,
            completion_tokens: 100,
            target_output_tokens: 50,
            target_input_tokens: 30 * 250,
            cached_input_tokens: 0,
            target_calls: 30,
        };
        let plan = CallPlan {
            reads_cache: true,
            prefix: 250,
            cacheable: 0,
            max_output: 32,
            stops: false,
        };
        assert_eq!(g.judge(&s, plan, 200), Some(GuardReason::HardCap));
        // Below the cap but above 1.0x: allowed while the traffic is within budget, refused
        // while it is over.
        let (s, plan) = at(20, 1, 4);
        let s = Spend {
            target_input_tokens: 200,
            cached_input_tokens: 0,
            ..s
        };
        assert!(
            CostGuard {
                price: DEEPSEEK.into(),
                max_cost_ratio: 1.0,
                cache: CacheRules::default()
            }
            .trips(&s, plan)
        );
        assert_eq!(g.judge(&s, plan, 300), None);
        g.traffic_ratio = Some(0.9);
        assert_eq!(g.judge(&s, plan, 300), None);
        // Within the margin: a hand-off's tokens in flight do not hold every request.
        g.traffic_ratio = Some(1.04);
        assert_eq!(g.judge(&s, plan, 300), None);
        g.traffic_ratio = Some(1.1);
        assert_eq!(g.judge(&s, plan, 300), Some(GuardReason::OverBudget));
    }
}
