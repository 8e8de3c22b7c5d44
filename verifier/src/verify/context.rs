//! What the answer so far says about the next draft token: its position, whether it sits in a
//! code block, how the draft has fared over the last tokens and how its uncertainty is moving.
//! One [`Context`] follows an answer token by token; serving (the decode loop) and training
//! (teacher-forced and live rows) both feed it through [`Context::push`] and read it through
//! [`Context::values`], so the two cannot drift apart.
//!
//! "Agreement" at a position is whether the token emitted there is the draft's own top-1. It
//! is what a verdict history can mean on both sides: at serving an accepted draft token agrees
//! and a target token agrees when the draft would have written it too; under teacher forcing
//! every token is the target's, so agreement is the row's label. The verifier's own accept /
//! reject decisions would not do: teacher forcing has none, and they would tie a head to the
//! threshold it was trained at.

use super::syntax::{N_SYNTAX, Syntax};
use crate::draft::PositionOutput;

/// Names of the context values, in the order [`Context::values`] returns them.
pub const CONTEXT_NAMES: [&str; 8] = [
    "log_position",
    "first_token",
    "in_code_block",
    "agreed_last",
    "log_agreed_run",
    "disagree_rate_16",
    "entropy_trend_8",
    "last_emitted_gap",
];

/// Number of context values.
pub const N_CONTEXT: usize = CONTEXT_NAMES.len();

/// Positions the disagreement rate looks back over.
const RATE_WINDOW: usize = 16;
/// Positions the entropy trend averages over.
const ENTROPY_WINDOW: usize = 8;

/// What the draft thought at one emitted position.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Record {
    /// The emitted token was the draft's top-1.
    pub agreed: bool,
    /// The draft's entropy there (nats).
    pub entropy: f32,
    /// log p(emitted) − log p(draft's top-1) under the draft: 0 when they agree, negative when
    /// the answer took a token the draft liked less.
    pub emitted_gap: f32,
}

impl Record {
    /// The record of emitting `token` where the draft's output was `out`. `entropy` may be
    /// passed when it is known already (the verifier's features hold it); otherwise it is the
    /// output's own scan's.
    pub fn new(out: &PositionOutput, token: u32, entropy: Option<f32>) -> Self {
        let scan = out.scan();
        let emitted = out.logits.get(token as usize).copied().unwrap_or(scan.max);
        Self {
            agreed: scan.top1 == token as usize,
            entropy: entropy.unwrap_or(scan.entropy),
            emitted_gap: emitted - scan.max,
        }
    }
}

/// Follows Markdown code fences in streamed text: a line that starts (after spaces) with three
/// backticks opens or closes a block.
#[derive(Debug, Clone, Default)]
struct Fences {
    inside: bool,
    /// Backticks seen at the start of the current line, or `None` once the line has anything
    /// else before three of them.
    leading_ticks: Option<u8>,
}

impl Fences {
    fn new() -> Self {
        Self {
            inside: false,
            leading_ticks: Some(0),
        }
    }

    fn push(&mut self, text: &str) {
        for c in text.chars() {
            match (c, self.leading_ticks) {
                ('\n', _) => self.leading_ticks = Some(0),
                ('`', Some(n)) => {
                    if n + 1 == 3 {
                        self.inside = !self.inside;
                        // The rest of the fence line (a language tag) is not code.
                        self.leading_ticks = None;
                    } else {
                        self.leading_ticks = Some(n + 1);
                    }
                }
                (' ' | '\t', Some(0)) => {}
                _ => self.leading_ticks = None,
            }
        }
    }
}

/// The state of one answer, as far as the verifier's context values need it.
#[derive(Debug, Clone)]
pub struct Context {
    position: usize,
    fences: Fences,
    /// The last [`RATE_WINDOW`] positions' records (`None`: the draft's view there is unknown,
    /// as for the rest of a multi-token correction, and counts as a disagreement).
    recent: std::collections::VecDeque<Option<Record>>,
    agreed_run: usize,
    syntax: Syntax,
}

impl Default for Context {
    fn default() -> Self {
        Self::new()
    }
}

impl Context {
    /// The context before an answer's first token.
    pub fn new() -> Self {
        Self {
            position: 0,
            fences: Fences::new(),
            recent: std::collections::VecDeque::with_capacity(RATE_WINDOW + 1),
            agreed_run: 0,
            syntax: Syntax::new(),
        }
    }

    /// Records one emitted token: what the draft thought there (when known) and the text it
    /// added to the answer.
    pub fn push(&mut self, record: Option<Record>, text: &str) {
        self.position += 1;
        self.fences.push(text);
        self.syntax.push(text);
        let agreed = record.is_some_and(|r| r.agreed);
        self.agreed_run = if agreed { self.agreed_run + 1 } else { 0 };
        self.recent.push_back(record);
        if self.recent.len() > RATE_WINDOW {
            self.recent.pop_front();
        }
    }

