use serde_json::json;

use super::*;
use crate::testing::{END_OF_TEXT, IM_END, VOCAB, tiny_tokenizer};

fn grammars() -> Grammars {
    let tok = tiny_tokenizer();
    Grammars::new(&tok, VOCAB, &[IM_END, END_OF_TEXT]).expect("tiny vocabulary")
}

fn bytes(s: &str) -> Vec<u32> {
    s.bytes().map(u32::from).collect()
}

/// Takes whatever the grammar forces; `None` at a free choice.
fn forced(c: &mut Constraint) -> Vec<u32> {
    let mut out = Vec::new();
    while let Ok(Next::Forced(ts)) = c.step() {
        for t in ts {
            c.consume(t).expect("a forced token is allowed");
            out.push(t);
        }
    }
    out
}

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {"age": {"type": "integer"}, "ok": {"type": "boolean"}},
        "required": ["age", "ok"],
        "additionalProperties": false
    })
}

#[test]
fn a_schema_forces_its_keys_and_separators_and_allows_only_legal_values() {
    let g = grammars();
    let mut c = g
        .constraint(&GrammarSpec::JsonSchema(schema()), JsonLayout::Compact)
        .expect("compiles");
    assert_eq!(forced(&mut c), bytes("{\"age\": "));
    assert!(c.allows(u32::from(b'4')));
    assert!(!c.allows(u32::from(b'x')));
    assert!(!c.allows(u32::from(b'"')));
    assert!(!c.allows(IM_END), "the answer cannot end inside the object");
    let Ok(Next::Choose(mask)) = c.step() else {
        panic!("a number is the draft's to choose")
    };
    let mut logits = vec![1.0f32; VOCAB];
    mask.apply(&mut logits);
    assert!(logits[usize::from(b'7')].is_finite());
    assert_eq!(logits[usize::from(b'a')], f32::NEG_INFINITY);
    for t in bytes("42") {
        c.consume(t).expect("digits");
    }
    c.consume(u32::from(b',')).expect("the integer ends");
    assert_eq!(forced(&mut c), bytes(" \"ok\": "));
    for t in bytes("true}") {
        c.consume(t).expect("a boolean and the end");
    }
    assert!(c.accepting());
    assert!(c.allows(IM_END));
    assert!(matches!(c.step(), Ok(Next::End)));
}

#[test]
fn json_mode_allows_any_object_and_nothing_else() {
    let g = grammars();
    let mut c = g
        .constraint(&GrammarSpec::JsonObject, JsonLayout::Compact)
        .expect("compiles");
    assert_eq!(forced(&mut c), bytes("{"));
    assert!(c.allows(u32::from(b'"')));
    assert!(c.allows(u32::from(b'}')));
    assert!(!c.allows(u32::from(b'[')));
}

#[test]
fn schemas_it_cannot_compile_are_refused_and_the_refusal_is_kept() {
    let g = grammars();
    let bad = GrammarSpec::JsonSchema(
        json!({"type": "object", "properties": {"a": {"type": "nonsense"}}}),
    );
    assert!(matches!(
        g.constraint(&bad, JsonLayout::Compact),
        Err(Unsupported::Refused(_))
    ));
    assert!(matches!(
        g.constraint(&bad, JsonLayout::Compact),
        Err(Unsupported::Refused(_))
    ));
    let huge: serde_json::Map<String, Value> = (0..4000)
        .map(|i| (format!("property_number_{i}"), json!({"type": "string"})))
        .collect();
    let huge = GrammarSpec::JsonSchema(json!({"type": "object", "properties": huge}));
    assert!(matches!(
        g.constraint(&huge, JsonLayout::Compact),
        Err(Unsupported::TooLarge(_))
    ));
}

#[test]
fn a_cached_grammar_starts_every_answer_afresh() {
    let g = grammars();
    let spec = GrammarSpec::JsonSchema(schema());
    let mut first = g.constraint(&spec, JsonLayout::Compact).expect("compiles");
    forced(&mut first);
    first.consume(u32::from(b'1')).expect("a digit");
    let mut second = g.constraint(&spec, JsonLayout::Compact).expect("cached");
    assert_eq!(forced(&mut second), bytes("{\"age\": "));
    // The first one's state is its own.
    assert!(first.allows(u32::from(b'2')));
    assert!(!first.allows(u32::from(b'"')));
}

