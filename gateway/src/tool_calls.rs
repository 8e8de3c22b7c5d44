//! An answer's text to OpenAI's tool calls. Under a tools grammar the model writes each call
//! in its chat template's form (`<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`);
//! the client is sent `tool_calls`, and when streaming, the deltas OpenAI sends: a call's id
//! and name first, then its arguments' JSON text in fragments as it is written.
//!
//! The grammar guarantees the form of an answer that ends; an answer cut short (`max_tokens`,
//! a stop string) may end inside a call, and what was read of it stands.
//!
//! Under `tool_choice: "auto"` (every SDK's default) the grammar leaves text free, and a model
//! may write a call in a form of its own: bare JSON, or JSON in a Markdown fence (Qwen2.5's
//! small models do, unasked). An answer that starts so is held to its end, and becomes a call
//! when it names a declared tool with arguments valid for its parameters ([`BareCalls`]);
//! otherwise it is sent as the text it is.

use std::sync::Arc;

use approxy_verifier::request::{CALL_CLOSE, CALL_OPEN, Tool};
use serde_json::{Value, json};

/// The tools an answer may call in a form of its own (bare or fenced JSON), with a check of
/// each one's arguments.
pub struct BareCalls {
    tools: Vec<(String, Option<jsonschema::Validator>)>,
}

impl std::fmt::Debug for BareCalls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.tools.iter().map(|(n, _)| n.as_str()).collect();
        f.debug_struct("BareCalls").field("tools", &names).finish()
    }
}

impl BareCalls {
    /// For these tools. A tool without parameters takes any object; one whose schema the
    /// checker cannot read takes none in this form (the grammar's tagged form still serves it).
    pub fn new(tools: &[Tool]) -> Arc<Self> {
        let tools = tools
            .iter()
            .map(|t| {
                let check = match &t.parameters {
                    Value::Null => None,
                    schema => Some(jsonschema::validator_for(schema).ok()),
                };
                (t.name.clone(), check)
            })
            .filter_map(|(name, check)| match check {
                None => Some((name, None)),
                Some(Some(v)) => Some((name, Some(v))),
                Some(None) => None,
            })
            .collect();
        Arc::new(Self { tools })
    }

    /// The call a whole answer makes, as its tool's name and its arguments' JSON text: one
    /// JSON object `{"name": ..., "arguments": {...}}` (or `"parameters"`, or the arguments as
    /// a JSON string), bare or in a Markdown fence, naming a declared tool with valid
    /// arguments. Anything else is text.
    fn read(&self, text: &str) -> Option<(String, String)> {
        let body = unfenced(text.trim())?;
        let v: Value = serde_json::from_str(body).ok()?;
        let o = v.as_object()?;
        let name = o.get("name")?.as_str()?;
        let args = match o.get("arguments").or_else(|| o.get("parameters"))? {
            Value::String(s) => serde_json::from_str(s).ok()?,
            other => other.clone(),
        };
        if !args.is_object() || o.len() != 2 {
            return None;
        }
        let (_, check) = self.tools.iter().find(|(n, _)| n == name)?;
        if check.as_ref().is_some_and(|c| !c.is_valid(&args)) {
            return None;
        }
        Some((name.to_string(), args.to_string()))
    }
}

