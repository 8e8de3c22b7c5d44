//! Windows: the draft runs ahead, the target scores the run in one pass on its cached
//! prefix, and its own probabilities decide how much of it stands.

use super::hand_off::HandOff;
use super::state::Run;

use crate::cost::GuardReason;
use crate::decode::calls::CallKind;
use crate::decode::cursor::Cursor;
use crate::decode::cursor::OVERLAP_MAX_AHEAD;
use crate::decode::engine::TIE_MARGIN;
use crate::decode::request::{FinishReason, Source, Verification};
use crate::draft::PositionOutput;
use crate::error::{EngineError, TargetError};
use crate::sampling::{Sampler, SamplingParams, nucleus, prob_of, residual};
use crate::targets::{WindowRequest, WindowScore};
use crate::verify::{AcceptanceRule, Features, Record, TargetProbs, Verifier, decide};

/// The target's top log-probabilities a relaxed window asks for at each position (as label
/// collection and the oracle study use).
pub(super) const RELAXED_TOP_LOGPROBS: u32 = 20;

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
pub(super) struct DraftedWindow {
    /// Its tokens, the proposed one first.
    pub(super) tokens: Vec<u32>,
    /// The distribution each was drawn from (sampled decoding only).
    pub(super) drawn_from: Vec<Vec<(u32, f32)>>,
    /// The draft's probability of each (greedy, under a rule that reads it).
    pub(super) draft_probs: Vec<f32>,
}

/// A window's scores as many as its tokens ask for: a top token at each position and one
/// after, and log-probabilities at each position when they were asked for.
pub(super) fn check_scores(
    score: &WindowScore,
    window: usize,
    logprobs: bool,
) -> Result<(), EngineError> {
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

impl Run<'_> {
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
            return self.hand_off_instead(reason).await;
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
            self.accept_greedy_judged(cursor, &start, &drafted, &score, rule, verifier)?
        };
        self.stats.window_accepted += accepted as u64;
        self.emit_window(cursor, &start, window, accepted, own)
            .await
    }

    /// The cost guard handed the rest of the answer to the target instead of this window.
    async fn hand_off_instead(&mut self, reason: GuardReason) -> Result<WindowEnd, EngineError> {
        self.stats.cost_guard = true;
        self.stats.cost_guard_reason = Some(reason);
        match self.hand_off().await? {
            HandOff::Finished(reason) => Ok(WindowEnd::Finished(reason)),
            // Windows are off under a grammar, the one thing that refuses.
            HandOff::Refused(_) => Err(EngineError::Grammar(
                "a grammar refused a token of a window's hand-off".into(),
            )),
        }
    }

    /// A greedy window's accepted tokens and the target's own after them; under judged
    /// verification the verifier first keeps the draft tokens it finds harmless.
    fn accept_greedy_judged(
        &mut self,
        cursor: &mut Cursor<'_>,
        start: &PositionOutput,
        drafted: &DraftedWindow,
        score: &WindowScore,
        rule: Option<AcceptanceRule>,
        verifier: &dyn Verifier,
    ) -> Result<(usize, u32), EngineError> {
        let window = &drafted.tokens;
        let kept = if self.req.settings.verification == Verification::Judged {
            self.harmless(cursor, start, window, &score.top, verifier)?
        } else {
            Vec::new()
        };
        Ok(self.accept_greedy(window, score, rule, &drafted.draft_probs, &kept))
    }

    /// Counts a window's call, `sent` prompt tokens of which the cache rules say `cacheable`
    /// could be served, with what the target reported of its cache.
    pub(super) fn count_window(&mut self, score: &WindowScore, sent: u64, cacheable: u64) {
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
    pub(super) async fn draft_window(
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
    pub(super) fn harmless(
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
    pub(super) fn accept_greedy(
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
    pub(super) async fn emit_window(
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
    pub(super) fn window_sampling(&self) -> SamplingParams {
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
    pub(super) fn accept_sampled(
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
}
