//! Stop sequences over streamed text. Text that could still turn into a stop sequence is
//! held back, so a client never sees the first half of a stop string.
//!
//! The held text never grows past the longest stop string plus one delta, and all stop strings
//! are searched in one Aho-Corasick pass over it, so the work per delta is bounded whatever the
//! client sent (the request validator also caps their number and length; stop strings added
//! mid-answer, a tool answer's calls, are capped where they are made, `grammar::tools`).

use aho_corasick::{AhoCorasick, MatchKind};

/// Tracks emitted text against a set of stop strings.
#[derive(Debug, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    /// `None` when there are no stop strings.
    automaton: Option<AhoCorasick>,
    held: String,
}

/// What to do with a piece of text.
#[derive(Debug, PartialEq, Eq)]
pub enum StopResult {
    /// Emit this text (possibly empty) and go on.
    Continue(String),
    /// Emit this text, then stop: a stop sequence was hit.
    Stop(String),
}

impl StopMatcher {
    /// A matcher for these stop strings (empty ones are ignored).
    pub fn new(stops: Vec<String>) -> Self {
        let stops: Vec<String> = stops.into_iter().filter(|s| !s.is_empty()).collect();
        // Leftmost-first: the answer is cut where the earliest stop string starts.
        let automaton = if stops.is_empty() {
            None
        } else {
            // Building fails only past the crate's size limits, far above what validation lets in;
            // matching each string by itself is then the (still bounded) way.
            AhoCorasick::builder()
                .match_kind(MatchKind::LeftmostFirst)
                .build(&stops)
                .ok()
        };
        Self {
            stops,
            automaton,
            held: String::new(),
        }
    }

    /// Adds a stop string for the text still to come (an empty one is ignored).
    pub fn add(&mut self, stop: String) {
        if stop.is_empty() || self.stops.contains(&stop) {
            return;
        }
        let held = std::mem::take(&mut self.held);
        let mut stops = std::mem::take(&mut self.stops);
        stops.push(stop);
        *self = Self::new(stops);
        self.held = held;
    }

    /// Start of the earliest stop string in the held text.
    fn earliest(&self) -> Option<usize> {
        match &self.automaton {
            Some(ac) => ac.find(&self.held).map(|m| m.start()),
            None => self
                .stops
                .iter()
                .filter_map(|s| self.held.find(s.as_str()))
                .min(),
        }
    }

    /// Feeds a text delta.
    pub fn push(&mut self, delta: &str) -> StopResult {
        if self.stops.is_empty() {
            return StopResult::Continue(delta.to_string());
        }
        self.held.push_str(delta);
        if let Some(pos) = self.earliest() {
            let out = self.held[..pos].to_string();
            self.held.clear();
            return StopResult::Stop(out);
        }
        // Hold back the longest tail that is a proper prefix of some stop string.
        let mut keep = 0;
        for s in &self.stops {
            // Longest first, so the first hit is this string's answer.
            let longest = (s.len() - 1).min(self.held.len());
            if let Some(i) = (keep + 1..=longest)
                .rev()
                .find(|&i| s.is_char_boundary(i) && self.held.ends_with(&s[..i]))
            {
                keep = i;
            }
        }
        let cut = self.held.len() - keep;
        let out = self.held[..cut].to_string();
        self.held.drain(..cut);
        StopResult::Continue(out)
    }

    /// The held text at the end of a generation that did not hit a stop sequence.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_split_across_deltas() {
        let mut m = StopMatcher::new(vec!["\n\n".into(), "END".into()]);
        assert_eq!(m.push("hello\n"), StopResult::Continue("hello".into()));
        assert_eq!(m.push("\nworld"), StopResult::Stop("".into()));
    }

    #[test]
    fn held_prefix_released_when_not_a_stop() {
        let mut m = StopMatcher::new(vec!["END".into()]);
        assert_eq!(m.push("an E"), StopResult::Continue("an ".into()));
        assert_eq!(m.push("Nx"), StopResult::Continue("ENx".into()));
        assert_eq!(m.push("EN"), StopResult::Continue("".into()));
        assert_eq!(m.finish(), "EN");
    }

    #[test]
    fn a_stop_added_later_holds_and_cuts_what_follows() {
        let mut m = StopMatcher::new(vec![]);
        assert_eq!(m.push("ab"), StopResult::Continue("ab".into()));
        m.add("xyz".into());
        m.add("xyz".into());
        assert_eq!(m.push("cx"), StopResult::Continue("c".into()));
        assert_eq!(m.push("yzd"), StopResult::Stop("".into()));
    }

    #[test]
    fn no_stops_passes_through() {
        let mut m = StopMatcher::new(vec![]);
        assert_eq!(m.push("abc"), StopResult::Continue("abc".into()));
    }

    #[test]
    fn multibyte_stop() {
        let mut m = StopMatcher::new(vec!["ü!".into()]);
        assert_eq!(m.push("aü"), StopResult::Continue("a".into()));
        assert_eq!(m.push("!b"), StopResult::Stop("".into()));
    }
}

/// Property tests (a fixed budget in every test run; `PROPTEST_CASES=100000` for a long run):
/// the streamed matcher, which holds text back, against a reference that keeps everything and
/// searches all of it after each delta.
#[cfg(test)]
mod properties {
    use proptest::prelude::*;

    use super::*;

    /// Generation stops at the first delta after which the text holds a stop string, and the
    /// answer is cut where the earliest of them starts. (Not "the earliest in the whole text": a
    /// longer stop string that would have started earlier never gets to complete. The first
    /// long fuzz run found that difference, in the reference.)
    fn reference(pieces: &[String], stops: &[String]) -> (String, bool) {
        let mut text = String::new();
        for p in pieces {
            text.push_str(p);
            if let Some(i) = stops
                .iter()
                .filter(|s| !s.is_empty())
                .filter_map(|s| text.find(s.as_str()))
                .min()
            {
                return (text[..i].to_string(), true);
            }
        }
        (text, false)
    }

    /// CPU time of this thread: the bound per push is on work done, so a run that is preempted
    /// (a long fuzz run at low priority beside other work) does not fail for the wait.
    fn thread_cpu() -> std::time::Duration {
        let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
        std::time::Duration::new(
            u64::try_from(t.tv_sec).unwrap_or(0),
            u32::try_from(t.tv_nsec).unwrap_or(0),
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(crate::testing::property_cases(512)))]
        #[test]
        fn streamed_matching_equals_matching_the_whole_text(
            // A small alphabet, with a multi-byte letter, so stops really occur and straddle deltas.
            pieces in proptest::collection::vec("[abé\n]{0,6}", 0..20),
            stops in proptest::collection::vec("[abé\n]{0,4}", 0..4),
        ) {
            let mut m = StopMatcher::new(stops.clone());
            let mut out = String::new();
            let mut stopped = false;
            for p in &pieces {
                let started = thread_cpu();
                let r = m.push(p);
                let took = thread_cpu() - started;
                prop_assert!(took < std::time::Duration::from_millis(50), "one push took {took:?} of CPU");
                match r {
                    StopResult::Continue(t) => out.push_str(&t),
                    StopResult::Stop(t) => {
                        out.push_str(&t);
                        stopped = true;
                        break;
                    }
                }
            }
            if !stopped {
                out.push_str(&m.finish());
            }
            prop_assert_eq!((out, stopped), reference(&pieces, &stops));
        }
    }
}
