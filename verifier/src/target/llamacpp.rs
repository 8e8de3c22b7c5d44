//! llama.cpp `llama-server`: `POST /completion` with a token-array prompt, `cache_prompt`
//! (reuses the common prefix of consecutive calls) and `return_tokens`.

use async_trait::async_trait;
use futures::StreamExt;
use serde_json::{Value, json};

use super::{
    Continuation, ContinuationRequest, StreamChunk, TargetClient, TargetConfig, TokenStream,
    get_ok, http_client, join, post_json, post_sse, token_ids,
};
use crate::error::TargetError;

/// Client for llama.cpp's native API.
#[derive(Debug, Clone)]
pub struct LlamaCppTarget {
    cfg: TargetConfig,
    http: reqwest::Client,
}

impl LlamaCppTarget {
    /// A client for `cfg.base_url` (the server root, without `/v1`).
    pub fn new(cfg: TargetConfig) -> Result<Self, TargetError> {
        Ok(Self {
            http: http_client(&cfg)?,
            cfg,
        })
    }
}

fn body(req: &ContinuationRequest, stream: bool) -> Value {
    let s = &req.sampling;
    let mut body = json!({
        "prompt": req.prefix,
        "n_predict": req.max_tokens,
        "temperature": s.temperature.max(0.0),
        "top_p": s.top_p,
        "top_k": 0,
        "min_p": 0.0,
        "cache_prompt": true,
        "return_tokens": true,
        "stream": stream,
    });
    if let Some(seed) = s.seed {
        body["seed"] = json!(seed as i64);
    }
    body
}

/// The `tokens` of an answer from `endpoint`.
fn tokens_of(v: &Value, endpoint: &str) -> Result<Vec<u32>, TargetError> {
    if !v.is_array() {
        return Err(TargetError::Protocol(format!(
            "no `tokens` in {endpoint} answer"
        )));
    }
    token_ids(v).ok_or_else(|| TargetError::Protocol("non-integer token id".into()))
}

#[async_trait]
impl TargetClient for LlamaCppTarget {
    async fn continue_tokens(
        &self,
        req: &ContinuationRequest,
    ) -> Result<Continuation, TargetError> {
        let v = post_json(
            &self.http,
            &self.cfg,
            &join(&self.cfg.base_url, "completion"),
            &body(req, false),
            None,
        )
        .await?;
        let tokens = tokens_of(&v["tokens"], "/completion")?;
        let stopped_on_eos = v["stop_type"].as_str() == Some("eos");
        let cached = v["tokens_cached"]
            .as_u64()
            .and_then(|x| u32::try_from(x).ok());
        let cached_prompt = v["timings"]["cache_n"]
            .as_u64()
            .and_then(|x| u32::try_from(x).ok())
            .or(cached);
        Ok(Continuation {
            tokens,
            stopped_on_eos,
            cached_prompt_tokens: cached_prompt,
            extra_calls: 0,
        })
    }

    async fn stream_tokens(&self, req: &ContinuationRequest) -> Result<TokenStream, TargetError> {
        let events = post_sse(
            &self.http,
            &self.cfg,
            &join(&self.cfg.base_url, "completion"),
            &body(req, true),
            None,
        )
        .await?;
        // Each event carries the tokens of its piece of text (`return_tokens`); the last one
        // says `stop` and why. A piece may hold no token (text held back at a stop string).
        Ok(Box::pin(events.map(|ev| {
            let v = ev?;
            let tokens = if v["tokens"].is_null() {
                Vec::new()
            } else {
                tokens_of(&v["tokens"], "/completion")?
            };
            let cached = v["timings"]["cache_n"]
                .as_u64()
                .and_then(|x| u32::try_from(x).ok());
            Ok(StreamChunk {
                tokens,
                stopped_on_eos: v["stop"].as_bool() == Some(true)
                    && v["stop_type"].as_str() == Some("eos"),
                cached_prompt_tokens: cached,
                extra_calls: 0,
            })
        })))
    }

    async fn tokenize(&self, text: &str) -> Result<Option<Vec<u32>>, TargetError> {
        let body = json!({"content": text, "add_special": false, "parse_special": true});
        let v = post_json(
            &self.http,
            &self.cfg,
            &join(&self.cfg.base_url, "tokenize"),
            &body,
            None,
        )
        .await?;
        tokens_of(&v["tokens"], "/tokenize").map(Some)
    }

    async fn health(&self) -> Result<(), TargetError> {
        get_ok(&self.http, &self.cfg, &join(&self.cfg.base_url, "health")).await
    }
}
