//! SGLang's native API at the server root: `POST /generate` with `input_ids`. Its radix cache
//! serves any common prefix of consecutive calls, and it returns prompt log-probabilities from
//! a position the call names (`logprob_start_len`), so a window is scored in one call whose
//! prefix still comes from the cache (vLLM's prefix cache skips a call that asks for prompt
//! log-probabilities).
//!
//! The wire format, as SGLang's source has it (`python/sglang/srt/...`):
//! - the request is `GenerateReqInput` (`managers/io_struct.py`); `sampling_params` is checked
//!   against a schema that refuses unknown keys (`sglang/api/v1/api_types.py`), so only the
//!   keys below are sent, and `sampling_seed` only when there is a seed;
//! - the answer is `{"output_ids", "text", "meta_info"}`; `meta_info` has `prompt_tokens`,
//!   `completion_tokens` (all generated so far), `cached_tokens` (prompt tokens the radix
//!   cache served) and `finish_reason` (null until the end, then `{"type": "stop", "matched":
//!   <token id>}` on an end-of-sequence token, `"length"`, or `"abort"` with a `message`)
//!   (`managers/tokenizer_manager.py`, `managers/schedule_batch.py`);
//! - a stream is `data: <answer>` events and `data: [DONE]`, an error as `data: {"error":
//!   {"message", "code"}}` before `[DONE]` (`entrypoints/http_server.py`). Its `output_ids`
//!   are all the ids so far by default, and only the new ones under the server flag
//!   `--incremental-streaming-output`; both are read (see `Delivered`).

use async_trait::async_trait;
use futures::StreamExt;
use serde_json::{Value, json};

use super::openai::max_model_len;
use super::{
    Continuation, ContinuationRequest, StreamChunk, TargetClient, TargetConfig, TargetFacts,
    TokenStream, WindowRequest, WindowScore, get_json, get_ok, http_client, join, post_json,
    post_sse, token_ids, tokenized,
};
use crate::error::TargetError;
use crate::sampling::SamplingParams;

/// Client for SGLang's native API.
#[derive(Debug, Clone)]
pub struct SglangTarget {
    cfg: TargetConfig,
    http: reqwest::Client,
}

impl SglangTarget {
    /// A client for `cfg.base_url`, the server root (its OpenAI API is under `/v1` there).
    pub fn new(cfg: TargetConfig) -> Result<Self, TargetError> {
        Ok(Self {
            http: http_client(&cfg)?,
            cfg,
        })
    }

    fn url(&self, path: &str) -> String {
        join(&self.cfg.base_url, path)
    }
}

/// `sampling_params` for `max_new_tokens` at `s` (temperature 0 is greedy there too: SGLang
/// turns it into `top_k = 1`).
fn sampling_params(s: &SamplingParams, max_new_tokens: u32) -> Value {
    let mut p = json!({
        "max_new_tokens": max_new_tokens,
        "temperature": s.temperature.max(0.0),
        "top_p": s.top_p,
    });
    if let Some(seed) = s.seed {
        p["sampling_seed"] = json!(seed as i64);
    }
    p
}

fn generate_body(req: &ContinuationRequest, stream: bool) -> Value {
    json!({
        "input_ids": req.prefix,
        "sampling_params": sampling_params(&req.sampling, req.max_tokens),
        "stream": stream,
    })
}

/// Top log-probabilities per window position asked for when sampling, as the `vllm` kind asks
/// (vLLM's default `max_logprobs`), so both kinds judge a sample on the same entries.
const SAMPLED_TOP_LOGPROBS: u32 = 20;

