//! Chat completions that continue a partial assistant answer: the request's own messages,
//! then an assistant message holding the answer so far (its last piece held back, see
//! [`super::text`]). The provider applies its own chat template, so neither its template nor
//! its tokenizer needs to match the draft's. How the last message is marked differs:
//! - DeepSeek (<https://api-docs.deepseek.com/guides/chat_prefix_completion>, base URL `/beta`)
//!   and Mistral (<https://docs.mistral.ai/api/#tag/chat>): `"prefix": true` on the message;
//! - vLLM (its OpenAI-compatible server's chat parameters): `"continue_final_message": true`
//!   with `"add_generation_prompt": false`;
//! - llama-server: a final assistant message is continued as it is (assistant prefill).

use std::sync::Arc;

use async_trait::async_trait;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::text::{self, OpenText, TextCall, TextChunk, TextPrefix};
use super::{
    Continuation, ContinuationRequest, TargetClient, TargetConfig, TokenStream, get_ok, http_client, join, post_sse, reported_cached_tokens,
};
use crate::error::TargetError;
use crate::tokenizer::Tokenizer;

/// How a `chat_prefix` target is told that the last message is to be continued.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PrefixStyle {
    /// `"prefix": true` on the assistant message (DeepSeek, Mistral).
    #[default]
    Prefix,
    /// `"continue_final_message": true, "add_generation_prompt": false` (vLLM).
    ContinueFinalMessage,
    /// Nothing: the server continues a final assistant message by itself (llama-server).
    Prefill,
}

/// Client for chat completions with a partial assistant message.
#[derive(Debug, Clone)]
pub struct ChatPrefixTarget {
    cfg: TargetConfig,
    http: reqwest::Client,
    tokenizer: Tokenizer,
    style: PrefixStyle,
}

impl ChatPrefixTarget {
    /// A client for `cfg.base_url` (ending in `/v1`, or DeepSeek's `/beta`).
    pub fn new(cfg: TargetConfig, tokenizer: Tokenizer, style: PrefixStyle) -> Result<Self, TargetError> {
        Ok(Self { http: http_client(&cfg)?, cfg, tokenizer, style })
    }

    /// The request body for a prefix.
    fn body(&self, req: &ContinuationRequest, p: &TextPrefix, key: &str) -> Result<Value, TargetError> {
        let messages = req
            .messages
            .as_ref()
            .ok_or_else(|| TargetError::Protocol("a chat_prefix target continues chat requests only (no messages given)".into()))?;
        let mut out: Vec<Value> = messages.iter().map(|m| json!({"role": m.role, "content": m.content})).collect();
        // An empty answer is a plain chat call; some providers refuse an empty prefix.
        if !p.answer.is_empty() {
            let mut last = json!({"role": "assistant", "content": p.answer});
            if self.style == PrefixStyle::Prefix {
                last["prefix"] = json!(true);
            }
            out.push(last);
        }
        let s = req.sampling;
        let mut body = json!({
            "model": req.model.as_deref().unwrap_or(&self.cfg.model),
            "messages": out,
            "max_tokens": req.max_tokens + p.held_back_tokens,
            "temperature": s.temperature.max(0.0),
            "top_p": s.top_p,
            "stream": true,
            "stream_options": {"include_usage": true},
        });
        if self.style == PrefixStyle::ContinueFinalMessage && !p.answer.is_empty() {
            body["continue_final_message"] = json!(true);
            body["add_generation_prompt"] = json!(false);
        }
        if let Some(seed) = s.seed {
            body["seed"] = json!(seed);
        }
        self.cfg.cache_hints.apply_to_body(&mut body, key);
        Ok(body)
    }

    fn call(&self, req: &ContinuationRequest) -> TextCall {
        TextCall { open: self.opener(req), heal: true, echoes: self.style == PrefixStyle::Prefill, template: None }
    }

    fn opener(&self, req: &ContinuationRequest) -> OpenText {
        let this = self.clone();
        let req = req.clone();
        Arc::new(move |p: TextPrefix| {
            let this = this.clone();
            let key = req.cache_key();
            let body = this.body(&req, &p, &key);
            Box::pin(async move {
                let body = body?;
                let header = this.cfg.cache_hints.header(&key);
                let url = join(&this.cfg.base_url, "chat/completions");
                let events = post_sse(&this.http, &this.cfg, &url, &body, header.as_ref()).await?;
                Ok(Box::pin(events.map(|ev| ev.map(|v| piece(&v)))) as text::TextStream)
            })
        })
    }
}

/// One streamed chat event as text: `choices[0].delta.content` (reasoning text, which some
/// providers send beside it, is not part of the answer), its `finish_reason`, and the usage
/// chunk's cached tokens.
fn piece(v: &Value) -> TextChunk {
    let choice = &v["choices"][0];
    TextChunk {
        text: choice["delta"]["content"].as_str().unwrap_or_default().to_string(),
        finished: choice["finish_reason"].as_str().map(|r| r == "stop"),
        cached_prompt_tokens: reported_cached_tokens(&v["usage"]),
    }
}

#[async_trait]
impl TargetClient for ChatPrefixTarget {
    async fn continue_tokens(&self, req: &ContinuationRequest) -> Result<Continuation, TargetError> {
        text::continuation(&self.tokenizer, req, self.call(req)).await
    }

    async fn stream_tokens(&self, req: &ContinuationRequest) -> Result<TokenStream, TargetError> {
        text::token_stream(self.tokenizer.clone(), req, self.call(req)).await
    }

    async fn tokenize(&self, _: &str) -> Result<Option<Vec<u32>>, TargetError> {
        Ok(None)
    }

    async fn health(&self) -> Result<(), TargetError> {
        get_ok(&self.http, &self.cfg, &join(&self.cfg.base_url, "models")).await
    }
}