fn tools(choice: ToolChoice, parallel: bool) -> GrammarSpec {
    GrammarSpec::Tools(ToolsSpec {
        tools: vec![
            Tool {
                name: "get_weather".into(),
                parameters: json!({"type": "object", "properties": {"city": {"type": "string"}},
                                   "required": ["city"], "additionalProperties": false}),
            },
            Tool {
                name: "get_time".into(),
                parameters: json!({}),
            },
        ],
        choice,
        parallel,
    })
}

/// Takes `text` a byte at a time, checking each is allowed; false at the first refused.
fn take(c: &mut Constraint, text: &str) -> bool {
    for t in bytes(text) {
        if !c.allows(t) {
            return false;
        }
        c.consume(t).expect("an allowed byte");
    }
    true
}

const WEATHER_CALL: &str =
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>";

#[test]
fn a_required_call_forces_its_frame_and_names_only_the_tools() {
    let g = grammars();
    let mut c = g
        .constraint(&tools(ToolChoice::Required, false), JsonLayout::Compact)
        .expect("compiles");
    // Up to the name's first letters, which the two tools share.
    assert_eq!(forced(&mut c), bytes("<tool_call>\n{\"name\": \"get_"));
    assert!(c.allows(u32::from(b'w')) && c.allows(u32::from(b't')));
    assert!(!c.allows(u32::from(b'x')));
    assert!(take(&mut c, "w"));
    // The rest of the name and the arguments' frame up to the city's value.
    assert_eq!(
        forced(&mut c),
        bytes("eather\", \"arguments\": {\"city\": \"")
    );
    assert!(take(&mut c, "Oslo\"}"));
    assert_eq!(forced(&mut c), bytes("}\n</tool_call>"));
    // One call only: the answer ends.
    assert!(matches!(c.step(), Ok(Next::End)));
}

#[test]
fn auto_allows_text_or_calls_and_none_allows_text_only() {
    let g = grammars();
    let mut text = g
        .constraint(&tools(ToolChoice::Auto, true), JsonLayout::Compact)
        .expect("compiles");
    assert!(text.allows(u32::from(b'<')) && text.allows(u32::from(b'I')));
    assert!(take(&mut text, "It is sunny <b>"));
    assert!(text.accepting());
    let mut call = g
        .constraint(&tools(ToolChoice::Auto, true), JsonLayout::Compact)
        .expect("cached");
    assert!(take(&mut call, WEATHER_CALL));
    // Parallel calls: another may follow, or the answer ends.
    assert!(call.accepting());
    assert!(take(
        &mut call,
        "\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>"
    ));
    assert!(call.accepting());
    let mut none = g
        .constraint(&tools(ToolChoice::None, true), JsonLayout::Compact)
        .expect("compiles");
    assert!(!none.allows(u32::from(b'<')));
    assert!(take(&mut none, "No call."));
}

#[test]
fn a_named_tool_is_the_only_call_and_one_call_is_one() {
    let g = grammars();
    let mut c = g
        .constraint(
            &tools(ToolChoice::Named("get_time".into()), true),
            JsonLayout::Compact,
        )
        .expect("compiles");
    assert_eq!(
        forced(&mut c),
        bytes("<tool_call>\n{\"name\": \"get_time\", \"arguments\": {")
    );
    assert!(take(&mut c, "\"zone\": \"CET\"}"));
    assert_eq!(forced(&mut c), bytes("}\n</tool_call>"));
    assert!(matches!(c.step(), Ok(Next::End)));
    let mut single = g
        .constraint(&tools(ToolChoice::Auto, false), JsonLayout::Compact)
        .expect("compiles");
    assert!(take(&mut single, WEATHER_CALL));
    assert!(!single.allows(u32::from(b'\n')));
}

#[test]
fn only_answers_that_may_call_several_times_watch_for_repeats() {
    let g = grammars();
    let several = |spec: &GrammarSpec| {
        g.constraint(spec, JsonLayout::Compact)
            .expect("compiles")
            .several_calls()
    };
    assert!(several(&tools(ToolChoice::Auto, true)));
    assert!(several(&tools(ToolChoice::Required, true)));
    assert!(!several(&tools(ToolChoice::Required, false)));
    assert!(!several(&tools(ToolChoice::Named("get_time".into()), true)));
    assert!(!several(&tools(ToolChoice::None, true)));
    assert!(!several(&GrammarSpec::JsonObject));
}

