//! Sequential approximate verification: draft a token, score it, emit it when the verifier
//! accepts; on rejection ask the target to continue the exact token prefix, emit its tokens
//! and feed them to the draft's KV cache. A correction is either a fixed number of target
//! tokens or a streamed span that ends as soon as the draft, following the target, predicts
//! it again with confidence. The target writes the rest of the answer in one call when
//! rejections exceed the policy's budget, or when another call could make the request cost
//! more than passing it through (the cost guard).

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio::sync::mpsc;

use crate::cost::{CacheRules, Guard, GuardReason, Segment, Spend};
use crate::draft::Draft;
use crate::error::EngineError;
use crate::grammar::Constraint;
use crate::sampling::{Sampler, SamplingParams};
use crate::targets::TargetClient;
use crate::template::ChatMessage;
use crate::tokenizer::Tokenizer;
use crate::verify::{AcceptanceRule, Verifier};

mod calls;
mod cursor;
mod lookup;
mod pacing;
mod repeats;
mod run;
mod warm;

pub use calls::{CallKind, CallRecord, TargetTime, target_time};
use cursor::Cursor;
pub use cursor::OVERLAP_MAX_AHEAD;
use lookup::Lookup;
use pacing::RejectionWindow;
pub use pacing::{WINDOW_MAX, WINDOW_MAX_LIMIT, WINDOW_MIN, WindowSize};
use run::{Corrected, GrammarStep, Run, Verdict, WindowEnd};

/// Who produced a token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// The local draft, accepted by the verifier.
    Draft,
    /// The remote target.
    Target,
    /// The answer's grammar, where it allows one token only (structured output).
    Grammar,
}

/// One streamed token.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenEvent {
    /// Token id; `None` for the final event that releases held-back text.
    pub id: Option<u32>,
    /// Text this token completes (empty while a character or a possible stop string is incomplete).
    pub text: String,
    /// Producer.
    pub source: Source,
}

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// End-of-sequence token or a stop sequence.
    Stop,
    /// `max_tokens` reached.
    Length,
    /// The receiver went away.
    Cancelled,
}

/// When to give up on drafting and let the target finish.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BailoutBudget {
    /// Decisions looked at.
    pub window: usize,
    /// Bail out when more than this fraction of them were rejections.
    pub max_rejection_rate: f32,
}

/// What the target is asked for after a rejection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Correction {
    /// Exactly this many tokens per call (at least 1).
    Fixed {
        /// Tokens per call.
        tokens: u32,
    },
    /// A streamed span of at most `max_span` tokens, each fed to the draft as it arrives. It
    /// may end once the draft has predicted the target's last `resync` tokens itself, each
    /// with the verifier's confidence (`end` says whether it then does); drafting resumes
    /// there.
    Span {
        /// Longest span.
        max_span: u32,
        /// Agreeing tokens that let a span end.
        resync: u32,
        /// What decides, once the draft agrees, whether the span ends.
        end: SpanClose,
        /// Tokens each of its calls asks for.
        ask: SpanAsk,
    },
}

/// How many tokens each call of a span asks the target for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SpanAsk {
    /// The rest of the span, in one streamed call that is closed where the span ends: one
    /// call a span, but a target that notices a closed stream only at its next write goes on
    /// generating meanwhile ([`TOKENS_IN_FLIGHT_AT_CLOSE`] on llama-server), and those tokens
    /// are paid for unseen.
    #[default]
    All,
    /// The fewest that could end the span (the agreeing tokens still missing, and the
    /// rejected position's on the first call); while the span has not ended, another call
    /// takes it on from where the last stopped. The target stops by itself at each call's
    /// end, so nothing is generated unseen, for a call more wherever the draft does not catch
    /// up at once. For a target whose calls are cheap (a prompt cache on the same slot).
    Fewest,
}

/// Whether a span the draft has caught up with ends there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SpanClose {
    /// Always: the fixed rule.
    #[default]
    Resync,
    /// When the cost guard would make the next call: drafting on is worth it only if the
    /// draft's next rejection can be corrected. Where the guard would refuse that call (it
    /// would hand the rest to the target), the span already streaming goes on instead, which
    /// saves re-sending the prefix and the drafted tokens. Without a guard, as `Resync`.
    Expected,
}

