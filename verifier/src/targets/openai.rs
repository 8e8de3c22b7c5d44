//! OpenAI-compatible `POST /v1/completions` with a token-id prompt (vLLM and others). Token
//! ids of the answer come from `choices[0].token_ids` (vLLM's `return_token_ids`) or from
//! `__verbose.tokens` (llama.cpp's server with `verbose` and `return_tokens`). A server that
//! returns only text cannot be used for exact-prefix continuation (re-tokenising text need
//! not give back the ids the model produced), so that is a protocol error, not a guess.
//!
//! Windows go to vLLM's token-in endpoint where the server offers it, so their prefix comes
//! from the prefix cache ([`token_in`]); `/v1/completions` with `prompt_logprobs` is the
//! fallback, which computes the whole prefix again on every window.

use std::sync::Arc;

use async_trait::async_trait;
use futures::StreamExt;
use serde_json::{Value, json};

use super::token_in::{self, RouteCell};
use super::{
    Continuation, ContinuationRequest, StreamChunk, TargetClient, TargetConfig, TargetFacts,
    TargetTimings, TokenStream, WindowRequest, WindowRoute, WindowScore, get_json, get_ok,
    http_client, join, post_json, post_sse, reported_cached_tokens, token_ids, tokenized,
};
use crate::error::TargetError;
use crate::sampling::SamplingParams;

/// Client for OpenAI-style completions with token ids.
#[derive(Debug, Clone)]
pub struct OpenAiCompletionsTarget {
    cfg: TargetConfig,
    http: reqwest::Client,
    /// How its server scores windows, once asked (shared by the client's clones).
    route: Arc<RouteCell>,
}

impl OpenAiCompletionsTarget {
    /// A client for `cfg.base_url`, which ends in `/v1`.
    pub fn new(cfg: TargetConfig) -> Result<Self, TargetError> {
        Ok(Self {
            http: http_client(&cfg)?,
            cfg,
            route: Arc::default(),
        })
    }

    fn root(&self) -> String {
        self.cfg
            .base_url
            .trim_end_matches('/')
            .trim_end_matches("/v1")
            .to_string()
    }

    fn body(&self, req: &ContinuationRequest, stream: bool) -> Value {
        let s = &req.sampling;
        let mut body = json!({
            "model": req.model.as_deref().unwrap_or(&self.cfg.model),
            "prompt": req.prefix,
            "max_tokens": req.max_tokens,
            "temperature": s.temperature.max(0.0),
            "top_p": s.top_p,
            "return_token_ids": true,
            "return_tokens": true,
            "verbose": true,
            "skip_special_tokens": false,
            "stream": stream,
        });
        if let Some(seed) = s.seed {
            body["seed"] = json!(seed as i64);
        }
        if !req.allowed.is_empty() {
            // vLLM's own parameter (its sampling keeps to these ids), and OpenAI's logit bias
            // at its largest for servers without it (llama-server's `/v1/completions`): the
            // greedy token is then the best allowed one. The engine checks it all the same.
            body["allowed_token_ids"] = json!(req.allowed);
            let bias: serde_json::Map<String, Value> = req
                .allowed
                .iter()
                .map(|t| (t.to_string(), json!(100)))
                .collect();
            body["logit_bias"] = Value::Object(bias);
        }
        if stream {
            // The usage (with the cached prompt tokens) comes in a last chunk.
            body["stream_options"] = json!({"include_usage": true});
        }
        self.cfg
            .cache_hints
            .apply_to_body(&mut body, &req.cache_key());
        body
    }

    /// The model to name in a window call.
    fn model_of<'a>(&'a self, req: &'a WindowRequest) -> &'a str {
        req.model.as_deref().unwrap_or(&self.cfg.model)
    }

