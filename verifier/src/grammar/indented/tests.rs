use serde_json::{Value, json};

use super::super::{Constraint, GrammarSpec, Grammars, JsonLayout, Next};
use crate::testing::{END_OF_TEXT, IM_END, VOCAB, tiny_tokenizer};

fn grammars() -> Grammars {
    Grammars::new(&tiny_tokenizer(), VOCAB, &[IM_END, END_OF_TEXT]).expect("tiny vocabulary")
}

fn indented(g: &Grammars, schema: Value) -> Constraint {
    g.constraint(&GrammarSpec::JsonSchema(schema), JsonLayout::Indented)
        .expect("compiles")
}

/// Whether the grammar takes `text` (byte tokens) whole and may end after it.
fn takes(mut c: Constraint, text: &str) -> bool {
    for b in text.bytes() {
        if !c.allows(u32::from(b)) || c.consume(u32::from(b)).is_err() {
            return false;
        }
    }
    c.accepting()
}

/// Takes whatever the grammar forces, as text.
fn forced(c: &mut Constraint) -> String {
    let mut out = Vec::new();
    while let Ok(Next::Forced(ts)) = c.step() {
        for t in ts {
            c.consume(t).expect("a forced token is allowed");
            out.push(t as u8);
        }
    }
    String::from_utf8(out).expect("text")
}

fn person() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "age": {"type": "integer"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "address": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
                "required": ["city", "zip"],
                "additionalProperties": false
            }
        },
        "required": ["name", "age", "tags", "address"],
        "additionalProperties": false
    })
}

#[test]
fn members_go_on_lines_indented_by_depth_and_the_layout_is_forced() {
    let g = grammars();
    let mut c = indented(&g, person());
    assert_eq!(forced(&mut c), "{\n  \"name\": \"");
    for b in "Al\",".bytes() {
        c.consume(u32::from(b)).expect("a name");
    }
    assert_eq!(forced(&mut c), "\n  \"age\": ");
    for b in "31,".bytes() {
        c.consume(u32::from(b)).expect("an age");
    }
    assert_eq!(forced(&mut c), "\n  \"tags\": [");
    assert!(c.allows(u32::from(b'\n')) && c.allows(u32::from(b'"')) && c.allows(u32::from(b']')));
    assert!(!c.allows(u32::from(b' ')), "no free whitespace");
    for b in "]".bytes() {
        c.consume(u32::from(b)).expect("no tags");
    }
    assert_eq!(forced(&mut c), ",\n  \"address\": {\n    \"city\": \"");
}

#[test]
fn what_serde_writes_pretty_and_arrays_on_one_line_are_taken_and_compact_is_not() {
    let g = grammars();
    let pretty = "{\n  \"name\": \"Al\",\n  \"age\": 31,\n  \"tags\": [\n    \"a\",\n    \"b\"\n  ],\n  \"address\": {\n    \"city\": \"Oslo\",\n    \"zip\": \"0150\"\n  }\n}";
    let value: Value = serde_json::from_str(pretty).expect("json");
    assert!(takes(indented(&g, person()), pretty));
    assert!(takes(
        indented(&g, person()),
        &pretty.replace("[\n    \"a\",\n    \"b\"\n  ]", "[\"a\", \"b\"]")
    ));
    assert!(takes(
        indented(&g, person()),
        &pretty.replace("[\n    \"a\",\n    \"b\"\n  ]", "[]")
    ));
    assert!(!takes(indented(&g, person()), &value.to_string()));
    assert!(!takes(
        indented(&g, person()),
        &pretty.replace("\"age\": 31", "\"age\":31")
    ));
}

#[test]
fn optional_members_may_be_left_out_anywhere_and_an_object_of_none_is_empty() {
    let g = grammars();
    let schema = json!({
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}, "c": {"type": "integer"}},
        "required": ["b"]
    });
    for (text, ok) in [
        ("{\n  \"b\": 1\n}", true),
        ("{\n  \"a\": 1,\n  \"b\": 2\n}", true),
        ("{\n  \"b\": 2,\n  \"c\": 3\n}", true),
        ("{\n  \"a\": 1,\n  \"b\": 2,\n  \"c\": 3\n}", true),
        ("{\n  \"a\": 1\n}", false),
        ("{\n  \"c\": 3,\n  \"b\": 2\n}", false),
        ("{}", false),
    ] {
        assert_eq!(takes(indented(&g, schema.clone()), text), ok, "{text}");
    }
    let none_required = json!({
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}
    });
    for (text, ok) in [
        ("{}", true),
        ("{\n  \"b\": 2\n}", true),
        ("{\n  \"a\": 1,\n  \"b\": 2\n}", true),
        ("{\n\n}", false),
    ] {
        assert_eq!(
            takes(indented(&g, none_required.clone()), text),
            ok,
            "{text}"
        );
    }
}

