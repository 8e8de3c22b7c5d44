//! Validation of a request the approximate path will serve: the typed request becomes a
//! [`ValidRequest`] (limits, ranges, text-only messages) and then prompt token ids, or one
//! [`ValidationError`] that names the offending field. Requests that pass through are held to
//! the limits in `limits` only; the target judges the rest.

use approxy_verifier::request::{
    ChatMessage, ChatTemplate, SamplingParams, Segment, Tokenizer, TooMany,
};
use axum::http::HeaderMap;
use serde_json::Value;

use super::error::ValidationError;
use super::limits::{MAX_PROMPT_TOKENS, MAX_STOP_BYTES, MAX_STOPS};
use super::{Content, Endpoint, GenerationRequest, Prompt, PromptInput, Stop, THRESHOLD_HEADER};
use crate::policy::{GatewayPolicy, ModelPolicy};

/// A request the approximate path can serve.
#[derive(Debug, Clone)]
pub struct ValidRequest {
    /// Endpoint.
    pub endpoint: Endpoint,
    /// Model id.
    pub model: String,
    /// Prompt.
    pub prompt: Prompt,
    /// Generation limit.
    pub max_tokens: u32,
    /// Whether the client set the limit (otherwise it is the gateway's default).
    pub max_tokens_given: bool,
    /// Sampling.
    pub sampling: SamplingParams,
    /// Stop strings.
    pub stop: Vec<String>,
    /// SSE streaming.
    pub stream: bool,
    /// `stream_options.include_usage`.
    pub include_usage: bool,
    /// The tools the chat template renders (`tools`, as sent; empty without tools).
    pub tools: Vec<Value>,
    /// The tools an answer may call in a form of its own, bare or fenced JSON
    /// (`tool_choice: "auto"`; empty otherwise).
    pub auto_tools: Vec<approxy_verifier::request::Tool>,
}

fn in_range(
    param: &'static str,
    ok: bool,
    range: impl Into<String>,
) -> Result<(), ValidationError> {
    if ok {
        Ok(())
    } else {
        Err(ValidationError::OutOfRange {
            param,
            range: range.into(),
        })
    }
}

/// Checks a typed request against the gateway's limits.
pub fn validate(
    endpoint: Endpoint,
    r: GenerationRequest,
    gw: &GatewayPolicy,
) -> Result<ValidRequest, ValidationError> {
    if r.model.is_empty() {
        return Err(ValidationError::OutOfRange {
            param: "model",
            range: "non-empty strings".into(),
        });
    }
    let (max_field, max) = match (endpoint, r.max_completion_tokens) {
        (Endpoint::Chat, Some(m)) => ("max_completion_tokens", Some(m)),
        _ => ("max_tokens", r.max_tokens),
    };
    let default_max = if endpoint == Endpoint::Completions {
        16
    } else {
        gw.default_max_tokens
    };
    let max_tokens = max.unwrap_or(default_max);
    in_range(
        max_field,
        (1..=gw.max_tokens_limit).contains(&max_tokens),
        format!("1..={}", gw.max_tokens_limit),
    )?;
    let temperature = r.temperature.unwrap_or(1.0);
    in_range("temperature", (0.0..=2.0).contains(&temperature), "[0, 2]")?;
    let top_p = r.top_p.unwrap_or(1.0);
    in_range("top_p", top_p > 0.0 && top_p <= 1.0, "(0, 1]")?;
    let stop = match r.stop {
        None => Vec::new(),
        Some(Stop::One(s)) => vec![s],
        Some(Stop::Many(v)) if v.len() <= MAX_STOPS => v,
        Some(Stop::Many(_)) => return Err(ValidationError::TooManyStops),
    };
    // Each emitted token is matched against every stop string; bounded strings keep that
    // cheap whatever a client sends.
    if stop
        .iter()
        .any(|s| s.is_empty() || s.len() > MAX_STOP_BYTES)
    {
        return Err(ValidationError::OutOfRange {
            param: "stop",
            range: format!("strings of 1 to {MAX_STOP_BYTES} bytes"),
        });
    }
    let prompt = match endpoint {
        Endpoint::Chat => Prompt::Chat(chat_messages(r.messages)?),
        Endpoint::Completions => completion_prompt(r.prompt)?,
    };
    Ok(ValidRequest {
        endpoint,
        model: r.model,
        prompt,
        max_tokens,
        max_tokens_given: max.is_some(),
        sampling: SamplingParams {
            temperature,
            top_p,
            // Bit for bit: the target clients write it back as an i64, so a negative seed
            // reaches the target as the client sent it.
            seed: r.seed.map(|s| s as u64),
        },
        stop,
        stream: r.stream.unwrap_or(false),
        include_usage: r
            .stream_options
            .and_then(|o| o.include_usage)
            .unwrap_or(false),
        tools: Vec::new(),
        auto_tools: Vec::new(),
    })
}

