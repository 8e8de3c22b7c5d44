//! A run's prompts summed: speed, calls, tokens, costs and the target's time.

use super::saved::CallsRun;
use crate::chat_sample::rouge_l;
use crate::client::{ApproxyUsage, Generation};
use crate::gpu_projection::ProjectedCall;
use crate::humaneval::Verdict;
use crate::instructions::InstructionScores;
use crate::prices::{PriceClass, cost};
use crate::target_account::{TargetAccount, Tokens};

/// A run's aggregates.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Aggregates {
    /// Prompts.
    pub n: usize,
    /// HumanEval problems passed.
    pub passed: usize,
    /// Failed generations.
    pub errors: usize,
    /// Output tokens.
    pub tokens: u64,
    /// Output tokens per second of generation.
    pub tok_s: f64,
    /// Median time to first text.
    pub ttft_p50: f64,
    /// Target calls per 100 output tokens.
    pub calls_per_100: f64,
    /// Target-written tokens per 100 output tokens.
    pub target_per_100: f64,
    /// Requests the cost guard handed to the target.
    pub cost_guard: usize,
    /// Overlap guesses drafted and used.
    pub guesses: (u64, u64),
    /// Prompt lookup's proposals computed and used.
    pub lookup: (u64, u64),
    /// Windows scored and the draft tokens they proposed.
    pub windows: (u64, u64),
    /// Tokens the target was sent, of them cacheable, and tokens it generated (paid for).
    pub input: u64,
    /// See `input`.
    pub cacheable: u64,
    /// See `input`.
    pub output: u64,
    /// approxy's own estimate at the policy's prices: the run's cost relative to passthrough,
    /// and its dearest request's.
    pub policy_ratio: Option<(f64, f64)>,
    /// Requests the guard handed to the target, by reason ("not_worth_it: 3").
    pub guard_reasons: Vec<String>,
    /// What approxy billed the target for (passthrough: the client's usage), in the target's
    /// terms: input it had to compute, input its cache served, output.
    pub billed: Tokens,
    /// approxy's estimate of the run's cost at the policy's prices (approximate runs only).
    pub estimated_usd: Option<f64>,
    /// What the target itself counted, when the run read it.
    pub account: Option<TargetAccount>,
    /// Tokens approxy billed as generated after it closed a stream early (its allowance per
    /// closed stream), included in `output`.
    pub inflight_billed: u64,
    /// approxy's account of the target's time (`usage.approxy.target_seconds`: measured where
    /// the target reported, at the learned rates elsewhere), and the calls it did not time.
    pub approxy_seconds: Option<(f64, u64)>,
    /// Every target call, in the projection's terms (passthrough: one per answer).
    pub calls: Vec<ProjectedCall>,
    /// The instruction-following sample's scores.
    pub instructions: Option<InstructionScores>,
    /// Whether any call scored a window.
    pub windowed: bool,
    /// The same calls as a radix cache (SGLang's) would serve them: see [`radix_served`].
    pub radix_calls: Vec<ProjectedCall>,
}

/// An approximate run's account of the target's time and its calls, in the projection's terms.
fn target_time(a: &mut Aggregates, us: &[&ApproxyUsage]) {
    if us.iter().any(|u| !u.target_call_records.is_empty()) {
        a.approxy_seconds = Some((
            us.iter().map(|u| u.target_seconds).sum(),
            us.iter().map(|u| u.target_calls_untimed).sum(),
        ));
    }
    a.calls = us
        .iter()
        .flat_map(|u| &u.target_call_records)
        .map(|c| ProjectedCall {
            cached: c.cached.min(c.sent),
            prefilled: c.sent.saturating_sub(c.cached),
            generated: c.generated,
        })
        .collect();
    a.windowed = us
        .iter()
        .any(|u| u.target_call_records.iter().any(|c| c.kind == "window"));
    a.radix_calls = us
        .iter()
        .flat_map(|u| radix_served(&u.target_call_records))
        .collect();
}