/// How draft tokens are checked.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum Verification {
    /// The local verifier accepts confident tokens; a rejection gets the `correction`.
    #[default]
    Approximate,
    /// The local verifier accepts confident tokens; at a rejection the draft runs a window
    /// ahead and the target scores it in one call (a target with prompt log-probabilities).
    ApproximateWindows,
    /// Every draft token is scored by the target in windows: at temperature 0 the output is
    /// the target's own greedy output (lossless speculative decoding over the API).
    Exact,
    /// Every draft token is scored by the target in windows, as in `Exact`, but at temperature
    /// 0 a draft token the target would not have chosen is kept when the rule accepts it from
    /// the target's top log-probabilities there (lossy speculative decoding over the API, with
    /// the target as the verifier). At temperature > 0 it is `Exact`: speculative sampling
    /// already keeps the target's distribution.
    Relaxed(AcceptanceRule),
    /// Every draft token is scored by the target in windows, as in `Exact`, but at
    /// temperature 0 a draft token the target would not have chosen is kept when the local
    /// verifier accepts it at the request's threshold: with an importance router as the
    /// verifier, a difference it calls harmless (AutoJudge's rule, judged on the draft's
    /// side), and the window goes on. At temperature > 0 it is `Exact`.
    Judged,
}

impl Verification {
    /// True when the target scores every draft token (no local verifier decides).
    pub fn target_scores_every_token(&self) -> bool {
        matches!(self, Self::Exact | Self::Relaxed(_) | Self::Judged)
    }

    /// The rule windows accept a differing draft token by (greedy only), if any.
    pub fn window_rule(&self) -> Option<AcceptanceRule> {
        match self {
            Self::Relaxed(r) => Some(*r),
            _ => None,
        }
    }
}

/// What a model's policy says of every generation for it: built once when the policy loads,
/// shared by its requests (each [`GenerateRequest`] holds a handle).
#[derive(Debug, Clone, PartialEq)]
pub struct DecodeSettings {
    /// How draft tokens are checked.
    pub verification: Verification,
    /// What a rejection asks the target for (when no window is scored).
    pub correction: Correction,
    /// Bail-out budget; `None` never bails out.
    pub bailout: Option<BailoutBudget>,
    /// Most target calls one request may make; the last one writes the rest of the answer.
    pub max_target_calls: Option<u32>,
    /// How the target's prompt cache serves re-sent prefixes (for the cost estimate).
    pub cache: CacheRules,
    /// Keep drafting along the draft's own guess while a target call is in flight (a window's
    /// worth during a window call, a resync's worth during a span); the work is kept where the
    /// target's answer agrees.
    pub overlap: bool,
    /// Most tokens prompt lookup proposes at once (0: off): where the answer's last few tokens
    /// occurred before, the draft computes what followed them there in the same pass as its
    /// next token, and keeps each that it then picks itself (see `lookup`).
    pub prompt_lookup: usize,
    /// Most draft tokens one window holds (vLLM and SGLang targets); windows grow toward it
    /// while the target keeps them. Longer windows pay where acceptance is high, as in
    /// `judged` verification.
    pub window_max: u32,
    /// Under a JSON grammar, thresholds by place in the answer instead of the request's one
    /// (see [`JsonThresholds`]); `None`: the request's threshold everywhere.
    pub json_thresholds: Option<JsonThresholds>,
}

/// Thresholds by place in a JSON answer (structured output, tool calls' arguments): a token
/// that decides a value (its first token, a number's digits, a container's end) is judged at
/// `value`, and one inside a string value's text at `text`. Text outside the JSON keeps the
/// request's threshold. See [`crate::grammar::place`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct JsonThresholds {
    /// For tokens that decide a value.
    pub value: f32,
    /// For tokens inside a string value's text.
    pub text: f32,
}

impl Default for DecodeSettings {
    /// Approximate verification, one target token per rejection, no bail-out, no call cap, a
    /// cache that serves any common prefix, no overlap, windows of at most [`WINDOW_MAX`].
    fn default() -> Self {
        Self {
            verification: Verification::Approximate,
            correction: Correction::Fixed { tokens: 1 },
            bailout: None,
            max_target_calls: None,
            cache: CacheRules::default(),
            overlap: false,
            prompt_lookup: 0,
            window_max: WINDOW_MAX,
            json_thresholds: None,
        }
    }
}

/// One generation's parameters: the request's own, and its model's [`DecodeSettings`].
#[derive(Debug, Clone)]
pub struct GenerateRequest {
    /// Prompt token ids (chat template already applied).
    pub prompt: Vec<u32>,
    /// Most tokens to generate.
    pub max_tokens: u32,
    /// Shared by draft and target.
    pub sampling: SamplingParams,
    /// Stop strings.
    pub stop: Vec<String>,
    /// Verifier threshold (see [`crate::verify::accepts`]).
    pub threshold: f32,
    /// Cost guard; `None` never hands off for cost. Per request: a budget guard reads its
    /// model's traffic as it stands when the request starts.
    pub cost_guard: Option<Guard>,
    /// Model id the client asked for, passed on to the target.
    pub model: Option<String>,
    /// The chat messages the prompt was rendered from (chat requests), for targets that are
    /// sent messages rather than the rendered prompt.
    pub messages: Option<Arc<Vec<ChatMessage>>>,
    /// The model's settings.
    pub settings: Arc<DecodeSettings>,
    /// The grammar the answer follows (structured output): the draft chooses only among the
    /// tokens it allows, what it forces is emitted as is, and a target token it refuses ends
    /// the target's part there. Windows are not scored under one.
    pub constraint: Option<Constraint>,
}

