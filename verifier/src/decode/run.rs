//! One generation's state: what was emitted, the text decoder and stop matcher, the stats,
//! and the target calls (fixed corrections, streamed spans, the hand-off).

use std::future::Future;
use std::time::{Duration, Instant};

use futures::{FutureExt, StreamExt};
use tokio::sync::mpsc;

use super::calls::{CallKind, CallRecord, settle};
use super::cursor::Cursor;
use super::repeats::LoopWatch;
use super::warm::{WarmCall, Warmed};
use super::{
    Correction, Engine, FinishReason, GenerateRequest, OVERLAP_MAX_AHEAD, Source, SpanAsk,
    SpanClose, Stats, TIE_MARGIN, TokenEvent, Verification,
};
use crate::cost::{CallPlan, GuardReason};
use crate::draft::PositionOutput;
use crate::error::{EngineError, TargetError};
use crate::grammar::fence::FenceReader;
use crate::grammar::tools::CallRepeats;
use crate::grammar::{Constraint, JsonPlace, Mask, Next, Place};
use crate::sampling::{Sampler, SamplingParams, nucleus, prob_of, residual};
use crate::stop::{StopMatcher, StopResult};
use crate::targets::{
    ContinuationRequest, StreamChunk, TargetClient, TargetTimings, TokenStream, WindowRequest,
    WindowScore, next_answer,
};
use crate::tokenizer::StreamDecoder;
use crate::verify::{AcceptanceRule, Context, Features, Record, TargetProbs, Verifier, decide};

/// The target's top log-probabilities a relaxed window asks for at each position (as label
/// collection and the oracle study use).
const RELAXED_TOP_LOGPROBS: u32 = 20;

/// The target's top entries asked for at each token under a grammar: where it writes a token
/// the grammar refuses, the best of these the grammar allows is its answer there.
const GRAMMAR_ALTERNATIVES: u32 = 8;

/// Most tokens a target is asked to choose among where the grammar refused its token and its
/// top entries (an enum's first tokens, a literal's); where more are allowed, the draft
/// writes the position.
const PICK_LIMIT: usize = 256;

/// Longest wait for the last event of a stream whose tokens have all arrived.
const USAGE_DRAIN_LIMIT: Duration = Duration::from_secs(2);

/// Tokens a call asked for `asked` may still generate once `arrived` have come.
fn unwritten(asked: u32, arrived: usize) -> u64 {
    u64::from(asked).saturating_sub(arrived as u64)
}

/// Awaits a target call, adding the time to `waited`, unless the client goes away first
/// (`None`): the call in flight is then dropped instead of waited for, which also closes its
/// connection and stops the target.
async fn unless_client_gone<T>(
    tx: &mpsc::Sender<TokenEvent>,
    waited: &mut Duration,
    call: impl Future<Output = T>,
) -> Option<T> {
    let t = Instant::now();
    let out = tokio::select! {
        v = call => Some(v),
        _ = tx.closed() => None,
    };
    *waited += t.elapsed();
    out
}

/// How a window ended.
pub(super) enum WindowEnd {
    /// Drafting resumes after the accepted tokens and the target's own; the draft's output
    /// there, and how many draft tokens were accepted.
    Resume {
        /// Output at the new position.
        next: PositionOutput,
        /// Draft tokens the target agreed with.
        accepted: usize,
    },
    /// The generation ended inside the window (or the cost guard handed the rest to the target).
    Finished(FinishReason),
    /// The target cannot score windows; the draft's output at the starting position, with the
    /// look-ahead rolled back.
    Unsupported(PositionOutput),
}

/// A window the draft ran ahead.
struct DraftedWindow {
    /// Its tokens, the proposed one first.
    tokens: Vec<u32>,
    /// The distribution each was drawn from (sampled decoding only).
    drawn_from: Vec<Vec<(u32, f32)>>,
    /// The draft's probability of each (greedy, under a rule that reads it).
    draft_probs: Vec<f32>,
}

/// A window's scores as many as its tokens ask for: a top token at each position and one
/// after, and log-probabilities at each position when they were asked for.
fn check_scores(score: &WindowScore, window: usize, logprobs: bool) -> Result<(), EngineError> {
    if score.top.len() != window + 1 {
        return Err(TargetError::Protocol(format!(
            "a window of {window} tokens came back with {} scores",
            score.top.len()
        ))
        .into());
    }
    if logprobs && score.logprobs.len() != window {
        return Err(TargetError::Protocol(format!(
            "a window of {window} tokens came back with log-probabilities at {} positions",
            score.logprobs.len()
        ))
        .into());
    }
    Ok(())
}

/// What a rejection's correction left.
pub(super) enum Corrected {
    /// Target tokens the draft has still to take.
    Produced(Vec<u32>),
    /// The draft has taken them; drafting resumes at this output.
    Resume(PositionOutput),
    /// The generation ended.
    Finished(FinishReason),
}

/// How a span ends and what its calls ask for (the policy's `Correction::Span`).
#[derive(Debug, Clone, Copy)]
pub(super) struct SpanRule {
    /// Its longest.
    pub max_span: u32,
    /// Agreeing tokens that let it end.
    pub resync: u32,
    /// Whether it ends once they have.
    pub end: SpanClose,
    /// Tokens each call asks for.
    pub ask: SpanAsk,
}

/// Where a span stands between its calls.
struct SpanProgress {
    /// The draft's output at the next position.
    out: PositionOutput,
    /// Target tokens so far, over its calls.
    received: u32,
    /// Of the last of those, how many in a row the draft predicted with confidence.
    agreeing: u32,
    /// Whether it went on after the draft caught up (`SpanClose::Expected`).
    kept: bool,
}

/// How one call of a span ended.
enum CallEnd {
    /// The span ended in it.
    Span(SpanEnd),
    /// It gave this many tokens and the span has not ended.
    Gave(SpanProgress, u32),
}

/// How a span ended.
pub(super) enum SpanEnd {
    /// Drafting resumes; the draft's output at the new position.
    Resume(PositionOutput),
    /// The generation ended inside the span.
    Finished(FinishReason),
}

/// An answer's id in its target calls; when the answer is over, however it ends, the target
/// client hears of it (llama-server's slot it held is free again).
struct Answer<'a> {
    target: &'a dyn TargetClient,
    id: u64,
}

impl Drop for Answer<'_> {
    fn drop(&mut self) {
        self.target.answer_done(self.id);
    }
}

/// How a draft token fared ([`Run::verdict`]).
pub(super) struct Verdict {
    /// It is emitted.
    pub(super) accepted: bool,
    /// The draft's entropy there, where the verifier computed it.
    pub(super) entropy: Option<f32>,
    /// The decision counts towards the bail-out budget (neither the draft's own turn nor a
    /// target that scores every token).
    pub(super) in_window: bool,
    /// The verifier made it (a rejection is then the verifier's).
    pub(super) by_verifier: bool,
}

/// State of one generation.
pub(super) struct Run<'a> {
    engine: &'a Engine,
    answer: Answer<'a>,
    pub(super) req: GenerateRequest,
    tx: mpsc::Sender<TokenEvent>,
    emitted: Vec<u32>,
    decoder: StreamDecoder,
    stop: StopMatcher,
    pub(super) stats: Stats,
    started: Instant,
    last_prefix_len: u64,
    pub(super) last_target_tokens: Vec<u32>,
    /// Set when the target answered a window call with "cannot".
    pub(super) windows_unsupported: bool,
    last_source: Source,
    hit_stop_sequence: bool,
    /// The draft's tokens since the target's last say, watched for a runaway loop.
    pub(super) loops: LoopWatch,
    /// A JSON answer's reader of its fence, which the client is not sent and stop strings
    /// are not matched against.
    fence: Option<FenceReader>,
    /// A JSON answer's text as sent, to tell whether a stop string left it whole.
    json_sent: Option<String>,
    /// The call in flight has reported its cached prompt tokens.
    call_reported: bool,
    /// The answer's context, kept when the verifier reads it.
    pub(super) context: Option<Context>,
    /// The grammar the answer follows (structured output), if any.
    grammar: Option<Constraint>,
    /// Set when the grammar refused the target's next token: the draft writes that position
    /// under the grammar, unjudged, so every round makes progress.
    draft_owns_next: bool,
    /// Where the answer may call tools several times: its calls, each a stop string for the
    /// rest of the answer, so that a repeated call ends it.
    repeats: Option<CallRepeats>,
    /// Where in the JSON answer the next token goes, kept where the model judges by place.
    place: Option<JsonPlace>,
    /// The prompt on its way to the target's cache, until the first call (see `warm`).
    warm: Option<WarmCall>,
}

