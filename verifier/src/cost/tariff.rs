//! What every price class answers: the cost of a call's input and of its output. The estimate
//! and the guards ask only this (through [`super::Pricing`]).

/// What a call's tokens cost under one price class, in USD.
pub trait Tariff {
    /// One call's input: `sent` tokens, of which `cacheable` were sent by the previous call.
    fn input_cost(&self, sent: u64, cacheable: u64) -> f64;
    /// `n` output tokens.
    fn output_cost(&self, n: u64) -> f64;
    /// True when nothing costs anything: there is nothing to guard.
    fn is_free(&self) -> bool;
}
