//! What every price class answers: the cost of a call's input, of its output and of the call
//! itself. The estimate and the guards ask only this (through [`super::Pricing`]).

use serde::Serialize;

/// What a price class's costs are counted in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Unit {
    /// US dollars (a price list).
    Usd,
    /// Seconds of the target's time (a self-hosted target).
    TargetSeconds,
}

impl Unit {
    /// Its name in usage and metrics.
    pub fn name(self) -> &'static str {
        match self {
            Unit::Usd => "usd",
            Unit::TargetSeconds => "target_seconds",
        }
    }
}

/// What a call's tokens cost under one price class, in its [`Unit`].
pub trait Tariff {
    /// One call's input: `sent` tokens, of which `cacheable` were sent by the previous call.
    fn input_cost(&self, sent: u64, cacheable: u64) -> f64;
    /// `n` output tokens.
    fn output_cost(&self, n: u64) -> f64;
    /// A call's own cost, whatever it sends (a price list bills none).
    fn call_cost(&self) -> f64 {
        0.0
    }
    /// True when nothing costs anything: there is nothing to guard.
    fn is_free(&self) -> bool;
    /// What the costs are counted in.
    fn unit(&self) -> Unit {
        Unit::Usd
    }
}
