//! The busy price class: a self-hosted target's cost is its own time. A call costs a fixed
//! part (a forward pass, however few tokens it reads), a part per prompt token its cache does
//! not serve, and a part per token it generates. On the CPU llama-server here a prompt token
//! costs about 0.27 of a generated one; on a GPU, where one pass scores 16 tokens for about the
//! price of one decode step, about 0.06 (`tests/bench/gpu/window_cost.json`). Costs are seconds of
//! the target's time, not USD.

use serde::{Deserialize, Serialize};

use super::tariff::{Tariff, Unit};

/// What the target's time costs, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct BusyRates {
    /// Per prompt token the target computes (its cache does not serve it).
    pub prefill_ms: f64,
    /// Per token it generates.
    pub generate_ms: f64,
    /// Per call, whatever its length: the pass a call always takes.
    pub call_ms: f64,
}

impl BusyRates {
    /// The CPU llama-server the run command starts (Qwen2.5-Coder-1.5B Q4_K_M, one core), by
    /// its own counters over `approxy bench calls` target-only runs: a prior, so that calls are
    /// priced sensibly before the target's timings teach its real rates. The fixed part is left
    /// to traffic. See policies/README.md, "Busy pricing: the target's time".
    pub const CPU_LLAMA_SERVER: BusyRates = BusyRates {
        prefill_ms: 10.6,
        generate_ms: 37.5,
        call_ms: 0.0,
    };

    /// Every rate finite and not negative, and generating costs something.
    pub fn valid(&self) -> bool {
        [self.prefill_ms, self.generate_ms, self.call_ms]
            .iter()
            .all(|x| x.is_finite() && *x >= 0.0)
            && self.generate_ms > 0.0
    }

    /// Seconds a call that computes `prefilled` prompt tokens and generates `generated`
    /// takes.
    pub fn call_seconds(&self, prefilled: u64, generated: u64) -> f64 {
        (self.call_ms + prefilled as f64 * self.prefill_ms + generated as f64 * self.generate_ms)
            / 1e3
    }
}

impl Default for BusyRates {
    fn default() -> Self {
        Self::CPU_LLAMA_SERVER
    }
}

impl Tariff for BusyRates {
    /// Cached prompt tokens are not computed again: they cost nothing beyond the call's
    /// fixed part (which counts the pass that reads them).
    fn input_cost(&self, sent: u64, cacheable: u64) -> f64 {
        sent.saturating_sub(cacheable) as f64 * self.prefill_ms / 1e3
    }

    fn output_cost(&self, n: u64) -> f64 {
        n as f64 * self.generate_ms / 1e3
    }

    fn call_cost(&self) -> f64 {
        self.call_ms / 1e3
    }

    fn is_free(&self) -> bool {
        false
    }

    fn unit(&self) -> Unit {
        Unit::TargetSeconds
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_costs_its_pass_its_computed_prompt_and_its_tokens() {
        let r = BusyRates {
            prefill_ms: 10.0,
            generate_ms: 40.0,
            call_ms: 25.0,
        };
        assert!((r.call_seconds(100, 10) - (25.0 + 1000.0 + 400.0) / 1e3).abs() < 1e-12);
        // 120 sent, 100 of them cached: 20 computed.
        assert!((r.input_cost(120, 100) - 0.2).abs() < 1e-12);
        assert_eq!(r.input_cost(10, 50), 0.0);
        assert!((r.output_cost(3) - 0.12).abs() < 1e-12);
        assert!((r.call_cost() - 0.025).abs() < 1e-12);
        assert!(!r.is_free() && r.valid());
        assert!(
            !BusyRates {
                generate_ms: 0.0,
                ..r
            }
            .valid()
        );
    }
}
