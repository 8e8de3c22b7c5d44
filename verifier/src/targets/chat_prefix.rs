//! Chat completions that continue a partial assistant answer: the request's own messages,
//! then an assistant message holding the answer so far (its last piece held back, see
//! [`super::text`]). The provider applies its own chat template, so neither its template nor
//! its tokenizer needs to match the draft's. How the last message is marked differs:
//! - DeepSeek (<https://api-docs.deepseek.com/guides/chat_prefix_completion>, base URL `/beta`)
//!   and Mistral (<https://docs.mistral.ai/api/#tag/chat>): `"prefix": true` on the message;
//! - vLLM (its OpenAI-compatible server's chat parameters): `"continue_final_message": true`
//!   with `"add_generation_prompt": false`;
//! - llama-server: a final assistant message is continued as it is (assistant prefill).

use serde_json::{Value, json};
use strum::{EnumString, IntoStaticStr, VariantNames};

use super::reported_cached_tokens;
use super::text::{TextChunk, TextPrefix, TextTarget, TextWire};
use super::{ContinuationRequest, TargetConfig};
use crate::error::TargetError;
use crate::tokenizer::Tokenizer;

/// How a `chat_prefix` target is told that the last message is to be continued.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, EnumString, IntoStaticStr, VariantNames)]
#[strum(serialize_all = "snake_case")]
pub enum PrefixStyle {
    /// `"prefix": true` on the assistant message (DeepSeek, Mistral).
    #[default]
    Prefix,
    /// `"continue_final_message": true, "add_generation_prompt": false` (vLLM).
    ContinueFinalMessage,
    /// Nothing: the server continues a final assistant message by itself (llama-server).
    Prefill,
}

impl PrefixStyle {
    /// The style a policy names (one of its snake_case names).
    pub fn parse(name: &str) -> Result<Self, String> {
        name.parse().map_err(|_| {
            format!(
                "{name:?} is not one of {}",
                super::kind::quoted(Self::VARIANTS)
            )
        })
    }
}

/// Chat completions with a partial assistant message, marked in one [`PrefixStyle`].
#[derive(Debug, Clone)]
pub struct ChatPrefix {
    style: PrefixStyle,
}

/// Client for chat completions with a partial assistant message.
pub type ChatPrefixTarget = TextTarget<ChatPrefix>;

impl TextTarget<ChatPrefix> {
    /// A client for `cfg.base_url` (ending in `/v1`, or DeepSeek's `/beta`).
    pub fn new(
        cfg: TargetConfig,
        tokenizer: Tokenizer,
        style: PrefixStyle,
    ) -> Result<Self, TargetError> {
        Self::with_wire(cfg, tokenizer, ChatPrefix { style })
    }
}

impl TextWire for ChatPrefix {
    const PATH: &'static str = "chat/completions";

    fn fields(
        &self,
        req: &ContinuationRequest,
        p: &TextPrefix,
        body: &mut Value,
    ) -> Result<(), TargetError> {
        let messages = req.messages.as_ref().ok_or_else(|| {
            TargetError::Protocol(
                "a chat_prefix target continues chat requests only (no messages given)".into(),
            )
        })?;
        let mut out: Vec<Value> = messages
            .iter()
            .map(|m| json!({"role": m.role, "content": m.content}))
            .collect();
        // An empty answer is a plain chat call; some providers refuse an empty prefix.
        if !p.answer.is_empty() {
            let mut last = json!({"role": "assistant", "content": p.answer});
            if self.style == PrefixStyle::Prefix {
                last["prefix"] = json!(true);
            }
            out.push(last);
            if self.style == PrefixStyle::ContinueFinalMessage {
                body["continue_final_message"] = json!(true);
                body["add_generation_prompt"] = json!(false);
            }
        }
        body["messages"] = json!(out);
        Ok(())
    }

    /// `choices[0].delta.content` (reasoning text, which some providers send beside it, is not
    /// part of the answer), its `finish_reason`, and the usage chunk's cached tokens.
    fn piece(v: &Value) -> TextChunk {
        let choice = &v["choices"][0];
        TextChunk {
            text: choice["delta"]["content"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            finished: choice["finish_reason"].as_str().map(|r| r == "stop"),
            cached_prompt_tokens: reported_cached_tokens(&v["usage"]),
        }
    }

    fn echoes(&self) -> bool {
        self.style == PrefixStyle::Prefill
    }
}
