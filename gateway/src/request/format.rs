//! `response_format`: `text` is the API's default, as if absent; JSON mode and a JSON Schema
//! approxy answers under a grammar; any other type, or a shape it cannot read, passes through
//! for the target to judge.

use approxy_verifier::request::GrammarSpec;
use serde_json::{Map, Value, json};

/// What a request's `response_format` asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum Format {
    /// Free text: absent, null, or `{"type": "text"}`.
    Text,
    /// An answer under a grammar.
    Structured(GrammarSpec),
    /// Something approxy does not constrain to.
    Unknown,
}

/// Reads `response_format`.
pub fn read(body: &Map<String, Value>) -> Format {
    let rf = match body.get("response_format") {
        None | Some(Value::Null) => return Format::Text,
        Some(Value::Object(rf)) => rf,
        Some(_) => return Format::Unknown,
    };
    match rf.get("type").and_then(Value::as_str) {
        Some("text") => Format::Text,
        Some("json_object") => Format::Structured(GrammarSpec::JsonObject),
        Some("json_schema") => match rf.get("json_schema") {
            Some(Value::Object(js)) => match js.get("schema") {
                // No schema: any JSON value, as the API reads it.
                None | Some(Value::Null) => Format::Structured(GrammarSpec::JsonSchema(json!({}))),
                Some(s @ Value::Object(_)) => {
                    Format::Structured(GrammarSpec::JsonSchema(s.clone()))
                }
                Some(_) => Format::Unknown,
            },
            _ => Format::Unknown,
        },
        _ => Format::Unknown,
    }
}

/// True when `response_format` asks for what approxy does not constrain to.
pub fn unconstrained_type(body: &Map<String, Value>) -> bool {
    read(body) == Format::Unknown
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(v: Value) -> Format {
        match v {
            Value::Object(m) => read(&m),
            _ => Format::Unknown,
        }
    }

    #[test]
    fn text_is_the_default_and_json_types_are_structured() {
        assert_eq!(of(json!({})), Format::Text);
        assert_eq!(of(json!({"response_format": null})), Format::Text);
        assert_eq!(
            of(json!({"response_format": {"type": "text"}})),
            Format::Text
        );
        assert_eq!(
            of(json!({"response_format": {"type": "json_object"}})),
            Format::Structured(GrammarSpec::JsonObject)
        );
        let schema = json!({"type": "object", "properties": {"a": {"type": "string"}}});
        assert_eq!(
            of(json!({"response_format": {"type": "json_schema",
                "json_schema": {"name": "x", "strict": true, "schema": schema.clone()}}})),
            Format::Structured(GrammarSpec::JsonSchema(schema))
        );
        assert_eq!(
            of(json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}})),
            Format::Structured(GrammarSpec::JsonSchema(json!({})))
        );
    }

    #[test]
    fn what_it_cannot_read_is_the_targets_to_judge() {
        for v in [
            json!({"response_format": "json"}),
            json!({"response_format": {"type": "grammar", "grammar": "root ::= x"}}),
            json!({"response_format": {"type": "json_schema"}}),
            json!({"response_format": {"type": "json_schema", "json_schema": {"schema": "{}"}}}),
            json!({"response_format": {}}),
        ] {
            assert_eq!(of(v.clone()), Format::Unknown, "{v}");
        }
    }
}