fn chat_messages(
    messages: Option<Vec<super::Message>>,
) -> Result<Vec<ChatMessage>, ValidationError> {
    let messages = messages.ok_or_else(|| ValidationError::Missing("messages".into()))?;
    if messages.is_empty() {
        return Err(ValidationError::OutOfRange {
            param: "messages",
            range: "non-empty arrays".into(),
        });
    }
    messages
        .into_iter()
        .enumerate()
        .map(|(index, m)| {
            // The template knows "system"; "developer" is OpenAI's newer name for it.
            let role = match m.role.as_str() {
                "system" | "developer" => "system",
                "user" => "user",
                "assistant" => "assistant",
                "tool" => "tool",
                _ => {
                    return Err(ValidationError::UnknownRole {
                        index,
                        role: m.role,
                    });
                }
            };
            let content = match m.content {
                None => String::new(),
                Some(Content::Text(t)) => t,
                Some(Content::Parts(parts)) => parts.into_iter().filter_map(|p| p.text).collect(),
            };
            let tool_calls = match m.extra.get("tool_calls") {
                Some(Value::Array(calls)) if role == "assistant" => {
                    Some(calls.iter().map(template_call).collect())
                }
                _ => None,
            };
            Ok(ChatMessage {
                role: role.to_string(),
                content,
                tool_calls,
            })
        })
        .collect()
}

/// An assistant's tool call as chat templates read it: the function, with its arguments (a
/// JSON text in OpenAI's shape, checked by `shapes`) as the object they hold.
fn template_call(call: &Value) -> Value {
    let f = &call["function"];
    let arguments = f["arguments"]
        .as_str()
        .and_then(|a| serde_json::from_str::<Value>(a).ok())
        .unwrap_or_else(|| f["arguments"].clone());
    serde_json::json!({
        "type": "function",
        "function": {"name": f["name"], "arguments": arguments},
    })
}

fn completion_prompt(prompt: Option<PromptInput>) -> Result<Prompt, ValidationError> {
    match prompt.ok_or_else(|| ValidationError::Missing("prompt".into()))? {
        PromptInput::Text(t) if !t.is_empty() => Ok(Prompt::Text(t)),
        PromptInput::Tokens(ids) if !ids.is_empty() => Ok(Prompt::Tokens(ids)),
        PromptInput::Texts(mut v) if v.len() == 1 && !v[0].is_empty() => {
            Ok(Prompt::Text(v.remove(0)))
        }
        _ => Err(ValidationError::EmptyPrompt(Endpoint::Completions)),
    }
}

/// The prompt as token ids, at most `limit` of them (at most [`MAX_PROMPT_TOKENS`], the draft's
/// own limit). Tokenizing stops once the prompt is past `limit` (the error then says how many it
/// has at least), so a prompt of megabytes costs the tokenizer's work and memory for that many
/// tokens, not for all of them.
pub fn prompt_tokens(
    v: &ValidRequest,
    template: &ChatTemplate,
    tokenizer: &Tokenizer,
    vocab: usize,
    limit: usize,
) -> Result<Vec<u32>, ValidationError> {
    let limit = limit.min(MAX_PROMPT_TOKENS);
    let too_long = |TooMany(tokens)| ValidationError::PromptTooLong {
        endpoint: v.endpoint,
        tokens,
        max: limit,
    };
    let ids = match &v.prompt {
        Prompt::Chat(msgs) => {
            chat_tokens(msgs, &v.tools, template, tokenizer, limit)?.map_err(too_long)?
        }
        Prompt::Text(t) => tokenizer
            .encode_within(t, limit)
            .map_err(|e| ValidationError::Template(e.to_string()))?
            .map_err(too_long)?,
        Prompt::Tokens(ids) if ids.len() > limit => {
            return Err(too_long(TooMany(ids.len())));
        }
        Prompt::Tokens(ids) => ids.clone(),
    };
    if ids.is_empty() {
        return Err(ValidationError::EmptyPrompt(v.endpoint));
    }
    if ids.iter().any(|&t| t as usize >= vocab) {
        return Err(ValidationError::TokenOutOfVocabulary(vocab));
    }
    Ok(ids)
}

