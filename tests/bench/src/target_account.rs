//! The target's own account of a benchmark run (its counters, read before and after a
//! configuration's prompts; [`TargetAccount`] is the verifier's `TargetCounters`), to check
//! approxy's bill against and to measure what a self-hosted target really spent.

use std::time::{Duration, Instant};

use approxy_verifier::targets::counters::processing;
pub use approxy_verifier::targets::counters::{TargetCounters as TargetAccount, Tokens};

/// Signed relative difference of `estimate` from `reported`, in percent.
pub fn difference_pct(estimate: f64, reported: f64) -> f64 {
    if reported == 0.0 {
        return if estimate == 0.0 { 0.0 } else { f64::INFINITY };
    }
    100.0 * (estimate - reported) / reported
}

/// The target's counters once it has finished what it was asked: a cancelled stream's slot is
/// released only when the server notices the closed connection, so the counters are read when
/// no request is processing (at most `settle`).
pub async fn read(
    http: &reqwest::Client,
    target_url: &str,
    settle: Duration,
) -> anyhow::Result<TargetAccount> {
    let url = format!("{target_url}/metrics");
    let start = Instant::now();
    loop {
        let text = http
            .get(&url)
            .timeout(Duration::from_secs(10))
            .send()
            .await?
            .error_for_status()?
            .text()
            .await?;
        if processing(&text) == Some(0.0) || start.elapsed() >= settle {
            return Ok(TargetAccount::parse(&text)?);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn differences_are_signed_and_relative_to_the_report() {
        assert_eq!(difference_pct(97.0, 100.0), -3.0);
        assert_eq!(difference_pct(0.0, 0.0), 0.0);
        assert!(difference_pct(1.0, 0.0).is_infinite());
    }
}
