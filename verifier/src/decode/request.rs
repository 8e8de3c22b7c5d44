//! What a caller asks a generation for (the request, its settings, the verification and
//! correction the policy chose) and what it gets back (token events, the finish reason).

use std::sync::Arc;

use serde::Serialize;

use crate::cost::{CacheRules, Guard};
use crate::grammar::Constraint;
use crate::sampling::SamplingParams;
use crate::template::ChatMessage;
use crate::verify::AcceptanceRule;

use super::pacing::{BailoutBudget, WINDOW_MAX};

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
    ///
    /// [`TOKENS_IN_FLIGHT_AT_CLOSE`]: crate::cost::TOKENS_IN_FLIGHT_AT_CLOSE
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
