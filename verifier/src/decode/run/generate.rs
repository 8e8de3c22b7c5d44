//! The decode loop: one generation, stage by stage, until its finish reason.

use super::grammar_step::GrammarStep;
use super::span::Corrected;
use super::state::Run;
use super::verdict::Verdict;
use super::window::WindowEnd;

use tokio::sync::mpsc;

use crate::decode::cursor::Cursor;
use crate::decode::engine::Engine;
use crate::decode::lookup::Lookup;
use crate::decode::pacing::{RejectionWindow, WindowSize};
use crate::decode::request::{FinishReason, GenerateRequest, Source, TokenEvent, Verification};
use crate::decode::stats::Stats;
use crate::draft::Draft;
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
