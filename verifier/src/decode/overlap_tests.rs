//! Drafting while the target works: the draft's guesses during a call change nothing in the
//! answer or the calls, and where the target agrees with them their work is kept.

use std::time::Duration;

use proptest::prelude::*;

use super::scripted_tests::{Outcome, off_and_on, request, run, text};
use super::*;
use crate::testing::{DraftScript, ScriptedTarget, TargetFault, property_cases};

/// A target that takes `call` per call and `token` per streamed token, so a call is in
/// flight long enough for the draft to guess ahead.
fn slow_target(text: &str, call: u64, token: u64, windows: bool) -> ScriptedTarget {
    let t = ScriptedTarget::says(text, None)
        .with_fault(TargetFault::Delay(Duration::from_millis(call)))
        .with_token_delay(Duration::from_millis(token));
    if windows { t.with_windows() } else { t }
}

/// The draft is right but unsure at the fourth token.
fn unsure_draft(text: &str) -> DraftScript {
    let mut d = DraftScript::says(text, 0.95);
    d.confidence = vec![0.95, 0.95, 0.95, 0.1];
    d
}

async fn both(
    draft: DraftScript,
    target: impl Fn() -> ScriptedTarget,
    req: GenerateRequest,
) -> Result<(Outcome, Outcome), EngineError> {
    off_and_on(draft, target, req, |s| s.overlap = true).await
}

fn same_answer_and_calls(off: &Outcome, on: &Outcome) {
    assert_eq!(on.text, off.text);
    assert_eq!(
        (
            on.stats.target_calls,
            on.stats.draft_tokens,
            on.stats.target_tokens,
            on.stats.resyncs,
            on.stats.windows,
        ),
        (
            off.stats.target_calls,
            off.stats.draft_tokens,
            off.stats.target_tokens,
            off.stats.resyncs,
            off.stats.windows,
        )
    );
    assert_eq!(
        (off.stats.overlap_guesses, off.stats.overlap_guesses_used),
        (0, 0)
    );
}

#[tokio::test]
async fn guesses_drafted_during_a_span_are_kept_where_the_target_agrees() -> Result<(), EngineError>
{
    let mut req = request(0.5, 64);
    req.settings_mut().correction = Correction::Span {
        max_span: 32,
        resync: 3,
        end: SpanClose::Resync,
        ask: SpanAsk::All,
    };
    let (off, on) = both(
        unsure_draft("abcdefghij"),
        || slow_target("abcdefghij", 20, 5, false),
        req,
    )
    .await?;
    same_answer_and_calls(&off, &on);
    assert_eq!(on.text, "abcdefghij");
    // While the span's first token was on its way, the draft guessed d e f g ...; the target
    // wrote d e f g (resync after e f g), each already drafted.
    assert!(
        on.stats.overlap_guesses >= 4,
        "{:?}",
        on.stats.overlap_guesses
    );
    assert_eq!(
        on.stats.overlap_guesses_used,
        on.stats.overlap_guesses.min(7)
    );
    Ok(())
}

#[tokio::test]
async fn guesses_that_the_target_overrules_are_rolled_back() -> Result<(), EngineError> {
    let mut req = request(0.5, 64);
    req.settings_mut().correction = Correction::Span {
        max_span: 32,
        resync: 3,
        end: SpanClose::Resync,
        ask: SpanAsk::All,
    };
    let mut draft = DraftScript::says("abcxyzghij", 0.95);
    draft.confidence = vec![0.95, 0.95, 0.95, 0.1];
    let (off, on) = both(draft, || slow_target("abcdefghij", 20, 5, false), req).await?;
    same_answer_and_calls(&off, &on);
    assert_eq!(on.text, "abcdefghij");
    // x y z were guessed and overruled by d e f (the scripted draft then says g h i, by
    // position, and those guesses hold).
    assert!(
        on.stats.overlap_guesses_used + 3 <= on.stats.overlap_guesses,
        "{:?}",
        (on.stats.overlap_guesses, on.stats.overlap_guesses_used)
    );
    Ok(())
}

#[tokio::test]
async fn a_window_call_overlaps_with_the_next_window_s_drafting() -> Result<(), EngineError> {
    let mut req = request(0.5, 64);
    req.settings_mut().verification = Verification::Exact;
    let (off, on) = both(
        DraftScript::says("abcdefghijklmnopqrstuvwxyz", 0.95),
        || slow_target("abcdefghijklmnopqrstuvwxyz", 30, 0, true),
        req,
    )
    .await?;
    same_answer_and_calls(&off, &on);
    // Every window is accepted whole and the target's token after it is the draft's first
    // guess, so the next window starts on drafted ground.
    assert!(on.stats.overlap_guesses_used > 0, "{:?}", on.stats);
    Ok(())
}

#[tokio::test]
async fn without_overlap_the_draft_waits() -> Result<(), EngineError> {
    let mut req = request(0.5, 64);
    req.settings_mut().correction = Correction::Span {
        max_span: 32,
        resync: 3,
        end: SpanClose::Resync,
        ask: SpanAsk::All,
    };
    let o = run(
        unsure_draft("abcdefghij"),
        slow_target("abcdefghij", 20, 5, false),
        req,
    )
    .await?;
    assert_eq!(
        (o.stats.overlap_guesses, o.stats.overlap_guesses_used),
        (0, 0)
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(property_cases(48)))]

    /// Whatever the draft, the target and the call structure, overlapping changes neither the
    /// answer nor the calls: it only moves draft work into the time a call is in flight.
    #[test]
    fn overlap_changes_no_token_and_no_call(
        draft in text("ab", 24),
        target in text("ab", 24),
        confidence in proptest::collection::vec(0.0f32..1.0, 0..24),
        mode in 0u8..4,
        call_ms in 0u64..4,
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().build()?;
        let mut script = DraftScript::says(&draft, 0.95);
        script.confidence = confidence;
        let mut req = request(0.5, 32);
        let windows = mode >= 2;
        match mode {
            0 => req.settings_mut().correction = Correction::Fixed { tokens: 2 },
            1 => req.settings_mut().correction = Correction::Span { max_span: 8, resync: 2, end: SpanClose::Resync, ask: SpanAsk::All },
            2 => req.settings_mut().verification = Verification::ApproximateWindows,
            _ => req.settings_mut().verification = Verification::Exact,
        }
        let (off, on) = rt
            .block_on(both(script, || slow_target(&target, call_ms, 1, windows), req))
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        same_answer_and_calls(&off, &on);
        prop_assert!(on.stats.overlap_guesses_used <= on.stats.overlap_guesses);
    }
}