#[test]
fn definitions_are_followed_and_a_cycle_is_written_compact() {
    let g = grammars();
    // As Pydantic writes a nested model and an enum.
    let pydantic = json!({
        "$defs": {
            "Level": {"enum": ["low", "high"], "title": "Level", "type": "string"},
            "Item": {
                "properties": {"task": {"title": "Task", "type": "string"}, "level": {"$ref": "#/$defs/Level"}},
                "required": ["task", "level"],
                "title": "Item",
                "type": "object"
            }
        },
        "properties": {"items": {"items": {"$ref": "#/$defs/Item"}, "title": "Items", "type": "array"}},
        "required": ["items"],
        "title": "Plan",
        "type": "object"
    });
    let text = "{\n  \"items\": [\n    {\n      \"task\": \"x\",\n      \"level\": \"high\"\n    }\n  ]\n}";
    assert!(takes(indented(&g, pydantic.clone()), text));
    assert!(!takes(
        indented(&g, pydantic),
        &text.replace("\"high\"", "\"mid\"")
    ));
    let recursive = json!({
        "$defs": {"Node": {
            "type": "object",
            "properties": {"value": {"type": "integer"}, "next": {"$ref": "#/$defs/Node"}},
            "required": ["value"]
        }},
        "$ref": "#/$defs/Node"
    });
    assert!(takes(
        indented(&g, recursive),
        "{\"value\": 1, \"next\": {\"value\": 2}}"
    ));
}

#[test]
fn json_mode_lays_out_any_object_and_what_it_cannot_lay_out_stays_compact() {
    let g = grammars();
    let any = || {
        g.constraint(&GrammarSpec::JsonObject, JsonLayout::Indented)
            .expect("compiles")
    };
    assert!(takes(any(), "{}"));
    assert!(takes(
        any(),
        "{\n  \"a\": [1, 2],\n  \"b\": {\n    \"c\": null\n  },\n  \"d\": [\n    {\n      \"e\": true\n    }\n  ]\n}"
    ));
    assert!(!takes(any(), "{\"a\": 1}"));
    assert!(!takes(any(), "[1]"));
    // A map (`additionalProperties` a schema) is llguidance's, on one line.
    let map = json!({
        "type": "object",
        "properties": {"counts": {"type": "object", "additionalProperties": {"type": "integer"}}},
        "required": ["counts"]
    });
    assert!(takes(
        indented(&g, map),
        "{\n  \"counts\": {\"x\": 1, \"y\": 2}\n}"
    ));
}

#[test]
fn the_two_layouts_are_cached_apart() {
    let g = grammars();
    let spec = GrammarSpec::JsonSchema(person());
    let mut compact = g.constraint(&spec, JsonLayout::Compact).expect("compiles");
    let mut laid_out = g.constraint(&spec, JsonLayout::Indented).expect("compiles");
    assert_eq!(forced(&mut compact), "{\"name\": \"");
    assert_eq!(forced(&mut laid_out), "{\n  \"name\": \"");
}

#[test]
fn a_schema_whose_indented_grammar_is_too_large_is_written_compact() {
    let g = grammars();
    // Under the compiled limit as a schema, over it as indented Lark (each member's line is
    // written into two rules).
    let props: serde_json::Map<String, Value> = (0..1000)
        .map(|i| (format!("property_number_{i}"), json!({"type": "string"})))
        .collect();
    let required: Vec<&String> = props.keys().collect();
    let schema = json!({"type": "object", "properties": props, "required": required});
    assert!(schema.to_string().len() < super::super::MAX_SCHEMA_BYTES);
    assert!(super::schema_lark(&schema).expect("laid out").len() > super::super::MAX_SCHEMA_BYTES);
    let mut c = indented(&g, schema);
    assert_eq!(forced(&mut c), "{\"property_number_0\": \"");
}
