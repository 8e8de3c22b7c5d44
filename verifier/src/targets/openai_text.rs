//! OpenAI-compatible `POST /v1/completions` with a *text* prompt: Together, OpenRouter,
//! DeepSeek's beta completions, TGI, llama-server, any OpenAI-compatible completions server
//! (wire format: <https://platform.openai.com/docs/api-reference/completions/create>). The
//! prompt is the draft's rendering of the chat template (or the target's own, when given)
//! followed by the answer so far, with the answer's last piece held back ([`super::text`]).

use std::sync::Arc;

use serde_json::{Value, json};

use super::reported_cached_tokens;
use super::text::{TextChunk, TextPrefix, TextTarget, TextWire};
use super::{ContinuationRequest, TargetConfig};
use crate::error::TargetError;
use crate::template::ChatTemplate;
use crate::tokenizer::Tokenizer;

/// Text completions: the prompt as text.
#[derive(Debug, Clone, Default)]
pub struct TextCompletions {
    template: Option<Arc<ChatTemplate>>,
}

/// Client for text completions.
pub type OpenAiTextTarget = TextTarget<TextCompletions>;

impl TextTarget<TextCompletions> {
    /// A client for `cfg.base_url` (ending in `/v1`) that re-tokenizes with `tokenizer`.
    pub fn new(cfg: TargetConfig, tokenizer: Tokenizer) -> Result<Self, TargetError> {
        Self::with_wire(cfg, tokenizer, TextCompletions::default())
    }

    /// Renders chat prompts with the target's own chat template rather than the draft's (a
    /// target of another model family).
    pub fn with_template(mut self, template: Option<Arc<ChatTemplate>>) -> Self {
        self.wire.template = template;
        self
    }
}

impl TextWire for TextCompletions {
    const PATH: &'static str = "completions";

    fn fields(
        &self,
        _: &ContinuationRequest,
        p: &TextPrefix,
        body: &mut Value,
    ) -> Result<(), TargetError> {
        body["prompt"] = json!(format!("{}{}", p.prompt, p.answer));
        Ok(())
    }

    /// `choices[0].text`, its `finish_reason` ("stop": the model ended, as approxy sends no
    /// stop strings; "length": the token limit), and the usage chunk's cached tokens.
    fn piece(v: &Value) -> TextChunk {
        let choice = &v["choices"][0];
        TextChunk {
            text: choice["text"].as_str().unwrap_or_default().to_string(),
            finished: choice["finish_reason"].as_str().map(|r| r == "stop"),
            cached_prompt_tokens: reported_cached_tokens(&v["usage"]),
        }
    }

    fn template(&self) -> Option<Arc<ChatTemplate>> {
        self.template.clone()
    }
}
