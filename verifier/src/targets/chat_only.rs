//! A target that cannot continue a partial answer: OpenAI's current chat models, Anthropic's
//! current Claude models (through an OpenAI-compatible chat endpoint), or any chat-only API.
//! approxy passes every request to it unchanged (reason `target_cannot_continue`), so the
//! engine never calls it; this client only answers health checks.

use async_trait::async_trait;

use super::{
    Continuation, ContinuationRequest, TargetClient, TargetConfig, get_ok, http_client, join,
};
use crate::error::TargetError;

/// Client for a chat-only target.
#[derive(Debug, Clone)]
pub struct ChatOnlyTarget {
    cfg: TargetConfig,
    http: reqwest::Client,
}

impl ChatOnlyTarget {
    /// A client for `cfg.base_url` (ending in `/v1`).
    pub fn new(cfg: TargetConfig) -> Result<Self, TargetError> {
        Ok(Self {
            http: http_client(&cfg)?,
            cfg,
        })
    }
}

#[async_trait]
impl TargetClient for ChatOnlyTarget {
    async fn continue_tokens(&self, _: &ContinuationRequest) -> Result<Continuation, TargetError> {
        Err(TargetError::Protocol(
            "this target kind cannot continue a partial answer".into(),
        ))
    }

    async fn tokenize(&self, _: &str) -> Result<Option<Vec<u32>>, TargetError> {
        Ok(None)
    }

    async fn health(&self) -> Result<(), TargetError> {
        get_ok(&self.http, &self.cfg, &join(&self.cfg.base_url, "models")).await
    }
}
