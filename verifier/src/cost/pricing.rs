//! How a target's work is priced, one class per way a target charges. The estimate, the
//! guards and the ledgers ask a [`Pricing`] what a call's input and output cost and never look
//! inside it: adding a class is its file (a type that implements [`Tariff`]) plus one variant
//! of [`Pricing`] and its arm in `Pricing::tariff`.

use super::price::Price;
use super::tariff::Tariff;

/// A model's pricing, by class.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Pricing {
    /// A price list per million tokens.
    Tokens(Price),
}

impl Pricing {
    /// The class's own rules.
    fn tariff(&self) -> &dyn Tariff {
        match self {
            Pricing::Tokens(p) => p,
        }
    }
}

impl Tariff for Pricing {
    fn input_cost(&self, sent: u64, cacheable: u64) -> f64 {
        self.tariff().input_cost(sent, cacheable)
    }

    fn output_cost(&self, n: u64) -> f64 {
        self.tariff().output_cost(n)
    }

    fn is_free(&self) -> bool {
        self.tariff().is_free()
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