impl GenerateRequest {
    /// The settings of this request alone, copied from its model's on first change.
    pub fn settings_mut(&mut self) -> &mut DecodeSettings {
        Arc::make_mut(&mut self.settings)
    }
}

pub use crate::cost::TOKENS_IN_FLIGHT_AT_CLOSE;

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
        self.completion_tokens += completion_tokens;
        self.draft_tokens += draft_tokens;
        self.forced_tokens += forced_tokens;
        self.grammar_refusals += grammar_refusals;
        self.grammar_alternatives += grammar_alternatives;
        self.grammar_picks += grammar_picks;
        self.loop_checks += loop_checks;
        self.target_tokens += target_tokens;
        self.target_calls += target_calls;
        self.target_warms += target_warms;
        self.verifier_rejections += verifier_rejections;
        self.bailed_out |= bailed_out;
        self.cost_guard |= cost_guard;
        self.cost_guard_reason = self.cost_guard_reason.or(cost_guard_reason);
        self.handed_off_at = self.handed_off_at.take().or(handed_off_at);
        self.call_cap |= call_cap;
        self.spans_for_windows |= spans_for_windows;
        self.resyncs += resyncs;
        self.spans_kept += spans_kept;
        self.span_continuations += span_continuations;
        self.target_discarded_tokens += target_discarded_tokens;
        self.target_inflight_tokens += target_inflight_tokens;
        self.windows += windows;
        self.window_tokens += window_tokens;
        self.window_accepted += window_accepted;
        self.window_rescores += window_rescores;
        self.window_relaxed_accepts += window_relaxed_accepts;
        self.target_input_tokens += target_input_tokens;
        self.target_cacheable_input_tokens += target_cacheable_input_tokens;
        self.target_reported_cached_tokens += target_reported_cached_tokens;
        self.target_calls_reporting_cache += target_calls_reporting_cache;
        self.heal_retries += heal_retries;
        self.target_busy += target_busy;
        self.target_prompt_processed += target_prompt_processed;
        self.target_predicted += target_predicted;
        self.target_calls_timed += target_calls_timed;
        self.overlap_guesses += overlap_guesses;
        self.overlap_guesses_used += overlap_guesses_used;
        self.lookup_tokens += lookup_tokens;
        self.lookup_tokens_used += lookup_tokens_used;
        self.draft_time += draft_time;
        self.target_wait += target_wait;
        self.verifier_time += verifier_time;
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

/// Draft model, tokenizer and target: everything a generation needs but the verifier.
#[derive(Debug, Clone)]
pub struct Engine {
    tokenizer: Tokenizer,
    target: Arc<dyn TargetClient>,
    eos: Vec<u32>,
}

/// Log-probability margin (nats) below which the target's preference over the draft's token
/// counts as a numerical tie.
pub const TIE_MARGIN: f32 = 0.01;

/// Fixed text that exercises specials, code, whitespace runs and multi-byte characters.
const PROBE: &str = "<|im_start|>user\nfn main() {\n    println!(\"héllo, 世界 🚀\");\n}\t  x = 3.14e-2<|im_end|>\n";