/// One request's calls as a server whose cache holds every token it has seen in the
/// request would serve them, and that starts a window's scoring one token before the window
/// (SGLang's `/generate` with `logprob_start_len`): each call computes what is new since the
/// previous call's prompt and answer, plus one token. What the same calls would cost an
/// SGLang target, where vLLM's windows recompute their whole prefix.
pub fn radix_served(records: &[crate::client::CallRecord]) -> Vec<ProjectedCall> {
    let mut seen = 0u64;
    records
        .iter()
        .map(|c| {
            let cached = seen.min(c.sent.saturating_sub(1));
            seen = c.sent + c.generated;
            ProjectedCall {
                cached,
                prefilled: c.sent - cached,
                generated: c.generated,
            }
        })
        .collect()
}

/// Sums a run's prompts.
pub fn aggregate(run: &CallsRun) -> Aggregates {
    let gens: Vec<&Generation> = run.prompts.iter().map(|p| &p.generation).collect();
    let tokens: u64 = gens.iter().map(|g| g.completion_tokens).sum();
    let seconds: f64 = gens.iter().map(|g| g.seconds).sum();
    let ttfts: Vec<f64> = gens.iter().filter_map(|g| g.ttft).collect();
    let mut a = Aggregates {
        n: run.prompts.len(),
        passed: run
            .prompts
            .iter()
            .filter(|p| p.verdict == Some(Verdict::Passed))
            .count(),
        errors: gens.iter().filter(|g| g.error.is_some()).count(),
        tokens,
        tok_s: tokens as f64 / seconds.max(1e-9),
        ttft_p50: crate::stats::quantile(&ttfts, 0.5).unwrap_or(0.0),
        account: run.target_account,
        instructions: run.instructions,
        ..Aggregates::default()
    };
    if run.config.passthrough() {
        passthrough_totals(&mut a, &gens);
    } else {
        let us: Vec<_> = gens.iter().filter_map(|g| g.approxy.as_ref()).collect();
        approximate_totals(&mut a, &us);
        estimated_costs(&mut a, &us);
        target_time(&mut a, &us);
        a.guard_reasons = guard_reasons(&us);
    }
    a
}

/// `x` per 100 of the run's output tokens.
fn per_100(x: u64, tokens: u64) -> f64 {
    100.0 * x as f64 / tokens.max(1) as f64
}

/// A passthrough run's calls and tokens: one call per answer, every token the target's.
fn passthrough_totals(a: &mut Aggregates, gens: &[&Generation]) {
    let answered = gens.iter().filter(|g| g.error.is_none()).count() as u64;
    a.calls_per_100 = per_100(answered, a.tokens);
    a.target_per_100 = 100.0;
    a.input = gens.iter().map(|g| g.prompt_tokens).sum();
    a.output = a.tokens;
    a.billed = Tokens {
        uncached_input: a.input,
        cached_input: 0,
        output: a.output,
    };
    a.calls = gens
        .iter()
        .filter(|g| g.error.is_none())
        .map(|g| ProjectedCall::passthrough(g.prompt_tokens, g.completion_tokens))
        .collect();
}

/// An approximate run's calls and tokens, as approxy reported them per request.
fn approximate_totals(a: &mut Aggregates, us: &[&ApproxyUsage]) {
    a.calls_per_100 = per_100(us.iter().map(|u| u.target_calls).sum(), a.tokens);
    let generated: u64 = us.iter().map(|u| u.target_tokens).sum();
    a.target_per_100 = per_100(generated, a.tokens);
    a.cost_guard = us.iter().filter(|u| u.cost_guard).count();
    a.lookup = (
        us.iter().map(|u| u.lookup_tokens).sum(),
        us.iter().map(|u| u.lookup_tokens_used).sum(),
    );
    a.guesses = (
        us.iter().map(|u| u.overlap_guesses).sum(),
        us.iter().map(|u| u.overlap_guesses_used).sum(),
    );
    a.windows = (
        us.iter().map(|u| u.windows).sum(),
        us.iter().map(|u| u.window_tokens).sum(),
    );
    a.input = us.iter().map(|u| u.target_input_tokens).sum();
    a.cacheable = us.iter().map(|u| u.target_cacheable_input_tokens).sum();
    a.inflight_billed = us.iter().map(|u| u.target_inflight_tokens).sum();
    a.output =
        generated + a.inflight_billed + us.iter().map(|u| u.target_discarded_tokens).sum::<u64>();
    // What the estimate priced as cached: the target's own figure where every call gave
    // one, else the cache rules' (as the engine does).
    let cached: u64 = us
        .iter()
        .map(|u| {
            u.target_reported_cached_tokens
                .unwrap_or(u.target_cacheable_input_tokens)
                .min(u.target_input_tokens)
        })
        .sum();
    a.billed = Tokens {
        uncached_input: a.input - cached,
        cached_input: cached,
        output: a.output,
    };
}