    /// A window through `/v1/completions` with `prompt_logprobs`: the whole prefix computed
    /// again. `Ok(None)` when the server returns no prompt log-probabilities.
    async fn score_recomputed(
        &self,
        req: &WindowRequest,
    ) -> Result<Option<WindowScore>, TargetError> {
        let (sampling, top) = window_sampling(req);
        let prompt = [req.prefix.as_slice(), req.window.as_slice()].concat();
        let mut body = json!({
            "model": self.model_of(req),
            "prompt": prompt,
            "max_tokens": 1,
            "temperature": sampling.temperature.max(0.0),
            "prompt_logprobs": top,
            "return_token_ids": true,
            "skip_special_tokens": false,
        });
        if req.sampling.is_some() {
            // The token after the window is the target's own sample; the log-probabilities
            // (raw, before temperature) give its distribution at every window position.
            body["top_p"] = json!(sampling.top_p);
            if let Some(seed) = sampling.seed {
                body["seed"] = json!(seed as i64);
            }
        }
        let v = post_json(
            &self.http,
            &self.cfg,
            &join(&self.cfg.base_url, "completions"),
            &body,
            None,
        )
        .await?;
        let choice = &v["choices"][0];
        // vLLM puts them on the choice; a server without the feature returns none at all.
        let Some(positions) = choice["prompt_logprobs"]
            .as_array()
            .or_else(|| v["prompt_logprobs"].as_array())
        else {
            return Ok(None);
        };
        let mut score = window_score(req, positions, &choice["token_ids"])?;
        score.cached_prompt_tokens = reported_cached_tokens(&v["usage"]);
        Ok(Some(score))
    }

    /// A window through the token-in endpoint, its prefix read from the cache; scored again
    /// without the cache when a window row was among the cached ones (see [`token_in`]).
    async fn score_from_cache(&self, req: &WindowRequest) -> Result<WindowScore, TargetError> {
        let (sampling, top) = window_sampling(req);
        let url = join(&self.root(), token_in::PATH);
        let prompt_len = req.prefix.len() + req.window.len();
        let call = |read_cache: bool| {
            let body = token_in::window_body(req, self.model_of(req), &sampling, top, read_cache);
            let url = url.clone();
            async move { post_json(&self.http, &self.cfg, &url, &body, None).await }
        };
        let mut v = call(true).await?;
        let mut stale_cached = None;
        if !token_in::rows_fresh(&v, req.prefix.len(), prompt_len) {
            stale_cached = Some(token_in::cached_tokens(&v).unwrap_or(0));
            metrics::counter!("approxy_window_rescores_total", "reason" => "stale").increment(1);
            tracing::debug!(
                cached = ?token_in::cached_tokens(&v),
                prefix = req.prefix.len(),
                "a window row was among the cached ones; scoring it again without the cache"
            );
            v = call(false).await?;
        }
        let positions = v["prompt_logprobs"].as_array().ok_or_else(|| {
            TargetError::Protocol(
                "the token-in endpoint returned no prompt log-probabilities".into(),
            )
        })?;
        let mut score = window_score(req, positions, &v["choices"][0]["token_ids"])?;
        score.cached_prompt_tokens = token_in::cached_tokens(&v);
        score.stale_cached = stale_cached;
        Ok(score)
    }
}

/// The sampling a window call asks for and how many log-probabilities at each position:
/// greedy with the top one (or the relaxed rule's top entries), or the request's sampling with
/// [`SAMPLED_TOP_LOGPROBS`].
fn window_sampling(req: &WindowRequest) -> (SamplingParams, u32) {
    match &req.sampling {
        Some(s) => (*s, SAMPLED_TOP_LOGPROBS.max(req.top_logprobs)),
        None => (SamplingParams::default(), req.top_logprobs.max(1)),
    }
}

