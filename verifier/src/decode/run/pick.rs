//! Picks: where the grammar refused the target's token, the target chooses among the tokens
//! it allows.

use super::state::{Run, unless_client_gone};

use crate::decode::calls::CallKind;
use crate::error::EngineError;
use crate::grammar::Mask;

/// The target's top entries asked for at each token under a grammar: where it writes a token
/// the grammar refuses, the best of these the grammar allows is its answer there.
pub(super) const GRAMMAR_ALTERNATIVES: u32 = 8;

/// Most tokens a target is asked to choose among where the grammar refused its token and its
/// top entries (an enum's first tokens, a literal's); where more are allowed, the draft
/// writes the position.
pub(super) const PICK_LIMIT: usize = 256;

impl Run<'_> {
    /// What the target writes where the grammar refused its token: the best allowed of its
    /// top entries, or else its own best of the few tokens the grammar allows there. `None`
    /// leaves the position to the draft.
    pub(super) async fn allowed_alternative(
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
    pub(super) async fn target_pick(
        &mut self,
        mask: Option<&Mask>,
    ) -> Result<Option<u32>, EngineError> {
        self.pick(mask, false).await
    }

    /// As [`Run::target_pick`], where the answer may also end here: the target's pick may be
    /// its end (an end-of-sequence id, which [`Run::emit`] takes as the answer's end).
    pub(super) async fn target_pick_or_end(
        &mut self,
        mask: &Mask,
    ) -> Result<Option<u32>, EngineError> {
        self.pick(Some(mask), true).await
    }

    pub(super) async fn pick(
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
    pub(super) fn best_allowed(&mut self, alternatives: Option<&Vec<(u32, f32)>>) -> Option<u32> {
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
}
