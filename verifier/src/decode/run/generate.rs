//! The decode loop: one generation, stage by stage, until its finish reason.

use super::grammar_step::GrammarStep;
use super::span::Corrected;
use super::state::Run;
use super::window::WindowEnd;

use tokio::sync::mpsc;

use crate::decode::cursor::Cursor;
use crate::decode::engine::Engine;
use crate::decode::lookup::Lookup;
use crate::decode::pacing::{RejectionWindow, WindowSize};
use crate::decode::request::{FinishReason, GenerateRequest, Source, TokenEvent, Verification};
use crate::decode::stats::Stats;
use crate::draft::Draft;
use crate::draft::PositionOutput;
use crate::error::EngineError;
use crate::sampling::Sampler;
use crate::verify::Verifier;

impl Engine {
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
            let verdict = run.verdict(verifier, &out, proposal);
            let accepted = verdict.accepted;
            let mut over_budget =
                verdict.in_window && window.as_mut().is_some_and(|w| w.push(!accepted));
            let at_call_cap = !accepted && run.next_call_is_the_last();
            if at_call_cap {
                run.stats.call_cap = true;
                over_budget = true;
            }
            let produced = if accepted {
                accepted_run += 1;
                let seen = run.record(&out, proposal, verdict.entropy);
                if let Some(reason) = run.emit(&[proposal], Source::Draft, seen).await? {
                    break reason;
                }
                vec![proposal]
            } else {
                run.note_rejection(verdict.by_verifier, &mut accepted_run);
                let rejected = Rejected {
                    out,
                    proposal,
                    over_budget,
                    at_call_cap,
                };
                match run
                    .after_rejection(&mut cursor, verifier, &mut sampler, &mut sizes, rejected)
                    .await?
                {
                    Corrected::Produced(tokens) => tokens,
                    // The draft already followed the window or the correction: its output is
                    // current.
                    Corrected::Resume(next) => {
                        out = next;
                        continue;
                    }
                    Corrected::Finished(reason) => break reason,
                }
            };
            if let Some(l) = &mut lookup {
                feed_lookup(l, run.emitted(), &mut cursor, &produced).await?;
            }
            out = cursor.commit(&produced).await?;
        };
        if accepted_run > 0 {
            run.stats.accepted_runs.push(accepted_run);
        }
        run.count_cursor(&cursor);
        run.finish(result).await
    }
}

/// A draft token the verdict rejected, and what the bail-out budget and the call cap say.
struct Rejected {
    /// The draft's output where it was proposed.
    out: PositionOutput,
    /// The token.
    proposal: u32,
    /// Rejections are over the bail-out budget (or the call cap is reached): the target
    /// writes the rest.
    over_budget: bool,
    /// The next call is the last one allowed.
    at_call_cap: bool,
}

/// Feeds the lookup's proposals after `produced` to the draft in one pass, where the cursor
/// holds no guesses of overlap's already.
async fn feed_lookup(
    l: &mut Lookup,
    emitted: &[u32],
    cursor: &mut Cursor<'_>,
    produced: &[u32],
) -> Result<(), EngineError> {
    l.catch_up(emitted);
    let proposed = l.propose();
    if !proposed.is_empty() && cursor.is_clear() {
        let fed = [produced, proposed].concat();
        cursor.feed(&fed, proposed.len()).await?;
    }
    Ok(())
}

impl Run<'_> {
    /// Counts a rejection: the verifier's, where it made it, and the run of accepted draft
    /// tokens it ends.
    fn note_rejection(&mut self, by_verifier: bool, accepted_run: &mut u32) {
        if by_verifier {
            self.stats.verifier_rejections += 1;
        }
        if *accepted_run > 0 {
            self.stats.accepted_runs.push(std::mem::take(accepted_run));
        }
    }

    /// After a rejection: a window where the verification scores them and the budget allows,
    /// else (or where the target scores none) a correction.
    async fn after_rejection(
        &mut self,
        cursor: &mut Cursor<'_>,
        verifier: &dyn Verifier,
        sampler: &mut Sampler,
        sizes: &mut WindowSize,
        r: Rejected,
    ) -> Result<Corrected, EngineError> {
        let mut out = r.out;
        if self.req.settings.verification != Verification::Approximate
            && !self.windows_unsupported
            && !r.over_budget
        {
            let k = sizes.k().min(self.remaining());
            match self
                .window(cursor, verifier, out, r.proposal, k, sampler)
                .await?
            {
                WindowEnd::Resume { next, accepted } => {
                    sizes.update(accepted, k as usize);
                    return Ok(Corrected::Resume(next));
                }
                WindowEnd::Finished(reason) => return Ok(Corrected::Finished(reason)),
                // The target scores no windows: corrections from here on.
                WindowEnd::Unsupported(back) => out = back,
            }
        }
        self.correct(cursor, verifier, out, r.over_budget, r.at_call_cap)
            .await
    }

    /// What the draft's cursor did: its time, overlap's guesses and the lookup's tokens.
    fn count_cursor(&mut self, cursor: &Cursor<'_>) {
        self.stats.draft_time += cursor.time;
        self.stats.overlap_guesses = cursor.guessed;
        self.stats.overlap_guesses_used = cursor.guesses_used;
        self.stats.lookup_tokens = cursor.looked_up;
        self.stats.lookup_tokens_used = cursor.looked_up_used;
    }
}
