//! Target calls and their account: the request, the cache the call reads, the cost guard,
//! and the time waited.

use super::pick::GRAMMAR_ALTERNATIVES;
use super::state::{Run, unless_client_gone};
use std::future::Future;

use crate::cost::{CallPlan, GuardReason};
use crate::decode::calls::{CallKind, CallRecord};
use crate::decode::cursor::Cursor;
use crate::decode::request::{FinishReason, Source};
use crate::draft::PositionOutput;
use crate::error::{EngineError, TargetError};
use crate::targets::{ContinuationRequest, TargetTimings};

impl Run<'_> {
    /// The exact prefix for the next call (prompt and everything emitted), with that call
    /// counted in the stats; after the warm, if one is still out.
    pub(super) async fn next_call(&mut self, kind: CallKind, n: u32) -> ContinuationRequest {
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
    pub(super) fn request(&self, prefix: Vec<u32>, max_tokens: u32) -> ContinuationRequest {
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

    /// Counts a call that sends `sent` tokens, `cacheable` of which the cache can serve.
    pub(super) fn count_call(&mut self, kind: CallKind, sent: u64, cacheable: u64) {
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
    pub(super) fn absorb(
        &mut self,
        cached: Option<u32>,
        timings: Option<TargetTimings>,
        extra_calls: u32,
    ) {
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
    pub(super) fn prefix(&self) -> Vec<u32> {
        [self.req.prompt.as_slice(), self.emitted.as_slice()].concat()
    }

    /// Whether a call reads the target's prompt cache: a window call (`window`) to a target
    /// whose window calls do not, does not.
    pub(super) fn reads_cache(&self, window: bool) -> bool {
        !window || self.engine.target.windows_read_cache()
    }

    /// Of a call's `prefix` tokens, those the target's prompt cache can serve: what the
    /// previous call sent or received, as the cache rules serve it, where the call reads the
    /// cache at all.
    pub(super) fn cacheable_prefix(&self, prefix: u64, window: bool) -> u64 {
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
    pub(super) async fn wait<T>(
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
}
