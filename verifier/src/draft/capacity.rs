//! How many streams a draft worker can take: its measured step times per batch width, and the
//! admission rule on them. A worker that would draft each of its streams slower than the
//! policy's floor once one more joins takes no more: the request passes through at once
//! (`draft_saturated`), as one that finds every worker full does. A width is the rows a step
//! ran: the streams in the batch, not those parked. A stream waiting on the target is parked,
//! so fewer streams step together than a worker holds: admission prices the width that the
//! measured share of them would step at with one more.

use std::time::Duration;

/// Widths measured: 1 to this many rows (the most streams a worker may take).
const WIDTHS: usize = 64;

/// The widest batch a worker's probe steps: wider ones are priced from it, as a whole step a
/// row, until their own steps measure them.
pub const PROBE_WIDEST: usize = 16;

/// Weight of the newest step in the running mean.
const ALPHA: f64 = 0.2;

/// What the time-weighted share of streams stepping keeps of its past at each step: about the
/// last 50 steps count.
const SHARE_DECAY: f64 = 0.98;

/// Mean step time per batch width, in milliseconds, for steps of one token a row (the decode
/// steps that set a stream's speed).
#[derive(Debug, Clone)]
pub struct StepTimes {
    ms: [Option<f64>; WIDTHS],
    /// Running sums of the steps' time, and of their time times the share of the worker's
    /// streams each ran (see [`StepTimes::record_share`]).
    time: f64,
    shared_time: f64,
}

impl Default for StepTimes {
    fn default() -> Self {
        Self {
            ms: [None; WIDTHS],
            time: 0.0,
            shared_time: 0.0,
        }
    }
}

impl StepTimes {
    /// Records one step of `width` rows that took `took`.
    pub fn record(&mut self, width: usize, took: Duration) {
        let Some(slot) = self.ms.get_mut(width.max(1) - 1) else {
            return;
        };
        let ms = took.as_secs_f64() * 1e3;
        *slot = Some(slot.map_or(ms, |m| m + ALPHA * (ms - m)));
    }

    /// Records that a step of `took` ran `width` rows while the worker held `live` streams
    /// (the others parked, waiting on the target). Weighted by time, as a stream drafting
    /// spends its time in the steps, and the wide ones take longest.
    pub fn record_share(&mut self, width: usize, live: usize, took: Duration) {
        if live == 0 {
            return;
        }
        let ms = took.as_secs_f64() * 1e3;
        let share = (width as f64 / live as f64).min(1.0);
        self.time = SHARE_DECAY * self.time + ms;
        self.shared_time = SHARE_DECAY * self.shared_time + ms * share;
    }

    /// The rows a step would run with `streams` held: the measured share of them, at least
    /// one; all of them before any step is measured.
    pub fn width_with(&self, streams: usize) -> usize {
        let share = if self.time > 0.0 {
            self.shared_time / self.time
        } else {
            1.0
        };
        ((share * streams as f64).ceil() as usize).clamp(1, streams.max(1))
    }

    /// The mean step time at `width` rows: measured; between two measured widths, on the line
    /// through them (a row adds its attention and its share of the products, about the same
    /// for each row); beyond the widest measured, as if each row cost as much as a whole step
    /// there (the most it can cost, since the weights are read once a step whatever the
    /// width). `None` when nothing is measured yet.
    pub fn predict(&self, width: usize) -> Option<f64> {
        let at = width.max(1) - 1;
        if let Some(Some(ms)) = self.ms.get(at) {
            return Some(*ms);
        }
        let below = (0..at.min(WIDTHS))
            .rev()
            .find_map(|i| self.ms[i].map(|ms| (i, ms)))?;
        let above = (at + 1..WIDTHS).find_map(|i| self.ms[i].map(|ms| (i, ms)));
        let (i, lo) = below;
        Some(match above {
            Some((j, hi)) => lo + (hi - lo) * (at - i) as f64 / (j - i) as f64,
            None => lo * (at + 1) as f64 / (i + 1) as f64,
        })
    }

    /// Each stream's draft speed, tokens a second, with `live` streams stepping together.
    pub fn speed(&self, live: usize) -> Option<f64> {
        self.predict(live).map(|ms| 1e3 / ms.max(1e-3))
    }