/// The window call: `prefix + window` with `max_new_tokens = 1`, prompt log-probabilities from
/// the prefix's last token on. SGLang gives position `start + j` (for `j >= 1`) the
/// distribution that predicts it and position `start` none (`[None] + ...` in its scheduler's
/// `_process_input_token_logprobs`), so starting one before the window gives every window
/// position its distribution; the one after the window is the generated token's. The radix
/// cache is read up to `logprob_start_len` (`_compute_max_prefix_len` in `schedule_batch.py`):
/// all of the prefix but its last token. `None` for an empty prefix (nothing to start from).
fn window_body(req: &WindowRequest) -> Option<Value> {
    let start = req.prefix.len().checked_sub(1)?;
    let mut input_ids = req.prefix.clone();
    input_ids.extend_from_slice(&req.window);
    let (sampling, top) = match &req.sampling {
        // The token after the window is the target's own sample; the log-probabilities are
        // the model's at temperature 1 (SGLang scales them only when asked).
        Some(s) => (*s, SAMPLED_TOP_LOGPROBS.max(req.top_logprobs)),
        None => (SamplingParams::default(), req.top_logprobs.max(1)),
    };
    Some(json!({
        "input_ids": input_ids,
        "sampling_params": sampling_params(&sampling, 1),
        "return_logprob": true,
        "logprob_start_len": start,
        "top_logprobs_num": top,
        "stream": false,
    }))
}

/// How a generation ended, from `meta_info.finish_reason`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Finish {
    /// Not yet (a streamed event before the last).
    Running,
    /// On an end-of-sequence token (`"stop"` matching a token id; no stop strings are sent).
    Eos,
    /// Any other end: the token limit.
    Other,
}

/// The finish of an answer, or the error an aborted one carries (SGLang aborts a request it
/// refuses after admitting it, with the status it would have answered with when it has one).
fn finish_of(meta: &Value) -> Result<Finish, TargetError> {
    let reason = &meta["finish_reason"];
    if reason.is_null() {
        return Ok(Finish::Running);
    }
    match reason["type"].as_str() {
        Some("stop") if !reason["matched"].is_string() => Ok(Finish::Eos),
        Some("abort") => {
            let message = reason["message"].as_str().unwrap_or("aborted").to_string();
            Err(match reason["status_code"].as_u64() {
                Some(status) => TargetError::Status {
                    status: u16::try_from(status).unwrap_or(500),
                    body: message,
                },
                None => TargetError::Protocol(format!("SGLang aborted the request: {message}")),
            })
        }
        _ => Ok(Finish::Other),
    }
}

/// The error a streamed `{"error": ...}` event carries: SGLang sends one for what it would
/// answer a non-streamed call with a 400 (its `code`, when it gives one).
fn stream_error(v: &Value) -> Option<TargetError> {
    let e = v.get("error")?;
    let body = e["message"].as_str().unwrap_or_default().to_string();
    let status = e["code"]
        .as_u64()
        .and_then(|c| u16::try_from(c).ok())
        .unwrap_or(400);
    Some(TargetError::Status { status, body })
}

/// The answer's `output_ids`, required: text alone cannot be continued exactly.
fn output_ids(v: &Value) -> Result<Vec<u32>, TargetError> {
    token_ids(&v["output_ids"]).ok_or_else(|| {
        TargetError::Protocol(
            "SGLang answered without `output_ids` (older servers send them only when started \
             with `--return-token-ids`)"
                .into(),
        )
    })
}

fn cached_tokens(meta: &Value) -> Option<u32> {
    meta["cached_tokens"]
        .as_u64()
        .and_then(|x| u32::try_from(x).ok())
}

/// The ids a stream has delivered, so that each event's new ids are found whether the server
/// sends all ids so far (its default) or only the new ones (`--incremental-streaming-output`).
/// `meta_info.completion_tokens` counts every id generated so far in both modes, which tells
/// them apart where the ids alone cannot (new ids that happen to repeat all delivered ones);
/// an event it fits neither way is refused rather than guessed at. Without it, ids that start
/// with all delivered ones are read as all so far.
#[derive(Debug, Default)]
struct Delivered {
    ids: Vec<u32>,
}

