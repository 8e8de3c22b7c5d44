//! The OpenAI request shapes a target answers with a 500 rather than a 400 when they are
//! wrong: tools and functions, `tool_choice`, a message's content parts and an assistant's
//! tool calls. llama-server does so for a tool without a function, a function without a
//! name, an `input_audio` part to a model without audio and tool-call arguments that are not
//! JSON; passed on, the client's mistake would read as the target failing (a 502, counted
//! against the target, setting off its alert). Checked here on every path, it is the client's
//! 400 naming the field. The shapes are those of OpenAI's Chat Completions reference
//! (`ChatCompletionTool`, `ChatCompletionRequestMessageContentPart*`,
//! `ChatCompletionMessageToolCall`); a field the reference makes optional is checked only when
//! it is there.

use serde_json::{Map, Value};

use super::error::ValidationError;

/// Longest function name (OpenAI's bound; its pattern is `^[a-zA-Z0-9_-]{1,64}$`).
pub const MAX_FUNCTION_NAME: usize = 64;

fn invalid(param: String, reason: &str) -> ValidationError {
    ValidationError::Invalid {
        param,
        reason: reason.into(),
    }
}

/// A field that is there and not null.
fn present<'a>(v: &'a Value, field: &str) -> Option<&'a Value> {
    v.get(field).filter(|v| !v.is_null())
}

/// Checks every shape of the module documentation in a chat or completions body.
pub fn check(body: &Map<String, Value>) -> Result<(), ValidationError> {
    each(
        body.get("tools"),
        "tools",
        "must be an array of tool objects",
        tool,
    )?;
    each(
        body.get("functions"),
        "functions",
        "must be an array of function objects",
        function,
    )?;
    if let Some(choice) = body.get("tool_choice").filter(|v| !v.is_null()) {
        tool_choice(choice)?;
    }
    if let Some(Value::Array(messages)) = body.get("messages") {
        for (i, m) in messages.iter().enumerate() {
            message(m, &format!("messages[{i}]"))?;
        }
    }
    Ok(())
}

/// Each item of the array `v`, named `at`, checked by `check`, where `v` is there and not null;
/// `not_array` is the reason when it is not an array.
fn each(
    v: Option<&Value>,
    at: &str,
    not_array: &str,
    check: fn(&Value, &str) -> Result<(), ValidationError>,
) -> Result<(), ValidationError> {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(());
    };
    let items = v.as_array().ok_or_else(|| invalid(at.into(), not_array))?;
    items
        .iter()
        .enumerate()
        .try_for_each(|(i, item)| check(item, &format!("{at}[{i}]")))
}

/// `{"type": "function", "function": {...}}`, or a custom tool `{"type": "custom",
/// "custom": {"name": ...}}`.
fn tool(t: &Value, at: &str) -> Result<(), ValidationError> {
    if !t.is_object() {
        return Err(invalid(at.into(), "must be a tool object"));
    }
    match t["type"].as_str() {
        Some("function") => match present(t, "function") {
            Some(f) => function(f, &format!("{at}.function")),
            None => Err(invalid(
                format!("{at}.function"),
                "is required for a tool of type \"function\"",
            )),
        },
        Some("custom") => match present(t, "custom") {
            Some(c) if c.is_object() => name(c, &format!("{at}.custom")),
            _ => Err(invalid(
                format!("{at}.custom"),
                "must be an object for a tool of type \"custom\"",
            )),
        },
        Some(_) => Err(invalid(
            format!("{at}.type"),
            "must be \"function\" or \"custom\"",
        )),
        None => Err(invalid(format!("{at}.type"), "is required")),
    }
}

/// A function definition: `name`, and `description` and `parameters` where given.
fn function(f: &Value, at: &str) -> Result<(), ValidationError> {
    if !f.is_object() {
        return Err(invalid(at.into(), "must be a function object"));
    }
    name(f, at)?;
    if present(f, "description").is_some_and(|d| !d.is_string()) {
        return Err(invalid(format!("{at}.description"), "must be a string"));
    }
    if present(f, "parameters").is_some_and(|p| !p.is_object()) {
        return Err(invalid(
            format!("{at}.parameters"),
            "must be a JSON Schema object",
        ));
    }
    Ok(())
}

/// The `name` of a function or custom tool at `at`.
fn name(v: &Value, at: &str) -> Result<(), ValidationError> {
    let ok = v["name"].as_str().is_some_and(|n| {
        !n.is_empty()
            && n.len() <= MAX_FUNCTION_NAME
            && n.bytes()
                .all(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b'-')
    });
    if ok {
        Ok(())
    } else {
        Err(invalid(
            format!("{at}.name"),
            "is required: 1 to 64 letters, digits, underscores or dashes",
        ))
    }
}

