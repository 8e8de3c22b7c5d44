//! Prompt lookup in the decode loop: the proposals change nothing in the answer or the calls,
//! and where the draft picks what the lookup proposed, its tokens come without a pass of
//! their own.

use proptest::prelude::*;

use super::scripted_tests::{Outcome, off_and_on, request, text};
use super::*;
use crate::testing::{DraftScript, IM_START, ScriptedTarget, property_cases};

fn with_prompt(mut req: GenerateRequest, prompt: &str) -> GenerateRequest {
    req.prompt = prompt.bytes().map(u32::from).collect();
    req.prompt.push(IM_START);
    req
}

async fn both(
    draft: DraftScript,
    target: &str,
    req: GenerateRequest,
    most: usize,
) -> Result<(Outcome, Outcome), EngineError> {
    off_and_on(
        draft,
        || ScriptedTarget::says(target, None),
        req,
        |s| s.prompt_lookup = most,
    )
    .await
}

fn same_answer_and_calls(off: &Outcome, on: &Outcome) {
    assert_eq!(on.text, off.text);
    assert_eq!(
        (
            on.stats.target_calls,
            on.stats.draft_tokens,
            on.stats.target_tokens,
            on.stats.verifier_rejections,
        ),
        (
            off.stats.target_calls,
            off.stats.draft_tokens,
            off.stats.target_tokens,
            off.stats.verifier_rejections,
        )
    );
    assert_eq!(
        (off.stats.lookup_tokens, off.stats.lookup_tokens_used),
        (0, 0)
    );
    assert!(on.stats.lookup_tokens_used <= on.stats.lookup_tokens);
}

#[tokio::test]
async fn copied_text_costs_one_draft_pass_for_several_tokens() -> Result<(), EngineError> {
    let copy = "fn add(a, b) { a + b }";
    let req = with_prompt(request(0.5, 64), &format!("rewrite: {copy}"));
    let (off, on) = both(DraftScript::says(copy, 0.95), copy, req, 8).await?;
    same_answer_and_calls(&off, &on);
    assert_eq!(on.text, copy);
    // Without lookup: a prefill and a pass per token. With it the draft picks what the prompt
    // had after the answer's last run of tokens, computed in the pass before.
    assert!(
        on.stats.lookup_tokens_used >= 15,
        "{} of {} proposals used",
        on.stats.lookup_tokens_used,
        on.stats.lookup_tokens
    );
    assert!(
        on.draft_steps + 10 <= off.draft_steps,
        "{} draft passes with lookup, {} without",
        on.draft_steps,
        off.draft_steps
    );
    Ok(())
}

#[tokio::test]
async fn proposals_the_draft_does_not_pick_are_rolled_back() -> Result<(), EngineError> {
    // The prompt has "ab" followed by "cd"; the answer has "ab" followed by "xy".
    let req = with_prompt(request(0.5, 64), "abcd abcd");
    let (off, on) = both(DraftScript::says("abxyabxy", 0.95), "abxyabxy", req, 4).await?;
    same_answer_and_calls(&off, &on);
    assert_eq!(on.text, "abxyabxy");
    assert!(on.stats.lookup_tokens > on.stats.lookup_tokens_used);
    Ok(())
}

#[tokio::test]
async fn rejections_and_corrections_see_the_same_tokens() -> Result<(), EngineError> {
    let copy = "let total = items.iter().sum();";
    let mut draft = DraftScript::says(copy, 0.95);
    // Unsure in three places: the target writes those.
    draft.confidence = (0..copy.len())
        .map(|i| if i % 9 == 4 { 0.1 } else { 0.95 })
        .collect();
    let req = with_prompt(request(0.5, 64), &format!("fix: {copy}"));
    let (off, on) = both(draft, copy, req, 8).await?;
    same_answer_and_calls(&off, &on);
    assert!(on.stats.target_calls >= 3);
    assert!(on.stats.lookup_tokens_used > 0);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(property_cases(48)))]

    /// Whatever the prompt, the draft, the target and the correction, prompt lookup changes
    /// neither the answer nor the calls: it only decides what the draft computes ahead.
    #[test]
    fn lookup_changes_no_token_and_no_call(
        prompt in text("abc", 24),
        draft in text("abc", 24),
        target in text("abc", 24),
        confidence in proptest::collection::vec(0.0f32..1.0, 0..24),
        most in 1usize..9,
        span in any::<bool>(),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().build()?;
        let mut script = DraftScript::says(&draft, 0.95);
        script.confidence = confidence;
        let mut req = with_prompt(request(0.5, 32), &prompt);
        if span {
            req.settings_mut().correction = Correction::Span { max_span: 8, resync: 2, end: SpanClose::Resync, ask: SpanAsk::All };
        }
        let (off, on) = rt
            .block_on(both(script, &target, req, most))
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        same_answer_and_calls(&off, &on);
    }
}
