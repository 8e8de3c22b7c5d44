//! OpenAI request parsing. A request body becomes a [`ValidRequest`] or a 400 naming the
//! field; the parse also decides whether the request can take the approximate path or must
//! be passed through (and says why).

use approxy_verifier::SamplingParams;
use serde::Serialize;
use serde_json::Value;

use crate::error::ApiError;
use crate::policy::GatewayPolicy;

/// Which endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `/v1/chat/completions`.
    Chat,
    /// `/v1/completions`.
    Completions,
}

/// One chat message, reduced to text.
#[derive(Debug, Clone, Serialize)]
pub struct ChatMessage {
    /// Role.
    pub role: String,
    /// Text content.
    pub content: String,
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

/// A validated request.
#[derive(Debug, Clone)]
pub struct ValidRequest {
    /// Endpoint.
    pub endpoint: Endpoint,
    /// Model id.
    pub model: String,
    /// Prompt (`None` when only passthrough can serve it).
    pub prompt: Option<Prompt>,
    /// Generation limit.
    pub max_tokens: u32,
    /// Sampling.
    pub sampling: SamplingParams,
    /// Stop strings.
    pub stop: Vec<String>,
    /// SSE streaming.
    pub stream: bool,
    /// `stream_options.include_usage`.
    pub include_usage: bool,
    /// Why the approximate path cannot serve it, if it cannot.
    pub passthrough_reason: Option<&'static str>,
}

fn num(body: &Value, field: &str) -> Result<Option<f64>, ApiError> {
    match body.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_f64().map(Some).ok_or_else(|| ApiError::bad(field, format!("`{field}` must be a number"))),
    }
}

fn uint(body: &Value, field: &str) -> Result<Option<u64>, ApiError> {
    match body.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_u64().map(Some).ok_or_else(|| ApiError::bad(field, format!("`{field}` must be a non-negative integer"))),
    }
}

fn boolean(body: &Value, field: &str) -> Result<Option<bool>, ApiError> {
    match body.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_bool().map(Some).ok_or_else(|| ApiError::bad(field, format!("`{field}` must be a boolean"))),
    }
}

fn present(body: &Value, field: &str) -> bool {
    body.get(field).is_some_and(|v| !v.is_null() && v != &Value::Bool(false))
}

/// Parses and validates a request body.
pub fn parse(endpoint: Endpoint, bytes: &[u8], gw: &GatewayPolicy) -> Result<ValidRequest, ApiError> {
    let body: Value = serde_json::from_slice(bytes)
        .map_err(|e| ApiError::BadRequest { message: format!("request body is not valid JSON: {e}"), param: None })?;
    if !body.is_object() {
        return Err(ApiError::BadRequest { message: "request body must be a JSON object".into(), param: None });
    }
    let model = match body.get("model") {
        Some(Value::String(s)) if !s.is_empty() => s.clone(),
        Some(_) => return Err(ApiError::bad("model", "`model` must be a non-empty string")),
        None => return Err(ApiError::bad("model", "`model` is required")),
    };
    let mut reason: Option<&'static str> = None;
    let mut why = |r: &'static str| {
        reason.get_or_insert(r);
    };

    let max_field = if endpoint == Endpoint::Chat && body.get("max_completion_tokens").is_some_and(|v| !v.is_null()) {
        "max_completion_tokens"
    } else {
        "max_tokens"
    };
    let default_max = if endpoint == Endpoint::Completions { 16 } else { gw.default_max_tokens };
    let max_tokens = uint(&body, max_field)?.unwrap_or(u64::from(default_max));
    if max_tokens == 0 || max_tokens > u64::from(gw.max_tokens_limit) {
        return Err(ApiError::bad(max_field, format!("`{max_field}` must be in 1..={}", gw.max_tokens_limit)));
    }
    let temperature = num(&body, "temperature")?.unwrap_or(1.0);
    if !(0.0..=2.0).contains(&temperature) {
        return Err(ApiError::bad("temperature", "`temperature` must be in [0, 2]"));
    }
    let top_p = num(&body, "top_p")?.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::bad("top_p", "`top_p` must be in (0, 1]"));
    }
    let seed = match body.get("seed") {
        None | Some(Value::Null) => None,
        Some(v) => Some(v.as_i64().ok_or_else(|| ApiError::bad("seed", "`seed` must be an integer"))? as u64),
    };
    let n = uint(&body, "n")?.unwrap_or(1);
    if n == 0 || n > 16 {
        return Err(ApiError::bad("n", "`n` must be in 1..=16"));
    }
    if n > 1 {
        why("n_greater_than_1");
    }
    let stream = boolean(&body, "stream")?.unwrap_or(false);
    let include_usage = match body.get("stream_options") {
        None | Some(Value::Null) => false,
        Some(Value::Object(o)) => match o.get("include_usage") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => return Err(ApiError::bad("stream_options.include_usage", "must be a boolean")),
        },
        Some(_) => return Err(ApiError::bad("stream_options", "`stream_options` must be an object")),
    };
    let stop = match body.get("stop") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) if a.len() <= 4 => a
            .iter()
            .map(|s| s.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| ApiError::bad("stop", "`stop` must be a string or up to 4 strings"))?,
        Some(_) => return Err(ApiError::bad("stop", "`stop` must be a string or up to 4 strings")),
    };
    for f in ["presence_penalty", "frequency_penalty"] {
        if let Some(v) = num(&body, f)? {
            if !(-2.0..=2.0).contains(&v) {
                return Err(ApiError::bad(f, format!("`{f}` must be in [-2, 2]")));
            }
            if v != 0.0 {
                why("penalties");
            }
        }
    }
    // Features the draft loop does not implement go to the target untouched.
    for (f, r) in [
        ("tools", "tools"),
        ("functions", "tools"),
        ("tool_choice", "tools"),
        ("logprobs", "logprobs"),
        ("top_logprobs", "logprobs"),
        ("logit_bias", "logit_bias"),
        ("response_format", "response_format"),
        ("echo", "echo"),
        ("suffix", "suffix"),
        ("best_of", "best_of"),
    ] {
        if present(&body, f) {
            why(r);
        }
    }

    let prompt = match endpoint {
        Endpoint::Chat => chat_messages(&body, &mut why)?.map(Prompt::Chat),
        Endpoint::Completions => completion_prompt(&body, &mut why)?,
    };
    Ok(ValidRequest {
        endpoint,
        model,
        prompt,
        max_tokens: max_tokens as u32,
        sampling: SamplingParams { temperature: temperature as f32, top_p: top_p as f32, seed },
        stop,
        stream,
        include_usage,
        passthrough_reason: reason,
    })
}

