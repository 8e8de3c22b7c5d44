//! What each target's time costs, learned from what it reports (see
//! [`approxy_verifier::cost::BusyMeter`]): one meter per target, kept across policy reloads,
//! fed by every approximate request's timed calls and read when a busy-priced request starts
//! and ends. Its rates are on `/metrics` as `approxy_target_rate_ms`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use approxy_verifier::Stats;
use approxy_verifier::cost::{BusyMeter, BusyRates};

/// The meters, by target base URL.
#[derive(Default)]
pub struct Meters {
    by_target: Mutex<HashMap<String, Arc<BusyMeter>>>,
}

impl Meters {
    /// The meter of the target at `base_url`, starting from `prior` (a reload that changes
    /// the prior starts it afresh: the operator has said something new about the target).
    pub fn meter(&self, base_url: &str, prior: BusyRates) -> Arc<BusyMeter> {
        let mut map = self.by_target.lock().unwrap_or_else(|e| e.into_inner());
        let entry = map
            .entry(base_url.to_string())
            .or_insert_with(|| Arc::new(BusyMeter::new(prior)));
        if entry.prior() != prior {
            *entry = Arc::new(BusyMeter::new(prior));
        }
        Arc::clone(entry)
    }
}

/// Teaches `meter` every call of `s` the target timed, and shows its rates.
pub fn learn(meter: &BusyMeter, s: &Stats) {
    let mut any = false;
    for t in s.calls.iter().filter_map(|c| c.timings.as_ref()) {
        meter.observe(t);
        any = true;
    }
    if any {
        let r = meter.rates();
        for (part, v) in [
            ("prefill", r.prefill_ms),
            ("generate", r.generate_ms),
            ("call", r.call_ms),
        ] {
            metrics::gauge!("approxy_target_rate_ms", "part" => part).set(v);
        }
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
}