/// approxy's own estimates of an approximate run's cost: in USD when every request priced in
/// USD, and relative to passthrough (the run's and its dearest request's).
fn estimated_costs(a: &mut Aggregates, us: &[&ApproxyUsage]) {
    // In the policy's unit (runs saved before the unit was reported are in USD).
    let cost = |u: &ApproxyUsage| u.estimated_cost.unwrap_or(u.estimated_cost_usd);
    let direct = |u: &ApproxyUsage| {
        u.estimated_passthrough_cost
            .unwrap_or(u.estimated_passthrough_cost_usd)
    };
    let spent: f64 = us.iter().map(|u| cost(u)).sum();
    a.estimated_usd = us
        .iter()
        .all(|u| u.cost_unit.as_deref().is_none_or(|x| x == "usd"))
        .then_some(spent);
    let passthrough: f64 = us.iter().map(|u| direct(u)).sum();
    if passthrough > 0.0 {
        let worst = us
            .iter()
            .filter(|u| direct(u) > 0.0)
            .map(|u| cost(u) / direct(u))
            .fold(0.0, f64::max);
        a.policy_ratio = Some((spent / passthrough, worst));
    }
}

/// The requests the guard handed to the target, counted by reason ("not_worth_it 3").
fn guard_reasons(us: &[&ApproxyUsage]) -> Vec<String> {
    let mut reasons: std::collections::BTreeMap<&str, usize> = Default::default();
    for u in us {
        if let Some(r) = &u.cost_guard_reason {
            *reasons.entry(r.as_str()).or_default() += 1;
        }
    }
    reasons.iter().map(|(r, n)| format!("{r} {n}")).collect()
}

/// The run's bill under a price class: from the target's own counts where the run read them
/// (what it really computed, cancelled streams included), else from approxy's.
pub(super) fn class_cost(a: &Aggregates, p: &PriceClass, cache: bool) -> f64 {
    let t = a.account.map_or(
        Tokens {
            uncached_input: a.input - a.cacheable.min(a.input),
            cached_input: a.cacheable.min(a.input),
            output: a.output,
        },
        |x| x.tokens(),
    );
    let input = t.uncached_input + t.cached_input;
    cost(p, input, if cache { t.cached_input } else { 0 }, t.output)
}

/// Chat agreement with the target-only run: exact-match share and mean ROUGE-L.
pub fn agreement(run: &CallsRun, baseline: &CallsRun) -> (f64, f64) {
    let pairs: Vec<(&str, &str)> = run
        .prompts
        .iter()
        .zip(&baseline.prompts)
        .map(|(a, b)| (a.generation.text.as_str(), b.generation.text.as_str()))
        .collect();
    let n = pairs.len().max(1) as f64;
    let exact = pairs.iter().filter(|(a, b)| a == b).count() as f64 / n;
    let rouge = pairs.iter().map(|(a, b)| rouge_l(a, b)).sum::<f64>() / n;
    (exact, rouge)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_radix_cache_serves_everything_a_request_sent_or_received_but_one_token() {
        let rec = |kind: &str, sent, cached, generated| crate::client::CallRecord {
            kind: kind.into(),
            sent,
            cached,
            generated,
        };
        // A prompt of 100, a span after 20 drafted tokens that brought 6, then a window of 8
        // after 30 more (vLLM recomputed its whole prefix: nothing cached).
        let calls = radix_served(&[rec("span", 120, 0, 6), rec("window", 164, 0, 1)]);
        assert_eq!(
            calls,
            [
                ProjectedCall {
                    cached: 0,
                    prefilled: 120,
                    generated: 6
                },
                // 126 seen; the window computes the 38 new tokens and starts one before them.
                ProjectedCall {
                    cached: 126,
                    prefilled: 38,
                    generated: 1
                },
            ]
        );
    }
}
