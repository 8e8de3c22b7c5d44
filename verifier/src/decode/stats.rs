//! What one generation cost: tokens by source, target calls and their time, and the spend
//! the cost guard and the price list read.

use std::time::Duration;

use serde::Serialize;

use crate::cost::{GuardReason, Segment, Spend};

use super::calls::{CallRecord, TargetTime, target_time};
use super::request::FinishReason;

/// `$s.field += field` for each field named.
macro_rules! add {
    ($s:expr; $($f:ident),* $(,)?) => {
        $($s.$f += $f;)*
    };
}

/// What one generation cost.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Stats {
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// Generated tokens (end-of-sequence not counted).
    pub completion_tokens: u32,
    /// Draft tokens accepted and emitted (forced tokens included).
    pub draft_tokens: u32,
    /// Of those, tokens the answer's grammar forced: no verifier and no target saw them.
    pub forced_tokens: u32,
    /// Target tokens the grammar refused (each ended the target's part; the target's best
    /// allowed alternative, or else the draft, wrote the position instead).
    pub grammar_refusals: u32,
    /// Of those, positions the target's best allowed alternative wrote (counted in
    /// `target_tokens`).
    pub grammar_alternatives: u32,
    /// Positions the target wrote in a call of one token that kept to the few tokens the
    /// grammar allows: where the grammar refused the target's token and its top entries, or
    /// the draft's own first choice (counted in `target_tokens` and `target_calls`).
    pub grammar_picks: u32,
    /// Target tokens emitted.
    pub target_tokens: u32,
    /// Calls made to the target (a warm included).
    pub target_calls: u32,
    /// Of those, calls that sent the prompt to the target's cache as the answer started
    /// (`target.cache.warm`): 0 or 1. The call cap does not count it.
    pub target_warms: u32,
    /// Draft tokens the verifier rejected.
    pub verifier_rejections: u32,
    /// Draft tokens sent to the target as if rejected because the draft's run since the
    /// target's last say was a loop or too long (see `decode/repeats.rs`).
    pub loop_checks: u32,
    /// True when the rejection budget ran out and the target finished the answer.
    pub bailed_out: bool,
    /// True when the cost guard handed the rest of the answer to the target.
    pub cost_guard: bool,
    /// Why it did.
    pub cost_guard_reason: Option<GuardReason>,
    /// Where the target was handed the rest of the answer (for whatever reason), as the
    /// answer stood then.
    pub handed_off_at: Option<Segment>,
    /// True when the request reached its cap on target calls and the target finished it.
    pub call_cap: bool,
    /// Spans that ended because the draft caught up with the target.
    pub resyncs: u32,
    /// Spans the draft caught up with that went on because the cost guard would not have made
    /// the next call (`SpanClose::Expected`).
    pub spans_kept: u32,
    /// Calls that took a span on after the call before it gave the fewest tokens that could
    /// have ended it (`SpanAsk::Fewest`); counted in `target_calls`, not by the call cap.
    pub span_continuations: u32,
    /// Tokens the target generated that were not used (a span cancelled mid-chunk); paid for
    /// all the same.
    pub target_discarded_tokens: u64,
    /// Tokens the target is taken to have generated after approxy closed its stream before
    /// the end (a server notices a closed stream only when it next writes to it):
    /// [`TOKENS_IN_FLIGHT_AT_CLOSE`] per such stream. Never seen, paid for all the same.
    ///
    /// [`TOKENS_IN_FLIGHT_AT_CLOSE`]: crate::cost::TOKENS_IN_FLIGHT_AT_CLOSE
    pub target_inflight_tokens: u64,
    /// Windows the target scored.
    pub windows: u32,
    /// Draft tokens proposed in those windows.
    pub window_tokens: u64,
    /// Of those, tokens the target agreed with (emitted as draft tokens).
    pub window_accepted: u64,
    /// Window calls made again without the target's cache, whose rows at cached positions
    /// were stale (vLLM's token-in endpoint; see `targets::token_in`).
    pub window_rescores: u32,
    /// Of those, tokens that were not the target's own choice but its relaxed rule accepted.
    pub window_relaxed_accepts: u64,
    /// Window positions where the target chose another token than the draft's by a margin
    /// below [`TIE_MARGIN`]: (position in the answer, margin in nats). A numerical tie, which
    /// batch shapes can tip either way.
    ///
    /// [`TIE_MARGIN`]: super::TIE_MARGIN
    #[serde(skip)]
    pub near_ties: Vec<(u32, f32)>,
    /// Input tokens sent to the target over all calls (each call re-sends the prefix).
    pub target_input_tokens: u64,
    /// Of those, tokens a prompt cache could reuse (prefix shared with the previous call, as
    /// the cache rules count it).
    pub target_cacheable_input_tokens: u64,
    /// Cached prompt tokens the target itself reported, summed over the calls that reported.
    pub target_reported_cached_tokens: u64,
    /// Calls whose answer reported cached prompt tokens.
    pub target_calls_reporting_cache: u32,
    /// Calls a text-level target needed again because its answer did not start with the
    /// held-back piece of the answer (token healing); counted in `target_calls` too.
    pub heal_retries: u32,
    /// Time the target reports it spent on this request's calls (prompt processing and
    /// generation), summed over the calls that reported it: the request's real compute cost
    /// on a self-hosted target.
    #[serde(serialize_with = "secs")]
    pub target_busy: Duration,
    /// Prompt tokens the target reports it processed (not served from its cache), same calls.
    pub target_prompt_processed: u64,
    /// Tokens the target reports it generated, same calls (a stream closed early reports none).
    pub target_predicted: u64,
    /// Calls that reported their compute.
    pub target_calls_timed: u32,
    /// Tokens the draft guessed ahead while a target call was in flight (overlap).
    pub overlap_guesses: u64,
    /// Of those, guesses the answer then took, so their draft work was not repeated.
    pub overlap_guesses_used: u64,
    /// Tokens prompt lookup proposed, computed by the draft in the pass of the token before.
    pub lookup_tokens: u64,
    /// Of those, tokens the draft then picked itself, so no pass of their own was needed.
    pub lookup_tokens_used: u64,
    /// Time spent in draft inference (overlapped with target calls or not).
    #[serde(serialize_with = "secs")]
    pub draft_time: Duration,
    /// Time spent waiting for the target.
    #[serde(serialize_with = "secs")]
    pub target_wait: Duration,
    /// Time spent in the verifier (features and score), not counting the draft's forward pass.
    #[serde(serialize_with = "secs")]
    pub verifier_time: Duration,
    /// Time to the first emitted token.
    #[serde(serialize_with = "secs")]
    pub time_to_first_token: Duration,
    /// Lengths of runs of consecutive accepted draft tokens.
    #[serde(skip)]
    pub accepted_runs: Vec<u32>,
    /// Every target call, in order (at most the request's call cap and the hand-off, so
    /// bounded); each call's `generated` is filled when the generation ends.
    #[serde(skip)]
    pub calls: Vec<CallRecord>,
    /// True when its settings scored windows but it was corrected with spans instead: it
    /// ran under a grammar (windows are scored on the draft's free run ahead, which no
    /// grammar checks), or the target scores no windows.
    pub spans_for_windows: bool,
    /// Why it ended.
    pub finish_reason: Option<FinishReason>,
}

