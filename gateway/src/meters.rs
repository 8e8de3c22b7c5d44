//! What each target's time costs, learned from what it reports (see
//! [`approxy_verifier::infer::BusyMeter`]): one meter per target, kept across policy reloads,
//! read when a busy-priced request starts and ends. It learns from the target's own counters
//! (`/metrics`, read by `server::watch_counters`) where its kind has them, since they count every
//! call, a stream approxy closed before its end included, which reports no timings; otherwise
//! from the calls that reported theirs. Its rates are on `/metrics` as `approxy_target_rate_ms`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use approxy_verifier::infer::{BusyMeter, Stats, TargetCounters};
use approxy_verifier::policy::BusyRates;

/// One target's meter, and what its counters need.
#[derive(Debug)]
pub struct TargetMeter {
    meter: BusyMeter,
    /// Calls the gateway made to the target since its counters were last read.
    pending: AtomicU64,
    /// The counters are being read: they, not the calls' own timings, teach the rates (both
    /// would count the timed calls twice).
    counted: AtomicBool,
}

impl TargetMeter {
    fn new(prior: BusyRates) -> Self {
        Self {
            meter: BusyMeter::new(prior),
            pending: AtomicU64::new(0),
            counted: AtomicBool::new(false),
        }
    }

    /// The rates now.
    pub fn rates(&self) -> BusyRates {
        self.meter.rates()
    }

    /// Counts a finished approximate request's calls, and learns from their timings while
    /// the counters are not read.
    pub fn learn(&self, s: &Stats) {
        self.pending
            .fetch_add(u64::from(s.target_calls), Ordering::Relaxed);
        if self.counted.load(Ordering::Relaxed) {
            return;
        }
        let mut any = false;
        for t in s.calls.iter().filter_map(|c| c.timings.as_ref()) {
            self.meter.observe(t);
            any = true;
        }
        if any {
            self.show();
        }
    }

    /// Counts a request passed through to the target (one call).
    pub fn passed_through(&self) {
        self.pending.fetch_add(1, Ordering::Relaxed);
    }

    /// Whether the counters are being read (then they, not the calls' timings, teach it).
    pub fn set_counted(&self, counted: bool) {
        self.counted.store(counted, Ordering::Relaxed);
    }

    /// Forgets the calls counted so far (a first reading holds none of them).
    pub fn forget_pending(&self) {
        self.pending.store(0, Ordering::Relaxed);
    }

    /// Learns from what the counters counted since the last reading.
    pub fn counted_since(&self, delta: &TargetCounters) {
        let calls = self.pending.swap(0, Ordering::Relaxed);
        self.meter.observe_counters(delta, calls);
        self.show();
    }

    fn show(&self) {
        let r = self.meter.rates();
        for (part, v) in [
            ("prefill", r.prefill_ms),
            ("generate", r.generate_ms),
            ("call", r.call_ms),
        ] {
            metrics::gauge!("approxy_target_rate_ms", "part" => part).set(v);
        }
    }
}

/// The meters, by target base URL.
#[derive(Default)]
pub struct Meters {
    by_target: Mutex<HashMap<String, Arc<TargetMeter>>>,
}

impl Meters {
    /// The meter of the target at `base_url`, starting from `prior` (a reload that changes
    /// the prior starts it afresh: the operator has said something new about the target).
    pub fn meter(&self, base_url: &str, prior: BusyRates) -> Arc<TargetMeter> {
        let mut map = self.by_target.lock().unwrap_or_else(|e| e.into_inner());
        let entry = map
            .entry(base_url.to_string())
            .or_insert_with(|| Arc::new(TargetMeter::new(prior)));
        if entry.meter.prior() != prior {
            *entry = Arc::new(TargetMeter::new(prior));
        }
        Arc::clone(entry)
    }
}

/// The engine learns the target's rates from each finished generation through this.
impl approxy_verifier::infer::Meter for TargetMeter {
    fn learn(&self, stats: &Stats) {
        TargetMeter::learn(self, stats);
    }

    fn rates(&self) -> BusyRates {
        TargetMeter::rates(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_target_keeps_its_meter_until_its_prior_changes() {
        let m = Meters::default();
        let a = m.meter("http://t", BusyRates::default());
        assert!(Arc::ptr_eq(&a, &m.meter("http://t", BusyRates::default())));
        assert!(!Arc::ptr_eq(&a, &m.meter("http://u", BusyRates::default())));
        let other = BusyRates {
            call_ms: 5.0,
            ..BusyRates::default()
        };
        assert!(!Arc::ptr_eq(&a, &m.meter("http://t", other)));
    }

    #[test]
    fn counters_teach_the_calls_made_since_the_last_reading_and_silence_the_timings() {
        let m = TargetMeter::new(BusyRates::CPU_LLAMA_SERVER);
        for _ in 0..3 {
            m.passed_through();
        }
        m.counted.store(true, Ordering::Relaxed);
        let delta = TargetCounters {
            prompt_processed: 300,
            prompt_seconds: 6.0,
            predicted: 200,
            predicted_seconds: 15.0,
            ..TargetCounters::default()
        };
        for _ in 0..200 {
            m.pending.fetch_add(3, Ordering::Relaxed);
            m.counted_since(&delta);
        }
        let r = m.rates();
        assert!((r.generate_ms - 75.0).abs() < 0.5, "{r:?}");
        // Every interval's mean call: 100 tokens in 2 s.
        assert!(
            (r.call_ms + 100.0 * r.prefill_ms - 2000.0).abs() < 20.0,
            "{r:?}"
        );
        assert_eq!(m.pending.load(Ordering::Relaxed), 0);
    }
}
