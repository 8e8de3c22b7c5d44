//! The decode loop under a grammar (structured output), against the scripted draft and target:
//! whatever the draft proposes and the target writes, the answer follows its schema; forced
//! tokens cost no verifier and no target call; a refused target token hands the position to
//! the draft.

use serde_json::{Value, json};

use super::scripted_tests::{request, run};
use super::*;
use crate::grammar::{GrammarSpec, Grammars, JsonLayout};
use crate::testing::{DraftScript, END_OF_TEXT, IM_END, ScriptedTarget, VOCAB, tiny_tokenizer};

fn person() -> Value {
    json!({
        "type": "object",
        "properties": {"age": {"type": "integer"}, "ok": {"type": "boolean"}},
        "required": ["age", "ok"],
        "additionalProperties": false
    })
}

fn constrained(spec: GrammarSpec, threshold: f32, max_tokens: u32) -> GenerateRequest {
    let grammars =
        Grammars::new(&tiny_tokenizer(), VOCAB, &[IM_END, END_OF_TEXT]).expect("tiny vocabulary");
    GenerateRequest {
        constraint: Some(
            grammars
                .constraint(&spec, JsonLayout::Compact)
                .expect("compiles"),
        ),
        ..request(threshold, max_tokens)
    }
}

/// The answer parsed, and checked against the person schema (an integer's value is integral:
/// `-0` is one).
fn person_of(text: &str) -> (f64, bool) {
    let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
    let o = v
        .as_object()
        .unwrap_or_else(|| panic!("{text:?} is not an object"));
    assert_eq!(o.len(), 2, "{text:?}");
    (
        o["age"]
            .as_f64()
            .filter(|a| a.fract() == 0.0)
            .unwrap_or_else(|| panic!("{text:?}: age")),
        o["ok"].as_bool().unwrap_or_else(|| panic!("{text:?}: ok")),
    )
}

#[tokio::test]
async fn a_confident_draft_writes_the_free_tokens_and_the_grammar_the_rest()
-> Result<(), EngineError> {
    let o = run(
        DraftScript::says("{\"age\": 42, \"ok\": true}", 0.95),
        ScriptedTarget::says("unused", None),
        constrained(GrammarSpec::JsonSchema(person()), 0.5, 64),
    )
    .await?;
    assert_eq!(o.text, "{\"age\": 42, \"ok\": true}");
    // `{"age": `, `, "ok": `, `rue` and `}`: the free tokens are `4`, `2`, `,` and `t`.
    assert_eq!(o.stats.forced_tokens, 19);
    assert_eq!(o.stats.draft_tokens, 23);
    assert_eq!(o.stats.target_calls, 0);
    assert_eq!(o.stats.finish_reason, Some(FinishReason::Stop));
    assert!(o.events.iter().any(|e| e.source == Source::Grammar));
    Ok(())
}

#[tokio::test]
async fn a_draft_that_would_write_anything_else_still_writes_the_schema() -> Result<(), EngineError>
{
    let o = run(
        DraftScript::says("Sure! Here is a person.", 0.95),
        ScriptedTarget::says("unused", None),
        constrained(GrammarSpec::JsonSchema(person()), 0.5, 64),
    )
    .await?;
    person_of(&o.text);
    Ok(())
}

#[tokio::test]
async fn target_tokens_the_grammar_refuses_end_its_part_and_the_draft_writes_there()
-> Result<(), EngineError> {
    // Unconfident free draft tokens are rejected; the target writes a number that turns into
    // text.
    for correction in [
        Correction::Fixed { tokens: 4 },
        Correction::Span {
            max_span: 8,
            resync: 2,
            end: SpanClose::Resync,
            ask: SpanAsk::All,
        },
    ] {
        let mut req = constrained(GrammarSpec::JsonSchema(person()), 0.99, 64);
        req.settings_mut().correction = correction;
        let o = run(
            DraftScript::says("{\"age\": 42, \"ok\": true}", 0.3),
            ScriptedTarget::says("{\"age\": 7x, \"ok\": maybe}", None),
            req,
        )
        .await?;
        let (age, ok) = person_of(&o.text);
        assert!(
            o.text.starts_with("{\"age\": 7"),
            "{correction:?}: {}",
            o.text
        );
        assert!(
            age >= 70.0,
            "{correction:?}: the target's 7 stays: {}",
            o.text
        );
        // The draft's `true` (masked to `true` or `false`, confident enough; or written where
        // the target's `maybe` is refused).
        assert!(ok, "{correction:?}: {}", o.text);
        assert!(
            o.stats.grammar_refusals >= 1,
            "{correction:?}: x: {} ({} refusals)",
            o.text,
            o.stats.grammar_refusals
        );
        assert!(o.stats.target_tokens >= 1);
        assert_eq!(
            o.stats.draft_tokens + o.stats.target_tokens,
            o.stats.completion_tokens
        );
    }
    Ok(())
}