/// What the grammar did before the draft proposes a token.
pub(super) enum GrammarStep {
    /// The draft chooses, from this output (masked to what a grammar allows).
    Draft(PositionOutput),
    /// The grammar forced tokens, emitted; the draft's output after them, where the grammar
    /// has its say again.
    Again(PositionOutput),
    /// The answer ended (complete, or it hit a stop).
    Finished(FinishReason),
}

/// What a span's stream had delivered when it was read (see [`Run::take_arrived`]).
struct Arrived {
    /// The tokens, in order.
    tokens: Vec<u32>,
    /// The target's top entries at each of them (empty where it gave none).
    alternatives: Vec<Vec<(u32, f32)>>,
    /// One of them ended on end-of-sequence.
    eos: bool,
    /// The error that broke the stream, after them.
    failed: Option<TargetError>,
}

/// How a hand-off ended.
pub(super) enum HandOff {
    /// The answer ended.
    Finished(FinishReason),
    /// The grammar refused a target token: these target tokens were emitted before it, and
    /// the draft goes on from there.
    Refused(Vec<u32>),
}

impl<'a> Run<'a> {
    pub(super) fn new(
        engine: &'a Engine,
        mut req: GenerateRequest,
        tx: mpsc::Sender<TokenEvent>,
        keep_context: bool,
    ) -> Self {
        let grammar = req.constraint.take();
        let place =
            (grammar.is_some() && req.settings.json_thresholds.is_some()).then(JsonPlace::new);
        let json_with_stops =
            grammar.as_ref().is_some_and(Constraint::json) && !req.stop.is_empty();
        let stats = Stats {
            prompt_tokens: req.prompt.len() as u32,
            ..Stats::default()
        };
        Self {
            engine,
            answer: Answer {
                target: &*engine.target,
                id: next_answer(),
            },
            decoder: StreamDecoder::new(engine.tokenizer.clone()),
            stop: StopMatcher::new(req.stop.clone()),
            req,
            tx,
            emitted: Vec::new(),
            stats,
            started: Instant::now(),
            last_prefix_len: 0,
            last_target_tokens: Vec::new(),
            last_source: Source::Draft,
            hit_stop_sequence: false,
            loops: LoopWatch::default(),
            fence: grammar
                .as_ref()
                .is_some_and(Constraint::fenced)
                .then(FenceReader::default),
            json_sent: json_with_stops.then(String::new),
            call_reported: false,
            context: keep_context.then(Context::new),
            // Windows are scored on the draft's free run ahead, which no grammar checks.
            windows_unsupported: grammar.is_some(),
            repeats: grammar
                .as_ref()
                .is_some_and(Constraint::several_calls)
                .then(CallRepeats::default),
            place,
            grammar,
            draft_owns_next: false,
            warm: None,
        }
    }

    /// Sends the prompt to the target's cache, where the target warms one and the answer may
    /// call it (at threshold 0 the draft writes everything).
    pub(super) async fn start_warm(&mut self) {
        let target = &self.engine.target;
        let draft_only = self.req.threshold <= 0.0
            && self.req.settings.verification == Verification::Approximate;
        if !target.warms() || draft_only {
            return;
        }
        let req = self.request(self.req.prompt.clone(), 0);
        self.warm = Some(WarmCall::start(target.clone(), req));
        // Its request goes out before the draft's prefill takes this task.
        tokio::task::yield_now().await;
    }

    /// Before the answer's first call: waits for the warm (the call would wait for the slot
    /// anyway) and counts it, so that the call's prefix is sent after it and counted as
    /// cached. Returns at once when there is none, or once the client has gone.
    async fn settle_warm(&mut self) {
        let Some(mut warm) = self.warm.take() else {
            return;
        };
        if let Some(w) =
            unless_client_gone(&self.tx, &mut self.stats.target_wait, warm.finished()).await
        {
            self.count_warm(w);
        }
    }

    /// Counts a warm as a call of the prompt, nothing generated: at its own timings where it
    /// finished; at the learned rates where it was aborted unfinished.
    fn count_warm(&mut self, w: Warmed) {
        let done = match w {
            Warmed::Nothing => return,
            Warmed::Unfinished => None,
            Warmed::Done(c) => Some(c),
        };
        let prompt = self.req.prompt.len() as u64;
        self.count_call(CallKind::Warm, prompt, 0);
        self.stats.target_warms += 1;
        self.call_reported = false;
        if let Some(c) = done {
            self.absorb(c.cached_prompt_tokens, c.timings, 0);
            // The next call's prefix starts with what the warm computed.
            self.last_prefix_len = prompt;
        }
    }

    /// The grammar's say at the draft's output `out`: what it forces is emitted at once (no
    /// verifier, no target) and the draft takes it; where the draft chooses, its output is
    /// masked to the allowed tokens. The verifier then judges the draft's pick on the masked
    /// distribution: on the structured sample that agreed with target-only as often as
    /// judging on the unmasked one, with fewer target tokens (tests/README.md, "Structured
    /// output"). Without a grammar the draft chooses from `out` as it is.
    pub(super) async fn grammar_step(
        &mut self,
        cursor: &mut Cursor<'_>,
        out: PositionOutput,
    ) -> Result<GrammarStep, EngineError> {
        let Some(g) = &mut self.grammar else {
            return Ok(GrammarStep::Draft(out));
        };
        Ok(match g.step()? {
            Next::End => GrammarStep::Finished(FinishReason::Stop),
            Next::Forced(tokens) => {
                self.emit_before_the_draft(cursor, &tokens, Source::Grammar)
                    .await?
            }
            Next::Choose(mask) => {
                // After a whole call, where the answer may end or call again: a further call is
                // the target's to open. A confident draft went on there and the grammar, once a
                // call was open, made it name some tool (a currency call for a weather
                // question); ending adds nothing, so the draft ends by itself.
                let after_a_call = self.repeats.as_ref().is_some_and(CallRepeats::after_a_call)
                    && g.accepting()
                    && !self.engine.eos.contains(&out.top1());
                if after_a_call && let Some(t) = self.target_pick_or_end(&mask).await? {
                    return self
                        .emit_before_the_draft(cursor, &[t], Source::Target)
                        .await;
                }
                // The draft's own choice is not allowed here: masked, its distribution says
                // only how it ranks what it did not want, often with a confidence near 1 (an
                // enum member it would never have written). The target picks instead.
                if !mask.allows(out.top1())
                    && let Some(t) = self.target_pick(Some(&mask)).await?
                {
                    return self
                        .emit_before_the_draft(cursor, &[t], Source::Target)
                        .await;
                }
                let mut logits = out.logits.clone();
                mask.apply(&mut logits);
                GrammarStep::Draft(PositionOutput::new(logits, out.hidden.clone()))
            }
        })
    }

    /// Emits `tokens` that came before the draft had its say (forced, or the target's pick)
    /// and takes them into the draft's cache, for the grammar's next say.
    async fn emit_before_the_draft(
        &mut self,
        cursor: &mut Cursor<'_>,
        tokens: &[u32],
        source: Source,
    ) -> Result<GrammarStep, EngineError> {
        Ok(match self.emit(tokens, source, None).await? {
            Some(reason) => GrammarStep::Finished(reason),
            None => GrammarStep::Again(cursor.commit(tokens).await?),
        })
    }

    /// True when the next target call is the last the request may make (it then writes the
    /// rest of the answer).
    pub(super) fn next_call_is_the_last(&self) -> bool {
        self.req
            .settings
            .max_target_calls
            .is_some_and(|cap| self.calls_capped() + 1 >= cap)
    }

    /// True when the request has made every target call it may: only after a grammar refused
    /// part of the last one (without a grammar that call writes the rest of the answer).
    pub(super) fn calls_exhausted(&self) -> bool {
        self.req
            .settings
            .max_target_calls
            .is_some_and(|cap| self.calls_capped() >= cap)
    }

    /// The calls the cap counts: all but the warm.
    fn calls_capped(&self) -> u32 {
        self.stats.target_calls - self.stats.target_warms - self.stats.span_continuations
    }

