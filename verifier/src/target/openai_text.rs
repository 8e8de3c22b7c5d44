//! OpenAI-compatible `POST /v1/completions` with a *text* prompt: Together, OpenRouter,
//! DeepSeek's beta completions, TGI, llama-server, any OpenAI-compatible completions server
//! (wire format: <https://platform.openai.com/docs/api-reference/completions/create>). The
//! prompt is the draft's rendering of the chat template followed by the answer so far, with
//! the answer's last piece held back ([`super::text`]); the text that comes back is
//! re-tokenized with the draft's tokenizer, so the target's own tokenizer does not matter.

use std::sync::Arc;

use async_trait::async_trait;
use futures::StreamExt;
use serde_json::{Value, json};

use super::text::{self, OpenText, TextCall, TextChunk, TextPrefix};
use super::{
    Continuation, ContinuationRequest, TargetClient, TargetConfig, TokenStream, get_ok, http_client, join, post_sse, reported_cached_tokens,
};
use crate::error::TargetError;
use crate::template::ChatTemplate;
use crate::tokenizer::Tokenizer;

/// Client for text completions.
#[derive(Debug, Clone)]
pub struct OpenAiTextTarget {
    cfg: TargetConfig,
    http: reqwest::Client,
    tokenizer: Tokenizer,
    template: Option<Arc<ChatTemplate>>,
}

impl OpenAiTextTarget {
    /// A client for `cfg.base_url` (ending in `/v1`) that re-tokenizes with `tokenizer`.
    pub fn new(cfg: TargetConfig, tokenizer: Tokenizer) -> Result<Self, TargetError> {
        Ok(Self { http: http_client(&cfg)?, cfg, tokenizer, template: None })
    }

    /// Renders chat prompts with the target's own chat template rather than the draft's (a
    /// target of another model family).
    pub fn with_template(mut self, template: Option<Arc<ChatTemplate>>) -> Self {
        self.template = template;
        self
    }

    /// One call per prefix, always streamed (a non-streamed continuation collects it): the
    /// healing check then stops a diverging answer at its first characters.
    fn call(&self, req: &ContinuationRequest) -> TextCall {
        TextCall { open: self.opener(req), heal: true, echoes: false, template: self.template.clone() }
    }

    fn opener(&self, req: &ContinuationRequest) -> OpenText {
        let this = self.clone();
        let s = req.sampling;
        let model = req.model.clone().unwrap_or_else(|| self.cfg.model.clone());
        let max_tokens = req.max_tokens;
        let key = req.cache_key();
        Arc::new(move |p: TextPrefix| {
            let this = this.clone();
            let mut body = json!({
                "model": model,
                "prompt": format!("{}{}", p.prompt, p.answer),
                // The held-back piece is written again; allow for it.
                "max_tokens": max_tokens + p.held_back_tokens,
                "temperature": s.temperature.max(0.0),
                "top_p": s.top_p,
                "stream": true,
                "stream_options": {"include_usage": true},
            });
            if let Some(seed) = s.seed {
                body["seed"] = json!(seed);
            }
            this.cfg.cache_hints.apply_to_body(&mut body, &key);
            let header = this.cfg.cache_hints.header(&key);
            Box::pin(async move {
                let url = join(&this.cfg.base_url, "completions");
                let events = post_sse(&this.http, &this.cfg, &url, &body, header.as_ref()).await?;
                Ok(Box::pin(events.map(|ev| ev.map(|v| piece(&v)))) as text::TextStream)
            })
        })
    }
}

/// One streamed completions event as text: `choices[0].text`, its `finish_reason` ("stop": the
/// model ended, as approxy sends no stop strings; "length": the token limit), and the usage
/// chunk's cached tokens.
fn piece(v: &Value) -> TextChunk {
    let choice = &v["choices"][0];
    TextChunk {
        text: choice["text"].as_str().unwrap_or_default().to_string(),
        finished: choice["finish_reason"].as_str().map(|r| r == "stop"),
        cached_prompt_tokens: reported_cached_tokens(&v["usage"]),
    }
}

#[async_trait]
impl TargetClient for OpenAiTextTarget {
    async fn continue_tokens(&self, req: &ContinuationRequest) -> Result<Continuation, TargetError> {
        text::continuation(&self.tokenizer, req, self.call(req)).await
    }

    async fn stream_tokens(&self, req: &ContinuationRequest) -> Result<TokenStream, TargetError> {
        text::token_stream(self.tokenizer.clone(), req, self.call(req)).await
    }

    async fn tokenize(&self, _: &str) -> Result<Option<Vec<u32>>, TargetError> {
        // Text goes both ways: the target's tokenizer does not need to match.
        Ok(None)
    }

    async fn health(&self) -> Result<(), TargetError> {
        get_ok(&self.http, &self.cfg, &join(&self.cfg.base_url, "models")).await
    }
}
