//! The grammar of an answer that may call tools, in the Hermes form Qwen2.5's chat template
//! teaches (and llama.cpp, vLLM and SGLang parse): each call is
//! `<tool_call>\n{"name": "NAME", "arguments": ARGS}\n</tool_call>`, several separated by a
//! newline. The names are the request's tools, each with its parameters' schema for `ARGS`.
//! `tool_choice` picks what the answer may be: text or calls (`auto`), calls only
//! (`required`), one call of one tool (a named tool), or text only (`none`).
//!
//! The grammar's calls are the tagged form. Qwen2.5's small models often write a call's JSON
//! bare, with no tags, when nothing forces them: under `auto` the gateway reads a whole answer
//! of bare or fenced JSON that names a declared tool with valid arguments as a call too
//! (`gateway/src/tool_calls.rs`), since that is what every SDK's default choice gets.

use serde_json::Value;

use super::compact::compact;

/// The text every call starts with: the template's opener, one token in Qwen2.5's vocabulary.
pub const CALL_OPEN: &str = "<tool_call>\n";
/// The text every call ends with.
pub const CALL_CLOSE: &str = "\n</tool_call>";

/// One tool the answer may call.
#[derive(Debug, Clone, PartialEq)]
pub struct Tool {
    /// Its name.
    pub name: String,
    /// The JSON Schema of its arguments (an object).
    pub parameters: Value,
}

/// What the answer may be (`tool_choice`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    /// Text, or calls.
    Auto,
    /// Calls only.
    Required,
    /// One call of this tool.
    Named(String),
    /// Text only.
    None,
}

/// The tools, the choice, and whether several calls may come in one answer.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolsSpec {
    /// The request's tools.
    pub tools: Vec<Tool>,
    /// `tool_choice`.
    pub choice: ToolChoice,
    /// `parallel_tool_calls`.
    pub parallel: bool,
}

/// A Lark string literal (JSON's escapes are Lark's).
fn literal(s: &str) -> String {
    Value::String(s.to_string()).to_string()
}

impl ToolsSpec {
    /// Whether an answer may hold more than one call. A named tool is one call of it, as
    /// OpenAI and vLLM read the choice.
    pub fn several_calls(&self) -> bool {
        self.parallel && matches!(self.choice, ToolChoice::Auto | ToolChoice::Required)
    }

    /// The grammar, in llguidance's Lark.
    pub fn lark(&self) -> String {
        // Free text may not start with `<`, so it cannot open a call: a call is always the
        // grammar's, never text that looks like one.
        const TEXT: &str = "TEXT: /[^<](.|\\n)*/\n";
        let callable: Vec<&Tool> = match &self.choice {
            ToolChoice::Named(n) => self.tools.iter().filter(|t| &t.name == n).collect(),
            ToolChoice::None => Vec::new(),
            ToolChoice::Auto | ToolChoice::Required => self.tools.iter().collect(),
        };
        if callable.is_empty() {
            return format!("start: TEXT\n{TEXT}");
        }
        let start = match self.choice {
            ToolChoice::Auto => "start: TEXT | calls\n",
            _ => "start: calls\n",
        };
        let calls = if self.several_calls() {
            "calls: call (\"\\n\" call)*\n"
        } else {
            "calls: call\n"
        };
        let mut g = format!("{start}{calls}call: ");
        let names: Vec<String> = (0..callable.len()).map(|i| format!("call_{i}")).collect();
        g.push_str(&names.join(" | "));
        g.push('\n');
        for (rule, tool) in names.iter().zip(&callable) {
            let name = Value::String(tool.name.clone());
            let head = format!("{CALL_OPEN}{{\"name\": {name}, \"arguments\": ");
            let tail = format!("}}{CALL_CLOSE}");
            g.push_str(&format!(
                "{rule}: {} %json {} {}\n",
                literal(&head),
                compact(arguments_schema(&tool.parameters)),
                literal(&tail)
            ));
        }
        if self.choice == ToolChoice::Auto {
            g.push_str(TEXT);
        }
        g
    }
}