    /// True once, after the grammar refused a target token (see `draft_owns_next`).
    pub(super) fn take_draft_turn(&mut self) -> bool {
        std::mem::take(&mut self.draft_owns_next)
    }

    /// Whether the grammar refuses the target's `token` here (an end-of-sequence id: ending
    /// here). A refused token ends the target's part; the draft writes the position instead.
    fn refuses(&mut self, token: u32) -> bool {
        let refused = self.grammar.as_mut().is_some_and(|g| !g.allows(token));
        if refused {
            self.stats.grammar_refusals += 1;
            self.draft_owns_next = true;
        }
        refused
    }

    /// Whether the grammar refuses to end the answer here (the target ended its part).
    fn refuses_end(&mut self) -> bool {
        match self.engine.eos.first() {
            Some(&eos) => self.refuses(eos),
            None => false,
        }
    }

    /// What the draft thought where `token` is emitted after output `out` (`entropy` when
    /// known already), for the context; `None` when no context is kept.
    pub(super) fn record(
        &self,
        out: &PositionOutput,
        token: u32,
        entropy: Option<f32>,
    ) -> Option<Record> {
        self.context
            .as_ref()
            .map(|_| Record::new(out, token, entropy))
    }

    /// Every token emitted so far.
    pub(super) fn emitted(&self) -> &[u32] {
        &self.emitted
    }

    pub(super) fn remaining(&self) -> u32 {
        self.req
            .max_tokens
            .saturating_sub(self.emitted.len() as u32)
    }

    /// Emits tokens; `Ok(Some(reason))` when one of them ends the generation. `first` is what
    /// the draft thought at the first of them (see [`Run::record`]); at the others it is not
    /// known.
    pub(super) async fn emit(
        &mut self,
        ids: &[u32],
        source: Source,
        first: Option<Record>,
    ) -> Result<Option<FinishReason>, EngineError> {
        for (i, &id) in ids.iter().enumerate() {
            if self.engine.eos.contains(&id) {
                return Ok(Some(FinishReason::Stop));
            }
            // A target's id goes into the draft's cache next: one it cannot hold is the
            // target's error, not a crash in the draft runtime.
            if source == Source::Target && id as usize >= self.engine.tokenizer.vocab_size() {
                return Err(TargetError::Protocol(format!(
                    "token id {id} is outside the vocabulary ({} tokens)",
                    self.engine.tokenizer.vocab_size()
                ))
                .into());
            }
            if self.emitted.is_empty() {
                self.stats.time_to_first_token = self.started.elapsed();
            }
            if let Some(g) = &mut self.grammar {
                g.consume(id)?;
            }
            self.emitted.push(id);
            self.last_source = source;
            self.stats.completion_tokens += 1;
            // Counted here, with completion_tokens, so an end-of-sequence token (never
            // emitted) is counted by neither and the three always add up.
            match source {
                Source::Draft => {
                    self.stats.draft_tokens += 1;
                    self.loops.draft(id);
                }
                Source::Grammar => {
                    self.stats.draft_tokens += 1;
                    self.stats.forced_tokens += 1;
                }
                Source::Target => {
                    self.stats.target_tokens += 1;
                    self.loops.target(id);
                }
            }
            let delta = self.decoder.push(id)?;
            if let Some(p) = &mut self.place {
                p.push(&delta);
            }
            if let Some(ctx) = &mut self.context {
                ctx.push(if i == 0 { first } else { None }, &delta);
            }
            if let Some(r) = &mut self.repeats {
                for stop in r.feed(&delta) {
                    self.stop.add(stop);
                }
            }
            let client = self.client_text(&delta);
            let (text, stop) = match self.stop.push(&client) {
                StopResult::Continue(t) => (t, false),
                StopResult::Stop(t) => (t, true),
            };
            if let Some(sent) = &mut self.json_sent {
                sent.push_str(&text);
            }
            if self
                .tx
                .send(TokenEvent {
                    id: Some(id),
                    text,
                    source,
                })
                .await
                .is_err()
            {
                return Ok(Some(FinishReason::Cancelled));
            }
            if stop {
                self.hit_stop_sequence = true;
                return Ok(Some(self.stopped_by_string()));
            }
            if self.remaining() == 0 {
                return Ok(Some(FinishReason::Length));
            }
        }
        Ok(None)
    }

    /// What of the answer's next text the client receives: all of it, but a JSON answer's
    /// fence.
    fn client_text(&mut self, delta: &str) -> String {
        match &mut self.fence {
            Some(fence) => fence.feed(delta),
            None => delta.to_string(),
        }
    }

    /// How an answer a stop string cut ends: `Stop`, but for a JSON answer whose text as sent
    /// is not a whole JSON value, which ends as if cut by its token limit (`Length`): every
    /// structured answer that ends with `Stop` is valid for its schema. Cut JSON that parses
    /// is whole for the schema too, as the grammar let each of its values close; a top-level
    /// number cut short is the exception no client schema in practice has.
    fn stopped_by_string(&self) -> FinishReason {
        match &self.json_sent {
            Some(sent) if serde_json::from_str::<serde::de::IgnoredAny>(sent).is_err() => {
                FinishReason::Length
            }
            _ => FinishReason::Stop,
        }
    }

    /// The exact prefix for the next call (prompt and everything emitted), with that call
    /// counted in the stats; after the warm, if one is still out.
    async fn next_call(&mut self, kind: CallKind, n: u32) -> ContinuationRequest {
        self.settle_warm().await;
        let prefix = self.prefix();
        let len = prefix.len() as u64;
        let cacheable = self
            .req
            .settings
            .cache
            .cacheable(self.last_prefix_len.min(len));
        self.count_call(kind, len, cacheable);
        self.last_prefix_len = len;
        self.call_reported = false;
        let mut creq = self.request(prefix, n);
        if self.grammar.is_some() {
            creq.top_logprobs = GRAMMAR_ALTERNATIVES;
        }
        creq
    }

    /// A call of this answer for `max_tokens` after `prefix`, with the request's sampling and
    /// model, asking for no alternatives.
    fn request(&self, prefix: Vec<u32>, max_tokens: u32) -> ContinuationRequest {
        ContinuationRequest {
            prefix,
            prompt_len: self.req.prompt.len(),
            messages: self.req.messages.clone(),
            max_tokens,
            sampling: self.req.sampling,
            model: self.req.model.clone(),
            top_logprobs: 0,
            answer: Some(self.answer.id),
            allowed: Vec::new(),
        }
    }

    /// What the target writes where the grammar refused its token: the best allowed of its
    /// top entries, or else its own best of the few tokens the grammar allows there. `None`
    /// leaves the position to the draft.
    async fn allowed_alternative(
        &mut self,
        alternatives: Option<&Vec<(u32, f32)>>,
    ) -> Result<Option<u32>, EngineError> {
        match self.best_allowed(alternatives) {
            Some(t) => Ok(Some(t)),
            None => self.target_pick(None).await,
        }
    }

    /// The target's own best of the tokens the grammar allows next, asked in a call of one
    /// token on the prefix its cache holds: what a target constraining its own answer writes
    /// where its top entries are all refused (an enum member far down its list: on the
    /// structured sample, `"advertising"` where it would write `"Promotion"`), or where the
    /// draft's own first choice is. `mask` is the position's, where the grammar has given it
    /// already. `None` where the target cannot keep to a set, more than [`PICK_LIMIT`] are
    /// allowed, or no call may be made (the request's threshold of 0 makes none).
    async fn target_pick(&mut self, mask: Option<&Mask>) -> Result<Option<u32>, EngineError> {
        self.pick(mask, false).await
    }

    /// As [`Run::target_pick`], where the answer may also end here: the target's pick may be
    /// its end (an end-of-sequence id, which [`Run::emit`] takes as the answer's end).
    async fn target_pick_or_end(&mut self, mask: &Mask) -> Result<Option<u32>, EngineError> {
        self.pick(Some(mask), true).await
    }