    /// Widths a worker measures before it takes its first stream (see the pool's probe):
    /// one row, then doubling, up to `streams` and at most [`PROBE_WIDEST`].
    pub fn probe_widths(streams: usize) -> Vec<usize> {
        let most = streams.clamp(1, PROBE_WIDEST);
        let mut widths: Vec<usize> = std::iter::successors(Some(1usize), |w| Some(w * 2))
            .take_while(|&w| w < most)
            .collect();
        widths.push(most);
        widths
    }

    /// Whether one more stream may join `live` ones without any of them drafting slower than
    /// `floor` tokens a second, at the width the measured share of them would step at (a
    /// floor of 0 admits up to the stream limit; an unmeasured width is admitted, and its
    /// first steps measure it).
    pub fn admits(&self, live: usize, floor: f64) -> bool {
        floor <= 0.0
            || self
                .speed(self.width_with(live + 1))
                .is_none_or(|s| s >= floor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_width_is_measured_as_a_running_mean() {
        let mut t = StepTimes::default();
        t.record(4, ms(100));
        assert_eq!(t.predict(4), Some(100.0));
        t.record(4, ms(200));
        assert_eq!(t.predict(4), Some(120.0));
    }

    #[test]
    fn an_unmeasured_width_is_priced_at_a_whole_step_a_row() {
        let mut t = StepTimes::default();
        assert_eq!(t.predict(2), None);
        t.record(1, ms(25));
        assert_eq!(t.predict(4), Some(100.0));
        t.record(2, ms(30));
        assert_eq!(t.predict(3), Some(45.0));
        assert_eq!(t.predict(8), Some(120.0));
    }

    #[test]
    fn a_width_between_two_measured_is_on_their_line() {
        let mut t = StepTimes::default();
        t.record(1, ms(30));
        t.record(4, ms(60));
        t.record(8, ms(100));
        assert_eq!(t.predict(2), Some(40.0));
        assert_eq!(t.predict(6), Some(80.0));
        // Beyond the widest measured: a whole step a row.
        assert_eq!(t.predict(16), Some(200.0));
    }

    #[test]
    fn the_probe_doubles_up_to_the_stream_limit() {
        assert_eq!(StepTimes::probe_widths(1), vec![1]);
        assert_eq!(StepTimes::probe_widths(8), vec![1, 2, 4, 8]);
        assert_eq!(StepTimes::probe_widths(6), vec![1, 2, 4, 6]);
        assert_eq!(StepTimes::probe_widths(64), vec![1, 2, 4, 8, 16]);
    }

    #[test]
    fn admission_keeps_every_stream_above_the_floor() {
        let mut t = StepTimes::default();
        // Nothing known: admitted (the first steps measure it).
        assert!(t.admits(0, 20.0));
        t.record(1, ms(25));
        t.record(2, ms(30));
        t.record(4, ms(40));
        t.record(5, ms(80));
        // A fifth stream: 12.5 tokens/s each.
        assert!(t.admits(3, 20.0));
        assert!(!t.admits(4, 20.0));
        assert!(t.admits(4, 12.0));
        // No floor: only the stream limit counts.
        assert!(t.admits(100, 0.0));
    }

    #[test]
    fn admission_prices_the_share_of_streams_that_step_together() {
        let mut t = StepTimes::default();
        t.record(1, ms(25));
        t.record(2, ms(30));
        t.record(4, ms(40));
        t.record(5, ms(80));
        assert_eq!(t.width_with(5), 5, "nothing measured: every stream steps");
        // Four streams held, two in each step: the others wait on the target.
        for _ in 0..200 {
            t.record_share(2, 4, ms(30));
        }
        assert_eq!(t.width_with(5), 3);
        assert!(
            t.admits(4, 20.0),
            "a fifth stream steps at 3 rows: 29 tokens/s"
        );
        // They come back: every held stream steps, and the fifth is refused again.
        for _ in 0..200 {
            t.record_share(4, 4, ms(40));
        }
        assert_eq!(t.width_with(5), 5);
        assert!(!t.admits(4, 20.0));
    }

    #[test]
    fn the_share_is_weighted_by_the_steps_time() {
        let mut t = StepTimes::default();
        // One stream alone in short steps as often as four together in long ones: a stream
        // drafting spends most of its time in the wide steps.
        for _ in 0..100 {
            t.record_share(1, 4, ms(10));
            t.record_share(4, 4, ms(90));
        }
        assert_eq!(t.width_with(8), 8, "share 0.925 of 8 rounds up");
        assert_eq!(t.width_with(4), 4);
        t.record_share(3, 0, ms(50));
        assert_eq!(
            t.width_with(4),
            4,
            "a step with no streams held says nothing"
        );
    }
}
