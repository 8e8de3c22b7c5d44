//! One configuration's results: each problem's outcome and the aggregates the report shows
//! (pass@1, speed, target work and estimated cost).

use serde::{Deserialize, Serialize};

use approxy_gateway::policy::Price;

use super::client::Generation;
use super::configs::{Config, Route};
use super::humaneval::Verdict;
use super::stats::{mean, quantile};

/// One problem's outcome.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProblemRun {
    /// HumanEval task id.
    pub task_id: String,
    /// pass@1 check.
    pub verdict: Verdict,
    /// The timed generation.
    pub generation: Generation,
}

/// Aggregates of one (layout, configuration) run.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Summary {
    /// Problems run.
    pub problems: usize,
    /// Problems whose tests passed.
    pub passed: usize,
    /// passed / problems, in percent.
    pub pass_at_1: f64,
    /// Calls that failed (counted as not passed).
    pub errors: usize,
    /// Output tokens over all problems.
    pub output_tokens: u64,
    /// Output tokens per second of generation wall time (TTFT included).
    pub tokens_per_second: f64,
    /// Generation wall time over all problems, seconds (test runs and server starts excluded).
    #[serde(default)]
    pub generation_seconds: f64,
    /// Median time to first token, seconds.
    pub ttft_p50: f64,
    /// Mean time to first token, seconds.
    pub ttft_mean: f64,
    /// Target calls per 100 output tokens.
    pub target_calls_per_100: f64,
    /// Output tokens the target generated, per 100 output tokens.
    pub target_tokens_per_100: f64,
    /// Every token the target was sent or generated (re-sent prefixes included).
    pub target_processed_tokens: u64,
    /// Of the input sent to the target, the part a prompt cache could reuse.
    pub target_cacheable_input_tokens: u64,
    /// Answers the target finished after too many rejections.
    pub bailouts: usize,
    /// USD for the run, every input token at the input price.
    pub cost_usd: f64,
    /// USD for the run, re-sent input at the cached-input price.
    pub cost_usd_cached: f64,
    /// llama.cpp's speculative decoding: accepted / drafted.
    pub llama_draft_acceptance: Option<f64>,
}

/// A finished (layout, configuration) run, as saved under `raw/`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ConfigRun {
    /// Layout name.
    pub layout: String,
    /// The configuration.
    pub config: Config,
    /// Aggregates.
    pub summary: Summary,
    /// Per problem.
    pub problems: Vec<ProblemRun>,
}

/// One row of `quality.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunSummary {
    /// Layout name.
    pub layout: String,
    /// Configuration.
    pub config: Config,
    /// Aggregates.
    pub summary: Summary,
}

/// Cost of a run scaled to 1,000 problems, in USD.
pub fn per_1k(usd: f64, problems: usize) -> f64 {
    if problems == 0 {
        0.0
    } else {
        usd * 1000.0 / problems as f64
    }
}

