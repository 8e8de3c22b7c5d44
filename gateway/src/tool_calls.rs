//! An answer's text to OpenAI's tool calls. Under a tools grammar the model writes each call
//! in its chat template's form (`<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`);
//! the client is sent `tool_calls`, and when streaming, the deltas OpenAI sends: a call's id
//! and name first, then its arguments' JSON text in fragments as it is written.
//!
//! The grammar guarantees the form of an answer that ends; an answer cut short (`max_tokens`,
//! a stop string) may end inside a call, and what was read of it stands.

use approxy_verifier::grammar::tools::{CALL_CLOSE, CALL_OPEN};
use serde_json::{Value, json};

/// A piece of an answer, in the order the client is sent them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    /// Text.
    Content(String),
    /// A call begins.
    Call {
        /// Its place among the answer's calls.
        index: usize,
        /// Its id (`call_…`).
        id: String,
        /// The tool's name.
        name: String,
    },
    /// Some of a call's arguments' JSON text.
    Arguments {
        /// The call's place.
        index: usize,
        /// The fragment.
        text: String,
    },
}

/// Where the reader is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum State {
    /// Nothing read yet: text or a call.
    #[default]
    Start,
    /// Text: everything is content.
    Text,
    /// Inside a call's opening, up to its arguments.
    Head,
    /// Inside a call's arguments object.
    Arguments,
    /// After the arguments: the call's closing, then another call or the end.
    Tail,
}

/// Reads an answer's text as it is written.
#[derive(Debug, Default)]
pub struct CallReader {
    state: State,
    buf: String,
    calls: usize,
    depth: u32,
    in_string: bool,
    escaped: bool,
}

/// A new call's id, as OpenAI forms them.
fn call_id() -> String {
    format!("call_{:024x}", rand::random::<u128>() >> 32)
}

impl CallReader {
    /// Calls begun so far.
    pub fn calls(&self) -> usize {
        self.calls
    }

    /// Reads more of the answer.
    pub fn feed(&mut self, text: &str) -> Vec<Piece> {
        let mut out = Vec::new();
        self.buf.push_str(text);
        loop {
            let progressed = match self.state {
                State::Start | State::Tail => self.opening(),
                State::Text => {
                    if !self.buf.is_empty() {
                        out.push(Piece::Content(std::mem::take(&mut self.buf)));
                    }
                    false
                }
                State::Head => self.head(&mut out),
                State::Arguments => self.arguments(&mut out),
            };
            if !progressed {
                return out;
            }
        }
    }

    /// The answer has ended: what is still held is text.
    pub fn finish(&mut self) -> Vec<Piece> {
        let rest = std::mem::take(&mut self.buf);
        match self.state {
            State::Start | State::Text if !rest.is_empty() => vec![Piece::Content(rest)],
            _ => Vec::new(),
        }
    }

    /// At the start or after a call: another call's opening, or (at the start) text.
    fn opening(&mut self) -> bool {
        let sep = if self.state == State::Tail {
            format!("{CALL_CLOSE}\n{CALL_OPEN}")
        } else {
            CALL_OPEN.to_string()
        };
        if self.buf.starts_with(&sep) {
            self.buf.drain(..sep.len());
            self.state = State::Head;
            return true;
        }
        if sep.starts_with(self.buf.as_str()) {
            return false;
        }
        if self.state == State::Start {
            self.state = State::Text;
            return true;
        }
        // After a call, only its closing and another call or the end: anything else was not
        // the grammar's and is dropped, as a parser of the template's form would.
        self.buf.clear();
        false
    }

    /// `{"name": "NAME", "arguments": ` once all of it is there.
    fn head(&mut self, out: &mut Vec<Piece>) -> bool {
        const NAME: &str = "{\"name\": \"";
        const ARGS: &str = "\", \"arguments\": ";
        if !self.buf.starts_with(NAME) {
            return false;
        }
        let rest = &self.buf[NAME.len()..];
        let Some(end) = rest.find('"') else {
            return false;
        };
        if !rest[end..].starts_with(ARGS) {
            return false;
        }
        let name = rest[..end].to_string();
        self.buf.drain(..NAME.len() + end + ARGS.len());
        out.push(Piece::Call {
            index: self.calls,
            id: call_id(),
            name,
        });
        self.calls += 1;
        self.state = State::Arguments;
        self.depth = 0;
        self.in_string = false;
        self.escaped = false;
        true
    }

