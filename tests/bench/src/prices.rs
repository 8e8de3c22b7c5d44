//! The price classes `approxy bench calls` reports costs under: USD per million tokens, each
//! with the date and the source it was read from. Prices change; re-check before relying on
//! them.

use serde::{Deserialize, Serialize};

/// One provider class's prices.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PriceClass {
    /// Short name.
    pub name: &'static str,
    /// What it stands for.
    pub what: &'static str,
    /// Input, per million tokens.
    pub input: f64,
    /// Input read from the provider's prompt cache.
    pub cached_input: f64,
    /// Output.
    pub output: f64,
    /// When the source was read (or when its prices took effect).
    pub date: &'static str,
    /// Where the numbers come from.
    pub source: &'static str,
}

/// The classes: self-hosted first, then the hosted ones from the cheapest re-read of a cached
/// prefix (relative to output) to the dearest.
pub const CLASSES: [PriceClass; 4] = [
    PriceClass {
        name: "self-hosted",
        what: "your own vLLM or llama.cpp with a prefix cache: the shipped policy's relative prices (input 1, cached 0.1, output 3), standing for GPU time",
        input: 0.50,
        cached_input: 0.05,
        output: 1.50,
        date: "2026-11-21",
        source: "policies/default.toml (illustrative, not a provider's list price)",
    },
    PriceClass {
        name: "DeepSeek",
        what: "deepseek-chat (DeepSeek V4 flash), automatic disk cache; V4 pro lists 0.435 / 0.0036 / 0.87, and off-peak hours (since 2026-08) are half price",
        input: 0.14,
        cached_input: 0.0028,
        output: 0.28,
        date: "read 2026-11-26",
        source: "https://api-docs.deepseek.com/quick_start/pricing",
    },
    PriceClass {
        name: "Fireworks",
        what: "serverless, base models of 16.1B-80B parameters; cached input at the default 50 %",
        input: 0.90,
        cached_input: 0.45,
        output: 0.90,
        date: "read 2026-11-26",
        source: "https://fireworks.ai/pricing and https://docs.fireworks.ai/serverless/overview (cached input)",
    },
    PriceClass {
        name: "Together",
        what: "serverless Llama-3.3-70B-Instruct-Turbo as a third-party listing quotes it; no prompt-cache discount (unconfirmed, FACTS.md)",
        input: 0.88,
        cached_input: 0.88,
        output: 0.88,
        date: "read 2026-11-26",
        source: "a third-party listing (Together's own page not read); read 2026-11-23 a third-party page quoted 0.80 / 2.40 (https://theneuralbase.com/together-ai/learn/intermediate/cost-per-quality-point/)",
    },
];

/// Cost in USD of sending `input` tokens, `cached` of them from the cache, and receiving
/// `output` tokens.
pub fn cost(p: &PriceClass, input: u64, cached: u64, output: u64) -> f64 {
    let cached = cached.min(input);
    ((input - cached) as f64 * p.input + cached as f64 * p.cached_input + output as f64 * p.output)
        / 1e6
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_class_is_dated_sourced_and_priced_sanely() {
        for p in &CLASSES {
            assert!(!p.date.is_empty() && !p.source.is_empty(), "{}", p.name);
            assert!(p.cached_input <= p.input && p.input > 0.0 && p.output > 0.0);
        }
        let c = &CLASSES[1];
        let (m, k) = (1_000_000u64, 1_000u64);
        assert!((cost(c, m, 0, 0) - 0.14).abs() < 1e-9);
        assert!((cost(c, m, m, 0) - 0.0028).abs() < 1e-9);
        assert!((cost(c, 0, 0, m) - 0.28).abs() < 1e-9);
        assert!(
            (cost(c, k, 2 * k, 0) - cost(c, k, k, 0)).abs() < 1e-12,
            "cached <= input"
        );
    }
}