/// Aggregates a run's problems at `price`.
pub fn summarize(route: Route, runs: &[ProblemRun], price: &Price) -> Summary {
    let n = runs.len();
    let gens: Vec<&Generation> = runs.iter().map(|r| &r.generation).collect();
    let passed = runs.iter().filter(|r| r.verdict == Verdict::Passed).count();
    let tokens: u64 = gens.iter().map(|g| g.completion_tokens).sum();
    let seconds: f64 = gens.iter().map(|g| g.seconds).sum();
    let ttfts: Vec<f64> = gens.iter().filter_map(|g| g.ttft).collect();
    let ok: Vec<&&Generation> = gens.iter().filter(|g| g.error.is_none()).collect();
    let per100 = |x: u64| {
        if tokens == 0 {
            0.0
        } else {
            100.0 * x as f64 / tokens as f64
        }
    };
    let m = 1e6;
    let mut s = Summary {
        problems: n,
        passed,
        pass_at_1: if n == 0 {
            0.0
        } else {
            100.0 * passed as f64 / n as f64
        },
        errors: n - ok.len(),
        output_tokens: tokens,
        tokens_per_second: if seconds > 0.0 {
            tokens as f64 / seconds
        } else {
            0.0
        },
        generation_seconds: seconds,
        ttft_p50: quantile(&ttfts, 0.5).unwrap_or(0.0),
        ttft_mean: mean(&ttfts).unwrap_or(0.0),
        ..Summary::default()
    };
    match route {
        Route::Passthrough | Route::LlamaSpeculative => {
            // The target reads the prompt once and produces every output token.
            let prompt: u64 = ok.iter().map(|g| g.prompt_tokens).sum();
            s.target_calls_per_100 = per100(ok.len() as u64);
            s.target_tokens_per_100 = per100(tokens);
            s.target_processed_tokens = prompt + tokens;
            s.cost_usd = (prompt as f64 * price.input + tokens as f64 * price.output) / m;
            s.cost_usd_cached = s.cost_usd;
            let drafted: u64 = gens.iter().filter_map(|g| g.draft_n).sum();
            let accepted: u64 = gens.iter().filter_map(|g| g.draft_n_accepted).sum();
            if route == Route::LlamaSpeculative && drafted > 0 {
                s.llama_draft_acceptance = Some(accepted as f64 / drafted as f64);
            }
        }
        Route::Approximate => {
            let a: Vec<_> = gens.iter().filter_map(|g| g.approxy.as_ref()).collect();
            let calls: u64 = a.iter().map(|u| u.target_calls).sum();
            let generated: u64 = a.iter().map(|u| u.target_tokens).sum();
            let input: u64 = a.iter().map(|u| u.target_input_tokens).sum();
            let cacheable: u64 = a.iter().map(|u| u.target_cacheable_input_tokens).sum();
            s.target_calls_per_100 = per100(calls);
            s.target_tokens_per_100 = per100(generated);
            s.target_processed_tokens = input + generated;
            s.target_cacheable_input_tokens = cacheable;
            s.bailouts = a.iter().filter(|u| u.bailed_out).count();
            s.cost_usd = (input as f64 * price.input + generated as f64 * price.output) / m;
            s.cost_usd_cached = ((input - cacheable.min(input)) as f64 * price.input
                + cacheable as f64 * price.cached_input
                + generated as f64 * price.output)
                / m;
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::ApproxyUsage;

    fn run(tokens: u64, prompt: u64, verdict: Verdict, a: Option<ApproxyUsage>) -> ProblemRun {
        ProblemRun {
            task_id: "t".into(),
            verdict,
            generation: Generation {
                completion_tokens: tokens,
                prompt_tokens: prompt,
                seconds: 2.0,
                ttft: Some(0.5),
                approxy: a,
                ..Generation::default()
            },
        }
    }

    #[test]
    fn summaries_count_target_work_and_cost() {
        let price = Price {
            input: 1.0,
            cached_input: 0.1,
            output: 2.0,
        };
        let pt = summarize(
            Route::Passthrough,
            &[
                run(10, 100, Verdict::Passed, None),
                run(30, 50, Verdict::Failed, None),
            ],
            &price,
        );
        assert_eq!(pt.pass_at_1, 50.0);
        assert_eq!(pt.output_tokens, 40);
        assert_eq!(pt.tokens_per_second, 10.0);
        assert_eq!(pt.generation_seconds, 4.0);
        assert_eq!(pt.target_tokens_per_100, 100.0);
        assert_eq!(pt.target_calls_per_100, 5.0);
        assert_eq!(pt.target_processed_tokens, 190);
        assert!((pt.cost_usd - (150.0 + 80.0) / 1e6).abs() < 1e-12);

        let a = ApproxyUsage {
            draft_tokens: 15,
            target_tokens: 5,
            target_calls: 5,
            target_input_tokens: 600,
            target_cacheable_input_tokens: 500,
            bailed_out: true,
            ..ApproxyUsage::default()
        };
        let ap = summarize(
            Route::Approximate,
            &[run(20, 100, Verdict::Passed, Some(a))],
            &price,
        );
        assert_eq!(ap.target_tokens_per_100, 25.0);
        assert_eq!(ap.target_calls_per_100, 25.0);
        assert_eq!(ap.target_processed_tokens, 605);
        assert_eq!(ap.bailouts, 1);
        assert!((ap.cost_usd - (600.0 + 10.0) / 1e6).abs() < 1e-12);
        assert!((ap.cost_usd_cached - (100.0 + 50.0 + 10.0) / 1e6).abs() < 1e-12);
    }
}