/// `"none"`, `"auto"`, `"required"`, or an object naming a function.
fn tool_choice(choice: &Value) -> Result<(), ValidationError> {
    match choice {
        Value::String(s) if matches!(s.as_str(), "none" | "auto" | "required") => Ok(()),
        Value::String(_) => Err(invalid(
            "tool_choice".into(),
            "must be \"none\", \"auto\", \"required\" or an object naming a tool",
        )),
        Value::Object(_) => match choice["type"].as_str() {
            Some("function") => match present(choice, "function") {
                Some(f) if f.is_object() => name(f, "tool_choice.function"),
                _ => Err(invalid(
                    "tool_choice.function".into(),
                    "must be an object with the function's name",
                )),
            },
            Some("custom") => match present(choice, "custom") {
                Some(c) if c.is_object() => name(c, "tool_choice.custom"),
                _ => Err(invalid(
                    "tool_choice.custom".into(),
                    "must be an object with the tool's name",
                )),
            },
            // Newer choices (`allowed_tools`) are the target's to judge.
            Some(_) => Ok(()),
            None => Err(invalid("tool_choice.type".into(), "is required")),
        },
        _ => Err(invalid(
            "tool_choice".into(),
            "must be a string or an object",
        )),
    }
}

/// One chat message: its content parts and, on an assistant's, its tool calls. Roles and
/// plain contents are the typed parse's (`validate`) or the target's to judge.
fn message(m: &Value, at: &str) -> Result<(), ValidationError> {
    if let Some(Value::Array(parts)) = m.get("content") {
        for (j, p) in parts.iter().enumerate() {
            part(p, &format!("{at}.content[{j}]"))?;
        }
    }
    each(
        m.get("tool_calls"),
        &format!("{at}.tool_calls"),
        "must be an array of tool calls",
        tool_call,
    )
}

/// A content part: `text`, `image_url`, `input_audio`, `file` or `refusal`, each with its
/// own object.
fn part(p: &Value, at: &str) -> Result<(), ValidationError> {
    let string_at = |field: &str| p[field].is_string();
    let ok = match p["type"].as_str() {
        Some("text") => string_at("text"),
        Some("refusal") => string_at("refusal"),
        Some("image_url") => p["image_url"]["url"].is_string(),
        Some("input_audio") => {
            p["input_audio"]["data"].is_string() && p["input_audio"]["format"].is_string()
        }
        Some("file") => p["file"].is_object(),
        Some(_) => {
            return Err(invalid(
                format!("{at}.type"),
                "must be \"text\", \"image_url\", \"input_audio\", \"file\" or \"refusal\"",
            ));
        }
        None => return Err(invalid(format!("{at}.type"), "is required")),
    };
    if ok {
        Ok(())
    } else {
        Err(invalid(
            at.into(),
            "does not have the fields its type needs (text: `text`; image_url: `image_url.url`; input_audio: `input_audio.data` and `.format`; file: `file`)",
        ))
    }
}

/// An assistant's tool call: an id, and a function with a name and arguments that are a JSON
/// text (the target parses them to render the conversation).
fn tool_call(c: &Value, at: &str) -> Result<(), ValidationError> {
    if !c.is_object() {
        return Err(invalid(at.into(), "must be a tool call object"));
    }
    if !c["id"].is_string() {
        return Err(invalid(
            format!("{at}.id"),
            "is required and must be a string",
        ));
    }
    if present(c, "type").is_some_and(|t| t.as_str() != Some("function")) {
        return Err(invalid(format!("{at}.type"), "must be \"function\""));
    }
    let f = &c["function"];
    if !f.is_object() {
        return Err(invalid(format!("{at}.function"), "is required"));
    }
    if f["name"].as_str().is_none_or(str::is_empty) {
        return Err(invalid(format!("{at}.function.name"), "is required"));
    }
    let Some(args) = f["arguments"].as_str() else {
        return Err(invalid(
            format!("{at}.function.arguments"),
            "must be a string holding JSON",
        ));
    };
    if serde_json::from_str::<serde::de::IgnoredAny>(args).is_err() {
        return Err(invalid(
            format!("{at}.function.arguments"),
            "must be valid JSON",
        ));
    }
    Ok(())
}

