//! The cheapest call plan for an answer whose target-written positions are known: what no
//! engine of this shape can beat, whatever its verifier, span ends or windows.
//!
//! The shape is the one every continuation API imposes: a call re-sends the whole prefix
//! (prompt and answer so far) and the target generates a span of tokens from there. A plan is
//! a set of calls, each starting at a position the target must write and generating any
//! number of tokens; positions outside every span are the draft's and are free until a later
//! call sends them as input. Costs are the most generous to approxy: everything a previous
//! call sent or generated is read from the cache, a span is stopped exactly where the plan
//! wants (no tokens in flight), and tokens after the last call are never sent.
//!
//! A span never starts before the position that needs it: tokens before it would be paid as
//! output instead of as input, and no price class prices input above output.

/// Per-token prices of one cost class (any unit: USD per million tokens, or milliseconds of
/// target time).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Rates {
    /// A prompt token the target has not seen.
    pub input: f64,
    /// A prompt token read from its cache.
    pub cached_input: f64,
    /// A generated token.
    pub output: f64,
}

impl Rates {
    /// What passthrough pays for `prompt` tokens in and `answer` tokens out.
    pub fn passthrough(&self, prompt: usize, answer: usize) -> f64 {
        prompt as f64 * self.input + answer as f64 * self.output
    }
}

/// The least any plan pays for an answer of `len` tokens after a `prompt`-token prompt whose
/// positions `target_at` (ascending, each below `len`) the target must write.
pub fn cheapest(prompt: usize, len: usize, target_at: &[usize], r: &Rates) -> f64 {
    debug_assert!(target_at.windows(2).all(|w| w[0] < w[1]));
    debug_assert!(target_at.last().is_none_or(|&t| t < len));
    // best[e]: the least paid with the last span ending at e (exclusive) and every target
    // position below e covered; best[len + 1] stands for "no call yet".
    let none_yet = len + 1;
    let mut best = vec![f64::INFINITY; len + 2];
    best[none_yet] = 0.0;
    let mut answer = f64::INFINITY;
    // States in order of the position they stand at (no call yet stands at 0).
    for state in std::iter::once(none_yet).chain(1..=len) {
        let paid = best[state];
        if !paid.is_finite() {
            continue;
        }
        let at = if state == none_yet { 0 } else { state };
        let Some(&t) = target_at.iter().find(|&&t| t >= at) else {
            answer = answer.min(paid);
            continue;
        };
        let sent = if state == none_yet {
            (prompt + t) as f64 * r.input
        } else {
            (prompt + at) as f64 * r.cached_input + (t - at) as f64 * r.input
        };
        for (n, slot) in best[t + 1..=len].iter_mut().enumerate() {
            // A span of n + 1 tokens, ending at t + n + 1.
            let c = paid + sent + (n + 1) as f64 * r.output;
            if c < *slot {
                *slot = c;
            }
        }
    }
    answer
}

#[cfg(test)]
mod tests {
    use super::*;

    const R: Rates = Rates {
        input: 1.0,
        cached_input: 0.1,
        output: 3.0,
    };

    /// Every plan enumerated: a span may start anywhere from the last one's end up to the next
    /// target position (so the rule that it starts at that position is checked, not assumed)
    /// and end anywhere up to the answer's end.
    fn brute(prompt: usize, len: usize, target_at: &[usize], r: &Rates) -> f64 {
        fn go(
            prompt: usize,
            len: usize,
            target_at: &[usize],
            r: &Rates,
            last_end: Option<usize>,
            paid: f64,
        ) -> f64 {
            let from = last_end.unwrap_or(0);
            let Some(&t) = target_at.iter().find(|&&t| t >= from) else {
                return paid;
            };
            (from..=t)
                .flat_map(|s| (t + 1..=len).map(move |end| (s, end)))
                .map(|(s, end)| {
                    let sent = match last_end {
                        None => (prompt + s) as f64 * r.input,
                        Some(e) => (prompt + e) as f64 * r.cached_input + (s - e) as f64 * r.input,
                    };
                    go(
                        prompt,
                        len,
                        target_at,
                        r,
                        Some(end),
                        paid + sent + (end - s) as f64 * r.output,
                    )
                })
                .fold(f64::INFINITY, f64::min)
        }
        go(prompt, len, target_at, r, None, 0.0)
    }

    #[test]
    fn worked_cases() {
        // No target position: the draft writes everything and nothing is sent.
        assert_eq!(cheapest(10, 5, &[], &R), 0.0);
        // Every position the target's: one call generating the whole answer is passthrough.
        assert_eq!(cheapest(10, 4, &[0, 1, 2, 3], &R), R.passthrough(10, 4));
        // One position at 3: send 10 + 3 tokens, generate one; the last token is the draft's.
        assert_eq!(cheapest(10, 5, &[3], &R), 13.0 + 3.0);
        // Positions 1 and 3: two calls (11 + 3, then 12 cached + 1 new + 3 = 5.2) cost 19.2;
        // one span over 1..=3 costs 11 + 9 = 20.
        assert!((cheapest(10, 5, &[1, 3], &R) - 19.2).abs() < 1e-9);
        // With the cache dear, the span is cheaper.
        let dear = Rates {
            cached_input: 1.0,
            ..R
        };
        assert!((cheapest(10, 5, &[1, 3], &dear) - 20.0).abs() < 1e-9);
    }

    #[test]
    fn the_least_over_every_plan() {
        // Small answers, every subset of target positions, three price shapes.
        let classes = [
            R,
            Rates {
                input: 0.56,
                cached_input: 0.07,
                output: 1.68,
            },
            Rates {
                input: 0.9,
                cached_input: 0.45,
                output: 0.9,
            },
        ];
        for r in &classes {
            for len in 1..=7usize {
                for mask in 0u32..(1 << len) {
                    let at: Vec<usize> = (0..len).filter(|i| mask & (1 << i) != 0).collect();
                    for prompt in [0, 5, 40] {
                        let (a, b) = (cheapest(prompt, len, &at, r), brute(prompt, len, &at, r));
                        assert!((a - b).abs() < 1e-9, "{prompt} {len} {at:?}: {a} vs {b}");
                        // Never dearer than passthrough generating the same answer.
                        assert!(a <= r.passthrough(prompt, len) + 1e-9);
                    }
                }
            }
        }
    }
}
