//! A target's own account of its work, from its Prometheus counters (`/metrics`): what the
//! gateway learns a target's rates from when its calls report no timings, and what the
//! benchmarks check approxy's bill against. llama-server (`--metrics`) and vLLM count what the
//! server computed, whoever stopped reading: a stream approxy cancels is released by
//! llama-server, and the release flushes the tokens it generated into `tokens_predicted_total`
//! (llama.cpp `tools/server/server-context.cpp`, `callback_on_reset`); vLLM counts generated
//! tokens per engine step (`vllm:generation_tokens`, vllm/v1/metrics/loggers.py), aborted
//! requests' included. So tokens in flight at a cancel are in the count even though no event
//! carried them to approxy.

use serde::{Deserialize, Serialize};

use crate::error::TargetError;

/// What the target computed, from its counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct TargetCounters {
    /// Prompt tokens it computed (`llamacpp:prompt_tokens_total`: cached tokens excluded).
    pub prompt_processed: u64,
    /// Prompt tokens it reused from its cache (`llamacpp:prompt_tokens_cached_total`).
    pub prompt_cached: u64,
    /// Tokens it generated, used or not (`llamacpp:tokens_predicted_total`).
    pub predicted: u64,
    /// Seconds spent on prompts (`llamacpp:prompt_seconds_total`).
    pub prompt_seconds: f64,
    /// Seconds spent generating (`llamacpp:tokens_predicted_seconds_total`).
    pub predicted_seconds: f64,
}

impl TargetCounters {
    /// Reads llama-server's or vLLM's `/metrics` text. Every counter must be there: a server
    /// without one is not the server this account was written for, and a silent zero would
    /// read as a saving.
    pub fn parse(text: &str) -> Result<Self, TargetError> {
        let get = |name: &str| -> Result<f64, TargetError> {
            sample_sum(text, name).ok_or_else(|| {
                TargetError::Protocol(format!("the target's /metrics has no {name}"))
            })
        };
        if text.lines().any(|l| l.starts_with("vllm:")) {
            // vLLM counts every prompt token and, apart, those its prefix cache served; its
            // compute time is the prefill and decode time of the requests it finished, which on
            // one request at a time is its busy time, except for requests a client closed:
            // vLLM aborts them and leaves them out of those histograms (not out of its token
            // counts).
            let total = get("vllm:prompt_tokens_total")?;
            let cached = get("vllm:prompt_tokens_cached_total")?;
            return Ok(Self {
                prompt_processed: (total - cached).max(0.0) as u64,
                prompt_cached: cached as u64,
                predicted: get("vllm:generation_tokens_total")? as u64,
                prompt_seconds: get("vllm:request_prefill_time_seconds_sum")?,
                predicted_seconds: get("vllm:request_decode_time_seconds_sum")?,
            });
        }
        Ok(Self {
            prompt_processed: get("llamacpp:prompt_tokens_total")? as u64,
            prompt_cached: get("llamacpp:prompt_tokens_cached_total")? as u64,
            predicted: get("llamacpp:tokens_predicted_total")? as u64,
            prompt_seconds: get("llamacpp:prompt_seconds_total")?,
            predicted_seconds: get("llamacpp:tokens_predicted_seconds_total")?,
        })
    }

    /// What was counted after `before`.
    pub fn since(&self, before: &Self) -> Self {
        Self {
            prompt_processed: self
                .prompt_processed
                .saturating_sub(before.prompt_processed),
            prompt_cached: self.prompt_cached.saturating_sub(before.prompt_cached),
            predicted: self.predicted.saturating_sub(before.predicted),
            prompt_seconds: (self.prompt_seconds - before.prompt_seconds).max(0.0),
            predicted_seconds: (self.predicted_seconds - before.predicted_seconds).max(0.0),
        }
    }

    /// The target's compute time: prompts and generation.
    pub fn busy_seconds(&self) -> f64 {
        self.prompt_seconds + self.predicted_seconds
    }

    /// The same tokens in the terms of a bill.
    pub fn tokens(&self) -> Tokens {
        Tokens {
            uncached_input: self.prompt_processed,
            cached_input: self.prompt_cached,
            output: self.predicted,
        }
    }
}

/// Tokens a target is paid for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tokens {
    /// Input computed from scratch.
    pub uncached_input: u64,
    /// Input served from a prompt cache.
    pub cached_input: u64,
    /// Output, used or not.
    pub output: u64,
}

/// Requests the target is working on now, when its counters say.
pub fn processing(text: &str) -> Option<f64> {
    sample_sum(text, "llamacpp:requests_processing")
        .or_else(|| sample_sum(text, "vllm:num_requests_running"))
}

