//! The OpenAI request bodies approxy can answer itself, as typed structs. One struct serves
//! both `/v1/chat/completions` (`messages`) and `/v1/completions` (`prompt`); fields approxy
//! does not use are kept in `extra`, never dropped. Only the approximate path parses into
//! these: a request that passes through reaches the target as the client wrote it.

use serde::Deserialize;
use serde_json::{Map, Value};

/// Which endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `/v1/chat/completions`.
    Chat,
    /// `/v1/completions`.
    Completions,
}

impl Endpoint {
    /// The field that carries the prompt.
    pub fn prompt_field(self) -> &'static str {
        match self {
            Endpoint::Chat => "messages",
            Endpoint::Completions => "prompt",
        }
    }
}

/// A chat or completion request.
#[derive(Debug, Clone, Deserialize)]
pub struct GenerationRequest {
    /// Model id.
    pub model: String,
    /// Chat: the conversation.
    pub messages: Option<Vec<Message>>,
    /// Completions: the prompt.
    pub prompt: Option<PromptInput>,
    /// Generation limit.
    pub max_tokens: Option<u32>,
    /// Chat: OpenAI's newer name for `max_tokens` (wins when both are given).
    pub max_completion_tokens: Option<u32>,
    /// Sampling temperature.
    pub temperature: Option<f32>,
    /// Nucleus sampling.
    pub top_p: Option<f32>,
    /// Sampling seed.
    pub seed: Option<i64>,
    /// Server-sent events.
    pub stream: Option<bool>,
    /// Streaming options.
    pub stream_options: Option<StreamOptions>,
    /// Stop strings.
    pub stop: Option<Stop>,
    /// Everything else, as sent.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// `stream_options`.
#[derive(Debug, Clone, Deserialize)]
pub struct StreamOptions {
    /// Send a last chunk with `usage`.
    pub include_usage: Option<bool>,
    /// Everything else, as sent.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// `stop`: one string or several.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    /// One.
    One(String),
    /// Several.
    Many(Vec<String>),
}

/// One chat message.
#[derive(Debug, Clone, Deserialize)]
pub struct Message {
    /// `system`, `developer`, `user`, `assistant`, `tool` or `function`.
    pub role: String,
    /// Text, or content parts; may be absent on an assistant message.
    pub content: Option<Content>,
    /// Everything else, as sent.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// Message content.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Content {
    /// Plain text.
    Text(String),
    /// Typed parts (`{"type": "text", "text": ...}`, images, ...).
    Parts(Vec<ContentPart>),
}

/// One content part.
#[derive(Debug, Clone, Deserialize)]
pub struct ContentPart {
    /// `text`, `image_url`, ...
    #[serde(rename = "type")]
    pub kind: String,
    /// The text of a `text` part.
    pub text: Option<String>,
    /// Everything else, as sent.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// A completion prompt approxy can continue: one text or one list of token ids.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum PromptInput {
    /// Text.
    Text(String),
    /// Token ids.
    Tokens(Vec<u32>),
    /// A list of texts (approxy continues it when it holds exactly one).
    Texts(Vec<String>),
}

/// Parses a body into the typed request; the error names the field (`messages[0].role`).
pub fn parse(body: &Value) -> Result<GenerationRequest, (String, String)> {
    serde_path_to_error::deserialize(body).map_err(|e| {
        let path = e.path().to_string();
        (path, e.into_inner().to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_fields_are_kept() -> Result<(), (String, String)> {
        let body = serde_json::json!({"model": "m", "messages": [{"role": "user", "content": "hi", "name": "x"}], "user": "u-1", "temperature": 0.5});
        let r = parse(&body)?;
        assert_eq!(r.extra.get("user"), Some(&Value::from("u-1")));
        assert_eq!(r.messages.as_ref().map(|m| m[0].extra.contains_key("name")), Some(true));
        assert_eq!(r.temperature, Some(0.5));
        Ok(())
    }

    #[test]
    fn type_errors_name_the_field() {
        let at = |v: Value| parse(&v).err().map(|e| e.0);
        assert_eq!(at(serde_json::json!({"model": "m", "temperature": "hot"})), Some("temperature".into()));
        assert_eq!(at(serde_json::json!({"model": "m", "max_tokens": -1})), Some("max_tokens".into()));
        assert_eq!(at(serde_json::json!({"model": "m", "messages": [{"content": "x"}]})), Some("messages[0]".into()));
        assert_eq!(at(serde_json::json!({"model": "m", "prompt": 42})), Some("prompt".into()));
        assert_eq!(at(serde_json::json!({"messages": []})), Some(".".into()));
    }
}
