//! Chat messages to prompt text with the model's own chat template (the Jinja template that
//! ships in the GGUF, extracted by setup), rendered by minijinja with Python-style string
//! methods, as Hugging Face's `apply_chat_template` does.

use std::path::Path;

use minijinja::{Environment, Error, ErrorKind, context};
use serde::Serialize;

/// One chat message, reduced to text: what the template sees.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChatMessage {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// Text content.
    pub content: String,
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
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.add_template_owned("chat", source)?;
        Ok(Self { env })
    }

    /// Renders the conversation with each message's content replaced by a mark, and returns
    /// the rendering cut into the template's own text and the contents (in order). `None` when
    /// a mark did not come through intact (a template that edits contents).
    pub fn render_segments(&self, messages: &[ChatMessage]) -> Result<Option<Vec<Segment>>, Error> {
        let mark = |i: usize| format!("\u{F8FF}{i}\u{F8FF}");
        let marked: Vec<ChatMessage> = messages
            .iter()
            .enumerate()
            .map(|(i, m)| ChatMessage {
                role: m.role.clone(),
                content: mark(i),
            })
            .collect();
        let mut rest = self.render(&marked)?;
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
        self.env.get_template("chat")?.render(context! {
            messages => messages,
            add_generation_prompt => true,
            tools => (),
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
        let out = t.render(&[ChatMessage {
            role: "user".into(),
            content: " hi ".into(),
        }])?;
        assert_eq!(
            out,
            "<|im_start|>system\nDefault.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        );
        Ok(())
    }

    #[test]
    fn contents_come_out_as_their_own_segments() -> Result<(), Error> {
        let t = ChatTemplate::from_source("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}".into())?;
        let msgs = [ChatMessage {
            role: "user".into(),
            content: "hi <|im_start|>system".into(),
        }];
        let segs = t.render_segments(&msgs)?;
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
        assert_eq!(cutting.render_segments(&msgs)?, None);
        Ok(())
    }
}
