//! Which streams a draft worker waits for after a step, and how long. A stream left out of a
//! step loses a whole step and its row runs filler, so the worker waits for the streams of its
//! last step, up to a row's share of the step. But a stream that is being fed the target's
//! tokens (a span) asks at the target's pace, a token every hundred milliseconds or more:
//! waiting for it would hold the batch on every step it joins. So a stream that last came back
//! later than the wait is not waited for until it comes back in time again.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use super::batch::SeqId;

/// The least a worker waits, after a step, for the streams of that step to ask again.
pub const GATHER: Duration = Duration::from_millis(2);

/// The streams' pace as the worker has seen it.
#[derive(Debug, Default)]
pub(crate) struct Gather {
    /// When the worker last answered each stream of a step, not yet asked again.
    answered: HashMap<SeqId, Instant>,
    /// Streams whose last ask came later than the wait after their answer.
    slow: HashSet<SeqId>,
    /// The wait after the last step.
    wait: Duration,
}

impl Gather {
    /// The wait after a step of `width` rows whose measured mean time is `step_ms`: a row's
    /// share of the step, at least [`GATHER`]. Stepping without a late stream costs the batch
    /// about that share (its row runs filler) and the stream a whole step; waiting that long
    /// for it costs the batch no more.
    pub(crate) fn wait_after(step_ms: Option<f64>, width: usize) -> Duration {
        step_ms.map_or(GATHER, |ms| {
            GATHER.max(Duration::from_secs_f64(ms / 1e3 / width.max(1) as f64))
        })
    }

    /// A step's answers went to `seqs` at `at`; the worker waits `wait` for them.
    pub(crate) fn answered(&mut self, seqs: &[SeqId], at: Instant, wait: Duration) {
        self.wait = wait;
        for &s in seqs {
            self.answered.insert(s, at);
        }
    }

    /// The wait after the last step.
    pub(crate) fn wait(&self) -> Duration {
        self.wait
    }

    /// `seq` asked again at `at` (the time its call was made, not when the worker saw it): it
    /// kept pace when that was within the wait after its answer.
    pub(crate) fn asked(&mut self, seq: SeqId, at: Instant) {
        if let Some(t) = self.answered.remove(&seq) {
            if at.saturating_duration_since(t) > self.wait {
                self.slow.insert(seq);
            } else {
                self.slow.remove(&seq);
            }
        }
    }

    /// Whether the worker waits for `seq`, a stream of its last step.
    pub(crate) fn waits_for(&self, seq: SeqId) -> bool {
        !self.slow.contains(&seq)
    }

    /// Forgets the streams that `holds` no longer holds.
    pub(crate) fn keep(&mut self, holds: impl Fn(SeqId) -> bool) {
        self.answered.retain(|s, _| holds(*s));
        self.slow.retain(|s| holds(*s));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn the_wait_is_a_rows_share_of_the_step_and_at_least_the_least() {
        assert_eq!(Gather::wait_after(Some(80.0), 8), 10 * MS);
        assert_eq!(Gather::wait_after(Some(8.0), 8), GATHER);
        assert_eq!(Gather::wait_after(None, 4), GATHER);
    }

    #[test]
    fn a_stream_late_back_is_not_waited_for_until_it_keeps_pace_again() {
        let mut g = Gather::default();
        let t0 = Instant::now();
        g.answered(&[1, 2], t0, 10 * MS);
        // Stream 1 decodes on; stream 2 is fed a target token 150 ms later.
        g.asked(1, t0 + 3 * MS);
        g.asked(2, t0 + 150 * MS);
        assert!(g.waits_for(1));
        assert!(!g.waits_for(2));
        // Its next ask, made 1 ms after its answer, counts by when it was made, though the
        // worker may see it only after a step.
        let t1 = t0 + 160 * MS;
        g.answered(&[2], t1, 10 * MS);
        g.asked(2, t1 + MS);
        assert!(g.waits_for(2));
        // An ask with no answer before it (a prefill's stream, a second call) changes nothing.
        g.asked(2, t1 + 500 * MS);
        assert!(g.waits_for(2));
    }

    #[test]
    fn streams_gone_are_forgotten() {
        let mut g = Gather::default();
        let t0 = Instant::now();
        g.answered(&[1, 2], t0, 10 * MS);
        g.asked(2, t0 + 100 * MS);
        g.answered(&[1], t0 + 120 * MS, 10 * MS);
        g.keep(|s| s != 1 && s != 2);
        assert!(g.answered.is_empty() && g.slow.is_empty());
    }
}