/// The sum of a metric's samples over all their label sets (vLLM labels each by engine and
/// model; llama-server's have none), or `None` when it has no sample.
fn sample_sum(text: &str, name: &str) -> Option<f64> {
    let mut found = None;
    for l in text.lines().filter(|l| !l.starts_with('#')) {
        let end = l.find(['{', ' ']).unwrap_or(l.len());
        if &l[..end] != name {
            continue;
        }
        // The value is the field after the labels (which may hold spaces inside quotes).
        let rest = match l[end..].strip_prefix('{') {
            Some(r) => r.rsplit_once('}').map_or("", |(_, v)| v),
            None => &l[end..],
        };
        if let Some(v) = rest
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<f64>().ok())
        {
            *found.get_or_insert(0.0) += v;
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    /// llama-server's `/metrics` as the vendored llama.cpp renders it (server-task.cpp,
    /// `to_metrics`), trimmed to the lines read and one that is not.
    const SAMPLE: &str = "\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed, excluding cached tokens
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 1234
# HELP llamacpp:prompt_tokens_cached_total Number of prompt tokens reused from the cache
# TYPE llamacpp:prompt_tokens_cached_total counter
llamacpp:prompt_tokens_cached_total 5678
llamacpp:prompt_seconds_total 1.5
llamacpp:tokens_predicted_total 910
llamacpp:tokens_predicted_seconds_total 12.25
llamacpp:n_decode_total 77
llamacpp:requests_processing 1
";

    #[test]
    fn the_counters_are_read_by_name() -> Result<(), TargetError> {
        let a = TargetCounters::parse(SAMPLE)?;
        assert_eq!(
            a,
            TargetCounters {
                prompt_processed: 1234,
                prompt_cached: 5678,
                predicted: 910,
                prompt_seconds: 1.5,
                predicted_seconds: 12.25,
            }
        );
        assert_eq!(a.busy_seconds(), 13.75);
        assert_eq!(processing(SAMPLE), Some(1.0));
        Ok(())
    }

    /// vLLM's `/metrics` as its v1 Prometheus logger renders it (vllm/v1/metrics/loggers.py),
    /// trimmed: labelled samples, summed over engines.
    const VLLM_SAMPLE: &str = "\
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine=\"0\",model_name=\"qwen coder\"} 1000.0
vllm:prompt_tokens_total{engine=\"1\",model_name=\"qwen coder\"} 500.0
vllm:prompt_tokens_cached_total{engine=\"0\",model_name=\"qwen coder\"} 600.0
vllm:prompt_tokens_cached_by_source_total{engine=\"0\",model_name=\"qwen coder\",source=\"device\"} 600.0
vllm:generation_tokens_total{engine=\"0\",model_name=\"qwen coder\"} 321.0
vllm:request_prefill_time_seconds_sum{engine=\"0\",model_name=\"qwen coder\"} 4.5
vllm:request_prefill_time_seconds_count{engine=\"0\",model_name=\"qwen coder\"} 9.0
vllm:request_decode_time_seconds_sum{engine=\"0\",model_name=\"qwen coder\"} 20.25
vllm:num_requests_running{engine=\"0\",model_name=\"qwen coder\"} 0.0
";

    #[test]
    fn vllm_counters_are_read_over_their_labels() -> Result<(), TargetError> {
        let a = TargetCounters::parse(VLLM_SAMPLE)?;
        assert_eq!(
            a,
            TargetCounters {
                prompt_processed: 900,
                prompt_cached: 600,
                predicted: 321,
                prompt_seconds: 4.5,
                predicted_seconds: 20.25,
            }
        );
        assert_eq!(processing(VLLM_SAMPLE), Some(0.0));
        let text = VLLM_SAMPLE.replace("vllm:generation_tokens_total", "vllm:other");
        assert!(TargetCounters::parse(&text).is_err());
        Ok(())
    }

    #[test]
    fn a_missing_counter_is_an_error_not_a_zero() {
        let text = SAMPLE.replace("llamacpp:tokens_predicted_total 910\n", "");
        let e = TargetCounters::parse(&text).map(|_| ()).unwrap_err();
        assert!(e.to_string().contains("tokens_predicted_total"), "{e}");
    }

    #[test]
    fn a_run_is_the_difference_of_two_readings() -> Result<(), TargetError> {
        let before = TargetCounters::parse(SAMPLE)?;
        let after = TargetCounters {
            prompt_processed: 1300,
            prompt_cached: 6000,
            predicted: 1000,
            prompt_seconds: 2.0,
            predicted_seconds: 14.25,
        };
        let d = after.since(&before);
        assert_eq!(
            d.tokens(),
            Tokens {
                uncached_input: 66,
                cached_input: 322,
                output: 90
            }
        );
        assert!((d.busy_seconds() - 2.5).abs() < 1e-12);
        Ok(())
    }
}