impl Stats {
    /// Adds another answer to the same prompt (`n > 1`): its work is summed, its prompt counted
    /// once, as the API bills `n` answers; the finish reason stays this answer's.
    pub fn absorb(&mut self, o: Stats) {
        // Destructured, so a new field cannot be forgotten here.
        let Stats {
            prompt_tokens: _,
            finish_reason: _,
            near_ties,
            accepted_runs,
            calls,
            completion_tokens,
            draft_tokens,
            forced_tokens,
            grammar_refusals,
            grammar_alternatives,
            grammar_picks,
            loop_checks,
            target_tokens,
            target_calls,
            target_warms,
            verifier_rejections,
            bailed_out,
            cost_guard,
            cost_guard_reason,
            handed_off_at,
            call_cap,
            resyncs,
            spans_kept,
            span_continuations,
            target_discarded_tokens,
            target_inflight_tokens,
            windows,
            window_tokens,
            window_accepted,
            window_rescores,
            window_relaxed_accepts,
            target_input_tokens,
            target_cacheable_input_tokens,
            target_reported_cached_tokens,
            target_calls_reporting_cache,
            heal_retries,
            target_busy,
            target_prompt_processed,
            target_predicted,
            target_calls_timed,
            overlap_guesses,
            overlap_guesses_used,
            lookup_tokens,
            lookup_tokens_used,
            draft_time,
            target_wait,
            verifier_time,
            time_to_first_token,
            spans_for_windows,
        } = o;
        // Counts and times add up over the answers.
        add!(
            self;
            completion_tokens, draft_tokens, forced_tokens, grammar_refusals, grammar_alternatives,
            grammar_picks, loop_checks, target_tokens, target_calls, target_warms,
            verifier_rejections, resyncs, spans_kept, span_continuations, target_discarded_tokens,
            target_inflight_tokens, windows, window_tokens, window_accepted, window_rescores,
            window_relaxed_accepts, target_input_tokens, target_cacheable_input_tokens,
            target_reported_cached_tokens, target_calls_reporting_cache, heal_retries, target_busy,
            target_prompt_processed, target_predicted, target_calls_timed, overlap_guesses,
            overlap_guesses_used, lookup_tokens, lookup_tokens_used, draft_time, target_wait,
            verifier_time
        );
        // Any answer's flag is the request's.
        self.bailed_out |= bailed_out;
        self.cost_guard |= cost_guard;
        self.call_cap |= call_cap;
        self.spans_for_windows |= spans_for_windows;
        self.cost_guard_reason = self.cost_guard_reason.or(cost_guard_reason);
        self.handed_off_at = self.handed_off_at.take().or(handed_off_at);
        self.time_to_first_token = self.time_to_first_token.min(time_to_first_token);
        self.near_ties.extend(near_ties);
        self.accepted_runs.extend(accepted_runs);
        self.calls.extend(calls);
    }