/// A window's score from the rows of a prompt of `prefix + window` (`positions`, one per
/// prompt token) and the token generated after it (the first of `generated`).
fn window_score(
    req: &WindowRequest,
    positions: &[Value],
    generated: &Value,
) -> Result<WindowScore, TargetError> {
    let prompt_len = req.prefix.len() + req.window.len();
    if positions.len() != prompt_len {
        return Err(TargetError::Protocol(format!(
            "{} prompt log-probabilities for {prompt_len} prompt tokens",
            positions.len(),
        )));
    }
    let entries_wanted = req.sampling.is_some() || req.top_logprobs > 0;
    let mut top = Vec::with_capacity(req.window.len() + 1);
    let mut margins = Vec::with_capacity(req.window.len());
    let mut logprobs = Vec::new();
    for (i, &w) in req.window.iter().enumerate() {
        let position = &positions[req.prefix.len() + i];
        let (t, m) = top_of(position, w).ok_or_else(|| {
            TargetError::Protocol(format!("no rank-1 token at window position {i}"))
        })?;
        top.push(t);
        margins.push(m);
        if entries_wanted {
            logprobs.push(entries_of(position).ok_or_else(|| {
                TargetError::Protocol(format!(
                    "unreadable log-probabilities at window position {i}"
                ))
            })?);
        }
    }
    let next = token_ids(generated)
        .and_then(|t| t.first().copied())
        .ok_or_else(|| {
            TargetError::Protocol(
                "the target returned no token ids (needs `return_token_ids` support)".into(),
            )
        })?;
    top.push(next);
    Ok(WindowScore {
        top,
        margins,
        logprobs,
        cached_prompt_tokens: None,
        stale_cached: None,
        refused: false,
    })
}

/// The top token at one prompt position of vLLM's `prompt_logprobs` (`{"<id>": {"logprob",
/// "rank", ...}}`, holding the prompt's own token and the rank-1 token), and how far its
/// log-probability is above that of `actual`.
fn top_of(position: &Value, actual: u32) -> Option<(u32, Option<f32>)> {
    let entries = position.as_object()?;
    let mut top = None;
    let mut actual_logprob = None;
    for (id, e) in entries {
        let id: u32 = id.parse().ok()?;
        let logprob = e["logprob"].as_f64().map(|x| x as f32);
        if e["rank"].as_u64() == Some(1) {
            top = Some((id, logprob));
        }
        if id == actual {
            actual_logprob = logprob;
        }
    }
    let (id, top_logprob) = top?;
    let margin = match (top_logprob, actual_logprob) {
        _ if id == actual => Some(0.0),
        (Some(t), Some(a)) => Some(t - a),
        _ => None,
    };
    Some((id, margin))
}

/// Every (token, log-probability) one prompt position reports.
fn entries_of(position: &Value) -> Option<Vec<(u32, f32)>> {
    position
        .as_object()?
        .iter()
        .map(|(id, e)| Some((id.parse().ok()?, e["logprob"].as_f64()? as f32)))
        .collect()
}

/// Log-probabilities per window position asked for when sampling: vLLM's default
/// `max_logprobs`. The target's distribution is known on these (and the window token) only;
/// its tail beyond them is left out of the acceptance rule (see "Verification modes" in policies/README.md).
const SAMPLED_TOP_LOGPROBS: u32 = 20;

#[async_trait]
impl TargetClient for OpenAiCompletionsTarget {
    async fn continue_tokens(
        &self,
        req: &ContinuationRequest,
    ) -> Result<Continuation, TargetError> {
        let header = self.cfg.cache_hints.header(&req.cache_key());
        let v = post_json(
            &self.http,
            &self.cfg,
            &join(&self.cfg.base_url, "completions"),
            &self.body(req, false),
            header.as_ref(),
        )
        .await?;
        let choice = &v["choices"][0];
        let mut tokens = token_ids(&choice["token_ids"])
            .or_else(|| token_ids(&v["__verbose"]["tokens"]))
            .ok_or_else(|| {
                TargetError::Protocol(
                    "the target returned no token ids (needs `return_token_ids` support)".into(),
                )
            })?;
        let stopped_on_eos = choice["finish_reason"].as_str() == Some("stop");
        tokens.truncate(req.max_tokens as usize);
        Ok(Continuation {
            tokens,
            stopped_on_eos,
            cached_prompt_tokens: reported_cached_tokens(&v["usage"]),
            extra_calls: 0,
            // Not asked of this kind yet: label collection runs on llama-server.
            top_logprobs: Vec::new(),
            // llama-server's OpenAI endpoints add its `timings`; vLLM's do not.
            timings: TargetTimings::from_llama(&v["timings"]),
        })
    }

