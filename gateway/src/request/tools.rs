//! `tools`, `tool_choice` and `parallel_tool_calls`: what approxy answers under a tool-call
//! grammar, and what it leaves to the target. Their shapes were checked on every path
//! (`shapes`); here they are read.
//!
//! approxy answers function tools with any `tool_choice` of the reference: `auto`,
//! `required`, `none` or a named function. It passes through custom tools, the legacy
//! `functions`, a `tool_choice` it does not read (`allowed_tools`) or that names a tool the
//! request lacks (the target's 400 to give), and tools asked for together with a
//! `response_format`.

use approxy_verifier::request::{Tool, ToolChoice, ToolsSpec};
use serde_json::{Map, Value};

use super::limits::present as given;

/// What a request asks of tools.
#[derive(Debug, Clone, PartialEq)]
pub enum Tooling {
    /// No tools.
    Absent,
    /// Tools approxy answers under a grammar: the tools as sent (the chat template renders
    /// them) and the grammar's spec.
    Calls {
        /// `tools`, as sent.
        tools: Vec<Value>,
        /// The grammar's spec.
        spec: ToolsSpec,
    },
    /// Tools approxy leaves to the target.
    Unsupported,
}

/// Reads the request's tools.
pub fn read(body: &Map<String, Value>) -> Tooling {
    if given(body, "functions").is_some() || given(body, "function_call").is_some() {
        return Tooling::Unsupported;
    }
    let tools = match given(body, "tools") {
        None => &[][..],
        Some(Value::Array(a)) => a.as_slice(),
        Some(_) => return Tooling::Unsupported,
    };
    let choice = match given(body, "tool_choice") {
        None => ToolChoice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            "none" => ToolChoice::None,
            _ => return Tooling::Unsupported,
        },
        Some(Value::Object(c)) if c.get("type").and_then(Value::as_str) == Some("function") => {
            match c
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
            {
                Some(n) => ToolChoice::Named(n.to_string()),
                None => return Tooling::Unsupported,
            }
        }
        Some(_) => return Tooling::Unsupported,
    };
    if tools.is_empty() {
        // No tool to call: `none` and `auto` ask nothing; `required` or a name cannot be met.
        return match choice {
            ToolChoice::Auto | ToolChoice::None => Tooling::Absent,
            _ => Tooling::Unsupported,
        };
    }
    let parallel = match given(body, "parallel_tool_calls") {
        None => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Tooling::Unsupported,
    };
    let mut read = Vec::with_capacity(tools.len());
    for t in tools {
        let (Some("function"), Some(f)) =
            (t.get("type").and_then(Value::as_str), t.get("function"))
        else {
            return Tooling::Unsupported;
        };
        let Some(name) = f.get("name").and_then(Value::as_str) else {
            return Tooling::Unsupported;
        };
        read.push(Tool {
            name: name.to_string(),
            parameters: f.get("parameters").cloned().unwrap_or(Value::Null),
        });
    }
    if let ToolChoice::Named(n) = &choice
        && !read.iter().any(|t| &t.name == n)
    {
        return Tooling::Unsupported;
    }
    Tooling::Calls {
        tools: tools.to_vec(),
        spec: ToolsSpec {
            tools: read,
            choice,
            parallel,
        },
    }
}

/// Whether the conversation's messages carry tool traffic: tool results or an assistant's
/// tool calls (the tools offered are [`read`]'s).
pub fn in_messages(body: &Map<String, Value>) -> bool {
    let traffic = |m: &Value| {
        matches!(
            m.get("role").and_then(Value::as_str),
            Some("tool" | "function")
        ) || m.get("tool_calls").is_some_and(|c| !c.is_null())
    };
    body.get("messages")
        .and_then(Value::as_array)
        .is_some_and(|ms| ms.iter().any(traffic))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn of(v: Value) -> Tooling {
        match v {
            Value::Object(m) => read(&m),
            _ => Tooling::Unsupported,
        }
    }

    fn weather() -> Value {
        json!({"type": "function", "function": {"name": "get_weather",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}})
    }

    fn choice_of(v: Value) -> Option<(ToolChoice, bool)> {
        match of(v) {
            Tooling::Calls { spec, .. } => Some((spec.choice, spec.parallel)),
            _ => None,
        }
    }

    #[test]
    fn every_choice_of_the_reference_is_read() {
        let tools = json!([weather()]);
        assert_eq!(
            choice_of(json!({"tools": tools})),
            Some((ToolChoice::Auto, true))
        );
        assert_eq!(
            choice_of(
                json!({"tools": tools, "tool_choice": "required", "parallel_tool_calls": false})
            ),
            Some((ToolChoice::Required, false))
        );
        assert_eq!(
            choice_of(json!({"tools": tools, "tool_choice": "none"})),
            Some((ToolChoice::None, true))
        );
        assert_eq!(
            choice_of(json!({"tools": tools,
                "tool_choice": {"type": "function", "function": {"name": "get_weather"}}})),
            Some((ToolChoice::Named("get_weather".into()), true))
        );
        assert_eq!(of(json!({})), Tooling::Absent);
        assert_eq!(
            of(json!({"tools": [], "tool_choice": "none"})),
            Tooling::Absent
        );
    }

    #[test]
    fn what_approxy_does_not_answer_is_the_targets() {
        let tools = json!([weather()]);
        for v in [
            json!({"tools": tools, "tool_choice": {"type": "function", "function": {"name": "other"}}}),
            json!({"tools": tools, "tool_choice": {"type": "allowed_tools", "allowed_tools": {}}}),
            json!({"tools": [{"type": "custom", "custom": {"name": "x"}}]}),
            json!({"functions": [{"name": "f"}]}),
            json!({"tool_choice": "required"}),
        ] {
            assert_eq!(of(v.clone()), Tooling::Unsupported, "{v}");
        }
    }

    #[test]
    fn tool_traffic_is_seen_in_the_messages_too() {
        let involved_in = |v: Value| match v {
            Value::Object(m) => in_messages(&m) || read(&m) != Tooling::Absent,
            _ => false,
        };
        assert!(!involved_in(
            json!({"messages": [{"role": "user", "content": "a"}]})
        ));
        assert!(involved_in(
            json!({"messages": [{"role": "tool", "content": "4", "tool_call_id": "c"}]})
        ));
        assert!(involved_in(json!({"messages": [], "tools": [weather()]})));
    }
}