    async fn pick(
        &mut self,
        mask: Option<&Mask>,
        may_end: bool,
    ) -> Result<Option<u32>, EngineError> {
        let end = self.engine.eos.first().copied().filter(|_| may_end);
        if !self.engine.target.picks_among_tokens()
            || self.req.threshold <= 0.0
            || self.calls_exhausted()
            || self.guard_judges(0, 1).is_some()
        {
            return Ok(None);
        }
        let Some(mut allowed) = self.grammar.as_mut().and_then(|g| match mask {
            Some(m) => g.few_of(m, PICK_LIMIT),
            None => g.allowed_tokens(PICK_LIMIT),
        }) else {
            return Ok(None);
        };
        allowed.extend(end);
        let mut creq = self.next_call(CallKind::Correction, 1).await;
        creq.allowed = allowed;
        creq.top_logprobs = 0;
        let engine = self.engine;
        let call = engine.target.continue_tokens(&creq);
        let Some(cont) = unless_client_gone(&self.tx, &mut self.stats.target_wait, call).await
        else {
            return Ok(None);
        };
        let cont = cont?;
        self.absorb(cont.cached_prompt_tokens, cont.timings, cont.extra_calls);
        self.last_prefix_len += cont.tokens.len() as u64;
        if let Some(e) = end
            && cont.tokens.is_empty()
            && cont.stopped_on_eos
        {
            // It ended at once: its end was its pick.
            self.stats.grammar_picks += 1;
            return Ok(Some(e));
        }
        let pick = cont.tokens.first().copied().filter(|t| {
            (*t as usize) < engine.tokenizer.vocab_size()
                && (!engine.eos.contains(t) || end == Some(*t))
        });
        if let Some(e) = pick.filter(|t| engine.eos.contains(t)) {
            self.stats.grammar_picks += 1;
            return Ok(Some(e));
        }
        let Some(t) = pick.filter(|&t| self.grammar.as_mut().is_some_and(|g| g.allows(t))) else {
            // A target that did not keep to the set: the draft writes the position.
            return Ok(None);
        };
        self.stats.grammar_picks += 1;
        self.draft_owns_next = false;
        Ok(Some(t))
    }

    /// The target's most likely token among `alternatives` (its top entries where it wrote a
    /// token the grammar refused) that the grammar allows: what a target constraining its own
    /// answer would have written there, when it is among them.
    fn best_allowed(&mut self, alternatives: Option<&Vec<(u32, f32)>>) -> Option<u32> {
        let g = self.grammar.as_mut()?;
        let mut ranked: Vec<(u32, f32)> = alternatives?.clone();
        ranked.sort_by(|a, b| b.1.total_cmp(&a.1));
        let eos = &self.engine.eos;
        let best = ranked
            .into_iter()
            .map(|(t, _)| t)
            .find(|&t| (t as usize) < self.engine.tokenizer.vocab_size() && g.allows(t))?;
        if eos.contains(&best) {
            // Ending is the draft's call too: it sees the grammar's end itself.
            return None;
        }
        self.stats.grammar_alternatives += 1;
        self.draft_owns_next = false;
        Some(best)
    }

    /// Counts a call that sends `sent` tokens, `cacheable` of which the cache can serve.
    fn count_call(&mut self, kind: CallKind, sent: u64, cacheable: u64) {
        if kind != CallKind::Warm {
            self.loops.heard();
        }
        self.stats.target_calls += 1;
        self.stats.target_input_tokens += sent;
        self.stats.target_cacheable_input_tokens += cacheable;
        let before = self.stats.target_generated();
        self.stats
            .calls
            .push(CallRecord::new(kind, sent, cacheable, before));
    }

    /// Counts what an answer says beyond its tokens: cached prompt tokens the target reported,
    /// the compute it reports the call took, and calls it had to make again (each re-sends
    /// the prefix, served from the cache).
    fn absorb(&mut self, cached: Option<u32>, timings: Option<TargetTimings>, extra_calls: u32) {
        if let Some(t) = timings {
            if let Some(c) = self.stats.calls.last_mut() {
                c.timings = Some(t);
            }
            self.stats.target_busy += t.busy();
            self.stats.target_prompt_processed += t.prompt_tokens;
            self.stats.target_predicted += t.predicted_tokens;
            self.stats.target_calls_timed += 1;
        }
        if let Some(c) = cached
            && !self.call_reported
        {
            // Once per call: some servers repeat their usage in several chunks.
            self.call_reported = true;
            if let Some(call) = self.stats.calls.last_mut() {
                call.cached = u64::from(c).min(call.sent);
                call.cached_reported = true;
            }
            self.stats.target_reported_cached_tokens += u64::from(c);
            self.stats.target_calls_reporting_cache += 1;
        }
        if extra_calls > 0 {
            let prefix = self.last_prefix_len;
            self.stats.target_calls += extra_calls;
            self.stats.heal_retries += extra_calls;
            self.stats.target_input_tokens += prefix * u64::from(extra_calls);
            let cacheable = self.req.settings.cache.cacheable(prefix);
            self.stats.target_cacheable_input_tokens += cacheable * u64::from(extra_calls);
            if let Some(c) = self.stats.calls.last_mut() {
                // Counted in the call's record: it is the same call, made again.
                c.sent += prefix * u64::from(extra_calls);
                if !c.cached_reported {
                    c.cached += cacheable * u64::from(extra_calls);
                }
            }
        }
    }

    /// The exact token prefix so far: the prompt and everything emitted.
    fn prefix(&self) -> Vec<u32> {
        [self.req.prompt.as_slice(), self.emitted.as_slice()].concat()
    }

    /// How the draft's `token` after its output `out` fares. The verifier judges the token
    /// that would be emitted: at temperature > 0 the sampled one, which need not be the draft's
    /// top-1. Where the grammar refused the target's token, or refused part of the last call
    /// the request may make, the draft's is taken unjudged; where the target scores every
    /// token, none is taken. A draft run that loops, or ran long unheard, goes to the target
    /// as if rejected: a looping draft is at its most confident (`decode/repeats.rs`).
    pub(super) fn verdict(
        &mut self,
        verifier: &dyn Verifier,
        out: &PositionOutput,
        token: u32,
    ) -> Verdict {
        let exact = self.req.settings.verification.target_scores_every_token();
        let owned = self.take_draft_turn() || self.calls_exhausted();
        let in_window = !exact && !owned;
        let runaway = in_window && self.loops.runaway();
        let (accepted, entropy) = if owned {
            (true, None)
        } else if exact {
            (false, None)
        } else if runaway {
            self.stats.loop_checks += 1;
            (false, None)
        } else {
            self.judge(verifier, out, token)
        };
        Verdict {
            accepted,
            entropy,
            in_window,
            by_verifier: in_window && !runaway,
        }
    }

    /// Whether the verifier accepts `token` after the draft's output `out`, at the request's
    /// threshold and in the answer's context (and the draft's entropy there, when computed);
    /// the time it takes is counted in the stats.
    pub(super) fn judge(
        &mut self,
        verifier: &dyn Verifier,
        out: &PositionOutput,
        token: u32,
    ) -> (bool, Option<f32>) {
        let t = Instant::now();
        let d = decide(
            verifier,
            out,
            token,
            self.threshold_for(token),
            self.context.as_ref(),
        );
        self.stats.verifier_time += t.elapsed();
        d
    }

    /// The threshold `token` is judged at: by its place in a JSON answer where the model says
    /// so, else the request's.
    fn threshold_for(&self, token: u32) -> f32 {
        let (Some(place), Some(t)) = (&self.place, self.req.settings.json_thresholds) else {
            return self.req.threshold;
        };
        // Only a closing quote matters in the token's text, so a piece of a character that
        // decodes lossily is as good as the whole.
        let text = self.engine.tokenizer.decode(&[token]).unwrap_or_default();
        match place.place_of(&text) {
            Place::Outside => self.req.threshold,
            Place::Value => t.value,
            Place::Text => t.text,
        }
    }

    /// Whether a call reads the target's prompt cache: a window call (`window`) to a target
    /// whose window calls do not, does not.
    fn reads_cache(&self, window: bool) -> bool {
        !window || self.engine.target.windows_read_cache()
    }

    /// Of a call's `prefix` tokens, those the target's prompt cache can serve: what the
    /// previous call sent or received, as the cache rules serve it, where the call reads the
    /// cache at all.
    fn cacheable_prefix(&self, prefix: u64, window: bool) -> u64 {
        if !self.reads_cache(window) {
            return 0;
        }
        self.req
            .settings
            .cache
            .cacheable(self.last_prefix_len.min(prefix))
    }