/// The JSON in a text that is JSON, bare or in one Markdown fence (with a language or none).
fn unfenced(text: &str) -> Option<&str> {
    let Some(rest) = text.strip_prefix("```") else {
        return Some(text);
    };
    let (_, inside) = rest.split_once('\n')?;
    Some(inside.trim_end().strip_suffix("```")?.trim())
}

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
    /// An answer that may be a call in a form of its own: held to its end.
    Held,
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
    /// The tools it may call in a form of its own (`tool_choice: "auto"`).
    bare: Option<Arc<BareCalls>>,
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
    /// A reader that also takes a whole answer of bare or fenced JSON as a call of one of
    /// `bare`'s tools.
    pub fn reading_bare(bare: Option<Arc<BareCalls>>) -> Self {
        Self {
            bare,
            ..Self::default()
        }
    }

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
                State::Held => false,
            };
            if !progressed {
                return out;
            }
        }
    }

    /// The answer has ended: what is still held is text, or the call it makes.
    pub fn finish(&mut self) -> Vec<Piece> {
        let rest = std::mem::take(&mut self.buf);
        let call = match (&self.state, &self.bare) {
            (State::Held, Some(bare)) => bare.read(&rest),
            _ => None,
        };
        if let Some((name, arguments)) = call {
            let index = self.calls;
            self.calls += 1;
            return vec![
                Piece::Call {
                    index,
                    id: call_id(),
                    name,
                },
                Piece::Arguments {
                    index,
                    text: arguments,
                },
            ];
        }
        match self.state {
            State::Start | State::Text | State::Held if !rest.is_empty() => {
                vec![Piece::Content(rest)]
            }
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
        if self.state == State::Start && self.bare.is_some() {
            match self.buf.trim_start().chars().next() {
                None => return false,
                Some('{' | '`') => {
                    self.state = State::Held;
                    return true;
                }
                Some(_) => {}
            }
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

/// A whole answer: its text (if any) and its calls, as a chat completion's `message`; a call
/// in a form of its own too where `bare` says which tools it may call so.
pub fn message(text: &str, bare: Option<Arc<BareCalls>>) -> (Value, usize) {
    let mut reader = CallReader::reading_bare(bare);
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
        let (m, n) = message(TWO, None);
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
        let (m, n) = message("It is sunny.", None);
        assert_eq!((m["content"].as_str(), n), (Some("It is sunny."), 0));
        assert!(m.get("tool_calls").is_none());
        // A text that starts like a call but is not one.
        let (m, _) = message("<tool", None);
        assert_eq!(m["content"], "<tool");
        let (m, n) = message(
            "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": ",
            None,
        );
        assert_eq!(n, 1);
        assert_eq!(m["tool_calls"][0]["function"]["arguments"], "{\"a\": ");
    }

    fn weather() -> Option<Arc<BareCalls>> {
        let tool = Tool {
            name: "get_weather".into(),
            parameters: json!({"type": "object", "properties": {
                "city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
                "required": ["city"], "additionalProperties": false}),
        };
        Some(BareCalls::new(&[tool]))
    }

    /// Under `auto`, a whole answer of bare or fenced JSON that names a declared tool with
    /// valid arguments is a call, streamed or not; before, all 5 of the tool sample's such
    /// answers went out as content.
    #[test]
    fn under_auto_a_call_in_bare_or_fenced_json_is_a_call() {
        let args = json!({"city": "Oslo", "unit": "celsius"});
        for text in [
            "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", \"unit\": \"celsius\"}}",
            "```json\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", \"unit\": \"celsius\"}}\n```",
            "\n```\n{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\", \"unit\": \"celsius\"}}\n```\n",
            "{\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Oslo\\\", \\\"unit\\\": \\\"celsius\\\"}\"}",
        ] {
            let (m, n) = message(text, weather());
            assert_eq!((n, &m["content"]), (1, &Value::Null), "{text}: {m}");
            assert_eq!(m["tool_calls"][0]["function"]["name"], "get_weather");
            let got: Value = serde_json::from_str(
                m["tool_calls"][0]["function"]["arguments"]
                    .as_str()
                    .unwrap(),
            )
            .unwrap();
            assert_eq!(got, args);
            // Streamed a character at a time: nothing goes out until the answer ends, then the
            // call.
            let mut r = CallReader::reading_bare(weather());
            for c in text.chars() {
                assert_eq!(r.feed(&c.to_string()), Vec::new(), "{text}");
            }
            let pieces = r.finish();
            assert!(matches!(&pieces[0], Piece::Call { name, .. } if name == "get_weather"));
            assert_eq!(r.calls(), 1);
        }
    }

    #[test]
    fn under_auto_json_that_is_not_a_valid_call_is_text() {
        for text in [
            // An undeclared tool, arguments the schema refuses, a key more, JSON that is data.
            "{\"name\": \"get_time\", \"arguments\": {}}",
            "{\"name\": \"get_weather\", \"arguments\": {\"town\": \"Oslo\"}}",
            "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}, \"id\": 1}",
            "{\"city\": \"Oslo\"}",
            "```python\nprint(1)\n```",
            "{\"name\": \"get_weather\", \"arguments\": {\"city\": ",
        ] {
            let (m, n) = message(text, weather());
            assert_eq!((n, m["content"].as_str()), (0, Some(text)), "{text}");
        }
        // Text that starts otherwise streams as it comes.
        let mut r = CallReader::reading_bare(weather());
        assert_eq!(r.feed("It is"), vec![Piece::Content("It is".into())]);
        // Without `auto`, bare JSON is text as before.
        let (m, n) = message(
            "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}",
            None,
        );
        assert_eq!(n, 0, "{m}");
    }
}