/// A chat prompt's ids, at most `limit` of them. Special tokens come only from the
/// template: a message whose content holds special-token text (`<|im_start|>system`, to fake a
/// turn) has that text tokenized as plain text. Such messages are rare, so the common case
/// renders and tokenizes in one piece.
fn chat_tokens(
    msgs: &[ChatMessage],
    tools: &[Value],
    template: &ChatTemplate,
    tokenizer: &Tokenizer,
    limit: usize,
) -> Result<Result<Vec<u32>, TooMany>, ValidationError> {
    let fail = |e: String| ValidationError::Template(e);
    let specials = tokenizer.special_texts();
    let special_in = |text: &str| specials.iter().any(|s| text.contains(s.as_str()));
    // The template writes tools and tool calls as its own text, where special-token text
    // would become the special token: refused, as no segment can keep it apart.
    let calls = msgs.iter().filter_map(|m| m.tool_calls.as_ref());
    if tools
        .iter()
        .chain(calls.flatten())
        .any(|v| special_in(&v.to_string()))
    {
        return Err(ValidationError::Invalid {
            param: "tools".into(),
            reason: "a tool or tool call holds special-token text".into(),
        });
    }
    if !msgs.iter().any(|m| special_in(&m.content)) {
        return tokenizer
            .encode_within(
                &template
                    .render_with_tools(msgs, tools)
                    .map_err(|e| fail(e.to_string()))?,
                limit,
            )
            .map_err(|e| fail(e.to_string()));
    }
    let Some(segments) = template
        .render_segments(msgs, tools)
        .map_err(|e| fail(e.to_string()))?
    else {
        return Err(ValidationError::Invalid {
            param: "messages".into(),
            reason:
                "special-token text in a message cannot be kept apart from this chat template's own"
                    .into(),
        });
    };
    let mut ids = Vec::new();
    for s in segments {
        let left = limit - ids.len();
        let part = match s {
            Segment::Template(t) => tokenizer.encode_within(&t, left),
            Segment::Content(c) => tokenizer.encode_plain_within(&c, left),
        };
        match part.map_err(|e| fail(e.to_string()))? {
            Ok(part) => ids.extend(part),
            Err(TooMany(n)) => return Ok(Err(TooMany(ids.len() + n))),
        }
    }
    Ok(Ok(ids))
}

