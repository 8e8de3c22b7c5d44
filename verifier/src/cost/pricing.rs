//! How a target's work is priced, one class per way a target charges. The estimate, the
//! guards and the ledgers ask a [`Pricing`] what a call's input and output cost and never look
//! inside it: adding a class is its file (a type that implements [`Tariff`]) plus one variant
//! of [`Pricing`] and its arm in `Pricing::tariff`.

use super::busy::BusyRates;
use super::price::Price;
use super::tariff::{Tariff, Unit};
use crate::targets::counters::Tokens;

/// A model's pricing, by class.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Pricing {
    /// A price list per million tokens.
    Tokens(Price),
    /// The target's own time (a self-hosted target), at these rates: the policy's prior, or
    /// what the target's reports have taught since (a request is priced at the rates of its
    /// start).
    Busy(BusyRates),
}

impl Pricing {
    /// The class's own rules.
    fn tariff(&self) -> &dyn Tariff {
        match self {
            Pricing::Tokens(p) => p,
            Pricing::Busy(r) => r,
        }
    }
}

impl Pricing {
    /// USD for the tokens a target's counters say it was paid for.
    pub fn cost_of(&self, t: &Tokens) -> f64 {
        self.input_cost(t.uncached_input + t.cached_input, t.cached_input)
            + self.output_cost(t.output)
    }
}

impl Tariff for Pricing {
    fn input_cost(&self, sent: u64, cacheable: u64) -> f64 {
        self.tariff().input_cost(sent, cacheable)
    }

    fn output_cost(&self, n: u64) -> f64 {
        self.tariff().output_cost(n)
    }

    fn call_cost(&self) -> f64 {
        self.tariff().call_cost()
    }

    fn is_free(&self) -> bool {
        self.tariff().is_free()
    }

    fn unit(&self) -> Unit {
        self.tariff().unit()
    }
}

impl Pricing {
    /// Its name in a policy and in usage: `"busy"` or `"tokens"`.
    pub fn class(&self) -> &'static str {
        match self {
            Pricing::Tokens(_) => "tokens",
            Pricing::Busy(_) => "busy",
        }
    }

    /// The same class at the rates `now` gives (busy: what the target has taught; a price
    /// list stays as it is).
    pub fn at(&self, now: impl FnOnce() -> BusyRates) -> Pricing {
        match self {
            Pricing::Busy(_) => Pricing::Busy(now()),
            p => *p,
        }
    }
}

impl Default for Pricing {
    fn default() -> Self {
        Pricing::Tokens(Price::default())
    }
}

impl From<Price> for Pricing {
    fn from(p: Price) -> Self {
        Pricing::Tokens(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counted_tokens_are_priced_per_million() {
        let t = Tokens {
            uncached_input: 66,
            cached_input: 322,
            output: 90,
        };
        // Priced per million: 66 * 1 + 322 * 0.1 + 90 * 3 = 368.2.
        let price = Price {
            input: 1.0,
            cached_input: 0.1,
            output: 3.0,
        };
        assert!((Pricing::from(price).cost_of(&t) * 1e6 - 368.2).abs() < 1e-9);
    }
}
