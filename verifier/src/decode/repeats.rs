//! Runaway loops in the draft's own text. A draft caught in a repetition loop is at its most
//! confident, so a confidence verifier never asks the target whether it would stop: asked for
//! a lowercase water cycle in under 100 words, the draft wrote "evaporation, condensation,
//! precipitation, collection, runoff, drainage," until `max_tokens` where the target alone
//! stops after its second pass. The watch sees the draft's tokens since the target last had a
//! say; when they end in the same stretch said [`TIMES`] times over, or run longer than
//! [`LONGEST_UNHEARD`], the loop's next draft token goes to the target as if rejected (a window,
//! a span or a hand-off, as the policy corrects), which ends the loop where the target would.
//! Twice, not three times: a target asked after a third pass reads a loop in its own context
//! and goes on with it, where after the second it still stops (tests/README.md, "Runaway
//! loops").

/// Times a stretch must come in a row to be a loop.
pub const TIMES: usize = 2;

/// Longest stretch (in tokens) watched for repeats.
pub const LONGEST_STRETCH: usize = 48;

/// Fewest tokens a loop spans: shorter repeats (`----`, `0, 0, 0`) are text, not a runaway.
pub const SHORTEST_LOOP: usize = 12;

/// Most draft tokens in a row with no say of the target's: past it the next one is the
/// target's to judge, loop or not.
pub const LONGEST_UNHEARD: usize = 256;

/// The draft's tokens since the target's last say.
#[derive(Debug, Default)]
pub struct LoopWatch {
    unheard: Vec<u32>,
}

impl LoopWatch {
    /// The draft's token went out unjudged by the target.
    pub fn draft(&mut self, token: u32) {
        self.unheard.push(token);
    }

    /// The target had its say (a token of its own, a window, a pick).
    pub fn heard(&mut self) {
        self.unheard.clear();
    }

    /// Whether the draft's run since the target's last say is a loop, or too long unheard.
    pub fn runaway(&self) -> bool {
        self.unheard.len() >= LONGEST_UNHEARD || self.looping()
    }

    /// Whether the run ends in one stretch [`TIMES`] in a row, spanning [`SHORTEST_LOOP`] or
    /// more tokens.
    fn looping(&self) -> bool {
        let t = &self.unheard;
        (1..=LONGEST_STRETCH).any(|period| {
            let span = period * TIMES;
            span >= SHORTEST_LOOP
                && span <= t.len()
                && t[t.len() - span..]
                    .iter()
                    .zip(&t[t.len() - span + period..])
                    .all(|(a, b)| a == b)
        })
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
    fn a_stretch_said_twice_is_a_loop_and_a_short_one_is_not() {
        let six: Vec<u32> = (1..=6).collect();
        let twice: Vec<u32> = [&[99, 98][..], &six, &six].concat();
        assert!(watched(&twice).runaway());
        assert!(
            !watched(&twice[..twice.len() - 1]).runaway(),
            "one and most of a second"
        );
        // `----` and `0, 0, 0`: repeats under the shortest loop are text.
        assert!(!watched(&[7; SHORTEST_LOOP - 1]).runaway());
        assert!(watched(&[7; SHORTEST_LOOP]).runaway());
        // Once the target has had its say, the count starts again.
        let mut w = watched(&twice);
        w.heard();
        assert!(!w.runaway());
        w.draft(1);
        assert!(!w.runaway());
    }

    #[test]
    fn a_long_unheard_run_is_the_targets_to_judge_loop_or_not() {
        let varied: Vec<u32> = (0..LONGEST_UNHEARD as u32).collect();
        assert!(!watched(&varied[..LONGEST_UNHEARD - 1]).runaway());
        assert!(watched(&varied).runaway());
    }
}
