//! Which guard decides, behind one type the decode loop holds: the strict guard of the parent
//! module or the budget guard of [`super::budget`] (kept apart so that neither depends on the
//! other).

use super::budget::BudgetGuard;
use super::spend::{CallPlan, Spend};
use super::strict::{CostGuard, GuardReason};

/// When approxy stops making calls and lets the target write the rest of an answer for cost.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Guard {
    /// Per request, worst case: no call may let the request cost more than `max_cost_ratio`
    /// times passthrough.
    Strict(CostGuard),
    /// Over the traffic, expected value: a call is made when it is expected to save, within a
    /// per-request hard cap, and per request at `max_cost_ratio` while the model's traffic is
    /// above it.
    Budget(BudgetGuard),
}

impl Guard {
    /// Why `call` should not be made (`None`: make it). `remaining` is the most tokens the
    /// answer may still have.
    pub fn judge(&self, s: &Spend, call: CallPlan, remaining: u64) -> Option<GuardReason> {
        match self {
            Self::Strict(g) => g.trips(s, call).then_some(GuardReason::Strict),
            Self::Budget(b) => b.judge(s, call, remaining),
        }
    }
}
