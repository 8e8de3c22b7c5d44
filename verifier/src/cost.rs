//! What a generation costs at the target's prices, and the guard that keeps it from costing
//! more than sending the request to the target directly.
//!
//! A face: each piece is a file below `cost/` (the spend and its estimate, the strict and
//! budget guards, the price classes and their tariffs, the busy meter and the ledgers).

pub mod budget;
pub mod busy;
pub mod guard;
pub mod ledger;
pub mod meter;
pub mod price;
pub mod pricing;
pub mod spend;
pub mod strict;
pub mod tariff;

pub use budget::{BudgetGuard, Rates};
pub use busy::BusyRates;
pub use guard::Guard;
pub use ledger::{Ledger, LedgerView, Segment};
pub use meter::BusyMeter;
pub use price::Price;
pub use pricing::Pricing;
pub use spend::{
    CacheRules, CallPlan, CostEstimate, Spend, TOKENS_IN_FLIGHT_AT_CLOSE, answer_cost, estimate,
};
pub use strict::{CostGuard, GuardReason};
pub use tariff::{Tariff, Unit};