    /// Where in code the next token falls ([`SYNTAX_NAMES`](super::syntax::SYNTAX_NAMES)).
    pub fn syntax_values(&self) -> [f32; N_SYNTAX] {
        self.syntax.values()
    }

    /// Tokens emitted so far.
    pub fn position(&self) -> usize {
        self.position
    }

    /// The context values (in [`CONTEXT_NAMES`] order) for the token at the next position,
    /// whose draft entropy is `entropy_now`.
    pub fn values(&self, entropy_now: f32) -> [f32; N_CONTEXT] {
        let last = self.recent.back().copied();
        let disagreements = self
            .recent
            .iter()
            .filter(|r| !r.is_some_and(|r| r.agreed))
            .count();
        let rate = if self.recent.is_empty() {
            0.0
        } else {
            disagreements as f32 / self.recent.len() as f32
        };
        let entropies: Vec<f32> = self
            .recent
            .iter()
            .rev()
            .take(ENTROPY_WINDOW)
            .flatten()
            .map(|r| r.entropy)
            .collect();
        let trend = if entropies.is_empty() {
            0.0
        } else {
            entropy_now - entropies.iter().sum::<f32>() / entropies.len() as f32
        };
        [
            (self.position as f32).ln_1p(),
            f32::from(u8::from(self.position == 0)),
            f32::from(u8::from(self.fences.inside)),
            // Before the first token nothing has gone wrong yet.
            f32::from(u8::from(last.is_none_or(|r| r.is_some_and(|r| r.agreed)))),
            (self.agreed_run as f32).ln_1p(),
            rate,
            trend,
            last.flatten().map_or(0.0, |r| r.emitted_gap),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(agreed: bool, entropy: f32) -> Option<Record> {
        Some(Record {
            agreed,
            entropy,
            emitted_gap: if agreed { 0.0 } else { -2.0 },
        })
    }

    #[test]
    fn fences_open_and_close_on_line_starts_only() {
        let mut f = Fences::new();
        f.push("Here:\n``");
        assert!(!f.inside);
        f.push("`python\nx = 1  # a ``` inside a line\n");
        assert!(f.inside, "opened by a fence split over two pieces");
        f.push("  ```\nDone.");
        assert!(!f.inside, "an indented fence closes");
        f.push(" Inline `code` and ``` mid-line.\n");
        assert!(!f.inside);
    }

    #[test]
    fn values_follow_position_history_and_entropy() {
        let mut c = Context::new();
        let v = c.values(1.0);
        assert_eq!(v, [0.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0]);
        c.push(rec(true, 2.0), "a");
        c.push(rec(true, 4.0), "b");
        let v = c.values(1.0);
        assert_eq!(v[0], 2f32.ln_1p());
        assert_eq!((v[1], v[3], v[5]), (0.0, 1.0, 0.0));
        assert_eq!(v[4], 2f32.ln_1p());
        assert_eq!(v[6], 1.0 - 3.0, "entropy now minus the recent mean");
        c.push(rec(false, 0.0), "c");
        c.push(None, "d");
        let v = c.values(0.0);
        assert_eq!((v[3], v[4]), (0.0, 0.0), "an unknown view is no agreement");
        assert_eq!(v[5], 0.5);
        assert_eq!(v[7], 0.0, "no gap is known at an unknown view");
        c.push(rec(false, 0.0), "e");
        assert_eq!(c.values(0.0)[7], -2.0);
        assert_eq!(c.position(), 5);
    }

    #[test]
    fn the_rate_looks_back_sixteen_positions() {
        let mut c = Context::new();
        c.push(rec(false, 1.0), "x");
        for _ in 0..RATE_WINDOW {
            c.push(rec(true, 1.0), "y");
        }
        assert_eq!(c.values(1.0)[5], 0.0);
    }

    #[test]
    fn a_record_knows_agreement_gap_and_entropy() {
        let out = PositionOutput::new(vec![0.5f32.ln(), 0.3f32.ln(), 0.2f32.ln()], vec![].into());
        let r = Record::new(&out, 0, None);
        assert!(r.agreed && r.emitted_gap == 0.0);
        let h = -(0.5f32 * 0.5f32.ln() + 0.3 * 0.3f32.ln() + 0.2 * 0.2f32.ln());
        assert!((r.entropy - h).abs() < 1e-5);
        let r = Record::new(&out, 2, Some(9.0));
        assert!(!r.agreed && (r.emitted_gap - (0.2f32 / 0.5).ln()).abs() < 1e-5);
        assert_eq!(r.entropy, 9.0);
    }
}
