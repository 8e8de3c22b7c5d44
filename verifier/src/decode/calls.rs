//! One record per target call a generation made: what it sent, what the target's cache served,
//! what it generated, and its compute when the target reported it. What the target's time is
//! accounted from: a call the target timed counts at its own figure, one it did not (a stream
//! approxy closed before its end gets no timings) at the learned rates.

use serde::Serialize;

use crate::cost::BusyRates;
use crate::targets::TargetTimings;

/// Why a call was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CallKind {
    /// A fixed number of target tokens after a rejection.
    Correction,
    /// A streamed correction, closed once the draft caught up.
    Span,
    /// A window of draft tokens scored in one pass.
    Window,
    /// The rest of the answer, written by the target.
    HandOff,
    /// The prompt computed into the target's cache as the answer started, nothing generated
    /// (see `warm`).
    Warm,
}

/// One target call.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CallRecord {
    /// Why.
    pub kind: CallKind,
    /// Prompt tokens sent (the prefix and any window; a call made again re-sends them).
    pub sent: u64,
    /// Of those, what the target said its cache served, else what the cache rules allow.
    pub cached: u64,
    /// Whether `cached` is the target's own word.
    pub cached_reported: bool,
    /// Tokens it generated, used or not (those after a close included, as estimated).
    pub generated: u64,
    /// Its compute, when the target reported it.
    #[serde(skip)]
    pub timings: Option<TargetTimings>,
    /// Tokens the generation had taken from the target before this call (to tell this
    /// call's from the next one's once the answer ends).
    #[serde(skip)]
    pub(super) generated_before: u64,
}

impl CallRecord {
    pub(super) fn new(kind: CallKind, sent: u64, cacheable: u64, generated_before: u64) -> Self {
        Self {
            kind,
            sent,
            cached: cacheable.min(sent),
            cached_reported: false,
            generated: 0,
            timings: None,
            generated_before,
        }
    }

    /// Prompt tokens the target computed.
    pub fn prefilled(&self) -> u64 {
        self.sent.saturating_sub(self.cached)
    }

    /// Seconds the target spent on it: its own figure when it reported one, else at `rates`.
    pub fn busy_seconds(&self, rates: &BusyRates) -> f64 {
        match &self.timings {
            Some(t) => t.busy().as_secs_f64(),
            None => rates.call_seconds(self.prefilled(), self.generated),
        }
    }
}

/// Fills each call's `generated` from where the next one started, the last's from `total`.
pub(super) fn settle(calls: &mut [CallRecord], total: u64) {
    let mut end = total;
    for c in calls.iter_mut().rev() {
        c.generated = end.saturating_sub(c.generated_before);
        end = c.generated_before;
    }
}

/// The target's time on a generation, and what passthrough would have taken.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct TargetTime {
    /// Seconds over all calls: measured where reported, estimated elsewhere.
    pub spent: f64,
    /// Of those, the seconds the target reported.
    pub measured: f64,
    /// Of those, the seconds estimated at the learned rates for calls it did not time.
    pub estimated: f64,
    /// Calls it did not time.
    pub untimed_calls: u32,
    /// Every call at the rates, timed or not: what the guard and the ledger compare with
    /// `passthrough`, which is at the same rates (so that an error in the rates, which the
    /// target's own figures do not share, cannot tip the comparison).
    pub at_rates: f64,
    /// The same answer through passthrough, at the same rates: one call that computes the
    /// whole prompt and generates every answer token.
    pub passthrough: f64,
}

/// The target's time on `calls` for an answer of `completion` tokens to a prompt of
/// `prompt` tokens, at `rates` where a call was not timed.
pub fn target_time(
    calls: &[CallRecord],
    prompt: u64,
    completion: u64,
    rates: &BusyRates,
) -> TargetTime {
    let mut t = TargetTime {
        passthrough: rates.call_seconds(prompt, completion),
        ..TargetTime::default()
    };
    for c in calls {
        t.at_rates += rates.call_seconds(c.prefilled(), c.generated);
        let s = c.busy_seconds(rates);
        if c.timings.is_some() {
            t.measured += s;
        } else {
            t.estimated += s;
            t.untimed_calls += 1;
        }
        t.spent += s;
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn untimed_calls_are_priced_at_the_rates_and_timed_ones_at_their_own_figure() {
        let rates = BusyRates {
            prefill_ms: 10.0,
            generate_ms: 40.0,
            call_ms: 20.0,
        };
        let mut calls = vec![
            CallRecord::new(CallKind::Span, 100, 0, 0),
            CallRecord::new(CallKind::Span, 130, 110, 5),
            CallRecord::new(CallKind::HandOff, 150, 140, 9),
        ];
        settle(&mut calls, 30);
        assert_eq!(
            calls.iter().map(|c| c.generated).collect::<Vec<_>>(),
            [5, 4, 21]
        );
        calls[0].timings = Some(TargetTimings {
            prompt_tokens: 100,
            prompt_ms: 900.0,
            predicted_tokens: 5,
            predicted_ms: 210.0,
        });
        let t = target_time(&calls, 100, 40, &rates);
        assert!((t.measured - 1.11).abs() < 1e-9, "{t:?}");
        // 20 + 20 * 10 + 4 * 40 = 380 ms; 20 + 10 * 10 + 21 * 40 = 960 ms.
        assert!((t.estimated - 1.34).abs() < 1e-9, "{t:?}");
        assert_eq!(t.untimed_calls, 2);
        assert!((t.spent - 2.45).abs() < 1e-9);
        // 20 + 1000 + 1600 ms.
        assert!((t.passthrough - 2.62).abs() < 1e-9);
        // The timed call at the rates: 20 + 1000 + 200 ms.
        assert!((t.at_rates - 1.22 - 1.34).abs() < 1e-9, "{t:?}");
    }
}
