//! The verdict on one draft token: the verifier's judgement, the threshold it meets, and the
//! loop watch that overrules it.

use super::state::Run;
use std::time::Instant;

use crate::draft::PositionOutput;
use crate::grammar::Place;
use crate::verify::{Verifier, decide};

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

impl Run<'_> {
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
    pub(super) fn threshold_for(&self, token: u32) -> f32 {
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
}