impl Delivered {
    /// The new ids in an event's `ids`, given its `completion_tokens`.
    fn fresh(
        &mut self,
        ids: Vec<u32>,
        completion_tokens: Option<u64>,
    ) -> Result<Vec<u32>, TargetError> {
        let n = self.ids.len();
        let repeats = n > 0 && ids.starts_with(&self.ids);
        let all_so_far = match completion_tokens {
            _ if n == 0 => false,
            Some(t) if t == (n + ids.len()) as u64 => false,
            Some(t) if t == ids.len() as u64 && repeats => true,
            Some(t) => {
                return Err(TargetError::Protocol(format!(
                    "SGLang streamed {} output ids after {n}, with {t} generated in all",
                    ids.len()
                )));
            }
            None => repeats,
        };
        let fresh = if all_so_far { ids[n..].to_vec() } else { ids };
        self.ids.extend_from_slice(&fresh);
        Ok(fresh)
    }
}

/// One streamed event as a chunk of new tokens.
fn chunk_of(v: &Value, delivered: &mut Delivered) -> Result<StreamChunk, TargetError> {
    if let Some(e) = stream_error(v) {
        return Err(e);
    }
    let meta = &v["meta_info"];
    let finish = finish_of(meta)?;
    let tokens = delivered.fresh(output_ids(v)?, meta["completion_tokens"].as_u64())?;
    Ok(StreamChunk {
        tokens,
        stopped_on_eos: finish == Finish::Eos,
        // Every event says it (the prefill is done before the first); the engine counts a
        // call's once, and a stream closed early has still said it.
        cached_prompt_tokens: cached_tokens(meta),
        extra_calls: 0,
        // Per-request compute is not in `meta_info`: it has `e2e_latency` (wall time from
        // arrival to finish, queueing included) and, under `--enable-metrics`, timestamps, but
        // no prompt and decode times, so there are no timings to report.
        timings: None,
        top_logprobs: Vec::new(),
    })
}

/// (token, log-probability) from SGLang's `[logprob, token_id, text]` triple.
fn entry(v: &Value) -> Option<(u32, f32)> {
    let lp = v.get(0)?.as_f64()?;
    let id = u32::try_from(v.get(1)?.as_u64()?).ok()?;
    Some((id, lp as f32))
}

/// What a window call says at one window position: the target's top entries and the window
/// token's log-probability.
fn window_position(
    token: &Value,
    tops: &Value,
    expected: u32,
) -> Result<(Vec<(u32, f32)>, f32), TargetError> {
    let (id, lp) = entry(token).ok_or_else(|| {
        TargetError::Protocol("unreadable input_token_logprobs in SGLang's answer".into())
    })?;
    if id != expected {
        return Err(TargetError::Protocol(format!(
            "SGLang's input_token_logprobs name token {id} where the window has {expected}"
        )));
    }
    let entries = tops
        .as_array()
        .and_then(|t| t.iter().map(entry).collect::<Option<Vec<_>>>())
        .filter(|t| !t.is_empty())
        .ok_or_else(|| {
            TargetError::Protocol("unreadable input_top_logprobs in SGLang's answer".into())
        })?;
    Ok((entries, lp))
}

/// The most likely entry (the first of equals: SGLang lists them most likely first).
fn best(entries: &[(u32, f32)]) -> Option<(u32, f32)> {
    entries
        .iter()
        .copied()
        .reduce(|a, b| if b.1 > a.1 { b } else { a })
}