    /// Why the cost guard forbids a call that sends the prefix and `window` more tokens (a
    /// correction sends none) and may bring back `n` tokens, if it does.
    pub(super) fn guard_judges(&self, window: usize, n: u32) -> Option<GuardReason> {
        let guard = self.req.cost_guard?;
        let prefix = (self.req.prompt.len() + self.emitted.len()) as u64;
        let cacheable = self.cacheable_prefix(prefix, window > 0);
        let plan = CallPlan {
            reads_cache: self.reads_cache(window > 0),
            prefix: prefix + window as u64,
            cacheable,
            max_output: u64::from(n),
            stops: !self.req.stop.is_empty(),
        };
        guard.judge(&self.stats.spend(), plan, u64::from(self.remaining()))
    }

    /// Awaits a target call, the draft guessing up to `guesses` tokens ahead meanwhile when
    /// the request overlaps (see [`Cursor::overlap`]); `None` when the client went away first.
    async fn wait<T>(
        &mut self,
        cursor: &mut Cursor<'_>,
        from: &PositionOutput,
        first: Option<(usize, u32)>,
        guesses: usize,
        call: impl Future<Output = T>,
    ) -> Result<Option<T>, EngineError> {
        let guesses = if self.req.settings.overlap {
            guesses
        } else {
            0
        };
        let engine = self.engine;
        let both = cursor.overlap(call, from, first, guesses, &engine.eos);
        unless_client_gone(&self.tx, &mut self.stats.target_wait, both)
            .await
            .transpose()
    }

    /// Asks the target for `n` tokens after the current prefix and emits them.
    /// `Ok(Some(reason))` when the generation ends there.
    pub(super) async fn call_target(
        &mut self,
        cursor: &mut Cursor<'_>,
        from: &PositionOutput,
        n: u32,
    ) -> Result<Option<FinishReason>, EngineError> {
        let creq = self.next_call(CallKind::Correction, n).await;
        let engine = self.engine;
        let call = engine.target.continue_tokens(&creq);
        let Some(cont) = self.wait(cursor, from, None, n as usize + 1, call).await? else {
            return Ok(Some(FinishReason::Cancelled));
        };
        let cont = cont?;
        self.absorb(cont.cached_prompt_tokens, cont.timings, cont.extra_calls);
        self.last_prefix_len += cont.tokens.len() as u64;
        if cont.tokens.is_empty() && !cont.stopped_on_eos {
            return Err(TargetError::Protocol("target returned no tokens".into()).into());
        }
        self.last_target_tokens.clear();
        for (i, &t) in cont.tokens.iter().enumerate() {
            if self.refuses(t) {
                self.stats.target_discarded_tokens += (cont.tokens.len() - i) as u64;
                if let Some(alt) = self.allowed_alternative(cont.top_logprobs.get(i)).await? {
                    self.last_target_tokens.push(alt);
                    return self.emit(&[alt], Source::Target, None).await;
                }
                return Ok(None);
            }
            let seen = if i == 0 {
                self.record(from, t, None)
            } else {
                None
            };
            self.last_target_tokens.push(t);
            if let Some(r) = self.emit(&[t], Source::Target, seen).await? {
                return Ok(Some(r));
            }
        }
        if cont.stopped_on_eos && !self.refuses_end() {
            return Ok(Some(FinishReason::Stop));
        }
        Ok(None)
    }

    /// Verifies a window: the draft runs ahead from `first` (the token it proposes at the
    /// current position) to `k` tokens, the target scores them in one call, and the longest
    /// prefix it accepts is emitted, then the target's own token after it. The draft's cache
    /// is rolled back to match. Greedy: the target accepts the tokens it would have chosen
    /// itself. Sampled: speculative sampling's rule on the target's log-probabilities (see
    /// [`Run::accept_sampled`]).
    pub(super) async fn window(
        &mut self,
        cursor: &mut Cursor<'_>,
        verifier: &dyn Verifier,
        out: PositionOutput,
        first: u32,
        k: u32,
        sampler: &mut Sampler,
    ) -> Result<WindowEnd, EngineError> {
        let sampled = !self.req.sampling.is_greedy();
        let start = out;
        // A relaxed rule judges greedy windows from the target's probabilities.
        let rule = self
            .req
            .settings
            .verification
            .window_rule()
            .filter(|_| !sampled);
        let drafted = self
            .draft_window(cursor, &start, first, k, sampler, rule)
            .await?;
        let window = &drafted.tokens;
        // The cursor now has every window token but the last ahead.
        let prefix = self.prefix();
        self.settle_warm().await;
        let sent = (prefix.len() + window.len()) as u64;
        let cacheable = self.cacheable_prefix(prefix.len() as u64, true);
        if let Some(reason) = self.guard_judges(window.len(), 1) {
            self.stats.cost_guard = true;
            self.stats.cost_guard_reason = Some(reason);
            return match self.hand_off().await? {
                HandOff::Finished(reason) => Ok(WindowEnd::Finished(reason)),
                // Windows are off under a grammar, the one thing that refuses.
                HandOff::Refused(_) => Err(EngineError::Grammar(
                    "a grammar refused a token of a window's hand-off".into(),
                )),
            };
        }
        let wreq = WindowRequest {
            prefix,
            window: window.clone(),
            model: self.req.model.clone(),
            sampling: sampled.then(|| self.window_sampling()),
            top_logprobs: if rule.is_some() {
                RELAXED_TOP_LOGPROBS
            } else {
                0
            },
        };
        let engine = self.engine;
        let call = engine.target.score_window(&wreq);
        let last = window.last().map(|&t| (window.len() - 1, t));
        let Some(scored) = self
            .wait(cursor, &start, last, OVERLAP_MAX_AHEAD, call)
            .await?
        else {
            return Ok(WindowEnd::Finished(FinishReason::Cancelled));
        };
        let Some(score) = scored? else {
            cursor.discard().await?;
            return Ok(WindowEnd::Unsupported(start));
        };
        check_scores(&score, window.len(), sampled || rule.is_some())?;
        self.count_window(&score, sent, cacheable);
        self.last_prefix_len = sent + 1;
        self.stats.windows += 1;
        self.stats.window_tokens += window.len() as u64;
        let (accepted, own) = if sampled {
            self.accept_sampled(window, &drafted.drawn_from, &score, sampler)
        } else {
            let kept = if self.req.settings.verification == Verification::Judged {
                self.harmless(cursor, &start, window, &score.top, verifier)?
            } else {
                Vec::new()
            };
            self.accept_greedy(window, &score, rule, &drafted.draft_probs, &kept)
        };
        self.stats.window_accepted += accepted as u64;
        self.emit_window(cursor, &start, window, accepted, own)
            .await
    }

    /// Counts a window's call, `sent` prompt tokens of which the cache rules say `cacheable`
    /// could be served, with what the target reported of its cache.
    fn count_window(&mut self, score: &WindowScore, sent: u64, cacheable: u64) {
        self.count_call(CallKind::Window, sent, cacheable);
        self.call_reported = false;
        if score.stale_cached.is_some() || score.refused {
            // The call read stale rows (or was refused for them) and was made again, its
            // prefix computed whole: two calls, the first billed at what its cache served
            // where it said, else at the cache rules' estimate.
            self.absorb(score.stale_cached, None, 0);
            // The first call's one generated token was never used.
            self.stats.target_discarded_tokens += 1;
            self.count_call(CallKind::Window, sent, 0);
            self.call_reported = false;
            self.stats.window_rescores += 1;
        }
        self.absorb(score.cached_prompt_tokens, None, 0);
    }

    /// Runs the draft ahead from `first` (the token it proposes at `start`) to a window of
    /// `k` tokens, or to an end of sequence.
    async fn draft_window(
        &self,
        cursor: &mut Cursor<'_>,
        start: &PositionOutput,
        first: u32,
        k: u32,
        sampler: &mut Sampler,
        rule: Option<AcceptanceRule>,
    ) -> Result<DraftedWindow, EngineError> {
        let sampled = !self.req.sampling.is_greedy();
        let mut d = DraftedWindow {
            tokens: vec![first],
            drawn_from: Vec::new(),
            draft_probs: Vec::new(),
        };
        if sampled {
            d.drawn_from.push(sampler.distribution(&start.logits));
        }
        // The draft's probability of each window token (its top-1, greedy) only when the rule
        // reads it, taken as the verifier, the rows and the oracle take it.
        let reads_q = rule.is_some_and(|r| r.reads_draft_probability());
        if reads_q {
            d.draft_probs.push(Features::from_output(start).top1_prob);
        }
        while d.tokens.len() < k as usize {
            let last = d.tokens[d.tokens.len() - 1];
            if self.engine.eos.contains(&last) {
                break;
            }
            let o = cursor.ahead_at(d.tokens.len() - 1, last).await?;
            if sampled {
                let dist = sampler.distribution(&o.logits);
                d.tokens.push(sampler.pick_from(&dist));
                d.drawn_from.push(dist);
            } else {
                let t = sampler.pick_at(o);
                if reads_q {
                    d.draft_probs.push(Features::from_output(o).top1_prob);
                }
                d.tokens.push(t);
            }
        }
        Ok(d)
    }