    async fn stream_tokens(&self, req: &ContinuationRequest) -> Result<TokenStream, TargetError> {
        let header = self.cfg.cache_hints.header(&req.cache_key());
        let events = post_sse(
            &self.http,
            &self.cfg,
            &join(&self.cfg.base_url, "completions"),
            &self.body(req, true),
            header.as_ref(),
        )
        .await?;
        // Each chunk carries the ids of its new tokens in `choices[0].token_ids` (vLLM) or
        // `__verbose.tokens` (llama.cpp's server); the last one has a `finish_reason` ("stop":
        // end of sequence, as no stop strings are sent). Text without ids is refused, as in
        // `continue_tokens`.
        Ok(Box::pin(events.map(|ev| {
            let v = ev?;
            let choice = &v["choices"][0];
            if choice.is_null() {
                // The usage chunk, when asked for.
                return Ok(StreamChunk {
                    cached_prompt_tokens: reported_cached_tokens(&v["usage"]),
                    ..StreamChunk::default()
                });
            }
            let text = choice["text"].as_str().unwrap_or_default();
            let tokens = match token_ids(&choice["token_ids"])
                .or_else(|| token_ids(&v["__verbose"]["tokens"]))
            {
                Some(t) => t,
                None if text.is_empty() => Vec::new(),
                None => return Err(TargetError::Protocol(
                    "the target streamed text without token ids (needs `return_token_ids` support)"
                        .into(),
                )),
            };
            let last = !choice["finish_reason"].is_null();
            Ok(StreamChunk {
                tokens,
                stopped_on_eos: choice["finish_reason"].as_str() == Some("stop"),
                timings: if last {
                    TargetTimings::from_llama(&v["timings"])
                } else {
                    None
                },
                ..StreamChunk::default()
            })
        })))
    }

    /// True once the server was found to offer its token-in endpoint (see [`token_in`]).
    fn windows_read_cache(&self) -> bool {
        self.route.get().is_some_and(|r| r.reads_cache)
    }

    async fn window_route(&self) -> Result<Option<WindowRoute>, TargetError> {
        if let Some(r) = self.route.get() {
            return Ok(Some(r));
        }
        let answer = post_json(
            &self.http,
            &self.cfg,
            &join(&self.root(), token_in::PATH),
            &token_in::probe_body(&self.cfg.model),
            None,
        )
        .await;
        let route = token_in::route_of(answer)?;
        if self.route.set(route) {
            if route.reads_cache {
                tracing::info!(
                    endpoint = route.endpoint,
                    "windows are scored from the target's prefix cache"
                );
            } else {
                tracing::warn!(
                    endpoint = route.endpoint,
                    hint = token_in::fallback_hint(),
                    "windows recompute their prefix on this target"
                );
            }
        }
        Ok(Some(route))
    }

    /// From the prefix cache through the token-in endpoint where the server offers it, else
    /// through `/v1/completions`, which recomputes the prefix.
    async fn score_window(&self, req: &WindowRequest) -> Result<Option<WindowScore>, TargetError> {
        let route = self.window_route().await?;
        if route.is_some_and(|r| r.reads_cache) {
            match self.score_from_cache(req).await {
                // A window the token-in endpoint refused is scored where every server of this
                // kind scores one, rather than failing the answer. vLLM 0.32 refuses one when a
                // stale row (uninitialised memory: `LogprobsTensors.empty_cpu`) holds a NaN or
                // an infinity, which its JSON encoder will not write ("Out of range float
                // values are not JSON compliant", 400).
                Err(TargetError::Status { status, body }) if token_in::refused(status) => {
                    metrics::counter!("approxy_window_rescores_total", "reason" => "refused")
                        .increment(1);
                    tracing::warn!(
                        status,
                        body = %body.chars().take(500).collect::<String>(),
                        "the token-in endpoint refused a window; scoring it through /v1/completions"
                    );
                    if self.route.refused() {
                        tracing::warn!(
                            refusals = token_in::REFUSALS_TO_GIVE_UP,
                            "the token-in endpoint refused windows in a row; windows recompute their prefix from now on"
                        );
                    }
                    let score = self.score_recomputed(req).await?;
                    return Ok(score.map(|s| WindowScore { refused: true, ..s }));
                }
                scored => {
                    if scored.is_ok() {
                        self.route.scored();
                    }
                    return scored.map(Some);
                }
            }
        }
        self.score_recomputed(req).await
    }