#[tokio::test]
async fn a_target_that_ends_inside_the_object_leaves_the_rest_to_the_draft()
-> Result<(), EngineError> {
    let mut req = constrained(GrammarSpec::JsonSchema(person()), 0.99, 64);
    req.settings_mut().correction = Correction::Span {
        max_span: 32,
        resync: 3,
        end: SpanClose::Resync,
        ask: SpanAsk::All,
    };
    let o = run(
        DraftScript::says("{\"age\": 42, \"ok\": false}", 0.3),
        ScriptedTarget::says("{\"age\": 5", None),
        req,
    )
    .await?;
    let (age, ok) = person_of(&o.text);
    assert!(o.text.starts_with("{\"age\": 5"), "{}", o.text);
    assert!(age >= 5.0 && !ok, "{}", o.text);
    assert!(o.stats.grammar_refusals >= 1);
    Ok(())
}

#[tokio::test]
async fn a_hand_off_under_a_grammar_keeps_the_answer_valid() -> Result<(), EngineError> {
    let mut req = constrained(GrammarSpec::JsonSchema(person()), 0.99, 64);
    req.settings_mut().bailout = Some(BailoutBudget {
        window: 1,
        max_rejection_rate: 0.0,
    });
    let o = run(
        DraftScript::says("{\"age\": 42, \"ok\": true}", 0.3),
        ScriptedTarget::says("{\"age\": 3, \"ok\": nope}", None),
        req,
    )
    .await?;
    let (age, _) = person_of(&o.text);
    assert_eq!(age, 3.0, "{}", o.text);
    assert!(o.stats.bailed_out);
    assert!(o.stats.grammar_refusals >= 1);
    Ok(())
}

#[tokio::test]
async fn thresholds_by_place_send_values_to_the_target_and_keep_the_drafts_wording()
-> Result<(), EngineError> {
    let schema = json!({
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": false
    });
    // Masked to the few tokens a number allows, the draft's 0.6 becomes about 0.97: confident
    // enough for one threshold of 0.9, which it is not inside a string.
    let draft = DraftScript::says("{\"name\": \"Alice Smith\", \"age\": 42}", 0.6);
    let target = || ScriptedTarget::says("{\"name\": \"Alice Smyth\", \"age\": 43}", None);
    let one = run(
        draft.clone(),
        target(),
        constrained(GrammarSpec::JsonSchema(schema.clone()), 0.9, 64),
    )
    .await?;
    assert_eq!(one.text, "{\"name\": \"Alice Smyth\", \"age\": 42}");
    let mut req = constrained(GrammarSpec::JsonSchema(schema), 0.9, 64);
    req.settings_mut().json_thresholds = Some(JsonThresholds {
        value: 0.999,
        text: 0.5,
    });
    let by_place = run(draft, target(), req).await?;
    // The name's first letter, its closing quote, the digits and the closing brace are the
    // target's; the rest of the name is the draft's.
    assert_eq!(by_place.text, "{\"name\": \"Alice Smith\", \"age\": 43}");
    assert_eq!(by_place.stats.target_tokens, 5, "{:?}", by_place.events);
    assert!(by_place.stats.target_tokens < one.stats.target_tokens);
    Ok(())
}

#[tokio::test]
async fn json_mode_gives_an_object() -> Result<(), EngineError> {
    let o = run(
        DraftScript::says("{\"a\": [1, 2]}", 0.95),
        ScriptedTarget::says("unused", None),
        constrained(GrammarSpec::JsonObject, 0.5, 32),
    )
    .await?;
    assert_eq!(o.text, "{\"a\": [1, 2]}");
    assert!(
        o.stats.forced_tokens >= 2,
        "the opening brace and the colon's space"
    );
    // A draft that would write an array gets the grammar's `{` first.
    let o = run(
        DraftScript::says("[1, 2]", 0.95),
        ScriptedTarget::says("unused", None),
        constrained(GrammarSpec::JsonObject, 0.5, 8),
    )
    .await?;
    assert!(o.text.starts_with('{'), "{}", o.text);
    Ok(())
}

