//! Request checking, in the spirit of TGI's `validation.rs`: the limits every chat and
//! completions request is held to whichever path serves it (`limits`, with the OpenAI shapes a
//! target would answer with a 500 in `shapes`), the features the draft
//! loop lacks (`unsupported`), `response_format` (`format`), tools (`tools`), validation of a request approxy answers (`validate`, with its
//! one error type in `error`), and whether it is about code or chat (`prompt_kind`).
//!
//! Here: the OpenAI request bodies approxy can answer itself, as typed structs, and the prompt
//! they carry. One struct serves both `/v1/chat/completions` (`messages`) and
//! `/v1/completions` (`prompt`); fields approxy does not use are kept in `extra`, never
//! dropped. Only the approximate path parses into these: a request that passes through
//! reaches the target as the client wrote it.

pub mod error;
pub mod format;
pub mod limits;
pub mod prompt_kind;
pub mod shapes;
pub mod tools;
pub mod unsupported;
pub mod validate;

use approxy_verifier::request::ChatMessage;
use serde::Deserialize;
use serde_json::{Map, Value};

/// Header for a per-request threshold within the policy's allowed range.
pub const THRESHOLD_HEADER: &str = "x-approxy-threshold";

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

/// What the model is asked to continue.
#[derive(Debug, Clone)]
pub enum Prompt {
    /// Chat messages (rendered with the chat template).
    Chat(Vec<ChatMessage>),
    /// A completion prompt as text.
    Text(String),
    /// A completion prompt as token ids.
    Tokens(Vec<u32>),
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
        assert_eq!(
            r.messages.as_ref().map(|m| m[0].extra.contains_key("name")),
            Some(true)
        );
        assert_eq!(r.temperature, Some(0.5));
        Ok(())
    }

    #[test]
    fn type_errors_name_the_field() {
        let at = |v: Value| parse(&v).err().map(|e| e.0);
        assert_eq!(
            at(serde_json::json!({"model": "m", "temperature": "hot"})),
            Some("temperature".into())
        );
        assert_eq!(
            at(serde_json::json!({"model": "m", "max_tokens": -1})),
            Some("max_tokens".into())
        );
        assert_eq!(
            at(serde_json::json!({"model": "m", "messages": [{"content": "x"}]})),
            Some("messages[0]".into())
        );
        assert_eq!(
            at(serde_json::json!({"model": "m", "prompt": 42})),
            Some("prompt".into())
        );
        assert_eq!(at(serde_json::json!({"messages": []})), Some(".".into()));
    }
}

/// Property tests (a fixed budget in every test run): any JSON a client sends is parsed and
/// validated without a panic, into a request or an error that names a field.
#[cfg(test)]
mod properties {
    use proptest::prelude::*;
    use serde_json::{Map, json};

    use super::*;

    /// JSON values with the request's field names (so the parser gets past the outer layer),
    /// and arbitrary values beneath them.
    fn value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(Value::from),
            "\\PC{0,12}".prop_map(Value::from),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
                proptest::collection::btree_map(
                    proptest::sample::select(vec!["role", "content", "type", "text", "model", "x"])
                        .prop_map(str::to_string),
                    inner,
                    0..4
                )
                .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(approxy_verifier::testing::property_cases(1024)))]
        #[test]
        fn any_body_parses_or_names_a_field(
            fields in proptest::collection::btree_map(
                proptest::sample::select(vec!["model", "messages", "prompt", "max_tokens", "max_completion_tokens", "temperature", "top_p", "seed", "stop", "stream", "stream_options", "n", "tools", "tool_choice", "functions", "top_logprobs", "logprobs", "other"]),
                value(),
                0..8,
            ),
            chat in any::<bool>(),
        ) {
            let mut body = Map::new();
            body.insert("model".into(), json!("m"));
            for (k, v) in fields {
                body.insert(k.to_string(), v);
            }
            // The limits every path has: within them or refused naming a field; never a panic.
            let gw = crate::policy::Policy::parse("[target]\nkind = \"llama_cpp\"\nbase_url = \"http://h:1\"\n[gateway]\nauth = \"none\"\n", std::path::Path::new("/p.toml"))
                .map(|p| p.gateway);
            prop_assert!(gw.is_ok());
            if let Ok(gw) = &gw {
                let endpoint = if chat { Endpoint::Chat } else { Endpoint::Completions };
                if let Err(e) = limits::check(endpoint, &body, gw) {
                    prop_assert!(e.param().is_some(), "{e}");
                }
                let _ = limits::special_token_text(&body, &["<|im_start|>".to_string()]);
            }
            let body = Value::Object(body);
            match parse(&body) {
                Err((path, reason)) => prop_assert!(!path.is_empty() && !reason.is_empty()),
                Ok(typed) => {
                    let endpoint = if chat { Endpoint::Chat } else { Endpoint::Completions };
                    let gw = crate::policy::Policy::parse("[target]\nkind = \"llama_cpp\"\nbase_url = \"http://h:1\"\n[gateway]\nauth = \"none\"\n", std::path::Path::new("/p.toml"))
                        .map(|p| p.gateway);
                    prop_assert!(gw.is_ok());
                    if let Ok(gw) = gw {
                        // Either a valid request or an error; never a panic.
                        let _ = validate::validate(endpoint, typed, &gw);
                    }
                }
            }
        }
    }
}
