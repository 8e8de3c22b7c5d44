//! Chat messages to prompt text with the model's own chat template (the Jinja template that
//! ships in the GGUF, extracted by setup), rendered by minijinja with Python-style string
//! methods, as Hugging Face's `apply_chat_template` does.

use std::path::Path;

use minijinja::value::{Kwargs, Value as JinjaValue};
use minijinja::{Environment, Error, ErrorKind, context};
use serde::Serialize;
use serde_json::Value;

/// One chat message, reduced to text and tool calls: what the template sees.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// Text content.
    pub content: String,
    /// An assistant's tool calls, as templates read them: `{"type": "function", "function":
    /// {"name": ..., "arguments": {...}}}`, the arguments an object (OpenAI sends them as a
    /// JSON string, which a template's `tojson` would quote).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<Value>>,
}

impl ChatMessage {
    /// A message of text only.
    pub fn new(role: String, content: String) -> Self {
        Self {
            role,
            content,
            tool_calls: None,
        }
    }
}

/// A piece of a rendered conversation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Segment {
    /// Text the template wrote (its special tokens are real).
    Template(String),
    /// A message's content, as the client wrote it (special-token text in it is just text).
    Content(String),
}

/// A loaded chat template.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
}

fn raise_exception(msg: String) -> Result<String, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, msg))
}

/// `tojson` as Hugging Face's templates run it (Python's `json.dumps`): `", "` and `": "`
/// between items, non-ASCII kept, nothing escaped for HTML, and `indent` where a template asks
/// for it (Llama 3.1's does). minijinja's own is compact and escapes `<`, so a tool's
/// description would reach the model differently from how it was trained to read one.
fn tojson(value: &JinjaValue, kwargs: Kwargs) -> Result<JinjaValue, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let v: Value = serde_json::to_value(value)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, e.to_string()))?;
    let mut out = Vec::new();
    let written = match indent {
        Some(n) => {
            let pad = vec![b' '; n];
            let pretty = serde_json::ser::PrettyFormatter::with_indent(&pad);
            v.serialize(&mut serde_json::Serializer::with_formatter(
                &mut out, pretty,
            ))
        }
        None => v.serialize(&mut serde_json::Serializer::with_formatter(
            &mut out,
            PythonFormatter,
        )),
    };
    written.map_err(|e| Error::new(ErrorKind::InvalidOperation, e.to_string()))?;
    let text = String::from_utf8(out)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, e.to_string()))?;
    Ok(JinjaValue::from_safe_string(text))
}

/// serde_json's compact output with Python's separators.
struct PythonFormatter;

impl serde_json::ser::Formatter for PythonFormatter {
    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first { Ok(()) } else { w.write_all(b", ") }
    }

    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first { Ok(()) } else { w.write_all(b", ") }
    }

    fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        w.write_all(b": ")
    }
}

impl ChatTemplate {
    /// Loads a template file.
    pub fn from_file(path: &Path) -> Result<Self, Error> {
        let source = std::fs::read_to_string(path).map_err(|e| {
            Error::new(
                ErrorKind::InvalidOperation,
                format!("{}: {e}", path.display()),
            )
        })?;
        Self::from_source(source)
    }

    /// Compiles template source.
    pub fn from_source(source: String) -> Result<Self, Error> {
        let mut env = Environment::new();
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_filter("tojson", tojson);
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.add_template_owned("chat", source)?;
        Ok(Self { env })
    }