    /// Judged windows: for each window token from the first, whether the local verifier keeps
    /// it where the target would have chosen another, judged on the draft's output there and
    /// in the context of the answer with the window before it, as the decode loop would have
    /// judged it; up to the first it does not keep.
    fn harmless(
        &self,
        cursor: &Cursor<'_>,
        start: &PositionOutput,
        window: &[u32],
        top: &[u32],
        verifier: &dyn Verifier,
    ) -> Result<Vec<bool>, EngineError> {
        let mut ctx = self.context.clone();
        let mut decoder = self.decoder.clone();
        let mut kept = Vec::with_capacity(window.len());
        for (i, (&w, &t)) in window.iter().zip(top).enumerate() {
            let out = match i {
                0 => Some(start),
                i => cursor.ahead_output(i - 1, window[i - 1]),
            };
            let Some(out) = out else { break };
            let (keep, entropy) = if w == t {
                (false, None)
            } else {
                decide(verifier, out, w, self.req.threshold, ctx.as_ref())
            };
            if w != t && !keep {
                break;
            }
            kept.push(keep);
            if let Some(c) = ctx.as_mut() {
                c.push(Some(Record::new(out, w, entropy)), &decoder.push(w)?);
            }
        }
        Ok(kept)
    }

    /// Greedy windows: the longest prefix the target would have chosen itself (or, under a
    /// relaxed rule, accepts from its log-probabilities; or, judged, `kept` says the local
    /// verifier keeps), then the target's own token there.
    fn accept_greedy(
        &mut self,
        window: &[u32],
        score: &WindowScore,
        rule: Option<AcceptanceRule>,
        draft_probs: &[f32],
        kept: &[bool],
    ) -> (usize, u32) {
        let accepted = window
            .iter()
            .zip(&score.top)
            .enumerate()
            .take_while(|&(i, (w, t))| {
                w == t
                    || kept.get(i).copied().unwrap_or(false)
                    || rule.is_some_and(|r| {
                        let mut top = score.logprobs[i].clone();
                        top.sort_by(|a, b| b.1.total_cmp(&a.1));
                        let q = draft_probs.get(i).copied().unwrap_or(0.0);
                        r.accepts(*w, q, &TargetProbs { top })
                    })
            })
            .count();
        self.stats.window_relaxed_accepts += window[..accepted]
            .iter()
            .zip(&score.top)
            .filter(|(w, t)| w != t)
            .count() as u64;
        if let Some(Some(m)) = score.margins.get(accepted)
            && accepted < window.len()
            && *m < TIE_MARGIN
        {
            self.stats
                .near_ties
                .push(((self.emitted.len() + accepted) as u32, *m));
        }
        (accepted, score.top[accepted])
    }