/// An object with one label, `"yes"` or `"no"`.
fn yes_or_no() -> Value {
    json!({
        "type": "object",
        "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}},
        "required": ["answer"],
        "additionalProperties": false
    })
}

/// A fixed correction and a span, both of which a refused target token ends.
fn corrections() -> [Correction; 2] {
    [
        Correction::Fixed { tokens: 8 },
        Correction::Span {
            max_span: 8,
            resync: 2,
            end: SpanClose::Resync,
            ask: SpanAsk::All,
        },
    ]
}

#[tokio::test]
async fn a_refused_target_token_gives_way_to_the_targets_best_allowed_one()
-> Result<(), EngineError> {
    // The target would write `"Yes"` where the schema's enum has `"yes"` and `"no"`: its second
    // choice there is `y`, which the grammar allows, and which a target constraining its own
    // answer would have written.
    for correction in corrections() {
        let mut req = constrained(GrammarSpec::JsonSchema(yes_or_no()), 0.99, 32);
        req.settings_mut().correction = correction;
        let o = run(
            // Its `maybe` is not a label: masked, it is torn between the two.
            DraftScript::says("{\"answer\": \"maybe\"}", 0.3),
            ScriptedTarget::says("{\"answer\": \"Yes\"}", None)
                .with_second_choices("{\"answer\": \"yes\"}"),
            req,
        )
        .await?;
        assert_eq!(o.text, "{\"answer\": \"yes\"}", "{correction:?}");
        assert_eq!(o.stats.grammar_alternatives, 1, "{correction:?}");
        assert!(o.target.calls().iter().all(|c| c.top_logprobs > 0));
    }
    Ok(())
}

#[tokio::test]
async fn where_the_grammar_refuses_every_top_entry_the_target_picks_among_what_it_allows()
-> Result<(), EngineError> {
    // The draft's `yes` is allowed but not sure enough (0.99 masked, against 0.999). The
    // target would write `"Maybe"`, and its second choice, `"Perhaps"`, is no label either:
    // asked for one token among those the grammar allows (`y` and `n`), it keeps to them and
    // writes its own best, `n`.
    for correction in corrections() {
        let mut req = constrained(GrammarSpec::JsonSchema(yes_or_no()), 0.999, 32);
        req.settings_mut().correction = correction;
        let o = run(
            DraftScript::says("{\"answer\": \"yes\"}", 0.3),
            ScriptedTarget::says("{\"answer\": \"Maybe\"}", None)
                .with_second_choices("{\"answer\": \"Perhaps\"}")
                .with_picks("{\"answer\": \"no\"}"),
            req,
        )
        .await?;
        assert_eq!(o.text, "{\"answer\": \"no\"}", "{correction:?}");
        assert_eq!(o.stats.grammar_refusals, 1, "{correction:?}");
        assert_eq!(o.stats.grammar_picks, 1, "{correction:?}");
        let picks: Vec<_> = o
            .target
            .calls()
            .into_iter()
            .filter(|c| !c.allowed.is_empty())
            .collect();
        assert_eq!(picks.len(), 1, "{correction:?}");
        let mut allowed = picks[0].allowed.clone();
        allowed.sort_unstable();
        assert_eq!(allowed, vec![u32::from(b'n'), u32::from(b'y')]);
        assert_eq!(picks[0].max_tokens, 1);
    }
    // A target that cannot keep to a set is not asked: the draft writes the position.
    let o = run(
        DraftScript::says("{\"answer\": \"yes\"}", 0.3),
        ScriptedTarget::says("{\"answer\": \"Maybe\"}", None)
            .with_second_choices("{\"answer\": \"Perhaps\"}"),
        constrained(GrammarSpec::JsonSchema(yes_or_no()), 0.999, 32),
    )
    .await?;
    assert_eq!(o.text, "{\"answer\": \"yes\"}");
    assert_eq!(o.stats.grammar_picks, 0);
    assert!(o.target.calls().iter().all(|c| c.allowed.is_empty()));
    Ok(())
}

