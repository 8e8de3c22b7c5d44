//! The features of a request the draft loop does not implement: a request that uses one passes
//! through, marked with the [`Reason`].

use serde_json::{Map, Value};

use super::Endpoint;
use crate::reason::Reason;

/// A field is "used" when present and not null, `false` or an empty object (`logit_bias: {}`
/// biases nothing, so approximate mode can serve it).
fn used(body: &Map<String, Value>, field: &str) -> bool {
    body.get(field).is_some_and(|v| {
        !v.is_null() && v != &Value::Bool(false) && !v.as_object().is_some_and(Map::is_empty)
    })
}

/// The first feature of the request the draft loop does not implement.
pub fn unsupported_feature(endpoint: Endpoint, body: &Map<String, Value>) -> Option<Reason> {
    let features = [
        // The legacy form of tools (`tools` is `tools::read`'s).
        ("functions", Reason::Tools),
        ("function_call", Reason::Tools),
        ("logprobs", Reason::Logprobs),
        ("top_logprobs", Reason::Logprobs),
        ("logit_bias", Reason::LogitBias),
        ("echo", Reason::Echo),
        ("suffix", Reason::Suffix),
        ("best_of", Reason::BestOf),
    ];
    if let Some((_, r)) = features.iter().find(|(f, _)| used(body, f)) {
        return Some(*r);
    }
    if super::format::unconstrained_type(body) {
        return Some(Reason::ResponseFormat);
    }
    let nonzero = |f: &str| {
        body.get(f)
            .is_some_and(|v| !v.is_null() && v.as_f64() != Some(0.0))
    };
    if nonzero("presence_penalty") || nonzero("frequency_penalty") {
        return Some(Reason::Penalties);
    }
    match endpoint {
        Endpoint::Chat => {
            let messages = body
                .get("messages")
                .and_then(Value::as_array)
                .map(Vec::as_slice)
                .unwrap_or_default();
            messages
                .iter()
                .any(not_text)
                .then_some(Reason::NonTextMessages)
        }
        Endpoint::Completions => match body.get("prompt") {
            Some(Value::Array(a))
                if a.len() > 1 && a.iter().all(|x| x.is_string() || x.is_array()) =>
            {
                Some(Reason::MultiplePrompts)
            }
            Some(Value::Array(a)) if a.len() == 1 && a[0].is_array() => {
                Some(Reason::MultiplePrompts)
            }
            _ => None,
        },
    }
}

/// A message the chat template cannot render as text: a legacy function result or non-text
/// parts (tool results and calls it renders).
fn not_text(m: &Value) -> bool {
    let role = m.get("role").and_then(Value::as_str);
    let parts_not_text = m
        .get("content")
        .and_then(Value::as_array)
        .is_some_and(|parts| {
            parts.iter().any(|p| {
                p.get("type")
                    .and_then(Value::as_str)
                    .is_some_and(|t| t != "text")
            })
        });
    role == Some("function") || parts_not_text
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn reason(endpoint: Endpoint, v: Value) -> Option<Reason> {
        match v {
            Value::Object(m) => unsupported_feature(endpoint, &m),
            _ => None,
        }
    }

    #[test]
    fn features_the_draft_loop_lacks_pass_through() {
        let msg = json!([{"role": "user", "content": "a"}]);
        assert_eq!(
            reason(
                Endpoint::Chat,
                json!({"messages": msg, "functions": [{"name": "f"}]})
            ),
            Some(Reason::Tools)
        );
        // `n` answers are `n` draft runs (its range is the limits' to check).
        assert_eq!(
            reason(Endpoint::Chat, json!({"messages": msg, "n": 2})),
            None
        );
        assert_eq!(
            reason(
                Endpoint::Chat,
                json!({"messages": msg, "n": 1, "logprobs": false})
            ),
            None
        );
        assert_eq!(
            reason(
                Endpoint::Chat,
                json!({"messages": msg, "presence_penalty": 0.5})
            ),
            Some(Reason::Penalties)
        );
        assert_eq!(
            reason(
                Endpoint::Chat,
                json!({"messages": msg, "frequency_penalty": 0})
            ),
            None
        );
        assert_eq!(
            reason(Endpoint::Completions, json!({"prompt": "a", "logprobs": 2})),
            Some(Reason::Logprobs)
        );
        assert_eq!(
            reason(Endpoint::Completions, json!({"prompt": ["a", "b"]})),
            Some(Reason::MultiplePrompts)
        );
        assert_eq!(
            reason(Endpoint::Completions, json!({"prompt": [[1, 2]]})),
            Some(Reason::MultiplePrompts)
        );
        assert_eq!(
            reason(Endpoint::Completions, json!({"prompt": [1, 2]})),
            None
        );
        let image = json!([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]);
        assert_eq!(
            reason(Endpoint::Chat, json!({"messages": image})),
            Some(Reason::NonTextMessages)
        );
        let tool = json!([{"role": "tool", "content": "42", "tool_call_id": "t"}]);
        assert_eq!(reason(Endpoint::Chat, json!({"messages": tool})), None);
        let function = json!([{"role": "function", "content": "42", "name": "f"}]);
        assert_eq!(
            reason(Endpoint::Chat, json!({"messages": function})),
            Some(Reason::NonTextMessages)
        );
    }
}