/// Whether a chat message holds a part of one of `types` (`image_url`, `input_audio`).
pub fn has_part(body: &Map<String, Value>, types: &[&str]) -> bool {
    body.get("messages")
        .and_then(Value::as_array)
        .is_some_and(|ms| {
            ms.iter().any(|m| {
                m["content"].as_array().is_some_and(|parts| {
                    parts
                        .iter()
                        .any(|p| p["type"].as_str().is_some_and(|t| types.contains(&t)))
                })
            })
        })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn refused(body: Value) -> Option<String> {
        let Value::Object(m) = body else {
            panic!("not an object")
        };
        check(&m).err().and_then(|e| e.param())
    }

    fn user(content: Value) -> Value {
        json!({"messages": [{"role": "user", "content": content}]})
    }

    #[test]
    fn the_shapes_a_target_would_answer_with_a_500_are_the_clients_400() {
        let assistant = |call: Value| {
            json!({"messages": [{"role": "user", "content": "hi"},
                                {"role": "assistant", "content": null, "tool_calls": [call]}]})
        };
        for (body, param) in [
            // The five shapes llama-server answered with a 500 before they were checked here.
            (
                json!({"tools": [{"type": "function"}]}),
                "tools[0].function",
            ),
            (
                json!({"tools": [{"type": "function", "function": "x"}]}),
                "tools[0].function",
            ),
            (
                json!({"tools": [{"type": "function", "function": {"description": "d"}}]}),
                "tools[0].function.name",
            ),
            (
                user(json!([{"type": "input_audio", "input_audio": "x"}])),
                "messages[0].content[0]",
            ),
            (
                assistant(
                    json!({"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{not json"}}),
                ),
                "messages[1].tool_calls[0].function.arguments",
            ),
            // And their neighbours.
            (json!({"tools": "x"}), "tools"),
            (json!({"tools": [{"function": {}}]}), "tools[0].type"),
            (json!({"tools": [{"type": "retrieval"}]}), "tools[0].type"),
            (
                json!({"tools": [{"type": "function", "function": {"name": "has space"}}]}),
                "tools[0].function.name",
            ),
            (
                json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": "{}"}}]}),
                "tools[0].function.parameters",
            ),
            (
                json!({"functions": [{"parameters": {}}]}),
                "functions[0].name",
            ),
            (json!({"tool_choice": "sometimes"}), "tool_choice"),
            (
                json!({"tool_choice": {"type": "function"}}),
                "tool_choice.function",
            ),
            (json!({"tool_choice": 3}), "tool_choice"),
            (
                user(json!([{"text": "no type"}])),
                "messages[0].content[0].type",
            ),
            (
                user(json!([{"type": "video"}])),
                "messages[0].content[0].type",
            ),
            (user(json!([{"type": "text"}])), "messages[0].content[0]"),
            (
                user(json!([{"type": "image_url", "image_url": {}}])),
                "messages[0].content[0]",
            ),
            (
                assistant(
                    json!({"type": "function", "function": {"name": "f", "arguments": "{}"}}),
                ),
                "messages[1].tool_calls[0].id",
            ),
            (
                assistant(json!({"id": "c", "function": {"name": "f", "arguments": {"a": 1}}})),
                "messages[1].tool_calls[0].function.arguments",
            ),
        ] {
            assert_eq!(refused(body.clone()).as_deref(), Some(param), "{body}");
        }
    }

    #[test]
    fn well_formed_requests_pass() {
        for body in [
            json!({}),
            json!({"tools": null, "tool_choice": null}),
            json!({"tools": [{"type": "function", "function": {"name": "get_weather", "description": "d",
                               "parameters": {"type": "object"}}}], "tool_choice": "auto"}),
            json!({"tool_choice": {"type": "function", "function": {"name": "f"}}}),
            json!({"tool_choice": {"type": "allowed_tools", "allowed_tools": {}}}),
            json!({"functions": [{"name": "f"}]}),
            user(json!("plain text")),
            user(json!([{"type": "text", "text": "a"},
                        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                        {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}])),
            json!({"messages": [{"role": "assistant", "content": null, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"a\": 1}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "42"}]}),
        ] {
            assert_eq!(refused(body.clone()), None, "{body}");
        }
    }

    #[test]
    fn media_parts_are_found_by_type() {
        let Value::Object(m) = user(json!([{"type": "input_audio", "input_audio": {}}])) else {
            panic!()
        };
        assert!(has_part(&m, &["input_audio"]));
        assert!(!has_part(&m, &["image_url", "input_image"]));
    }
}
