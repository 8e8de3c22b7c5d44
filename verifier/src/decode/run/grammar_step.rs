//! The grammar's step before the draft proposes a token: tokens the grammar forces are
//! emitted, and the draft's output is masked to what it allows.

use super::state::Run;

use crate::decode::cursor::Cursor;
use crate::decode::request::{FinishReason, Source};
use crate::draft::PositionOutput;
use crate::error::EngineError;
use crate::grammar::Next;
use crate::grammar::tools::CallRepeats;

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

impl Run<'_> {
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
    pub(super) async fn emit_before_the_draft(
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

    /// Whether the grammar refuses the target's `token` here (an end-of-sequence id: ending
    /// here). A refused token ends the target's part; the draft writes the position instead.
    pub(super) fn refuses(&mut self, token: u32) -> bool {
        let refused = self.grammar.as_mut().is_some_and(|g| !g.allows(token));
        if refused {
            self.stats.grammar_refusals += 1;
            self.draft_owns_next = true;
        }
        refused
    }

    /// Whether the grammar refuses to end the answer here (the target ended its part).
    pub(super) fn refuses_end(&mut self) -> bool {
        match self.engine.eos.first() {
            Some(&eos) => self.refuses(eos),
            None => false,
        }
    }
}
