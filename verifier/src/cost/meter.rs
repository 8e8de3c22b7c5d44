//! Learns a target's [`BusyRates`] from what it reports on every call (llama-server's
//! `timings`): the prompt's time against the tokens it computed, a straight line whose
//! intercept is the call's fixed part and whose slope is the prefill rate, and the generation
//! time per generated token. The fits start from a prior (the policy's) worth a few calls and
//! forget old calls at a fixed rate, so the rates follow the traffic (a target that gets
//! busier, a longer context) without being swung by one call.

use std::sync::Mutex;

use super::busy::BusyRates;
use crate::targets::TargetTimings;
use crate::targets::counters::TargetCounters;

/// How many calls the prior weighs as, at the start: a couple, so that the target's own
/// reports decide within a few calls (the prior is a guess from another machine; a target
/// twice as slow as it says is common).
const PRIOR_CALLS: f64 = 2.0;

/// The prompt lengths the prior's calls are placed at: a short one and a typical one, so that
/// the prior fixes both the intercept and the slope of the prompt line.
const PRIOR_PROMPTS: [f64; 2] = [1.0, 64.0];

/// Generated tokens the prior weighs as.
const PRIOR_GENERATED: f64 = 64.0;

/// Each new call keeps this share of everything before it: about the last 500 calls count.
const KEEP: f64 = 1.0 - 1.0 / 512.0;

/// Weighted sums of the observations so far (decayed).
#[derive(Debug, Clone, Copy, Default)]
struct Sums {
    /// Prompt line: weight, Σx, Σx², Σy, Σxy (x tokens computed, y ms).
    w: f64,
    x: f64,
    xx: f64,
    y: f64,
    xy: f64,
    /// Generation: tokens and ms.
    gen_tokens: f64,
    gen_ms: f64,
    /// Calls observed (not decayed; the prior's do not count).
    calls: u64,
}

impl Sums {
    fn prompt(&mut self, weight: f64, x: f64, y: f64) {
        self.w += weight;
        self.x += weight * x;
        self.xx += weight * x * x;
        self.y += weight * y;
        self.xy += weight * x * y;
    }

    fn decay(&mut self, keep: f64) {
        for v in [
            &mut self.w,
            &mut self.x,
            &mut self.xx,
            &mut self.y,
            &mut self.xy,
            &mut self.gen_tokens,
            &mut self.gen_ms,
        ] {
            *v *= keep;
        }
    }
}

/// One target's learned rates, shared by every request to it.
#[derive(Debug)]
pub struct BusyMeter {
    prior: BusyRates,
    sums: Mutex<Sums>,
}

impl BusyMeter {
    /// A meter at `prior`.
    pub fn new(prior: BusyRates) -> Self {
        let mut s = Sums::default();
        for x in PRIOR_PROMPTS {
            let w = PRIOR_CALLS / PRIOR_PROMPTS.len() as f64;
            s.prompt(w, x, prior.call_ms + prior.prefill_ms * x);
        }
        s.gen_tokens = PRIOR_GENERATED;
        s.gen_ms = PRIOR_GENERATED * prior.generate_ms;
        Self {
            prior,
            sums: Mutex::new(s),
        }
    }

    /// The prior it started from.
    pub fn prior(&self) -> BusyRates {
        self.prior
    }

    /// Learns from one call's report.
    pub fn observe(&self, t: &TargetTimings) {
        if !(t.prompt_ms.is_finite() && t.predicted_ms.is_finite())
            || t.prompt_ms < 0.0
            || t.predicted_ms < 0.0
        {
            return;
        }
        let mut s = self.sums.lock().unwrap_or_else(|e| e.into_inner());
        s.decay(KEEP);
        s.prompt(1.0, t.prompt_tokens as f64, t.prompt_ms);
        s.gen_tokens += t.predicted_tokens as f64;
        s.gen_ms += t.predicted_ms;
        s.calls += 1;
    }

    /// Learns from the target's own counters over an interval in which it served `calls`
    /// calls (`delta`: what they computed, cancelled streams included): the prompt line gets
    /// the interval's mean call, weighted as `calls` calls, and the generation rate its totals.
    /// The source for a target whose calls report no timings (a stream closed early never
    /// does).
    pub fn observe_counters(&self, delta: &TargetCounters, calls: u64) {
        let (prompt_ms, predicted_ms) = (delta.prompt_seconds * 1e3, delta.predicted_seconds * 1e3);
        if calls == 0
            || !(prompt_ms.is_finite() && predicted_ms.is_finite())
            || prompt_ms < 0.0
            || predicted_ms < 0.0
        {
            return;
        }
        let n = calls as f64;
        let mut s = self.sums.lock().unwrap_or_else(|e| e.into_inner());
        s.decay(KEEP.powf(n));
        s.prompt(n, delta.prompt_processed as f64 / n, prompt_ms / n);
        s.gen_tokens += delta.predicted as f64;
        s.gen_ms += predicted_ms;
        s.calls += calls;
    }

    /// Calls it has learned from.
    pub fn calls_observed(&self) -> u64 {
        self.sums.lock().unwrap_or_else(|e| e.into_inner()).calls
    }

