//! How far the draft runs ahead and when it gives up: the rejection budget behind the
//! bail-out, and the window length chosen from recent acceptance.

use std::collections::VecDeque;

use super::BailoutBudget;

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

/// Window length chosen from recent acceptance: start at 8, then the recent mean accepted
/// length plus 2, between 4 and 16.
#[derive(Debug, Clone, Copy)]
pub(super) struct WindowSize {
    recent: f32,
}

impl WindowSize {
    pub(super) fn new() -> Self {
        Self { recent: 6.0 }
    }

    pub(super) fn k(self) -> u32 {
        (self.recent.ceil() as u32 + 2).clamp(4, 16)
    }

    pub(super) fn update(&mut self, accepted: usize) {
        self.recent = 0.5 * self.recent + 0.5 * accepted as f32;
    }
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
