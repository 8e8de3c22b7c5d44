//! How far the draft runs ahead and when it gives up: the rejection budget behind the
//! bail-out, and the window length chosen from recent acceptance.

use std::collections::VecDeque;

/// The last `window` accept/reject decisions.
pub(super) struct RejectionWindow {
    budget: BailoutBudget,
    rejected: VecDeque<bool>,
}

impl RejectionWindow {
    pub(super) fn new(budget: BailoutBudget) -> Self {
        Self {
            budget,
            rejected: VecDeque::with_capacity(budget.window + 1),
        }
    }

    /// Records a decision; true when a full window holds more rejections than the budget allows.
    pub(super) fn push(&mut self, rejected: bool) -> bool {
        self.rejected.push_back(rejected);
        if self.rejected.len() > self.budget.window {
            self.rejected.pop_front();
        }
        let n = self.rejected.iter().filter(|r| **r).count();
        self.rejected.len() >= self.budget.window.max(1)
            && n as f32 > self.budget.max_rejection_rate * self.budget.window as f32
    }
}

/// The longest window by default: a window's draft tokens are computed before the call, one
/// draft pass each, so a long one delays the answer where the target refuses early.
pub const WINDOW_MAX: u32 = 16;

/// The shortest window.
pub const WINDOW_MIN: u32 = 4;

/// The most a policy may allow (`window_max`): 64 draft passes ahead is already seconds on a
/// CPU draft.
pub const WINDOW_MAX_LIMIT: u32 = 64;

/// Window length chosen from recent acceptance: start at 8; after a window the target kept
/// whole, twice that window (it agrees further than was asked, as far as the limit allows);
/// otherwise the recent mean accepted length plus 2. Always between [`WINDOW_MIN`] and the
/// longest window allowed. Growing one token a window instead, a long window came only after
/// dozens of calls, more than most answers make. Public so that a study of windows
/// (`approxy bench oracle --judged`) paces them as decoding does.
#[derive(Debug, Clone, Copy)]
pub struct WindowSize {
    recent: f32,
    max: u32,
}

impl WindowSize {
    /// Windows of at most `max` draft tokens (at least [`WINDOW_MIN`]).
    pub fn new(max: u32) -> Self {
        Self {
            recent: 6.0,
            max: max.max(WINDOW_MIN),
        }
    }

    /// The next window's draft tokens.
    pub fn k(self) -> u32 {
        (self.recent.ceil() as u32 + 2).clamp(WINDOW_MIN, self.max)
    }

    /// After a window of `offered` draft tokens whose first `accepted` the target kept.
    pub fn update(&mut self, accepted: usize, offered: usize) {
        self.recent = if offered > 0 && accepted >= offered {
            // Capped where the next window is the longest, so one refusal brings it down.
            (2 * offered).min(self.max as usize).saturating_sub(2) as f32
        } else {
            0.5 * self.recent + 0.5 * accepted as f32
        };
    }
}

/// When to give up on drafting and let the target finish.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BailoutBudget {
    /// Decisions looked at.
    pub window: usize,
    /// Bail out when more than this fraction of them were rejections.
    pub max_rejection_rate: f32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejection_window_needs_a_full_window_over_budget() {
        let mut w = RejectionWindow::new(BailoutBudget {
            window: 4,
            max_rejection_rate: 0.5,
        });
        // Three rejections, but the window is not full yet.
        assert!(!w.push(true) && !w.push(true) && !w.push(true));
        // Full: 3 of 4 rejected > 0.5 * 4.
        assert!(w.push(false));
        let mut w = RejectionWindow::new(BailoutBudget {
            window: 4,
            max_rejection_rate: 0.5,
        });
        // Exactly at the budget (2 of 4) is allowed; old decisions slide out.
        assert!(!w.push(true) && !w.push(false) && !w.push(true) && !w.push(false));
        assert!(
            !w.push(false) && !w.push(true) && !w.push(true),
            "false, false, true, true is at the budget"
        );
        assert!(w.push(true), "false, true, true, true is over it");
    }
}
