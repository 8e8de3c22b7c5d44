//! The token price class: a price list per million tokens, as hosted APIs bill (and as a
//! self-hosted target is priced when its policy gives it one).

use serde::{Deserialize, Serialize};

use super::tariff::Tariff;

/// USD per million tokens.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Price {
    /// Input tokens.
    pub input: f64,
    /// Input tokens served from a prompt cache.
    pub cached_input: f64,
    /// Output tokens.
    pub output: f64,
}

impl Price {
    fn per_token(x: f64) -> f64 {
        x / 1e6
    }
}

impl Tariff for Price {
    fn input_cost(&self, sent: u64, cacheable: u64) -> f64 {
        let cacheable = cacheable.min(sent);
        Self::per_token(
            (sent - cacheable) as f64 * self.input + cacheable as f64 * self.cached_input,
        )
    }

    fn output_cost(&self, n: u64) -> f64 {
        Self::per_token(n as f64 * self.output)
    }

    /// Every price zero: a self-hosted target priced at nothing.
    fn is_free(&self) -> bool {
        self.input == 0.0 && self.cached_input == 0.0 && self.output == 0.0
    }
}