#[tokio::test]
async fn where_the_grammar_refuses_the_drafts_own_choice_the_target_picks()
-> Result<(), EngineError> {
    // A confident draft that would write `maybe`: masked, its `m` is gone and what is left
    // says nothing of the labels, so neither verifier nor draft decides: the target picks its
    // own best of `y` and `n` in a call of one token, and the grammar forces the rest.
    let o = run(
        DraftScript::says("{\"answer\": \"maybe\"}", 0.95),
        ScriptedTarget::says("{\"answer\": \"no\"}", None).with_picks(""),
        constrained(GrammarSpec::JsonSchema(yes_or_no()), 0.5, 32),
    )
    .await?;
    assert_eq!(o.text, "{\"answer\": \"no\"}");
    assert_eq!(o.stats.grammar_picks, 1);
    assert_eq!(o.stats.target_calls, 1);
    assert_eq!(o.target.calls()[0].max_tokens, 1);
    // A client's threshold of 0 asks the target nothing: the draft writes a label.
    let o = run(
        DraftScript::says("{\"answer\": \"maybe\"}", 0.95),
        ScriptedTarget::says("{\"answer\": \"no\"}", None).with_picks(""),
        constrained(GrammarSpec::JsonSchema(yes_or_no()), 0.0, 32),
    )
    .await?;
    assert_eq!(o.stats.target_calls, 0);
    assert_eq!(o.stats.grammar_picks, 0);
    Ok(())
}

#[tokio::test]
async fn a_call_that_repeats_an_earlier_one_ends_the_answer_before_it() -> Result<(), EngineError> {
    use crate::grammar::{Tool, ToolChoice, ToolsSpec};
    let spec = GrammarSpec::Tools(ToolsSpec {
        tools: vec![Tool {
            name: "quote".into(),
            parameters: json!({"type": "object", "properties": {"symbol": {"type": "string"}},
                               "required": ["symbol"], "additionalProperties": false}),
        }],
        choice: ToolChoice::Required,
        parallel: true,
    });
    let call = |s: &str| {
        format!(
            "<tool_call>\n{{\"name\": \"quote\", \"arguments\": {{\"symbol\": \"{s}\"}}}}\n</tool_call>"
        )
    };
    let two = format!("{}\n{}", call("NVDA"), call("TSLA"));
    let looping = format!(
        "{two}\n{}\n{}\n{}",
        call("NVDA"),
        call("TSLA"),
        call("NVDA")
    );
    // Written by the draft (confident), and by the target (the draft rejected everywhere).
    for (draft, threshold) in [(0.95, 0.5), (0.3, 0.99)] {
        let o = run(
            DraftScript::says(&looping, draft),
            ScriptedTarget::says(&looping, None),
            constrained(spec.clone(), threshold, 400),
        )
        .await?;
        assert_eq!(o.text, two, "threshold {threshold}");
        assert_eq!(o.stats.finish_reason, Some(FinishReason::Stop));
    }
    // A call that only starts like an earlier one is held until it parts, then streamed.
    let o = run(
        DraftScript::says(&two, 0.95),
        ScriptedTarget::says("unused", None),
        constrained(spec, 0.5, 400),
    )
    .await?;
    assert_eq!(o.text, two);
    Ok(())
}

#[tokio::test]
async fn under_a_grammar_windows_give_way_to_spans_and_the_stats_say_so() -> Result<(), EngineError>
{
    let mut req = constrained(GrammarSpec::JsonSchema(person()), 0.99, 64);
    req.settings_mut().verification = Verification::ApproximateWindows;
    let o = run(
        DraftScript::says("{\"age\": 42, \"ok\": true}", 0.3),
        ScriptedTarget::says("{\"age\": 7, \"ok\": true}", None),
        req,
    )
    .await?;
    person_of(&o.text);
    assert!(o.stats.target_calls >= 1);
    assert_eq!(o.stats.windows, 0);
    assert!(o.stats.spans_for_windows);
    // Without windows in its settings, nothing gave way.
    let o = run(
        DraftScript::says("{\"age\": 42, \"ok\": true}", 0.3),
        ScriptedTarget::says("{\"age\": 7, \"ok\": true}", None),
        constrained(GrammarSpec::JsonSchema(person()), 0.99, 64),
    )
    .await?;
    assert!(!o.stats.spans_for_windows);
    Ok(())
}