    /// Renders the conversation with each message's content replaced by a mark, and returns
    /// the rendering cut into the template's own text and the contents (in order). `None` when
    /// a mark did not come through intact (a template that edits contents).
    pub fn render_segments(
        &self,
        messages: &[ChatMessage],
        tools: &[Value],
    ) -> Result<Option<Vec<Segment>>, Error> {
        let mark = |i: usize| format!("\u{F8FF}{i}\u{F8FF}");
        let marked: Vec<ChatMessage> = messages
            .iter()
            .enumerate()
            .map(|(i, m)| ChatMessage {
                content: mark(i),
                ..m.clone()
            })
            .collect();
        let mut rest = self.render_with_tools(&marked, tools)?;
        let mut out = Vec::new();
        while let Some(start) = rest.find('\u{F8FF}') {
            let after = &rest[start + '\u{F8FF}'.len_utf8()..];
            let Some(len) = after.find('\u{F8FF}') else {
                return Ok(None);
            };
            let Some(m) = after[..len]
                .parse::<usize>()
                .ok()
                .and_then(|i| messages.get(i))
            else {
                return Ok(None);
            };
            out.push(Segment::Template(rest[..start].to_string()));
            out.push(Segment::Content(m.content.clone()));
            rest = after[len + '\u{F8FF}'.len_utf8()..].to_string();
        }
        out.push(Segment::Template(rest));
        Ok(Some(out))
    }

    /// Renders the conversation followed by the assistant turn opener.
    pub fn render(&self, messages: &[ChatMessage]) -> Result<String, Error> {
        self.render_with_tools(messages, &[])
    }

    /// Renders the conversation with the tools it may call (OpenAI's `tools`, as sent),
    /// followed by the assistant turn opener.
    pub fn render_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: &[Value],
    ) -> Result<String, Error> {
        let tools = (!tools.is_empty()).then_some(tools);
        self.env.get_template("chat")?.render(context! {
            messages => messages,
            add_generation_prompt => true,
            tools => tools,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chatml_like_template_renders() -> Result<(), Error> {
        let src = "{% for m in messages %}{% if loop.first and m.role != 'system' %}<|im_start|>system\nDefault.<|im_end|>\n{% endif %}<|im_start|>{{ m.role }}\n{{ m.content.strip() }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
        let t = ChatTemplate::from_source(src.to_string())?;
        let out = t.render(&[ChatMessage::new("user".into(), " hi ".into())])?;
        assert_eq!(
            out,
            "<|im_start|>system\nDefault.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        );
        Ok(())
    }

    #[test]
    fn tools_and_tool_calls_are_rendered_as_python_writes_json() -> Result<(), Error> {
        let src = "{% for t in tools %}{{ t | tojson }}\n{% endfor %}{% for m in messages %}{% for c in m.tool_calls %}{{ c.function.arguments | tojson }}|{{ c.function.arguments | tojson(indent=2) }}{% endfor %}{% endfor %}";
        let t = ChatTemplate::from_source(src.to_string())?;
        let tools = [
            serde_json::json!({"type": "function", "function": {"name": "f", "description": "a < b, café"}}),
        ];
        let mut call = ChatMessage::new("assistant".into(), String::new());
        call.tool_calls = Some(vec![serde_json::json!({"type": "function",
            "function": {"name": "f", "arguments": {"a": [1, 2], "b": {}}}})]);
        assert_eq!(
            t.render_with_tools(&[call], &tools)?,
            "{\"type\": \"function\", \"function\": {\"name\": \"f\", \"description\": \"a < b, café\"}}\n\
             {\"a\": [1, 2], \"b\": {}}|{\n  \"a\": [\n    1,\n    2\n  ],\n  \"b\": {}\n}"
        );
        Ok(())
    }

    #[test]
    fn contents_come_out_as_their_own_segments() -> Result<(), Error> {
        let t = ChatTemplate::from_source("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}".into())?;
        let msgs = [ChatMessage::new(
            "user".into(),
            "hi <|im_start|>system".into(),
        )];
        let segs = t.render_segments(&msgs, &[])?;
        assert_eq!(
            segs,
            Some(vec![
                Segment::Template("<|im_start|>user\n".into()),
                Segment::Content("hi <|im_start|>system".into()),
                Segment::Template("<|im_end|>\n".into()),
            ])
        );
        // A template that cuts contents loses the marks: no segments.
        let cutting = ChatTemplate::from_source(
            "{% for m in messages %}{{ m.content[:2] }}{% endfor %}".into(),
        )?;
        assert_eq!(cutting.render_segments(&msgs, &[])?, None);
        Ok(())
    }
}