impl Engine {
    /// An engine; `eos` lists the ids that end a generation.
    pub fn new(tokenizer: Tokenizer, target: Arc<dyn TargetClient>, eos: Vec<u32>) -> Self {
        Self {
            tokenizer,
            target,
            eos,
        }
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The target.
    pub fn target(&self) -> &Arc<dyn TargetClient> {
        &self.target
    }

    /// Refuses approximate mode when draft and target tokenize a probe text differently.
    /// Returns `Ok(false)` when the target has no tokenize endpoint to compare with.
    pub async fn check_tokenizer(&self) -> Result<bool, EngineError> {
        let ours = self.tokenizer.encode(PROBE)?;
        match self.target.tokenize(PROBE).await? {
            None => Ok(false),
            Some(theirs) if theirs == ours => Ok(true),
            Some(theirs) => Err(EngineError::TokenizerMismatch(format!(
                "probe text gives {} draft tokens and {} target tokens (first difference at {})",
                ours.len(),
                theirs.len(),
                ours.iter().zip(&theirs).take_while(|(a, b)| a == b).count()
            ))),
        }
    }

    /// Runs one generation, sending tokens to `tx` as they are decided. Dropping the receiver
    /// stops all work, including a target call in flight.
    pub async fn generate(
        &self,
        lease: &dyn Draft,
        verifier: &dyn Verifier,
        req: GenerateRequest,
        tx: mpsc::Sender<TokenEvent>,
    ) -> Result<Stats, EngineError> {
        let mut run = Run::new(self, req, tx, verifier.reads_context());
        run.start_warm().await;
        let mut cursor = Cursor::new(lease);
        let mut out = cursor.prefill(run.req.prompt.clone()).await?;
        let mut sampler = Sampler::new(run.req.sampling);
        let mut window = run.req.settings.bailout.map(RejectionWindow::new);
        let mut accepted_run = 0u32;
        let mut sizes = WindowSize::new(run.req.settings.window_max);
        let mut lookup = (run.req.settings.prompt_lookup > 0)
            .then(|| Lookup::new(&run.req.prompt, run.req.settings.prompt_lookup));
        let result = loop {
            if run.remaining() == 0 {
                break FinishReason::Length;
            }
            out = match run.grammar_step(&mut cursor, out).await? {
                GrammarStep::Draft(o) => o,
                GrammarStep::Again(next) => {
                    out = next;
                    continue;
                }
                GrammarStep::Finished(reason) => break reason,
            };
            let proposal = sampler.pick_at(&out);
            let Verdict {
                accepted,
                entropy,
                in_window,
                by_verifier,
            } = run.verdict(verifier, &out, proposal);
            let mut over_budget = in_window && window.as_mut().is_some_and(|w| w.push(!accepted));
            let at_call_cap = !accepted && run.next_call_is_the_last();
            if at_call_cap {
                run.stats.call_cap = true;
                over_budget = true;
            }
            let produced = if accepted {
                accepted_run += 1;
                let seen = run.record(&out, proposal, entropy);
                if let Some(reason) = run.emit(&[proposal], Source::Draft, seen).await? {
                    break reason;
                }
                vec![proposal]
            } else {
                if by_verifier {
                    run.stats.verifier_rejections += 1;
                }
                if accepted_run > 0 {
                    run.stats
                        .accepted_runs
                        .push(std::mem::take(&mut accepted_run));
                }
                if run.req.settings.verification != Verification::Approximate
                    && !run.windows_unsupported
                    && !over_budget
                {
                    let k = sizes.k().min(run.remaining());
                    match run
                        .window(&mut cursor, verifier, out, proposal, k, &mut sampler)
                        .await?
                    {
                        WindowEnd::Resume { next, accepted } => {
                            sizes.update(accepted, k as usize);
                            out = next;
                            continue;
                        }
                        WindowEnd::Finished(reason) => break reason,
                        // The target scores no windows: corrections from here on.
                        WindowEnd::Unsupported(back) => out = back,
                    }
                }
                match run
                    .correct(&mut cursor, verifier, out, over_budget, at_call_cap)
                    .await?
                {
                    Corrected::Produced(tokens) => tokens,
                    // The draft already followed the correction: its output is current.
                    Corrected::Resume(next) => {
                        out = next;
                        continue;
                    }
                    Corrected::Finished(reason) => break reason,
                }
            };
            if let Some(l) = &mut lookup {
                l.catch_up(run.emitted());
                let proposed = l.propose();
                // Not over guesses of overlap's, which the cursor holds already.
                if !proposed.is_empty() && cursor.is_clear() {
                    let fed = [produced.as_slice(), proposed].concat();
                    cursor.feed(&fed, proposed.len()).await?;
                }
            }
            out = cursor.commit(&produced).await?;
        };
        if accepted_run > 0 {
            run.stats.accepted_runs.push(accepted_run);
        }
        run.stats.draft_time += cursor.time;
        run.stats.overlap_guesses = cursor.guessed;
        run.stats.overlap_guesses_used = cursor.guesses_used;
        run.stats.lookup_tokens = cursor.looked_up;
        run.stats.lookup_tokens_used = cursor.looked_up_used;
        run.finish(result).await
    }
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
#[cfg(test)]
mod context_tests;
#[cfg(test)]
mod grammar_tests;
#[cfg(test)]
mod lookup_tests;
#[cfg(test)]
mod overlap_tests;
#[cfg(test)]
mod sampled_tests;
#[cfg(test)]
mod scripted_tests;
#[cfg(test)]
mod warm_tests;
