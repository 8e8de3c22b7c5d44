//! Corrections: after a rejection the target writes a fixed number of tokens or a streamed
//! span that ends once the draft, following it, predicts it again with confidence.

use std::time::Duration;

use super::hand_off::HandOff;
use super::state::{Run, unwritten};

use futures::{FutureExt, StreamExt};

use crate::decode::calls::CallKind;
use crate::decode::cursor::Cursor;
use crate::decode::request::{Correction, FinishReason, Source, SpanAsk, SpanClose};
use crate::draft::PositionOutput;
use crate::error::{EngineError, TargetError};
use crate::targets::{ContinuationRequest, StreamChunk, TokenStream};
use crate::verify::Verifier;

/// Longest wait for the last event of a stream whose tokens have all arrived.
const USAGE_DRAIN_LIMIT: Duration = Duration::from_secs(2);

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
    pub(super) max_span: u32,
    /// Agreeing tokens that let it end.
    pub(super) resync: u32,
    /// Whether it ends once they have.
    pub(super) end: SpanClose,
    /// Tokens each call asks for.
    pub(super) ask: SpanAsk,
}

/// Feeds the draft a span's token and those after it that have arrived, up to the fewest that
/// could end the span (`needed` more confident ones), in one call: cheaper than one call each,
/// and none is fed that the span may not need.
async fn feed_arrived(
    cursor: &mut Cursor<'_>,
    arrived: &[u32],
    needed: u32,
) -> Result<(), EngineError> {
    let n = (needed as usize + 1).min(arrived.len());
    cursor.feed(&arrived[..n], 0).await
}

/// Where a span stands between its calls.
pub(super) struct SpanProgress {
    /// The draft's output at the next position.
    pub(super) out: PositionOutput,
    /// Target tokens so far, over its calls.
    pub(super) received: u32,
    /// Of the last of those, how many in a row the draft predicted with confidence.
    pub(super) agreeing: u32,
    /// Whether it went on after the draft caught up (`SpanClose::Expected`).
    pub(super) kept: bool,
}