/// A tool's arguments are an object whatever its schema says of the type: no parameters
/// means any object, as OpenAI reads it.
fn arguments_schema(parameters: &Value) -> Value {
    match parameters {
        Value::Object(m) if !m.is_empty() => {
            let mut m = m.clone();
            m.entry("type")
                .or_insert_with(|| Value::String("object".into()));
            Value::Object(m)
        }
        _ => serde_json::json!({"type": "object"}),
    }
}

/// Finds the calls an answer completes, so that a call repeating one of them can end the
/// answer before it. Greedy small models loop on their calls: on the tool sample most
/// parallel-call answers (and the target's under the same grammar) wrote the same calls over
/// and over until `max_tokens` cut them, invalid (see tests/README.md, "Structured output"). A
/// call identical to an earlier one, same tool and same arguments, would only return what the
/// first returned.
#[derive(Debug, Default)]
pub struct CallRepeats {
    /// Text since the last complete call, or from where a call may still open.
    pending: String,
    /// Calls watched for repeats so far.
    watched: usize,
    /// Calls completed so far.
    closed: usize,
}

/// Calls watched at most, and the longest watched: each is a stop string, and the stop
/// matcher's work per token grows with their number and length (a request's own stop strings
/// are bounded by the validator). An answer past these still ends at `max_tokens`.
const MAX_WATCHED: usize = 32;
const MAX_WATCHED_BYTES: usize = 2048;

impl CallRepeats {
    /// Whether the answer so far ends with a whole call: where it may end or call again.
    pub fn after_a_call(&self) -> bool {
        self.closed > 0 && self.pending.is_empty()
    }

    /// Reads more of the answer's text; for each call it completes, the text that would
    /// repeat it after a separator (a stop string for the rest of the answer).
    pub fn feed(&mut self, text: &str) -> Vec<String> {
        self.pending.push_str(text);
        let mut repeats = Vec::new();
        while let Some(open) = self.pending.find(CALL_OPEN) {
            let Some(close) = self.pending[open..].find(CALL_CLOSE) else {
                self.pending.drain(..open);
                return repeats;
            };
            let end = open + close + CALL_CLOSE.len();
            self.closed += 1;
            if self.watched < MAX_WATCHED && end - open <= MAX_WATCHED_BYTES {
                self.watched += 1;
                repeats.push(format!("\n{}", &self.pending[open..end]));
            }
            self.pending.drain(..end);
        }
        // No call is open: keep only what could be the start of one.
        let mut keep = self.pending.len().saturating_sub(CALL_OPEN.len() - 1);
        while !self.pending.is_char_boundary(keep) {
            keep -= 1;
        }
        self.pending.drain(..keep);
        repeats
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_with_no_call_keeps_only_what_could_open_one() {
        let mut r = CallRepeats::default();
        assert!(r.feed(&"é".repeat(10_000)).is_empty());
        assert!(r.feed("<tool").is_empty());
        assert!(r.pending.ends_with("<tool") && r.pending.len() <= CALL_OPEN.len());
    }

    #[test]
    fn the_calls_watched_are_bounded_in_number_and_length() {
        let call = |i: usize, arg: &str| {
            format!(
                "{CALL_OPEN}{{\"name\": \"f{i}\", \"arguments\": {{\"a\": \"{arg}\"}}}}{CALL_CLOSE}\n"
            )
        };
        let mut r = CallRepeats::default();
        assert!(r.feed(&call(0, &"x".repeat(MAX_WATCHED_BYTES))).is_empty());
        let found: usize = (1..=MAX_WATCHED + 5)
            .map(|i| r.feed(&call(i, "y")).len())
            .sum();
        assert_eq!(found, MAX_WATCHED);
    }
}