#[test]
fn each_complete_call_gives_the_text_that_would_repeat_it() {
    let mut r = tools::CallRepeats::default();
    let (head, tail) = WEATHER_CALL.split_at(20);
    assert!(r.feed(head).is_empty());
    assert_eq!(r.feed(tail), vec![format!("\n{WEATHER_CALL}")]);
    // Two calls in one piece, cut anywhere, and text before them.
    let time = "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
    let both = format!("\n{WEATHER_CALL}\n{time}");
    let mut r = tools::CallRepeats::default();
    let mut found = r.feed("Let me check. <tool_");
    for piece in both.as_bytes().chunks(7) {
        found.extend(r.feed(std::str::from_utf8(piece).expect("ascii")));
    }
    assert_eq!(
        found,
        vec![format!("\n{WEATHER_CALL}"), format!("\n{time}")]
    );
}

#[test]
fn hostile_schemas_compile_or_are_refused_within_the_limits() {
    let g = grammars();
    let mut deep = json!({"type": "string"});
    for _ in 0..200 {
        deep = json!({"type": "object", "properties": {"a": deep}, "required": ["a"]});
    }
    let huge_enum: Vec<String> = (0..20_000).map(|i| format!("value-{i}")).collect();
    let recursive = json!({
        "$defs": {"node": {"type": "object",
            "properties": {"value": {"type": "integer"}, "next": {"$ref": "#/$defs/node"}},
            "required": ["value"]}},
        "$ref": "#/$defs/node"
    });
    let cases = [
        ("200 levels deep", deep),
        (
            "an enum of 20,000",
            json!({"type": "string", "enum": huge_enum}),
        ),
        ("a recursive reference", recursive.clone()),
    ];
    for ((what, schema), layout) in cases
        .iter()
        .flat_map(|c| [(c, JsonLayout::Compact), (c, JsonLayout::Indented)])
    {
        let started = Instant::now();
        let result = g.constraint(&GrammarSpec::JsonSchema(schema.clone()), layout);
        let took = started.elapsed();
        // Either outcome is fine; what is not is a compile that runs on past the limit (the
        // margin is for a loaded machine: the limit is checked when the compile returns).
        assert!(
            took < COMPILE_TIME_LIMIT * 5,
            "{what}, {layout:?}: {took:?}, {:?}",
            result.as_ref().err()
        );
    }
    // A recursive schema is a grammar like any other: it compiles, and an answer follows it.
    let mut c = g
        .constraint(&GrammarSpec::JsonSchema(recursive), JsonLayout::Compact)
        .expect("recursion compiles");
    assert!(take(&mut c, "{\"value\": 1, \"next\": {\"value\": 2}}"));
    assert!(c.accepting());
}

#[test]
fn a_fenced_answer_is_the_models_pick_and_the_fence_is_forced_once_begun() {
    let g = grammars();
    for layout in [JsonLayout::Compact, JsonLayout::Indented] {
        let style = JsonStyle {
            layout,
            fence: Fence::Optional,
        };
        let start = g
            .constraint(&GrammarSpec::JsonSchema(schema()), style)
            .expect("compiles");
        assert!(start.fenced());
        // Bare, as without the fence.
        let mut bare = start.clone();
        assert!(matches!(bare.step(), Ok(Next::Choose(_))), "{layout:?}");
        assert!(bare.allows(u32::from(b'{')) && bare.allows(u32::from(b'`')));
        assert!(!bare.allows(u32::from(b'"')) && !bare.allows(IM_END));
        let json = match layout {
            JsonLayout::Compact => "{\"age\": 4, \"ok\": true}",
            JsonLayout::Indented => "{\n  \"age\": 4,\n  \"ok\": true\n}",
        };
        assert!(take(&mut bare, json), "{layout:?}");
        assert!(bare.accepting() && matches!(bare.step(), Ok(Next::End)));
        // Fenced: once begun, the rest of the opening is forced, and so is the closing.
        let mut fenced = start.clone();
        fenced.consume(u32::from(b'`')).expect("a fence begins");
        let opening = forced(&mut fenced);
        let rest = bytes(&FENCE_OPEN[1..]);
        assert!(opening.starts_with(&rest), "{layout:?}");
        let json_forced = opening.len() - rest.len();
        assert!(json_forced > 0, "the JSON's own forced start follows");
        assert!(take(&mut fenced, &json[json_forced..]), "{layout:?}");
        assert_eq!(forced(&mut fenced), bytes(FENCE_CLOSE), "{layout:?}");
        assert!(fenced.accepting() && matches!(fenced.step(), Ok(Next::End)));
    }
    let plain = g
        .constraint(&GrammarSpec::JsonSchema(schema()), JsonLayout::Indented)
        .expect("compiles");
    assert!(!plain.fenced());
    let calls = g
        .constraint(
            &tools(ToolChoice::Required, false),
            JsonStyle {
                layout: JsonLayout::Indented,
                fence: Fence::Always,
            },
        )
        .expect("compiles");
    assert!(!calls.fenced(), "tool calls are never fenced");
    let style = JsonStyle {
        layout: JsonLayout::Indented,
        fence: Fence::Always,
    };
    let mut always = g
        .constraint(&GrammarSpec::JsonSchema(schema()), style)
        .expect("compiles");
    assert!(always.fenced());
    let opening = forced(&mut always);
    assert!(
        opening.starts_with(&bytes(FENCE_OPEN)),
        "the fence is forced"
    );
    assert_eq!(Fence::parse("always"), Some(Fence::Always));
    assert_eq!(Fence::parse(Fence::Optional.name()), Some(Fence::Optional));
    assert_eq!(Fence::parse("yes"), None);
}