    /// The rates now.
    pub fn rates(&self) -> BusyRates {
        let s = *self.sums.lock().unwrap_or_else(|e| e.into_inner());
        let det = s.w * s.xx - s.x * s.x;
        // Least squares of y = a + b·x; the prior's two lengths keep det above zero.
        let (mut a, mut b) = if det > 1e-9 * s.w * s.w {
            let b = (s.w * s.xy - s.x * s.y) / det;
            ((s.y - b * s.x) / s.w, b)
        } else {
            (self.prior.call_ms, self.prior.prefill_ms)
        };
        // A negative part is noise around zero: fit the line with that part at zero instead.
        if a < 0.0 {
            a = 0.0;
            b = if s.xx > 0.0 { s.xy / s.xx } else { b };
        }
        if b < 0.0 {
            b = 0.0;
            a = if s.w > 0.0 { s.y / s.w } else { a };
        }
        let generate_ms = if s.gen_tokens > 0.0 {
            s.gen_ms / s.gen_tokens
        } else {
            self.prior.generate_ms
        };
        BusyRates {
            prefill_ms: b.max(0.0),
            generate_ms: generate_ms.max(f64::MIN_POSITIVE),
            call_ms: a.max(0.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timings(r: &BusyRates, prompt: u64, generated: u64) -> TargetTimings {
        TargetTimings {
            prompt_tokens: prompt,
            prompt_ms: r.call_ms + r.prefill_ms * prompt as f64,
            predicted_tokens: generated,
            predicted_ms: r.generate_ms * generated as f64,
        }
    }

    #[test]
    fn starts_at_the_prior_and_converges_on_a_target_whose_timings_are_known() {
        let prior = BusyRates::CPU_LLAMA_SERVER;
        let m = BusyMeter::new(prior);
        let r0 = m.rates();
        assert!((r0.prefill_ms - prior.prefill_ms).abs() < 1e-9, "{r0:?}");
        assert!((r0.generate_ms - prior.generate_ms).abs() < 1e-9);
        assert!(r0.call_ms.abs() < 1e-9);
        // A GPU-like target: a call's pass costs 18 ms, a computed prompt token 1.2 ms, a
        // generated one 19 ms; spans of 1 to 40 new prompt tokens, windows of 16, prompts of
        // 150. After 1,500 calls the prior weighs as a tenth of a call.
        let truth = BusyRates {
            prefill_ms: 1.2,
            generate_ms: 19.0,
            call_ms: 18.0,
        };
        for i in 0..1500u64 {
            let prompt = [1, 16, 40, 150, 7][i as usize % 5];
            m.observe(&timings(&truth, prompt, 1 + i % 32));
        }
        let r = m.rates();
        assert_eq!(m.calls_observed(), 1500);
        for (got, want) in [
            (r.prefill_ms, truth.prefill_ms),
            (r.generate_ms, truth.generate_ms),
            (r.call_ms, truth.call_ms),
        ] {
            assert!((got - want).abs() / want < 0.05, "{r:?} against {truth:?}");
        }
    }

    #[test]
    fn the_target_s_counters_teach_the_rates_its_calls_did_not_report() {
        // Twice as slow as the prior: 21.2 ms per prompt token and 75 ms per generated one,
        // no fixed part; intervals of 6 calls of 20 to 60 new prompt tokens each.
        let m = BusyMeter::new(BusyRates::CPU_LLAMA_SERVER);
        for i in 0..60u64 {
            let tokens = 6 * (20 + i % 5 * 10);
            m.observe_counters(
                &TargetCounters {
                    prompt_processed: tokens,
                    prompt_seconds: tokens as f64 * 0.0212,
                    predicted: 90,
                    predicted_seconds: 90.0 * 0.075,
                    ..TargetCounters::default()
                },
                6,
            );
        }
        let r = m.rates();
        assert_eq!(m.calls_observed(), 360);
        assert!((r.generate_ms - 75.0).abs() < 0.5, "{r:?}");
        assert!((r.prefill_ms - 21.2).abs() < 1.0, "{r:?}");
        assert!(r.call_ms < 20.0, "{r:?}");
    }

    #[test]
    fn follows_a_target_that_slows_down_and_ignores_nonsense() {
        let m = BusyMeter::new(BusyRates::CPU_LLAMA_SERVER);
        let fast = BusyRates {
            prefill_ms: 5.0,
            generate_ms: 20.0,
            call_ms: 10.0,
        };
        let slow = BusyRates {
            prefill_ms: 10.0,
            generate_ms: 40.0,
            call_ms: 20.0,
        };
        for i in 0..2000u64 {
            m.observe(&timings(&fast, 1 + i % 60, 8));
        }
        assert!((m.rates().generate_ms - 20.0).abs() < 0.5);
        for i in 0..3000u64 {
            m.observe(&timings(&slow, 1 + i % 60, 8));
        }
        let r = m.rates();
        assert!((r.generate_ms - 40.0).abs() < 1.0, "{r:?}");
        assert!((r.prefill_ms - 10.0).abs() < 0.5, "{r:?}");
        let before = m.rates();
        m.observe(&TargetTimings {
            prompt_tokens: 3,
            prompt_ms: f64::NAN,
            predicted_tokens: 1,
            predicted_ms: -4.0,
        });
        assert_eq!(m.rates(), before);
    }
}