/// How one call of a span ended.
pub(super) enum CallEnd {
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

/// What a span's stream had delivered when it was read (see [`Run::take_arrived`]).
pub(super) struct Arrived {
    /// The tokens, in order.
    pub(super) tokens: Vec<u32>,
    /// The target's top entries at each of them (empty where it gave none).
    pub(super) alternatives: Vec<Vec<(u32, f32)>>,
    /// One of them ended on end-of-sequence.
    pub(super) eos: bool,
    /// The error that broke the stream, after them.
    pub(super) failed: Option<TargetError>,
}

impl Run<'_> {
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
    pub(super) async fn span_call(
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
        let call = self.engine.target.stream_tokens(creq);
        let Some(stream) = self.wait(cursor, &at.out, None, guesses, call).await? else {
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
            let arrived = self.take_arrived(first, &mut stream, &mut ended);
            let batch = &arrived.tokens;
            for (i, &token) in batch.iter().enumerate() {
                at.received += 1;
                got += 1;
                self.last_prefix_len += 1;
                let unused = (batch.len() - i - 1) as u64;
                let (confident, entropy) = self.judge_the_draft_top(verifier, &at.out, token);
                // What the call may still generate beyond what has arrived.
                let more = unwritten(creq.max_tokens, got as usize + unused as usize);
                if self.refuses(token) {
                    self.stats.target_discarded_tokens += unused + 1;
                    self.end_call(&mut stream, ended, more).await;
                    // Closed first: a pick goes to the same slot, which would finish this
                    // generation before taking it.
                    drop(stream);
                    let end = self.refused_in_span(cursor, arrived.alternatives.get(i), at.out);
                    return Ok(CallEnd::Span(end.await?));
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
                    feed_arrived(cursor, &batch[i..], rule.resync.saturating_sub(at.agreeing))
                        .await?;
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
            if let Some(e) = arrived.failed {
                return Err(e.into());
            }
            if arrived.eos {
                return Ok(CallEnd::Span(self.ended_on_eos(at.out)));
            }
        }
        Ok(CallEnd::Gave(at, got))
    }

    /// Whether the draft is confident of the target's `token`, where it is the draft's own top
    /// choice there (and the draft's entropy): agreeing tokens let a span end.
    fn judge_the_draft_top(
        &mut self,
        verifier: &dyn Verifier,
        out: &PositionOutput,
        token: u32,
    ) -> (bool, Option<f32>) {
        if out.top1() == token {
            self.judge(verifier, out, token)
        } else {
            (false, None)
        }
    }

    /// The grammar refused the span's token: the target's best allowed token, when it said,
    /// is its answer here, and the draft goes on after it.
    async fn refused_in_span(
        &mut self,
        cursor: &mut Cursor<'_>,
        alternatives: Option<&Vec<(u32, f32)>>,
        out: PositionOutput,
    ) -> Result<SpanEnd, EngineError> {
        let Some(alt) = self.allowed_alternative(alternatives).await? else {
            return Ok(SpanEnd::Resume(out));
        };
        if let Some(reason) = self.emit(&[alt], Source::Target, None).await? {
            return Ok(SpanEnd::Finished(reason));
        }
        Ok(SpanEnd::Resume(cursor.commit(&[alt]).await?))
    }

    /// The span's stream ended on end-of-sequence: the answer ends there, unless the grammar
    /// refuses to end it, when the draft goes on.
    fn ended_on_eos(&mut self, out: PositionOutput) -> SpanEnd {
        if self.refuses_end() {
            SpanEnd::Resume(out)
        } else {
            SpanEnd::Finished(FinishReason::Stop)
        }
    }

    /// The tokens of a streamed chunk and of whatever else has arrived meanwhile (a fast
    /// target's backlog), so that the draft can be fed several tokens in one call, with the
    /// target's top entries at each where it gave them; whether one of them ended on
    /// end-of-sequence, and the error that broke the stream, if one did (the tokens before it
    /// are emitted first). `ended` is set when the stream ended.
    pub(super) fn take_arrived(
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
    pub(super) fn keeps_span(&mut self, end: SpanClose, max_span: u32, kept: &mut bool) -> bool {
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
    pub(super) fn upstream_is_done(&self, reason: FinishReason, received: u64, asked: u64) -> bool {
        match reason {
            FinishReason::Length => received >= asked,
            FinishReason::Stop => !self.hit_stop_sequence,
            FinishReason::Cancelled => false,
        }
    }

    /// Leaves a call's stream that is still open once its tokens are no longer wanted: read
    /// to its end when the target has nothing left to generate (`more` is 0: it gave all it
    /// was asked for, or its end-of-sequence), else closed, which stops the target.
    pub(super) async fn end_call(&mut self, stream: &mut TokenStream, ended: bool, more: u64) {
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
    /// [`crate::cost::TOKENS_IN_FLIGHT_AT_CLOSE`], measured, but never more than the call could
    /// still generate (`more`, counted from what had arrived before).
    pub(super) fn count_unread(&mut self, stream: &mut TokenStream, mut more: u64) {
        while let Some(Some(Ok(chunk))) = stream.next().now_or_never() {
            let n = chunk.tokens.len() as u64;
            self.stats.target_discarded_tokens += n;
            more = more.saturating_sub(n);
            self.absorb(chunk.cached_prompt_tokens, chunk.timings, chunk.extra_calls);
        }
        self.stats.target_inflight_tokens += crate::cost::TOKENS_IN_FLIGHT_AT_CLOSE.min(more);
    }

    /// Reads the rest of a stream that has nothing left to generate (see
    /// [`Run::upstream_is_done`]), for what its last event reports: the cached prompt tokens and
    /// the call's compute, which dropping it at once would lose. The target has nothing left
    /// to generate, so the wait is short; it is bounded all the same.
    pub(super) async fn drain_usage(&mut self, stream: &mut TokenStream) {
        let drain = async {
            while let Some(Ok(chunk)) = stream.next().await {
                self.stats.target_discarded_tokens += chunk.tokens.len() as u64;
                self.absorb(chunk.cached_prompt_tokens, chunk.timings, chunk.extra_calls);
            }
        };
        let _ = tokio::time::timeout(USAGE_DRAIN_LIMIT, drain).await;
    }
}
