//! Runaway loops in the answer. A draft caught in a repetition loop is at its most confident,
//! so a confidence verifier never asks the target whether it would stop: asked for a lowercase
//! water cycle in under 100 words, the draft wrote "evaporation, condensation, precipitation,
//! collection, runoff, drainage," until `max_tokens` where the target alone stops during its
//! second pass. Asking the target once the loop is plain comes too late: after two passes a
//! target reads the loop in its own context and goes on with it. So while the answer copies a
//! stretch of [`COPIED`] tokens or more of its own earlier text, each draft token goes to the
//! target as if rejected (a window, a span or a hand-off, as the policy corrects), and the
//! target writes the copy for as long as it goes on: where the target would leave the loop,
//! the answer does. A draft that runs [`LONGEST_UNHEARD`] tokens with no say of the target's is
//! put to it too, loop or not.

/// Fewest tokens in a row, repeated from earlier in the answer, that make it a copy.
pub const COPIED: usize = 10;

/// Most recent tokens of the answer searched for the copy's source.
pub const HISTORY: usize = 1024;

/// Most draft tokens in a row with no say of the target's: past it the next one is the
/// target's to judge, loop or not.
pub const LONGEST_UNHEARD: usize = 256;

/// The answer's recent tokens and the draft's run since the target's last say.
#[derive(Debug, Default)]
pub struct LoopWatch {
    recent: Vec<u32>,
    unheard: usize,
}

impl LoopWatch {
    /// A token of the draft's went out unjudged by the target.
    pub fn draft(&mut self, token: u32) {
        self.push(token);
        self.unheard += 1;
    }

    /// A token of the target's went out.
    pub fn target(&mut self, token: u32) {
        self.push(token);
        self.heard();
    }

    /// The target had its say (a window it scored, a call).
    pub fn heard(&mut self) {
        self.unheard = 0;
    }

    fn push(&mut self, token: u32) {
        if self.recent.len() == 2 * HISTORY {
            self.recent.drain(..HISTORY);
        }
        self.recent.push(token);
    }

    /// Whether the next draft token is the target's to judge: the answer is copying its own
    /// earlier text, or the draft has run too long unheard.
    pub fn runaway(&self) -> bool {
        self.unheard >= LONGEST_UNHEARD || self.copying()
    }

    /// Whether the answer's last [`COPIED`] tokens came before, within [`HISTORY`].
    fn copying(&self) -> bool {
        let t = &self.recent;
        if t.len() <= COPIED {
            return false;
        }
        let tail = &t[t.len() - COPIED..];
        let from = t.len().saturating_sub(HISTORY);
        t[from..t.len() - 1].windows(COPIED).any(|w| w == tail)
    }
}

#[cfg(test)]
mod loop_tests;

#[cfg(test)]
mod tests {
    use super::*;

    fn watched(tokens: &[u32]) -> LoopWatch {
        let mut w = LoopWatch::default();
        tokens.iter().for_each(|&t| w.draft(t));
        w
    }

    #[test]
    fn an_answer_that_copies_its_own_stretch_is_a_loop_while_it_copies() {
        let twelve: Vec<u32> = (1..=12).collect();
        let mut answer = [&[99, 98][..], &twelve, &twelve[..COPIED - 1]].concat();
        assert!(!watched(&answer).runaway(), "a copy one token short");
        answer.push(twelve[COPIED - 1]);
        assert!(watched(&answer).runaway());
        // Each token that goes on copying keeps it so, whoever wrote it.
        let mut w = watched(&answer);
        w.target(twelve[COPIED]);
        assert!(w.runaway());
        // A token that leaves the copy ends it.
        w.target(500);
        assert!(!w.runaway());
        // Repeats under the copy's length are text (`----`, `0, 0, 0`).
        assert!(!watched(&[7; COPIED]).runaway());
        assert!(watched(&[7; COPIED + 1]).runaway());
    }

    #[test]
    fn a_long_unheard_run_is_the_targets_to_judge_loop_or_not() {
        let varied: Vec<u32> = (0..LONGEST_UNHEARD as u32).collect();
        assert!(!watched(&varied[..LONGEST_UNHEARD - 1]).runaway());
        let mut w = watched(&varied);
        assert!(w.runaway());
        w.heard();
        assert!(!w.runaway());
    }
}