    /// The arguments' text, up to where their object closes.
    fn arguments(&mut self, out: &mut Vec<Piece>) -> bool {
        let mut end = None;
        for (i, c) in self.buf.char_indices() {
            if self.in_string {
                match (self.escaped, c) {
                    (true, _) => self.escaped = false,
                    (false, '\\') => self.escaped = true,
                    (false, '"') => self.in_string = false,
                    _ => {}
                }
                continue;
            }
            match c {
                '"' => self.in_string = true,
                '{' | '[' => self.depth += 1,
                '}' | ']' => {
                    self.depth = self.depth.saturating_sub(1);
                    if self.depth == 0 {
                        end = Some(i + 1);
                        break;
                    }
                }
                _ => {}
            }
        }
        let index = self.calls - 1;
        let cut = end.unwrap_or(self.buf.len());
        if cut > 0 {
            out.push(Piece::Arguments {
                index,
                text: self.buf[..cut].to_string(),
            });
        }
        self.buf.drain(..cut);
        match end {
            Some(_) => {
                // The call's own closing brace, then its closing tag.
                self.buf = self
                    .buf
                    .strip_prefix('}')
                    .map(str::to_string)
                    .unwrap_or_default();
                self.state = State::Tail;
                true
            }
            None => false,
        }
    }
}

/// A whole answer: its text (if any) and its calls, as a chat completion's `message`.
pub fn message(text: &str) -> (Value, usize) {
    let mut reader = CallReader::default();
    let mut pieces = reader.feed(text);
    pieces.extend(reader.finish());
    let mut content = String::new();
    let mut calls: Vec<Value> = Vec::new();
    for p in pieces {
        match p {
            Piece::Content(t) => content.push_str(&t),
            Piece::Call { id, name, .. } => calls.push(json!({
                "id": id, "type": "function", "function": {"name": name, "arguments": ""}
            })),
            Piece::Arguments { index, text } => {
                if let Some(Value::String(a)) = calls
                    .get_mut(index)
                    .and_then(|c| c.pointer_mut("/function/arguments"))
                {
                    a.push_str(&text);
                }
            }
        }
    }
    let n = calls.len();
    let mut m = json!({"role": "assistant", "content": content});
    if n > 0 {
        if content.is_empty() {
            m["content"] = Value::Null;
        }
        m["tool_calls"] = Value::Array(calls);
    }
    (m, n)
}

/// A piece as a chunk's `delta`.
pub fn delta(p: &Piece) -> Value {
    match p {
        Piece::Content(t) => json!({"content": t}),
        Piece::Call { index, id, name } => json!({"tool_calls": [{
            "index": index, "id": id, "type": "function",
            "function": {"name": name, "arguments": ""}
        }]}),
        Piece::Arguments { index, text } => {
            json!({"tool_calls": [{"index": index, "function": {"arguments": text}}]})
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWO: &str = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo {}\\\"\", \"days\": [1, 2]}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";

    #[test]
    fn calls_come_out_whole_however_the_text_is_cut() {
        let (m, n) = message(TWO);
        assert_eq!(n, 2);
        assert_eq!(m["content"], Value::Null);
        let calls = m["tool_calls"].as_array().cloned().unwrap_or_default();
        assert_eq!(calls[0]["function"]["name"], "get_weather");
        assert_eq!(
            calls[0]["function"]["arguments"],
            "{\"city\": \"Oslo {}\\\"\", \"days\": [1, 2]}"
        );
        assert_eq!(calls[1]["function"]["arguments"], "{}");
        assert!(
            calls[0]["id"]
                .as_str()
                .is_some_and(|i| i.starts_with("call_"))
        );
        // Fed a character at a time, the same calls, with the name before any argument.
        let mut r = CallReader::default();
        let mut pieces = Vec::new();
        for c in TWO.chars() {
            pieces.extend(r.feed(&c.to_string()));
        }
        pieces.extend(r.finish());
        let mut args = [String::new(), String::new()];
        let mut names = Vec::new();
        for p in &pieces {
            match p {
                Piece::Call { index, name, .. } => {
                    assert!(args[*index].is_empty());
                    names.push(name.clone());
                }
                Piece::Arguments { index, text } => args[*index].push_str(text),
                Piece::Content(c) => panic!("no content expected, got {c:?}"),
            }
        }
        assert_eq!(names, ["get_weather", "get_time"]);
        assert_eq!(args[0], calls[0]["function"]["arguments"]);
        assert_eq!(args[1], "{}");
    }

    #[test]
    fn text_is_content_and_a_cut_call_keeps_what_was_read() {
        let (m, n) = message("It is sunny.");
        assert_eq!((m["content"].as_str(), n), (Some("It is sunny."), 0));
        assert!(m.get("tool_calls").is_none());
        // A text that starts like a call but is not one.
        let (m, _) = message("<tool");
        assert_eq!(m["content"], "<tool");
        let (m, n) = message("<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": ");
        assert_eq!(n, 1);
        assert_eq!(m["tool_calls"][0]["function"]["arguments"], "{\"a\": ");
    }
}