fn chat_messages(body: &Value, why: &mut impl FnMut(&'static str)) -> Result<Option<Vec<ChatMessage>>, ApiError> {
    let msgs = match body.get("messages") {
        Some(Value::Array(a)) if !a.is_empty() => a,
        Some(_) => return Err(ApiError::bad("messages", "`messages` must be a non-empty array")),
        None => return Err(ApiError::bad("messages", "`messages` is required")),
    };
    let mut out = Vec::with_capacity(msgs.len());
    let mut text_only = true;
    for (i, m) in msgs.iter().enumerate() {
        let field = |k: &str| format!("messages[{i}].{k}");
        let role = m.get("role").and_then(Value::as_str).ok_or_else(|| ApiError::bad(&field("role"), "each message needs a string `role`"))?;
        if !["system", "developer", "user", "assistant", "tool", "function"].contains(&role) {
            return Err(ApiError::bad(&field("role"), format!("unknown role {role:?}")));
        }
        if m.get("tool_calls").is_some_and(|v| !v.is_null()) || role == "tool" || role == "function" {
            text_only = false;
        }
        let content = match m.get("content") {
            Some(Value::String(s)) => s.clone(),
            None | Some(Value::Null) if role == "assistant" => String::new(),
            Some(Value::Array(parts)) => {
                let mut s = String::new();
                for (j, p) in parts.iter().enumerate() {
                    match (p.get("type").and_then(Value::as_str), p.get("text").and_then(Value::as_str)) {
                        (Some("text"), Some(t)) => s.push_str(t),
                        (Some(_), _) => text_only = false,
                        (None, _) => return Err(ApiError::bad(&format!("messages[{i}].content[{j}].type"), "each content part needs a `type`")),
                    }
                }
                s
            }
            _ => return Err(ApiError::bad(&field("content"), "`content` must be a string or an array of content parts")),
        };
        // The template knows "system"; "developer" is OpenAI's newer name for it.
        let role = if role == "developer" { "system" } else { role };
        out.push(ChatMessage { role: role.to_string(), content });
    }
    if !text_only {
        why("non_text_messages");
        return Ok(None);
    }
    Ok(Some(out))
}

fn completion_prompt(body: &Value, why: &mut impl FnMut(&'static str)) -> Result<Option<Prompt>, ApiError> {
    let ids = |a: &Vec<Value>| a.iter().map(|t| t.as_u64().and_then(|x| u32::try_from(x).ok())).collect::<Option<Vec<u32>>>();
    match body.get("prompt") {
        None => Err(ApiError::bad("prompt", "`prompt` is required")),
        Some(Value::String(s)) if !s.is_empty() => Ok(Some(Prompt::Text(s.clone()))),
        Some(Value::Array(a)) if !a.is_empty() && a.iter().all(Value::is_u64) => {
            ids(a).map(|v| Some(Prompt::Tokens(v))).ok_or_else(|| ApiError::bad("prompt", "token ids must fit in 32 bits"))
        }
        Some(Value::Array(a)) if a.len() == 1 && a[0].is_string() => {
            Ok(a[0].as_str().filter(|s| !s.is_empty()).map(|s| Prompt::Text(s.to_string())))
                .and_then(|p| p.ok_or_else(|| ApiError::bad("prompt", "`prompt` must not be empty")).map(Some))
        }
        Some(Value::Array(a)) if !a.is_empty() && a.iter().all(|x| x.is_string() || x.is_array()) => {
            // Several prompts in one request: only the target can answer them together.
            why("multiple_prompts");
            Ok(None)
        }
        Some(_) => Err(ApiError::bad("prompt", "`prompt` must be a non-empty string, array of strings or array of token ids")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gw() -> GatewayPolicy {
        GatewayPolicy {
            api_keys_env: None,
            max_body_bytes: 1 << 20,
            max_concurrent_requests: 4,
            request_timeout: std::time::Duration::from_secs(5),
            max_tokens_limit: 1000,
            default_max_tokens: 100,
        }
    }

    fn param_of(r: Result<ValidRequest, ApiError>) -> Option<String> {
        match r {
            Err(ApiError::BadRequest { param, .. }) => param,
            _ => None,
        }
    }

    #[test]
    fn valid_chat() -> Result<(), ApiError> {
        let r = parse(Endpoint::Chat, br#"{"model":"m","messages":[{"role":"user","content":"hi"}],"temperature":0,"stream":true,"stream_options":{"include_usage":true},"stop":"x"}"#, &gw())?;
        assert!(r.stream && r.include_usage && r.passthrough_reason.is_none());
        assert_eq!(r.max_tokens, 100);
        assert_eq!(r.stop, vec!["x".to_string()]);
        assert!(r.sampling.is_greedy());
        Ok(())
    }

    #[test]
    fn errors_name_the_field() {
        let g = gw();
        assert_eq!(param_of(parse(Endpoint::Chat, br#"{"messages":[]}"#, &g)), Some("model".into()));
        assert_eq!(param_of(parse(Endpoint::Chat, br#"{"model":"m","messages":[]}"#, &g)), Some("messages".into()));
        assert_eq!(param_of(parse(Endpoint::Chat, br#"{"model":"m","messages":[{"role":"x","content":"a"}]}"#, &g)), Some("messages[0].role".into()));
        assert_eq!(param_of(parse(Endpoint::Chat, br#"{"model":"m","messages":[{"role":"user","content":"a"}],"temperature":"hot"}"#, &g)), Some("temperature".into()));
        assert_eq!(param_of(parse(Endpoint::Chat, br#"{"model":"m","messages":[{"role":"user","content":"a"}],"max_tokens":0}"#, &g)), Some("max_tokens".into()));
        assert_eq!(param_of(parse(Endpoint::Chat, br#"{"model":"m","messages":[{"role":"user","content":"a"}],"max_tokens":5000}"#, &g)), Some("max_tokens".into()));
        assert_eq!(param_of(parse(Endpoint::Completions, br#"{"model":"m","prompt":5}"#, &g)), Some("prompt".into()));
        assert!(matches!(parse(Endpoint::Chat, b"{not json", &g), Err(ApiError::BadRequest { .. })));
    }

    #[test]
    fn unsupported_features_pass_through() -> Result<(), ApiError> {
        let g = gw();
        let r = parse(Endpoint::Chat, br#"{"model":"m","messages":[{"role":"user","content":"a"}],"tools":[{"type":"function"}]}"#, &g)?;
        assert_eq!(r.passthrough_reason, Some("tools"));
        let r = parse(Endpoint::Chat, br#"{"model":"m","messages":[{"role":"user","content":"a"}],"n":2}"#, &g)?;
        assert_eq!(r.passthrough_reason, Some("n_greater_than_1"));
        let r = parse(Endpoint::Completions, br#"{"model":"m","prompt":"a","logprobs":2}"#, &g)?;
        assert_eq!(r.passthrough_reason, Some("logprobs"));
        assert_eq!(r.max_tokens, 16);
        Ok(())
    }
}