/// Reads a window call's answer into the target's choices (see [`window_body`] for which
/// position is which).
fn window_score(req: &WindowRequest, v: &Value) -> Result<WindowScore, TargetError> {
    let meta = &v["meta_info"];
    let (Some(tokens), Some(tops)) = (
        meta["input_token_logprobs"].as_array(),
        meta["input_top_logprobs"].as_array(),
    ) else {
        return Err(TargetError::Protocol(
            "SGLang returned no prompt log-probabilities".into(),
        ));
    };
    let w = req.window.len();
    if tokens.len() != w + 1 || tops.len() != w + 1 {
        return Err(TargetError::Protocol(format!(
            "SGLang returned {} prompt log-probabilities for a window of {w} and its last prefix token",
            tokens.len()
        )));
    }
    let keep_logprobs = req.sampling.is_some() || req.top_logprobs > 0;
    let mut score = WindowScore::default();
    for (i, &want) in req.window.iter().enumerate() {
        let (mut entries, lp) = window_position(&tokens[i + 1], &tops[i + 1], want)?;
        let (top, top_lp) = best(&entries).unwrap_or((want, lp));
        score.top.push(top);
        score
            .margins
            .push(Some(if top == want { 0.0 } else { top_lp - lp }));
        if keep_logprobs {
            if !entries.iter().any(|e| e.0 == want) {
                entries.push((want, lp));
            }
            score.logprobs.push(entries);
        }
    }
    let next = output_ids(v)?.first().copied().ok_or_else(|| {
        TargetError::Protocol("SGLang generated no token after the window".into())
    })?;
    score.top.push(next);
    score.cached_prompt_tokens = cached_tokens(meta);
    Ok(score)
}

#[async_trait]
impl TargetClient for SglangTarget {
    async fn continue_tokens(
        &self,
        req: &ContinuationRequest,
    ) -> Result<Continuation, TargetError> {
        let body = generate_body(req, false);
        let v = post_json(&self.http, &self.cfg, &self.url("generate"), &body, None).await?;
        let meta = &v["meta_info"];
        let finish = finish_of(meta)?;
        let mut tokens = output_ids(&v)?;
        tokens.truncate(req.max_tokens as usize);
        Ok(Continuation {
            tokens,
            stopped_on_eos: finish == Finish::Eos,
            cached_prompt_tokens: cached_tokens(meta),
            extra_calls: 0,
            // Not asked of this kind: label collection runs on llama-server.
            top_logprobs: Vec::new(),
            // No per-request compute in `meta_info` (see `chunk_of`).
            timings: None,
        })
    }

    async fn stream_tokens(&self, req: &ContinuationRequest) -> Result<TokenStream, TargetError> {
        let body = generate_body(req, true);
        let events = post_sse(&self.http, &self.cfg, &self.url("generate"), &body, None).await?;
        let mut delivered = Delivered::default();
        Ok(Box::pin(
            events.map(move |ev| chunk_of(&ev?, &mut delivered)),
        ))
    }

    async fn score_window(&self, req: &WindowRequest) -> Result<Option<WindowScore>, TargetError> {
        let Some(body) = window_body(req) else {
            return Ok(None);
        };
        let v = post_json(&self.http, &self.cfg, &self.url("generate"), &body, None).await?;
        window_score(req, &v).map(Some)
    }

    /// The prefix of a window call comes from the radix cache (all but its last token).
    fn windows_read_cache(&self) -> bool {
        true
    }

    /// `/tokenize` (SGLang 0.5 and later; no `model`, which it would read as a LoRA adapter
    /// when it holds a colon). A server without it just cannot be checked.
    async fn tokenize(&self, text: &str) -> Result<Option<Vec<u32>>, TargetError> {
        let body = json!({"prompt": text, "add_special_tokens": false});
        tokenized(post_json(&self.http, &self.cfg, &self.url("tokenize"), &body, None).await)
    }

    /// `/health`: 200 once the server is up (and, where the server is set to, once a one-token
    /// generation went through).
    async fn health(&self) -> Result<(), TargetError> {
        get_ok(&self.http, &self.cfg, &self.url("health")).await
    }

    /// The context from its OpenAI model list (`/v1/models`, `max_model_len`: the model's
    /// `context_len`), as vLLM's.
    async fn facts(&self) -> Result<TargetFacts, TargetError> {
        let v = get_json(&self.http, &self.cfg, &self.url("v1/models")).await?;
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

#[cfg(test)]
mod tests;
