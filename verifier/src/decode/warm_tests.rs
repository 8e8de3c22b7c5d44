//! The warm of an answer's prompt (`warm`) against a scripted target: sent once as the answer
//! starts, before its first call and on the slot its calls take, counted as a call of the
//! prompt, and stopped when the answer ends without needing it.

use std::time::Duration;

use super::calls::CallKind;
use super::scripted_tests::{prompt, request, run, span};
use super::*;
use crate::testing::{DraftScript, ScriptedTarget};

#[tokio::test]
async fn a_warm_goes_before_the_first_call_and_changes_no_token() -> Result<(), EngineError> {
    let target = || ScriptedTarget::says("the quick brown fox", None).with_timings();
    let mut req = request(0.5, 12);
    req.settings_mut().correction = span(8, 3);
    let mut draft = DraftScript::says("the quiXk brown fox", 0.95);
    draft.confidence = vec![0.95; 7];
    draft.confidence.push(0.1);
    let plain_low = run(draft.clone(), target(), req.clone()).await?;
    let warmed = run(draft, target().with_warms(Duration::from_millis(30)), req).await?;
    assert_eq!(warmed.text, plain_low.text, "the same answer");
    assert!(plain_low.stats.target_calls > 0);
    let warms = warmed.target.warm_calls();
    assert_eq!(warms.len(), 1);
    let p = prompt();
    assert_eq!(
        (warms[0].prefix.as_slice(), warms[0].max_tokens),
        (p.as_slice(), 0)
    );
    let first = &warmed.target.calls()[0];
    assert_eq!(warms[0].answer, first.answer, "the slot the calls take");
    let s = &warmed.stats;
    assert_eq!(s.target_warms, 1);
    assert_eq!(s.target_calls, plain_low.stats.target_calls + 1);
    assert_eq!(s.calls[0].kind, CallKind::Warm);
    assert_eq!((s.calls[0].sent, s.calls[0].generated), (p.len() as u64, 0));
    assert_eq!(
        s.calls[1].cached,
        p.len() as u64,
        "the first call's prompt is what the warm computed"
    );
    // Its compute is the target's: the prompt once more than without it (the scripted target
    // computes every prefix whole).
    assert_eq!(
        s.target_prompt_processed,
        plain_low.stats.target_prompt_processed + p.len() as u64
    );
    Ok(())
}

#[tokio::test]
async fn an_answer_the_draft_writes_alone_stops_its_warm() -> Result<(), EngineError> {
    let o = run(
        DraftScript::says("hello", 0.95),
        ScriptedTarget::says("HELLO", None).with_warms(Duration::from_secs(30)),
        request(0.5, 64),
    )
    .await?;
    assert_eq!(o.text, "hello");
    assert_eq!(o.target.warm_calls().len(), 1);
    // Counted as sent, at the rates (it never reported), and no longer running.
    assert_eq!((o.stats.target_warms, o.stats.target_calls), (1, 1));
    assert!(o.stats.calls[0].timings.is_none());
    tokio::task::yield_now().await;
    assert_eq!(o.target.warms_running(), 0, "aborted");
    Ok(())
}

#[tokio::test]
async fn no_warm_where_the_draft_writes_everything_or_the_target_cannot() -> Result<(), EngineError>
{
    let o = run(
        DraftScript::says("hello", 0.1),
        ScriptedTarget::says("HELLO", None).with_warms(Duration::ZERO),
        request(0.0, 64),
    )
    .await?;
    assert_eq!(o.text, "hello");
    assert!(o.target.warm_calls().is_empty());
    let o = run(
        DraftScript::says("hello", 0.1),
        ScriptedTarget::says("HELLO", None),
        request(0.5, 64),
    )
    .await?;
    assert_eq!(o.stats.target_warms, 0);
    Ok(())
}

#[tokio::test]
async fn the_call_cap_does_not_count_the_warm() -> Result<(), EngineError> {
    let mut req = request(0.5, 64);
    req.settings_mut().max_target_calls = Some(3);
    let target = || ScriptedTarget::says("HELLO", None);
    let plain = run(DraftScript::says("hello", 0.1), target(), req.clone()).await?;
    let warmed = run(
        DraftScript::says("hello", 0.1),
        target().with_warms(Duration::ZERO),
        req,
    )
    .await?;
    assert_eq!(warmed.text, plain.text);
    // Three calls besides the warm: two corrections, then the last, which writes the rest.
    assert_eq!(plain.stats.target_calls, 3);
    assert_eq!(warmed.stats.target_calls, plain.stats.target_calls + 1);
    assert!(warmed.stats.call_cap == plain.stats.call_cap);
    Ok(())
}