    /// The cached prompt tokens the target reported, when every call reported them (then they
    /// replace the estimate under the cache rules).
    pub fn reported_cached_tokens(&self) -> Option<u64> {
        (self.target_calls > 0 && self.target_calls_reporting_cache == self.target_calls)
            .then_some(self.target_reported_cached_tokens)
    }

    /// What the generation has spent, for the cost model: the cached input is what the target
    /// reported when every call reported it, else the estimate under the cache rules.
    pub fn spend(&self) -> Spend {
        Spend {
            prompt_tokens: u64::from(self.prompt_tokens),
            completion_tokens: u64::from(self.completion_tokens),
            target_output_tokens: self.target_generated(),
            target_input_tokens: self.target_input_tokens,
            cached_input_tokens: self
                .reported_cached_tokens()
                .unwrap_or(self.target_cacheable_input_tokens),
            target_calls: u64::from(self.target_calls),
        }
    }

    /// The answer so far: its tokens, the target calls made and the tokens the target generated.
    pub fn so_far(&self) -> Segment {
        Segment {
            tokens: u64::from(self.completion_tokens),
            calls: u64::from(self.target_calls),
            target_tokens: self.spend().target_output_tokens,
        }
    }

    /// Tokens the target generated so far, used or not (those estimated after a close
    /// included).
    pub fn target_generated(&self) -> u64 {
        u64::from(self.target_tokens) + self.target_discarded_tokens + self.target_inflight_tokens
    }

    /// The target's time on this generation, at `rates` for calls it did not time.
    pub fn target_time(&self, rates: &crate::cost::BusyRates) -> TargetTime {
        target_time(
            &self.calls,
            u64::from(self.prompt_tokens),
            u64::from(self.completion_tokens),
            rates,
        )
    }

    /// The part of the answer approxy drafted and corrected: all of it, or what came before
    /// the hand-off (see [`Stats::handed_off_at`]). What a model's rates are measured on.
    pub fn approximate_part(&self) -> Segment {
        self.handed_off_at.unwrap_or_else(|| self.so_far())
    }
}

fn secs<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

#[cfg(test)]
mod spend_tests {
    use super::*;

    #[test]
    fn spend_counts_discarded_tokens_and_prefers_reported_cache_when_every_call_reported() {
        let mut s = Stats {
            prompt_tokens: 100,
            completion_tokens: 50,
            target_tokens: 5,
            target_discarded_tokens: 2,
            target_calls: 2,
            target_input_tokens: 1000,
            target_cacheable_input_tokens: 800,
            ..Stats::default()
        };
        s.target_calls_reporting_cache = 2;
        s.target_reported_cached_tokens = 0;
        let want = Spend {
            prompt_tokens: 100,
            completion_tokens: 50,
            target_output_tokens: 7,
            target_input_tokens: 1000,
            cached_input_tokens: 0,
            target_calls: 2,
        };
        assert_eq!(s.spend(), want);
        // One call did not report: the estimate under the cache rules stands.
        s.target_calls_reporting_cache = 1;
        assert_eq!(s.spend().cached_input_tokens, 800);
    }
}
