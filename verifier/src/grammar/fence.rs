//! Takes off the Markdown fence a model may wrap a JSON answer in (the grammar allows it, as
//! llama-server's does: see [`FENCE_OPEN`]), so the client gets the JSON alone, as
//! llama-server's own answer gives it. The decode loop reads its text through this before its
//! stop strings: they are matched against what the client receives, never the fence.
//!
//! The grammar allows the fence only whole and only around the whole answer, and inside JSON
//! no line break is followed by a backtick (a string's line breaks are escaped), so the text
//! can be read as it streams: the opening is held until it is whole or the answer is seen
//! not to start with it, and once it was taken off, a line break is held until what follows
//! shows it is not the closing.

use super::{FENCE_CLOSE, FENCE_OPEN};

/// Reads one answer's text as it streams.
#[derive(Debug, Default)]
pub struct FenceReader {
    /// Text not yet given out: a start that may still be the opening, or, inside a fence, an
    /// end that may be the closing.
    held: String,
    state: State,
}

#[derive(Debug, Default, Clone, Copy, PartialEq)]
enum State {
    /// Not yet known whether the answer opens with a fence.
    #[default]
    Start,
    /// It did: the closing is held back when it comes.
    Inside,
    /// It did not: the text goes out as it comes.
    Bare,
}

impl FenceReader {
    /// The text to send for `text`, the answer's next piece.
    pub fn feed(&mut self, text: &str) -> String {
        self.held.push_str(text);
        match self.state {
            State::Bare => std::mem::take(&mut self.held),
            State::Start => {
                if self.held.starts_with(FENCE_OPEN) {
                    self.held.drain(..FENCE_OPEN.len());
                    self.state = State::Inside;
                    self.inside()
                } else if FENCE_OPEN.starts_with(self.held.as_str()) {
                    String::new()
                } else {
                    self.state = State::Bare;
                    std::mem::take(&mut self.held)
                }
            }
            State::Inside => self.inside(),
        }
    }

    /// Inside a fence: all but an end that may be the start of the closing.
    fn inside(&mut self) -> String {
        let keep = (1..=FENCE_CLOSE.len().min(self.held.len()))
            .rev()
            .find(|&n| {
                self.held.is_char_boundary(self.held.len() - n)
                    && FENCE_CLOSE.starts_with(&self.held[self.held.len() - n..])
            })
            .unwrap_or(0);
        let rest = self.held.split_off(self.held.len() - keep);
        std::mem::replace(&mut self.held, rest)
    }

    /// The answer ended: what was held and is part of it. Inside a fence only a lone line break
    /// is (an answer cut there by its token limit); a closing, whole or begun, is not. A start
    /// that was only ever the beginning of an opening is the answer's own text.
    pub fn finish(&mut self) -> String {
        let held = std::mem::take(&mut self.held);
        match self.state {
            State::Inside if held != "\n" => String::new(),
            _ => held,
        }
    }
}

/// A whole answer's text without its fence.
pub fn strip(text: &str) -> String {
    let mut r = FenceReader::default();
    let mut out = r.feed(text);
    out.push_str(&r.finish());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `text` fed in pieces cut at every pair of places.
    fn every_cut(text: &str) -> Vec<String> {
        let bounds: Vec<usize> = (0..=text.len())
            .filter(|&i| text.is_char_boundary(i))
            .collect();
        let mut outs = Vec::new();
        for &a in &bounds {
            for &b in bounds.iter().filter(|&&b| b >= a) {
                let mut r = FenceReader::default();
                let mut out = String::new();
                for piece in [&text[..a], &text[a..b], &text[b..]] {
                    out.push_str(&r.feed(piece));
                }
                out.push_str(&r.finish());
                outs.push(out);
            }
        }
        outs
    }

    #[test]
    fn a_fenced_answer_comes_out_bare_however_it_is_cut() {
        let json = "{\n  \"a\": \"b\\nc\",\n  \"é\": [1, 2]\n}";
        let fenced = format!("{FENCE_OPEN}{json}{FENCE_CLOSE}");
        for out in every_cut(&fenced) {
            assert_eq!(out, json);
        }
        assert_eq!(strip(&fenced), json);
    }

    #[test]
    fn a_bare_answer_comes_out_as_it_is() {
        for text in [
            "{\"a\": 1}",
            "{\n  \"a\": \"```\"\n}",
            "`",
            "``` not json",
            "",
        ] {
            for out in every_cut(text) {
                assert_eq!(out, text);
            }
        }
    }

    #[test]
    fn an_answer_cut_inside_its_fence_keeps_its_json_and_loses_a_begun_closing() {
        let cut = format!("{FENCE_OPEN}{{\n  \"a\": 1");
        for out in every_cut(&cut) {
            assert_eq!(out, "{\n  \"a\": 1");
        }
        assert_eq!(
            strip(&format!("{FENCE_OPEN}{{\"a\": 1}}\n")),
            "{\"a\": 1}\n"
        );
        assert_eq!(
            strip(&format!("{FENCE_OPEN}{{\"a\": 1}}\n``")),
            "{\"a\": 1}"
        );
        assert_eq!(strip(FENCE_OPEN), "");
    }

    #[test]
    fn line_breaks_inside_the_fence_go_out_once_the_next_text_shows_them() {
        let mut r = FenceReader::default();
        assert_eq!(r.feed("```json\n{"), "{");
        assert_eq!(r.feed("\n"), "", "may be the closing");
        assert_eq!(r.feed("  \"a\""), "\n  \"a\"");
        assert_eq!(r.feed("\n}\n`"), "\n}");
        assert_eq!(r.feed("``"), "");
        assert_eq!(r.finish(), "");
    }
}