    fn picks_among_tokens(&self) -> bool {
        true
    }

    async fn tokenize(&self, text: &str) -> Result<Option<Vec<u32>>, TargetError> {
        // vLLM serves /tokenize at the root and reads `prompt`; llama.cpp's server reads
        // `content`. Servers without the endpoint just cannot be checked.
        let body = json!({
            "model": self.cfg.model,
            "prompt": text,
            "content": text,
            "add_special_tokens": false,
            "add_special": false,
            "parse_special": true,
        });
        tokenized(
            post_json(
                &self.http,
                &self.cfg,
                &join(&self.root(), "tokenize"),
                &body,
                None,
            )
            .await,
        )
    }

    async fn health(&self) -> Result<(), TargetError> {
        get_ok(&self.http, &self.cfg, &join(&self.cfg.base_url, "models")).await
    }

    /// vLLM's `max_model_len` in its model list, for the configured model (or the only one).
    async fn facts(&self) -> Result<TargetFacts, TargetError> {
        let v = get_json(&self.http, &self.cfg, &join(&self.cfg.base_url, "models")).await?;
        Ok(TargetFacts {
            context_length: max_model_len(
                &v,
                Some(self.cfg.model.as_str()).filter(|m| !m.is_empty()),
            ),
            images: None,
            audio: None,
            parallel: None,
        })
    }
}

/// The `max_model_len` a model list gives `model`, or its only model (a server that serves one
/// model under another name than the policy's).
pub(crate) fn max_model_len(list: &Value, model: Option<&str>) -> Option<usize> {
    let models = list["data"].as_array()?;
    let m = model
        .and_then(|id| models.iter().find(|m| m["id"].as_str() == Some(id)))
        .or_else(|| models.first().filter(|_| models.len() == 1))?;
    m["max_model_len"]
        .as_u64()
        .and_then(|n| usize::try_from(n).ok())
}

#[cfg(test)]
mod window_tests;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_context_is_the_named_models_max_model_len() {
        // vLLM's /v1/models answer (fields beyond these left out).
        let list = json!({"object": "list", "data": [
            {"id": "a", "object": "model", "max_model_len": 4096},
            {"id": "b", "object": "model", "max_model_len": 32768}
        ]});
        assert_eq!(max_model_len(&list, Some("b")), Some(32768));
        assert_eq!(max_model_len(&list, Some("c")), None, "which of two?");
        let one = json!({"data": [{"id": "a", "max_model_len": 2048}]});
        assert_eq!(max_model_len(&one, Some("alias")), Some(2048));
        assert_eq!(max_model_len(&one, None), Some(2048));
        assert_eq!(max_model_len(&json!({"data": [{"id": "a"}]}), None), None);
    }

    #[test]
    fn the_rank_one_token_and_its_margin_over_the_prompt_token() {
        let agree = json!({"42": {"logprob": -0.1, "rank": 1, "decoded_token": "a"}});
        assert_eq!(top_of(&agree, 42), Some((42, Some(0.0))));
        let differ = json!({"42": {"logprob": -2.0, "rank": 3, "decoded_token": "a"}, "7": {"logprob": -0.5, "rank": 1, "decoded_token": "b"}});
        assert_eq!(top_of(&differ, 42), Some((7, Some(1.5))));
        assert_eq!(top_of(&Value::Null, 42), None);
        let mut e = entries_of(&differ).unwrap_or_default();
        e.sort_by_key(|x| x.0);
        assert_eq!(e, vec![(7, -0.5), (42, -2.0)]);
        assert_eq!(entries_of(&json!({"x": {"logprob": -1.0}})), None);
    }
}
