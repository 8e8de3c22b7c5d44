//! The grammar of an answer that may call tools, in the Hermes form Qwen2.5's chat template
//! teaches (and llama.cpp, vLLM and SGLang parse): each call is
//! `<tool_call>\n{"name": "NAME", "arguments": ARGS}\n</tool_call>`, several separated by a
//! newline. The names are the request's tools, each with its parameters' schema for `ARGS`.
//! `tool_choice` picks what the answer may be: text or calls (`auto`), calls only
//! (`required`), one call of one tool (a named tool), or text only (`none`).
//!
//! Only the tagged form is a call. Qwen2.5's small models often write a call's JSON bare, with
//! no tags, when nothing forces them; reading that as a call too was tried on the tool sample
//! (`approxy bench structured`, 2026-11-27): the target under the grammar then called the
//! right tools on 10 of 18 prompts against 11, and approxy on 9 against 11, since after a
//! tool's result the model would call again where it should answer.

use serde_json::Value;

use super::compact;

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
        // A named tool is one call of it, as OpenAI and vLLM read the choice.
        let several = self.parallel && !matches!(self.choice, ToolChoice::Named(_));
        let calls = if several {
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