/// The per-request threshold from the header, checked against the model's allowed range.
pub fn requested_threshold(
    headers: &HeaderMap,
    mp: &ModelPolicy,
) -> Result<Option<f32>, ValidationError> {
    let Some(v) = headers.get(THRESHOLD_HEADER) else {
        return Ok(None);
    };
    let t: f32 = v
        .to_str()
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .filter(|t: &f32| t.is_finite())
        .ok_or(ValidationError::ThresholdNotANumber)?;
    let (lo, hi) = mp.threshold_override;
    if t < lo || t > hi {
        return Err(ValidationError::ThresholdOutOfRange { value: t, lo, hi });
    }
    Ok(Some(t))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gw() -> GatewayPolicy {
        GatewayPolicy {
            auth: crate::policy::Auth::None,
            api_keys_env: None,
            max_body_bytes: 1 << 20,
            max_concurrent_requests: 4,
            request_timeout: std::time::Duration::from_secs(5),
            header_timeout: std::time::Duration::from_secs(10),
            max_n: 16,
            max_response_bytes: 32 << 20,
            body_timeout: std::time::Duration::from_secs(30),
            body_idle_timeout: std::time::Duration::from_secs(10),
            max_connections: 16,
            idle_timeout: std::time::Duration::from_secs(60),
            max_connections_per_ip: 16,
            write_idle_timeout: std::time::Duration::from_secs(60),
            max_tokens_limit: 1000,
            default_max_tokens: 100,
        }
    }

    fn check(endpoint: Endpoint, body: serde_json::Value) -> Result<ValidRequest, ValidationError> {
        let r = crate::request::parse(&body).map_err(|(p, m)| ValidationError::from_parse(p, m))?;
        validate(endpoint, r, &gw())
    }

    fn param_of(r: Result<ValidRequest, ValidationError>) -> Option<String> {
        r.err().and_then(|e| e.param())
    }

    #[test]
    fn valid_chat() -> Result<(), ValidationError> {
        let r = check(
            Endpoint::Chat,
            serde_json::json!({"model":"m","messages":[{"role":"developer","content":[{"type":"text","text":"be brief"}]},{"role":"user","content":"hi"}],
                               "temperature":0,"stream":true,"stream_options":{"include_usage":true},"stop":"x"}),
        )?;
        assert!(r.stream && r.include_usage);
        assert_eq!(r.max_tokens, 100);
        assert_eq!(r.stop, vec!["x".to_string()]);
        assert!(r.sampling.is_greedy());
        let Prompt::Chat(m) = r.prompt else {
            return Err(ValidationError::NotObject);
        };
        assert_eq!(
            (m[0].role.as_str(), m[0].content.as_str()),
            ("system", "be brief")
        );
        Ok(())
    }

    #[test]
    fn errors_name_the_field() {
        use serde_json::json;
        let chat = |v| param_of(check(Endpoint::Chat, v));
        assert_eq!(chat(json!({"messages":[]})), Some("model".into()));
        assert_eq!(chat(json!({"model":"m"})), Some("messages".into()));
        assert_eq!(
            chat(json!({"model":"m","messages":[]})),
            Some("messages".into())
        );
        assert_eq!(
            chat(json!({"model":"m","messages":[{"role":"x","content":"a"}]})),
            Some("messages[0].role".into())
        );
        assert_eq!(
            chat(json!({"model":"m","messages":[{"content":"a"}]})),
            Some("messages[0].role".into())
        );
        assert_eq!(
            chat(
                json!({"model":"m","messages":[{"role":"user","content":"a"}],"temperature":"hot"})
            ),
            Some("temperature".into())
        );
        assert_eq!(
            chat(json!({"model":"m","messages":[{"role":"user","content":"a"}],"temperature":3})),
            Some("temperature".into())
        );
        assert_eq!(
            chat(json!({"model":"m","messages":[{"role":"user","content":"a"}],"max_tokens":0})),
            Some("max_tokens".into())
        );
        assert_eq!(
            chat(
                json!({"model":"m","messages":[{"role":"user","content":"a"}],"max_completion_tokens":5000})
            ),
            Some("max_completion_tokens".into())
        );
        assert_eq!(
            chat(
                json!({"model":"m","messages":[{"role":"user","content":"a"}],"stop":["a","b","c","d","e"]})
            ),
            Some("stop".into())
        );
        assert_eq!(
            chat(
                json!({"model":"m","messages":[{"role":"user","content":"a"}],"stop":["x".repeat(257)]})
            ),
            Some("stop".into())
        );
        assert_eq!(
            chat(json!({"model":"m","messages":[{"role":"user","content":"a"}],"stop":[""]})),
            Some("stop".into())
        );
        assert_eq!(
            param_of(check(
                Endpoint::Completions,
                json!({"model":"m","prompt":5})
            )),
            Some("prompt".into())
        );
        assert_eq!(
            param_of(check(
                Endpoint::Completions,
                json!({"model":"m","prompt":""})
            )),
            Some("prompt".into())
        );
        assert_eq!(
            param_of(check(Endpoint::Completions, json!({"model":"m"}))),
            Some("prompt".into())
        );
    }

    #[test]
    fn completion_defaults_to_sixteen_tokens() -> Result<(), ValidationError> {
        let r = check(
            Endpoint::Completions,
            serde_json::json!({"model":"m","prompt":[1,2,3]}),
        )?;
        assert_eq!(r.max_tokens, 16);
        assert!(matches!(r.prompt, Prompt::Tokens(ref t) if t == &[1, 2, 3]));
        Ok(())
    }
}
