//! A model's spend in approximate mode over a sliding window: approxy's estimated cost
//! against passthrough's, and the rates the budget guard's expected-value model reads. The
//! window is kept as a fixed number of time slots, so its memory does not grow with traffic.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::budget::Rates;
use super::budget::blend;
use super::spend::CostEstimate;

/// Slots a window is kept in: a request leaves the window up to 1/SLOTS of it early (its
/// slot's start counts).
const SLOTS: u32 = 32;

/// The part of an answer approxy drafted and corrected, before any hand-off: what the model's
/// rates are measured on (a hand-off's tokens are the target's by choice, not by rejection).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct Segment {
    /// Answer tokens.
    pub tokens: u64,
    /// Target calls.
    pub calls: u64,
    /// Tokens the target generated.
    pub target_tokens: u64,
}

/// Totals over a window.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct LedgerView {
    /// Requests.
    pub requests: u64,
    /// approxy's estimated cost, USD.
    pub approxy: f64,
    /// The same requests' estimated passthrough cost, USD.
    pub passthrough: f64,
    /// Answer tokens.
    pub completion_tokens: u64,
    /// The approximate parts of the answers.
    pub approximate: Segment,
}

impl LedgerView {
    /// approxy's cost relative to passthrough, when anything was spent.
    pub fn cost_ratio(&self) -> Option<f64> {
        (self.passthrough > 0.0).then(|| self.approxy / self.passthrough)
    }

    /// The model's rates: the window's, blended with `prior` weighted as `prior_tokens` tokens
    /// (the prior alone on an empty window).
    pub fn rates(&self, prior: Rates, prior_tokens: f64) -> Rates {
        let seg = &self.approximate;
        let own = |count: u64, p: f64| blend(count as f64, seg.tokens as f64, p, prior_tokens);
        Rates {
            calls_per_token: own(seg.calls, prior.calls_per_token),
            target_share: own(seg.target_tokens, prior.target_share).clamp(0.0, 1.0),
            mean_completion: if self.requests > 0 {
                Some(self.completion_tokens as f64 / self.requests as f64)
            } else {
                prior.mean_completion
            },
        }
    }

    fn add(&mut self, o: &LedgerView) {
        self.requests += o.requests;
        self.approxy += o.approxy;
        self.passthrough += o.passthrough;
        self.completion_tokens += o.completion_tokens;
        self.approximate.tokens += o.approximate.tokens;
        self.approximate.calls += o.approximate.calls;
        self.approximate.target_tokens += o.approximate.target_tokens;
    }
}

/// One model's ledger, shared by its requests.
#[derive(Debug)]
pub struct Ledger {
    window: Duration,
    slots: Mutex<VecDeque<(Instant, LedgerView)>>,
}

impl Ledger {
    /// A ledger over the last `window` (see [`Ledger::kept`]).
    pub fn new(window: Duration) -> Self {
        Self {
            window: Self::kept(window),
            slots: Mutex::new(VecDeque::new()),
        }
    }

    /// The window a ledger asked for `window` keeps: at least a millisecond per slot.
    pub fn kept(window: Duration) -> Duration {
        window.max(Duration::from_millis(u64::from(SLOTS)))
    }

    /// The window it keeps.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// Records a finished request.
    pub fn record(&self, cost: CostEstimate, completion_tokens: u64, approximate: Segment) {
        self.record_at(Instant::now(), cost, completion_tokens, approximate);
    }

    /// As [`Ledger::record`], at `now`.
    pub fn record_at(
        &self,
        now: Instant,
        cost: CostEstimate,
        completion_tokens: u64,
        approximate: Segment,
    ) {
        let one = LedgerView {
            requests: 1,
            approxy: cost.approxy,
            passthrough: cost.passthrough,
            completion_tokens,
            approximate,
        };
        let slot = self.window / SLOTS;
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        self.expire(&mut slots, now);
        match slots.back_mut() {
            Some((start, v)) if now.saturating_duration_since(*start) < slot => v.add(&one),
            _ => slots.push_back((now, one)),
        }
    }

    /// The totals over the window.
    pub fn view(&self) -> LedgerView {
        self.view_at(Instant::now())
    }

    /// As [`Ledger::view`], at `now`.
    pub fn view_at(&self, now: Instant) -> LedgerView {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        self.expire(&mut slots, now);
        let mut total = LedgerView::default();
        for (_, v) in slots.iter() {
            total.add(v);
        }
        total
    }

    fn expire(&self, slots: &mut VecDeque<(Instant, LedgerView)>, now: Instant) {
        while slots
            .front()
            .is_some_and(|(start, _)| now.saturating_duration_since(*start) >= self.window)
        {
            slots.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cost(approxy: f64, passthrough: f64) -> CostEstimate {
        CostEstimate {
            approxy,
            passthrough,
        }
    }

    #[test]
    fn the_window_slides_and_its_memory_is_bounded() {
        let l = Ledger::new(Duration::from_secs(320));
        let t0 = Instant::now();
        let seg = Segment {
            tokens: 100,
            calls: 4,
            target_tokens: 20,
        };
        for i in 0..1000u64 {
            l.record_at(
                t0 + Duration::from_millis(i * 100),
                cost(1.0, 2.0),
                100,
                seg,
            );
        }
        let v = l.view_at(t0 + Duration::from_secs(100));
        assert_eq!(v.requests, 1000);
        assert_eq!(v.cost_ratio(), Some(0.5));
        // 100 s of requests in 10 s slots.
        assert!(l.slots.lock().unwrap().len() <= 11);
        // After the window, they are gone, and a new request stands alone.
        l.record_at(t0 + Duration::from_secs(500), cost(3.0, 2.0), 10, seg);
        let v = l.view_at(t0 + Duration::from_secs(500));
        assert_eq!((v.requests, v.cost_ratio()), (1, Some(1.5)));
        assert_eq!(l.view_at(t0 + Duration::from_secs(900)).cost_ratio(), None);
    }

    #[test]
    fn rates_blend_the_traffic_with_the_prior() {
        let prior = Rates {
            calls_per_token: 0.05,
            target_share: 0.3,
            mean_completion: None,
        };
        // Nothing recorded: the prior.
        assert_eq!(LedgerView::default().rates(prior, 512.0), prior);
        let v = LedgerView {
            requests: 4,
            approxy: 1.0,
            passthrough: 1.0,
            completion_tokens: 800,
            approximate: Segment {
                tokens: 1536,
                calls: 0,
                target_tokens: 1536,
            },
        };
        let r = v.rates(prior, 512.0);
        // (0 + 512 * 0.05) / 2048 and (1536 + 512 * 0.3) / 2048.
        assert!((r.calls_per_token - 0.0125).abs() < 1e-12);
        assert!((r.target_share - 0.825).abs() < 1e-12);
        assert_eq!(r.mean_completion, Some(200.0));
    }
}
