//! The grammar of an answer that may call tools, in the Hermes form Qwen2.5's chat template
//! teaches (and llama.cpp, vLLM and SGLang parse): each call is
//! `<tool_call>\n{"name": "NAME", "arguments": ARGS}\n</tool_call>`, several separated by a
//! newline. The names are the request's tools, each with its parameters' schema for `ARGS`.
//! `tool_choice` picks what the answer may be: text or calls (`auto`), calls only
//! (`required`), one call of one tool (a named tool), or text only (`none`).
//!
//! Under `auto`, one call may also come bare, `{"name": NAME, "arguments": ARGS}` without the
//! tags: Qwen2.5's small models often write a call so when nothing forces the tags (on this
//! project's tool sample the 1.5B target did so for every weather, stock, currency and flight
//! question). Free text then starts with neither `<` nor `{`, so an answer that starts like a
//! call is one, under the grammar.

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
        // Free text may not start with `<` (or, beside bare calls, `{`), so it cannot open a
        // call: a call is always the grammar's, never text that looks like one.
        const TEXT: &str = "TEXT: /[^<](.|\\n)*/\n";
        const TEXT_BESIDE_BARE: &str = "TEXT: /[^<{](.|\\n)*/\n";
        let callable: Vec<&Tool> = match &self.choice {
            ToolChoice::Named(n) => self.tools.iter().filter(|t| &t.name == n).collect(),
            ToolChoice::None => Vec::new(),
            ToolChoice::Auto | ToolChoice::Required => self.tools.iter().collect(),
        };
        if callable.is_empty() {
            return format!("start: TEXT\n{TEXT}");
        }
        let start = match self.choice {
            ToolChoice::Auto => "start: TEXT | calls | bare\n",
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
            let head = format!("{{\"name\": {name}, \"arguments\": ");
            let args = compact(arguments_schema(&tool.parameters));
            g.push_str(&format!(
                "{rule}: {} %json {args} {}\n",
                literal(&format!("{CALL_OPEN}{head}")),
                literal(&format!("}}{CALL_CLOSE}")),
            ));
            if self.choice == ToolChoice::Auto {
                g.push_str(&format!("bare_{rule}: {} %json {args} \"}}\"\n", literal(&head)));
            }
        }
        if self.choice == ToolChoice::Auto {
            let bare: Vec<String> = names.iter().map(|n| format!("bare_{n}")).collect();
            g.push_str(&format!("bare: {}\n", bare.join(" | ")));
            g.push_str(TEXT_BESIDE_BARE);
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