/// Schemas that compile but cannot start an answer: refused at compile time as over the
/// grammar's limits (the client's 400), fenced or not, never left to fail mid-answer.
#[test]
fn schemas_that_fail_at_their_first_token_are_refused_when_compiled() {
    let g = grammars();
    let cycles = [
        json!({"$ref": "#"}),
        json!({"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}}),
        json!({"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}}),
    ];
    let recursion = json!({
        "type": "object", "properties": {"x": {"$ref": "#/$defs/b"}}, "required": ["x"],
        "$defs": {
            "a": {"type": "object", "properties": {"x": {"$ref": "#/$defs/b"}}, "required": ["x"]},
            "b": {"type": "object", "properties": {"y": {"$ref": "#/$defs/a"}}, "required": ["y"]}
        }
    });
    let optional: serde_json::Map<String, Value> = (0..2000)
        .map(|i| (format!("p{i}"), json!({"type": "integer"})))
        .collect();
    let optional = json!({"type": "object", "properties": optional});
    for schema in cycles.iter().chain([&recursion, &optional]) {
        for layout in [JsonLayout::Compact, JsonLayout::Indented] {
            for fence in [Fence::Never, Fence::Optional, Fence::Always] {
                let spec = GrammarSpec::JsonSchema(schema.clone());
                let got = g.constraint(&spec, JsonStyle { layout, fence });
                let Err(why) = got else {
                    panic!("{schema} {layout:?} {fence:?} compiled")
                };
                assert!(why.over_limits(), "{schema}: {why}");
                let text = why.to_string();
                assert!(!text.contains('\n') && !text.contains("$defs"), "{text}");
                let kept = g.cache.lock().unwrap().map.len();
                assert_eq!(
                    g.constraint(&spec, JsonStyle { layout, fence }).err(),
                    Some(why)
                );
                assert_eq!(
                    g.cache.lock().unwrap().map.len(),
                    kept,
                    "answered from the cache"
                );
            }
        }
    }
}

#[test]
fn only_limits_are_the_clients_fault() {
    assert!(!Unsupported::Refused("Unimplemented keys: [\"if\"]".into()).over_limits());
    assert!(Unsupported::TooLarge(MAX_SCHEMA_BYTES + 1).over_limits());
    assert!(Unsupported::TooSlow(Duration::from_secs(2)).over_limits());
    let row = "Current row has 8007 items; max is 2000; consider making your grammar left-recursive\n<state>\n{\"schema\": 1}";
    assert_eq!(
        Unsupported::from_llguidance(row),
        Unsupported::Unbounded(
            "Current row has 8007 items; max is 2000; consider making your grammar left-recursive"
                .into()
        )
    );
}

/// The cache is bounded by the text of the grammars it holds compiled, not only their number:
/// twenty distinct schemas of 60 KB each would otherwise all stay.
#[test]
fn the_cache_holds_at_most_its_text_bound_of_compiled_grammars() {
    let g = grammars();
    let big = |i: usize| {
        let description = format!("{i} {}", "x".repeat(60_000));
        GrammarSpec::JsonSchema(json!({"type": "object", "description": description}))
    };
    for i in 0..20 {
        g.constraint(&big(i), JsonLayout::Compact)
            .expect("compiles");
        let cache = g.cache.lock().unwrap();
        assert!(
            cache.text <= CACHED_GRAMMAR_TEXT,
            "{} after {i}",
            cache.text
        );
        let held: usize = cache
            .map
            .iter()
            .filter(|(_, e)| e.is_ok())
            .map(|(k, _)| k.len())
            .sum();
        assert_eq!(held, cache.text);
    }
    let cache = g.cache.lock().unwrap();
    assert!(cache.map.len() < 20, "{} kept", cache.map.len());
    assert!(cache.text > CACHED_GRAMMAR_TEXT / 2, "the newest are kept");
}