    /// Emits a scored window's `accepted` draft tokens and the target's own token after them,
    /// and moves the draft past them.
    async fn emit_window(
        &mut self,
        cursor: &mut Cursor<'_>,
        start: &PositionOutput,
        window: &[u32],
        accepted: usize,
        own: u32,
    ) -> Result<WindowEnd, EngineError> {
        // The draft's output before window token `i`, for the context (when kept): the cursor
        // still holds the outputs of the window it ran ahead (a guess made while waiting only
        // replaces what comes after the last window token), so none is copied.
        let record = |run: &Self, cursor: &Cursor<'_>, i: usize, token: u32| {
            let before = match i {
                0 => Some(start),
                // After a fully accepted window the draft has not looked past it yet.
                i if i >= window.len() => None,
                i => cursor.ahead_output(i - 1, window[i - 1]),
            };
            before.and_then(|o| run.record(o, token, None))
        };
        for (i, &token) in window[..accepted].iter().enumerate() {
            let r = record(self, cursor, i, token);
            if let Some(reason) = self.emit(&[token], Source::Draft, r).await? {
                return Ok(WindowEnd::Finished(reason));
            }
        }
        let r = record(self, cursor, accepted, own);
        if let Some(reason) = self.emit(&[own], Source::Target, r).await? {
            return Ok(WindowEnd::Finished(reason));
        }
        // The accepted tokens are ahead already; the target's own token is too when the draft,
        // overlapping, guessed it.
        let mut emitted = window[..accepted].to_vec();
        emitted.push(own);
        let next = cursor.commit(&emitted).await?;
        Ok(WindowEnd::Resume { next, accepted })
    }

    /// The sampling parameters of the next window call. A seeded request gets a different
    /// seed per call, derived from its own: the same seed in every call would make the
    /// target's draws after successive windows repeat one another. Kept within a signed
    /// 64-bit integer, the API's type for a seed (vLLM refuses others with a 400).
    fn window_sampling(&self) -> SamplingParams {
        let call = u64::from(self.stats.windows) + 1;
        SamplingParams {
            seed: self
                .req
                .sampling
                .seed
                .map(|s| (s ^ call.wrapping_mul(0x9E37_79B9_7F4A_7C15)) & i64::MAX as u64),
            ..self.req.sampling
        }
    }

    /// Speculative sampling over a scored window: the draft token `x` at a position, drawn from
    /// the draft's distribution q, is accepted with probability min(1, p(x) / q(x)), p being
    /// the target's distribution there at the request's temperature and top-p (from the
    /// log-probabilities it reported). At the first rejection the token comes from max(0, p −
    /// q), renormalised; when all are accepted, it is the target's own sample after the window.
    /// Each emitted token is then distributed as the target's own sampling would give it, up
    /// to the target's tail beyond the entries it reports. Returns the accepted count and the
    /// token after them.
    fn accept_sampled(
        &self,
        window: &[u32],
        drawn_from: &[Vec<(u32, f32)>],
        score: &WindowScore,
        sampler: &mut Sampler,
    ) -> (usize, u32) {
        for (i, (&x, q)) in window.iter().zip(drawn_from).enumerate() {
            let p = nucleus(score.logprobs[i].iter().copied(), &self.req.sampling);
            let (px, qx) = (prob_of(&p, x), prob_of(q, x));
            if qx > 0.0 && sampler.uniform() < (px / qx).min(1.0) {
                continue;
            }
            return (i, sampler.pick_from(&residual(&p, q)));
        }
        (window.len(), score.top[window.len()])
    }

    /// Opens a streamed call for at most `n` tokens after the current prefix; `None` when the
    /// client went away first.
    async fn open_stream(&mut self, n: u32) -> Result<Option<TokenStream>, EngineError> {
        let creq = self.next_call(CallKind::HandOff, n).await;
        let call = self.engine.target.stream_tokens(&creq);
        Ok(
            unless_client_gone(&self.tx, &mut self.stats.target_wait, call)
                .await
                .transpose()?,
        )
    }

    /// Lets the target write the rest of the answer in one streamed call. Streamed, so that a
    /// stop string or the token limit ends it (and the upstream generation with it) as soon
    /// as it appears, as passthrough would.
    pub(super) async fn hand_off(&mut self) -> Result<HandOff, EngineError> {
        if self.stats.handed_off_at.is_none() {
            self.stats.handed_off_at = Some(self.stats.so_far());
        }
        let n = self.remaining();
        let Some(mut stream) = self.open_stream(n).await? else {
            return Ok(HandOff::Finished(FinishReason::Cancelled));
        };
        let mut taken = Vec::new();
        let mut received = 0usize;
        // A text-level target ends on end-of-sequence without a token for it.
        let mut ended = false;
        loop {
            let Some(chunk) =
                unless_client_gone(&self.tx, &mut self.stats.target_wait, stream.next()).await
            else {
                return Ok(HandOff::Finished(FinishReason::Cancelled));
            };
            let Some(chunk) = chunk else { break };
            let chunk = chunk?;
            self.absorb(chunk.cached_prompt_tokens, chunk.timings, chunk.extra_calls);
            received += chunk.tokens.len();
            self.last_prefix_len += chunk.tokens.len() as u64;
            for (i, &token) in chunk.tokens.iter().enumerate() {
                if self.refuses(token) {
                    self.stats.target_discarded_tokens += (chunk.tokens.len() - i) as u64;
                    self.end_call(&mut stream, false, unwritten(n, received))
                        .await;
                    // Closed first: a pick goes to the same slot, which would finish this
                    // generation before taking it.
                    drop(stream);
                    if let Some(alt) = self.allowed_alternative(chunk.top_logprobs.get(i)).await? {
                        taken.push(alt);
                        if let Some(reason) = self.emit(&[alt], Source::Target, None).await? {
                            return Ok(HandOff::Finished(reason));
                        }
                    }
                    return Ok(HandOff::Refused(taken));
                }
                taken.push(token);
                if let Some(reason) = self.emit(&[token], Source::Target, None).await? {
                    self.stats.target_discarded_tokens += (chunk.tokens.len() - i - 1) as u64;
                    let done = self.upstream_is_done(reason, received as u64, u64::from(n));
                    let more = if done { 0 } else { unwritten(n, received) };
                    self.end_call(&mut stream, false, more).await;
                    return Ok(HandOff::Finished(reason));
                }
            }
            if chunk.stopped_on_eos {
                ended = true;
                break;
            }
        }
        // A target that ended where the grammar says the answer goes on (or that stopped
        // short of it) leaves the rest to the draft.
        if self.remaining() > 0 && self.refuses_end() {
            self.drain_usage(&mut stream).await;
            return Ok(HandOff::Refused(taken));
        }
        if received == 0 && !ended && self.remaining() > 0 {
            return Err(TargetError::Protocol("target streamed no tokens".into()).into());
        }
        Ok(HandOff::Finished(if self.remaining() == 0 {
            FinishReason::Length
        } else {
            FinishReason::Stop
        }))
    }

    /// Corrects a rejection as the model's settings say: the target writes the rest in one
    /// call when the request is `over_budget` (too many rejections, or at its call cap) or the
    /// cost guard will not have another correction; otherwise a fixed number of target tokens
    /// or a streamed span.
    pub(super) async fn correct(
        &mut self,
        cursor: &mut Cursor<'_>,
        verifier: &dyn Verifier,
        out: PositionOutput,
        over_budget: bool,
        at_call_cap: bool,
    ) -> Result<Corrected, EngineError> {
        let correction = self.req.settings.correction;
        let asked = match correction {
            Correction::Fixed { tokens } => tokens.max(1),
            Correction::Span { max_span, .. } => max_span.max(1),
        }
        .min(self.remaining());
        let guarded = if over_budget {
            None
        } else {
            self.guard_judges(0, asked)
        };
        if over_budget || guarded.is_some() {
            self.stats.bailed_out = over_budget && !at_call_cap;
            self.stats.cost_guard = guarded.is_some();
            self.stats.cost_guard_reason = guarded;
            return Ok(match self.hand_off().await? {
                HandOff::Finished(reason) => Corrected::Finished(reason),
                HandOff::Refused(taken) if taken.is_empty() => Corrected::Resume(out),
                HandOff::Refused(taken) => Corrected::Produced(taken),
            });
        }
        Ok(match correction {
            Correction::Fixed { .. } => match self.call_target(cursor, &out, asked).await? {
                Some(reason) => Corrected::Finished(reason),
                None if self.last_target_tokens.is_empty() => Corrected::Resume(out),
                None => Corrected::Produced(self.last_target_tokens.clone()),
            },
            Correction::Span {
                resync, end, ask, ..
            } => {
                let rule = SpanRule {
                    max_span: asked,
                    resync: resync.max(1),
                    end,
                    ask,
                };
                match self.span(cursor, verifier, out, rule).await? {
                    SpanEnd::Resume(next) => Corrected::Resume(next),
                    SpanEnd::Finished(reason) => Corrected::Finished(reason),
                }
            }
        })
    }

    /// Streams a correction of at most `max_span` tokens. Each target token is emitted as it
    /// arrives and fed to the draft (tokens that arrived together in one call); the draft's
    /// output before it says whether the draft would have written it, confidently. After
    /// `resync` such tokens in a row the span may end (`end` decides), and drafting resumes.
    /// Under [`SpanAsk::All`] one call asks for the whole span, and its stream is closed
    /// where the span ends, which stops the target. Under [`SpanAsk::Fewest`] each call asks
    /// for the fewest tokens that could end the span, and another follows while it has not
    /// ended: no stream is closed early, for a target that writes on after a close.
    pub(super) async fn span(
        &mut self,
        cursor: &mut Cursor<'_>,
        verifier: &dyn Verifier,
        out: PositionOutput,
        rule: SpanRule,
    ) -> Result<SpanEnd, EngineError> {
        let mut at = SpanProgress {
            out,
            received: 0,
            agreeing: 0,
            kept: false,
        };
        loop {
            let left = rule.max_span - at.received;
            // The first token is where the draft was rejected, so it cannot agree.
            let fewest = rule.resync.saturating_sub(at.agreeing) + u32::from(at.received == 0);
            let asked = match rule.ask {
                SpanAsk::Fewest if !at.kept && fewest < left => fewest,
                _ => left,
            };
            if at.received > 0 {
                self.stats.span_continuations += 1;
            }
            let creq = self.next_call(CallKind::Span, asked).await;
            let got;
            (at, got) = match self.span_call(cursor, verifier, &creq, rule, at).await? {
                CallEnd::Span(end) => return Ok(end),
                CallEnd::Gave(at, got) => (at, got),
            };
            if got == 0 {
                return Err(TargetError::Protocol("target streamed no tokens".into()).into());
            }
            // The call gave what it was asked for and the span may go on: the next call
            // continues it. Otherwise (the span's length, or a target that stopped short) the
            // draft resumes.
            if got < asked || at.received >= rule.max_span {
                return Ok(SpanEnd::Resume(at.out));
            }
        }
    }

    /// Reads one call of a span (see [`Run::span`]): the span's end if it ended in it, else
    /// where the span stands and the tokens the call gave.
    async fn span_call(
        &mut self,
        cursor: &mut Cursor<'_>,
        verifier: &dyn Verifier,
        creq: &ContinuationRequest,
        rule: SpanRule,
        mut at: SpanProgress,
    ) -> Result<CallEnd, EngineError> {
        // A guess is used only while the target keeps to the draft's path, and the span ends
        // once the draft has predicted `resync` tokens: more guesses than that are rarely used
        // and take cores a target on the same machine could use.
        let guesses = rule.resync as usize + 1;
        let engine = self.engine;
        let Some(stream) = self
            .wait(
                cursor,
                &at.out,
                None,
                guesses,
                engine.target.stream_tokens(creq),
            )
            .await?
        else {
            return Ok(CallEnd::Span(SpanEnd::Finished(FinishReason::Cancelled)));
        };
        let mut stream = stream?;
        let mut got = 0u32;
        // The stream ended while what had arrived was taken: it is not read again.
        let mut ended = false;
        while !ended {
            let Some(first) = self
                .wait(cursor, &at.out, None, guesses, stream.next())
                .await?
            else {
                return Ok(CallEnd::Span(SpanEnd::Finished(FinishReason::Cancelled)));
            };
            let Some(first) = first else { break };
            let Arrived {
                tokens: batch,
                alternatives,
                eos,
                failed,
            } = self.take_arrived(first, &mut stream, &mut ended);
            for (i, &token) in batch.iter().enumerate() {
                at.received += 1;
                got += 1;
                self.last_prefix_len += 1;
                let unused = (batch.len() - i - 1) as u64;
                let (confident, entropy) = if at.out.top1() == token {
                    self.judge(verifier, &at.out, token)
                } else {
                    (false, None)
                };
                // What the call may still generate beyond what has arrived.
                let more = unwritten(creq.max_tokens, got as usize + unused as usize);
                if self.refuses(token) {
                    self.stats.target_discarded_tokens += unused + 1;
                    self.end_call(&mut stream, ended, more).await;
                    // Closed first: a pick goes to the same slot, which would finish this
                    // generation before taking it.
                    drop(stream);
                    // The target's best allowed token, when it said, is its answer here; the
                    // draft goes on after it.
                    if let Some(alt) = self.allowed_alternative(alternatives.get(i)).await? {
                        if let Some(reason) = self.emit(&[alt], Source::Target, None).await? {
                            return Ok(CallEnd::Span(SpanEnd::Finished(reason)));
                        }
                        at.out = cursor.commit(&[alt]).await?;
                    }
                    return Ok(CallEnd::Span(SpanEnd::Resume(at.out)));
                }
                at.agreeing = if confident { at.agreeing + 1 } else { 0 };
                let seen = self.record(&at.out, token, entropy);
                if let Some(reason) = self.emit(&[token], Source::Target, seen).await? {
                    self.stats.target_discarded_tokens += unused;
                    let done =
                        self.upstream_is_done(reason, u64::from(got), u64::from(creq.max_tokens));
                    let more = if done { 0 } else { more };
                    self.end_call(&mut stream, ended, more).await;
                    return Ok(CallEnd::Span(SpanEnd::Finished(reason)));
                }
                if cursor.ahead_output(0, token).is_none() {
                    // This token and those after it that have arrived, up to the fewest that
                    // could end the span (all confident), go to the draft in one call: cheaper
                    // than one call each, and none is fed that the span may not need.
                    let n =
                        (rule.resync.saturating_sub(at.agreeing) as usize + 1).min(batch.len() - i);
                    cursor.feed(&batch[i..i + n], 0).await?;
                }
                at.out = cursor.commit(&[token]).await?;
                if at.agreeing >= rule.resync
                    && !self.keeps_span(rule.end, rule.max_span, &mut at.kept)
                {
                    self.stats.resyncs += 1;
                    self.stats.target_discarded_tokens += unused;
                    self.end_call(&mut stream, ended, more).await;
                    return Ok(CallEnd::Span(SpanEnd::Resume(at.out)));
                }
            }
            if let Some(e) = failed {
                return Err(e.into());
            }
            if eos && !self.refuses_end() {
                return Ok(CallEnd::Span(SpanEnd::Finished(FinishReason::Stop)));
            }
            if eos {
                return Ok(CallEnd::Span(SpanEnd::Resume(at.out)));
            }
        }
        Ok(CallEnd::Gave(at, got))
    }

    /// The tokens of a streamed chunk and of whatever else has arrived meanwhile (a fast
    /// target's backlog), so that the draft can be fed several tokens in one call, with the
    /// target's top entries at each where it gave them; whether one of them ended on
    /// end-of-sequence, and the error that broke the stream, if one did (the tokens before it
    /// are emitted first). `ended` is set when the stream ended.
    fn take_arrived(
        &mut self,
        first: Result<StreamChunk, TargetError>,
        stream: &mut TokenStream,
        ended: &mut bool,
    ) -> Arrived {
        let mut chunks = vec![first];
        while chunks
            .last()
            .is_some_and(|c| c.as_ref().is_ok_and(|c| !c.stopped_on_eos))
        {
            match stream.next().now_or_never() {
                Some(Some(c)) => chunks.push(c),
                Some(None) => {
                    *ended = true;
                    break;
                }
                None => break,
            }
        }
        let (mut batch, mut alternatives, mut eos, mut failed) =
            (Vec::new(), Vec::new(), false, None);
        for c in chunks {
            match c {
                Ok(c) => {
                    self.absorb(c.cached_prompt_tokens, c.timings, c.extra_calls);
                    // One entry a token, so that the batch's indices find them (empty where
                    // none were asked for or given).
                    let mut alts = c.top_logprobs;
                    alts.resize(c.tokens.len(), Vec::new());
                    alternatives.extend(alts);
                    batch.extend(c.tokens);
                    eos |= c.stopped_on_eos;
                }
                Err(e) => failed = Some(e),
            }
        }
        Arrived {
            tokens: batch,
            alternatives,
            eos,
            failed,
        }
    }

    /// Whether a span the draft has caught up with goes on: under `SpanClose::Expected`, when
    /// the cost guard would refuse the correction a next rejection needs (it would hand the
    /// rest to the target, re-sending the prefix and what the draft wrote meanwhile; the
    /// stream already open costs neither). The guard is asked again at each agreeing token,
    /// so a span goes on only while that holds; `kept` counts a span once.
    fn keeps_span(&mut self, end: SpanClose, max_span: u32, kept: &mut bool) -> bool {
        if end == SpanClose::Resync {
            return false;
        }
        let next = max_span.max(1).min(self.remaining());
        let keep = self.remaining() > 0 && self.guard_judges(0, next).is_some();
        if keep && !*kept {
            *kept = true;
            self.stats.spans_kept += 1;
        }
        keep
    }

    /// True when a streamed call that ended the answer for `reason` after `received` of the
    /// `asked` tokens has nothing left to generate: it delivered all it was asked for, or its
    /// end-of-sequence. Not after a stop string: the target would go on, so its stream is
    /// closed at once to stop it.
    fn upstream_is_done(&self, reason: FinishReason, received: u64, asked: u64) -> bool {
        match reason {
            FinishReason::Length => received >= asked,
            FinishReason::Stop => !self.hit_stop_sequence,
            FinishReason::Cancelled => false,
        }
    }

    /// Leaves a call's stream that is still open once its tokens are no longer wanted: read
    /// to its end when the target has nothing left to generate (`more` is 0: it gave all it
    /// was asked for, or its end-of-sequence), else closed, which stops the target.
    async fn end_call(&mut self, stream: &mut TokenStream, ended: bool, more: u64) {
        if ended {
            // Nothing is left to read.
        } else if more == 0 {
            self.drain_usage(stream).await;
        } else {
            self.count_unread(stream, more);
        }
    }

    /// Counts what a stream about to be closed has already delivered and nobody read: the
    /// target generated those tokens, so they are billed (the stream is read a token per
    /// draft step, so a backlog builds while the draft works). Tokens still on the wire, and
    /// those the target writes before it notices the close, are not seen: they are billed as
    /// [`super::TOKENS_IN_FLIGHT_AT_CLOSE`], measured, but never more than the call could
    /// still generate (`more`, counted from what had arrived before).
    fn count_unread(&mut self, stream: &mut TokenStream, mut more: u64) {
        while let Some(Some(Ok(chunk))) = stream.next().now_or_never() {
            let n = chunk.tokens.len() as u64;
            self.stats.target_discarded_tokens += n;
            more = more.saturating_sub(n);
            self.absorb(chunk.cached_prompt_tokens, chunk.timings, chunk.extra_calls);
        }
        self.stats.target_inflight_tokens += super::TOKENS_IN_FLIGHT_AT_CLOSE.min(more);
    }

    /// Reads the rest of a stream that has nothing left to generate (see
    /// [`Run::upstream_is_done`]), for what its last event reports: the cached prompt tokens and
    /// the call's compute, which dropping it at once would lose. The target has nothing left
    /// to generate, so the wait is short; it is bounded all the same.
    async fn drain_usage(&mut self, stream: &mut TokenStream) {
        let drain = async {
            while let Some(Ok(chunk)) = stream.next().await {
                self.stats.target_discarded_tokens += chunk.tokens.len() as u64;
                self.absorb(chunk.cached_prompt_tokens, chunk.timings, chunk.extra_calls);
            }
        };
        let _ = tokio::time::timeout(USAGE_DRAIN_LIMIT, drain).await;
    }

    pub(super) async fn finish(mut self, reason: FinishReason) -> Result<Stats, EngineError> {
        if reason != FinishReason::Cancelled && !self.hit_stop_sequence {
            // Whatever was held back (an incomplete character, a possible stop string) is text.
            let flushed = self.decoder.flush()?;
            let mut tail = self.client_text(&flushed);
            if let Some(fence) = &mut self.fence {
                tail.push_str(&fence.finish());
            }
            let text = match self.stop.push(&tail) {
                StopResult::Continue(t) => t + &self.stop.finish(),
                StopResult::Stop(t) => t,
            };
            if !text.is_empty() {
                let _ = self
                    .tx
                    .send(TokenEvent {
                        id: None,
                        text,
                        source: self.last_source,
                    })
                    .await;
            }
        }
        if let Some(warm) = self.warm.take() {
            // No call came after it (the draft wrote the whole answer): whatever it finished
            // is counted, and if unfinished it is stopped.
            self.count_warm(warm.now());
        }
        let total = self.stats.target_generated();
        settle(&mut self.stats.calls, total);
        self.stats.finish_reason = Some(reason);
        self.stats.spans_for_windows =
            self.windows_unsupported && self.req.settings.verification != Verification::Approximate;
        Ok(self.stats)
    }
}