/// Stop strings are matched against what the client receives: never the fence around a JSON
/// answer, and a structured answer they cut is not whole, so it ends as `Length`. Before, a
/// `json_object` answer with `stop: ["{"]` came back as the fence's own text with `"stop"`,
/// and `stop: ["```"]` as an empty answer with `"stop"`.
#[tokio::test]
async fn stop_strings_see_the_json_not_its_fence_and_a_cut_answer_is_not_stop()
-> Result<(), EngineError> {
    use crate::grammar::{Fence, JsonStyle};
    let grammars =
        Grammars::new(&tiny_tokenizer(), VOCAB, &[IM_END, END_OF_TEXT]).expect("tiny vocabulary");
    let fenced = |stop: &[&str]| GenerateRequest {
        constraint: Some(
            grammars
                .constraint(
                    &GrammarSpec::JsonSchema(person()),
                    JsonStyle {
                        layout: JsonLayout::Compact,
                        fence: Fence::Always,
                    },
                )
                .expect("compiles"),
        ),
        stop: stop.iter().map(|s| s.to_string()).collect(),
        ..request(0.5, 64)
    };
    let answer = "```json\n{\"age\": 42, \"ok\": true}\n```";
    // The fence is never the client's, so a stop string on it finds nothing.
    let o = run(
        DraftScript::says(answer, 0.95),
        ScriptedTarget::says("unused", None),
        fenced(&["```", "json"]),
    )
    .await?;
    assert_eq!(o.text, "{\"age\": 42, \"ok\": true}");
    assert_eq!(o.stats.finish_reason, Some(FinishReason::Stop));
    // A stop string inside the JSON cuts it: what was sent is not a whole value.
    for stop in [&["{", "\n"][..], &[", \"ok\""], &["}"]] {
        let o = run(
            DraftScript::says(answer, 0.95),
            ScriptedTarget::says("unused", None),
            fenced(stop),
        )
        .await?;
        assert!(!o.text.contains('`'), "{stop:?}: {:?}", o.text);
        assert!(
            serde_json::from_str::<Value>(&o.text).is_err(),
            "{stop:?}: {:?}",
            o.text
        );
        assert_eq!(
            o.stats.finish_reason,
            Some(FinishReason::Length),
            "{stop:?}"
        );
    }
    Ok(())
}

/// Under `required` (or `auto`), after a whole call the answer may end or call again: a further
/// call is the target's to open. Before, a confident draft went on, and the grammar then made it
/// name some tool (a currency call for a weather question).
#[tokio::test]
async fn after_a_call_only_the_target_opens_another() -> Result<(), EngineError> {
    use crate::grammar::{Tool, ToolChoice, ToolsSpec};
    let tool = |name: &str| Tool {
        name: name.into(),
        parameters: json!({"type": "object", "properties": {"city": {"type": "string"}},
                           "required": ["city"], "additionalProperties": false}),
    };
    let spec = GrammarSpec::Tools(ToolsSpec {
        tools: vec![tool("weather"), tool("convert")],
        choice: ToolChoice::Required,
        parallel: true,
    });
    let call = |n: &str| {
        format!(
            "<tool_call>\n{{\"name\": \"{n}\", \"arguments\": {{\"city\": \"Oslo\"}}}}\n</tool_call>"
        )
    };
    let one = call("weather");
    let two = format!("{one}\n{}", call("convert"));
    // The draft would go on to a second call; the target, which ends after one, is asked.
    let o = run(
        DraftScript::says(&two, 0.95),
        ScriptedTarget::says(&one, None).with_picks(""),
        constrained(spec.clone(), 0.5, 400),
    )
    .await?;
    assert_eq!(o.text, one);
    assert_eq!(o.stats.finish_reason, Some(FinishReason::Stop));
    assert_eq!(o.stats.grammar_picks, 1);
    // A target that opens the second call has it.
    let o = run(
        DraftScript::says(&two, 0.95),
        ScriptedTarget::says(&two, None).with_picks(""),
        constrained(spec.clone(), 0.5, 400),
    )
    .await?;
    assert_eq!(o.text, two);
    // A draft that ends by itself is not asked about: ending adds no call.
    let o = run(
        DraftScript::says(&one, 0.95),
        ScriptedTarget::says(&two, None).with_picks(""),
        constrained(spec, 0.5, 400),
    )
    .await?;
    assert_eq!((o.text.as_str(), o.stats.target_calls), (one.as_str(), 0));
    // Under `auto`, text may end anywhere too: only the end of a call is asked about.
    let auto = GrammarSpec::Tools(ToolsSpec {
        tools: vec![tool("weather")],
        choice: ToolChoice::Auto,
        parallel: true,
    });
    let o = run(
        DraftScript::says("It is sunny in Oslo.", 0.95),
        ScriptedTarget::says("unused", None).with_picks(""),
        constrained(auto, 0.5, 400),
    )
    .await?;
    assert_eq!(
        (o.text.as_str(), o.stats.target_calls),
        ("It is sunny in Oslo.", 0)
    );
    Ok(())
}
