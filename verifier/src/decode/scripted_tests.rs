//! The decode loop against a scripted draft and target: every path in milliseconds, without
//! models. The real-model tests are in `tests/engine.rs`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::pacing::{WINDOW_MAX, WindowSize};
use super::*;
use crate::cost::{CostGuard, Price, estimate};
use crate::error::TargetError;
use crate::testing::{
    DraftScript, IM_START, ScriptedTarget, ScriptedWorkers, TargetFault, tiny_tokenizer,
};
use crate::verify::{AcceptanceRule, ConfidenceVerifier};
use crate::{DraftWorkers, SamplingParams};

pub(super) fn prompt() -> Vec<u32> {
    let mut p: Vec<u32> = "question?".bytes().map(u32::from).collect();
    p.push(IM_START);
    p
}

/// Texts of 1 to `len - 1` characters of `alphabet`, for property tests over scripted answers.
pub(super) fn text(
    alphabet: &'static str,
    len: usize,
) -> impl proptest::strategy::Strategy<Value = String> {
    use proptest::strategy::Strategy;
    proptest::collection::vec(
        proptest::sample::select(alphabet.as_bytes().to_vec()),
        1..len,
    )
    .prop_map(|b| String::from_utf8_lossy(&b).into_owned())
}

/// The same generation twice: as `req` asks, then with `on` changing its settings.
pub(super) async fn off_and_on(
    draft: DraftScript,
    target: impl Fn() -> ScriptedTarget,
    req: GenerateRequest,
    on: impl FnOnce(&mut DecodeSettings),
) -> Result<(Outcome, Outcome), EngineError> {
    let off = run(draft.clone(), target(), req.clone()).await?;
    let mut changed = req;
    on(changed.settings_mut());
    let on = run(draft, target(), changed).await?;
    Ok((off, on))
}

pub(super) fn request(threshold: f32, max_tokens: u32) -> GenerateRequest {
    GenerateRequest {
        prompt: prompt(),
        max_tokens,
        sampling: SamplingParams {
            temperature: 0.0,
            top_p: 1.0,
            seed: None,
        },
        stop: Vec::new(),
        threshold,
        cost_guard: None,
        model: None,
        messages: None,
        settings: Default::default(),
        constraint: None,
    }
}

pub(super) struct Outcome {
    pub(super) text: String,
    pub(super) events: Vec<TokenEvent>,
    pub(super) stats: Stats,
    pub(super) target: Arc<ScriptedTarget>,
    /// Draft calls (prefill and extends).
    pub(super) draft_steps: usize,
}

pub(super) async fn run(
    draft: DraftScript,
    target: ScriptedTarget,
    req: GenerateRequest,
) -> Result<Outcome, EngineError> {
    run_with(draft, target, req, &ConfidenceVerifier).await
}

/// [`run`] with another verifier than the draft's confidence.
pub(super) async fn run_with(
    draft: DraftScript,
    target: ScriptedTarget,
    req: GenerateRequest,
    verifier: &dyn crate::verify::Verifier,
) -> Result<Outcome, EngineError> {
    let tok = tiny_tokenizer();
    let target = Arc::new(target);
    let engine = Engine::new(tok.clone(), target.clone(), tok.end_of_sequence_ids());
    let workers = ScriptedWorkers::new(draft, 1);
    let lease = workers.try_lease().ok_or(EngineError::Saturated)?;
    let (tx, mut rx) = mpsc::channel(1024);
    let stats = engine.generate(lease.as_ref(), verifier, req, tx).await?;
    let mut events = Vec::new();
    while let Ok(ev) = rx.try_recv() {
        events.push(ev);
    }
    let text = events.iter().map(|e| e.text.as_str()).collect();
    assert_eq!(
        stats.draft_tokens + stats.target_tokens,
        stats.completion_tokens,
        "who wrote what adds up"
    );
    assert_eq!(
        (target.calls().len() + target.window_calls().len() + target.warm_calls().len()) as u32,
        stats.target_calls
    );
    Ok(Outcome {
        text,
        events,
        stats,
        target,
        draft_steps: workers.steps(),
    })
}

#[tokio::test]
async fn confident_draft_answers_alone() -> Result<(), EngineError> {
    let o = run(
        DraftScript::says("hello", 0.95),
        ScriptedTarget::says("HELLO", None),
        request(0.5, 64),
    )
    .await?;
    assert_eq!(o.text, "hello");
    assert_eq!((o.stats.draft_tokens, o.stats.target_calls), (5, 0));
    assert_eq!(o.stats.finish_reason, Some(FinishReason::Stop));
    assert!(o.events.iter().all(|e| e.source == Source::Draft));
    Ok(())
}

#[tokio::test]
async fn rejecting_everything_gives_the_target_answer_one_call_per_token() -> Result<(), EngineError>
{
    let o = run(
        DraftScript::says("hello", 0.95),
        ScriptedTarget::says("world", None),
        request(1.0, 64),
    )
    .await?;
    assert_eq!(o.text, "world");
    assert_eq!(o.stats.draft_tokens, 0);
    // Five tokens, then the call that returns end-of-turn.
    assert_eq!(o.stats.target_calls, 6);
    assert_eq!(o.stats.verifier_rejections, 6);
    Ok(())
}

#[tokio::test]
async fn a_rejected_token_is_replaced_by_the_target_and_drafting_resumes() -> Result<(), EngineError>
{
    let mut draft = DraftScript::says("abcXef", 0.95);
    draft.confidence = vec![0.95, 0.95, 0.95, 0.1];
    let o = run(
        draft,
        ScriptedTarget::says("abcdef", None),
        request(0.5, 64),
    )
    .await?;
    assert_eq!(o.text, "abcdef");
    assert_eq!(
        (
            o.stats.draft_tokens,
            o.stats.target_tokens,
            o.stats.target_calls
        ),
        (5, 1, 1)
    );
    // "abc", then "ef" and the accepted end-of-turn.
    assert_eq!(o.stats.accepted_runs, vec![3, 3]);
    let sources: Vec<Source> = o
        .events
        .iter()
        .filter(|e| e.id.is_some())
        .map(|e| e.source)
        .collect();
    assert_eq!(sources[3], Source::Target);
    // The call continued exactly the prompt plus the three accepted tokens.
    let call = &o.target.calls()[0];
    assert_eq!(call.prefix.len(), prompt().len() + 3);
    assert_eq!(call.max_tokens, 1);
    Ok(())
}

/// llama-server keeps an answer's cache in the slot its calls name: every call of an answer
/// names the same answer, another answer another, and the target hears when each is over.
#[tokio::test]
async fn an_answers_calls_name_it_and_the_target_hears_when_it_is_over() -> Result<(), EngineError>
{
    let mut first = None;
    for _ in 0..2 {
        let o = run(
            DraftScript::says("hello", 0.95),
            ScriptedTarget::says("world", None),
            request(1.0, 64),
        )
        .await?;
        let answers: Vec<Option<u64>> = o.target.calls().iter().map(|c| c.answer).collect();
        let Some(&Some(id)) = answers.first() else {
            panic!("no call named its answer: {answers:?}");
        };
        assert!(answers.len() > 1 && answers.iter().all(|a| *a == Some(id)));
        assert_eq!(o.target.answers_done(), vec![id]);
        assert_ne!(first.replace(id), Some(id), "two answers, two ids");
    }
    Ok(())
}

#[tokio::test]
async fn correction_tokens_take_several_target_tokens_per_call() -> Result<(), EngineError> {
    let mut req = request(1.0, 64);
    req.settings_mut().correction = Correction::Fixed { tokens: 4 };
    let o = run(
        DraftScript::says("", 0.9),
        ScriptedTarget::says("abcdefgh", None),
        req,
    )
    .await?;
    assert_eq!(o.text, "abcdefgh");
    // 4 + 4 tokens, then the call that returns end-of-turn.
    assert_eq!(o.stats.target_calls, 3);
    // Each call re-sends the prefix; all but the first could come from a prompt cache.
    let p = prompt().len() as u64;
    assert_eq!(o.stats.target_input_tokens, p + (p + 4) + (p + 8));
    assert_eq!(o.stats.target_cacheable_input_tokens, (p + 4) + (p + 8));
    Ok(())
}

#[tokio::test]
async fn over_the_rejection_budget_the_target_writes_the_rest_in_one_call()
-> Result<(), EngineError> {
    let mut req = request(0.5, 64);
    req.settings_mut().bailout = Some(BailoutBudget {
        window: 4,
        max_rejection_rate: 0.5,
    });
    let o = run(
        DraftScript::says("xxxxxxxxxx", 0.1),
        ScriptedTarget::says("the target's answer", None),
        req,
    )
    .await?;
    assert_eq!(o.text, "the target's answer");
    assert!(o.stats.bailed_out);
    // Three single-token corrections fill the window; the fourth rejection bails out.
    assert_eq!(o.stats.target_calls, 4);
    assert_eq!(o.target.calls()[3].max_tokens, 64 - 3);
    Ok(())
}

#[tokio::test]
async fn max_tokens_ends_with_length() -> Result<(), EngineError> {
    let o = run(
        DraftScript::says("abcdefgh", 0.95),
        ScriptedTarget::says("", None),
        request(0.5, 3),
    )
    .await?;
    assert_eq!(o.text, "abc");
    assert_eq!(o.stats.finish_reason, Some(FinishReason::Length));
    assert_eq!(o.stats.completion_tokens, 3);
    Ok(())
}

#[tokio::test]
async fn a_stop_string_ends_the_answer_before_it() -> Result<(), EngineError> {
    let mut req = request(0.5, 64);
    req.stop = vec!["STOP".into()];
    let o = run(
        DraftScript::says("one two STOP three", 0.95),
        ScriptedTarget::says("", None),
        req,
    )
    .await?;
    assert_eq!(o.text, "one two ");
    assert_eq!(o.stats.finish_reason, Some(FinishReason::Stop));
    Ok(())
}

#[tokio::test]
async fn multi_byte_characters_are_never_split_in_the_stream() -> Result<(), EngineError> {
    let o = run(
        DraftScript::says("héllo 世界", 0.95),
        ScriptedTarget::says("", None),
        request(0.5, 64),
    )
    .await?;
    assert_eq!(o.text, "héllo 世界");
    assert!(o.events.iter().all(|e| !e.text.contains('\u{FFFD}')));
    Ok(())
}

#[tokio::test]
async fn a_failing_target_fails_the_generation() {
    let target = ScriptedTarget::says("abc", None).with_fault(TargetFault::Status(503));
    let r = run(DraftScript::says("abc", 0.1), target, request(0.5, 64)).await;
    assert!(
        matches!(
            r,
            Err(EngineError::Target(TargetError::Status { status: 503, .. }))
        ),
        "{:?}",
        r.err()
    );
}

#[tokio::test]
async fn a_client_that_leaves_abandons_the_target_call_in_flight() -> Result<(), EngineError> {
    let tok = tiny_tokenizer();
    let target = Arc::new(
        ScriptedTarget::says("abc", None).with_fault(TargetFault::Delay(Duration::from_secs(30))),
    );
    let engine = Engine::new(tok.clone(), target.clone(), tok.end_of_sequence_ids());
    let workers = ScriptedWorkers::new(DraftScript::says("abc", 0.1), 1);
    let lease = workers.try_lease().ok_or(EngineError::Saturated)?;
    let (tx, rx) = mpsc::channel(16);
    let started = Instant::now();
    let generation = engine.generate(lease.as_ref(), &ConfidenceVerifier, request(0.5, 64), tx);
    let leave = async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        drop(rx);
    };
    let (stats, ()) = tokio::join!(generation, leave);
    assert_eq!(stats?.finish_reason, Some(FinishReason::Cancelled));
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "waited for the target: {:?}",
        started.elapsed()
    );
    drop(lease);
    assert_eq!(workers.idle(), 1, "the draft worker is free again");
    Ok(())
}

pub(super) fn span(max_span: u32, resync: u32) -> Correction {
    Correction::Span {
        max_span,
        resync,
        end: SpanClose::Resync,
        ask: SpanAsk::All,
    }
}

/// The draft says "abcxyzghij": confident except at the fourth token, wrong at the 4th to 6th.
fn diverging_draft() -> DraftScript {
    let mut d = DraftScript::says("abcxyzghij", 0.95);
    d.confidence = vec![0.95, 0.95, 0.95, 0.1];
    d
}

#[tokio::test]
async fn a_span_follows_the_target_until_the_draft_catches_up_then_stops_it()
-> Result<(), EngineError> {
    let mut req = request(0.5, 64);
    req.settings_mut().correction = span(32, 3);
    let target =
        ScriptedTarget::says("abcdefghij", None).with_token_delay(Duration::from_millis(2));
    let o = run(diverging_draft(), target, req).await?;
    assert_eq!(o.text, "abcdefghij");
    // One streamed call: d e f (the draft disagreed), g h i (agreed three times: resync).
    assert_eq!((o.stats.target_calls, o.stats.resyncs), (1, 1));
    assert_eq!(o.stats.target_tokens, 6);
    assert_eq!(o.stats.draft_tokens, 4, "a b c, then j after the resync");
    assert_eq!(o.target.calls()[0].max_tokens, 32);
    assert_eq!(
        o.target.streamed_tokens(),
        6,
        "the cancelled stream generated nothing more"
    );
    // A real server would have: the stream closed before its end is billed its allowance.
    assert_eq!(
        o.stats.target_inflight_tokens,
        crate::decode::TOKENS_IN_FLIGHT_AT_CLOSE
    );
    assert_eq!(
        o.stats.spend().target_output_tokens,
        6 + crate::decode::TOKENS_IN_FLIGHT_AT_CLOSE
    );
    Ok(())
}

/// A stream closed one token before the end of what its call asked for is billed that one
/// token in flight, not the measured allowance: the target cannot write more than it was asked.
#[tokio::test]
async fn a_close_bills_no_more_in_flight_than_the_call_could_still_write() -> Result<(), EngineError>
{
    let mut req = request(0.5, 64);
    // d e f g h i reach the resync: the seventh token asked for is the one left.
    req.settings_mut().correction = span(7, 3);
    let target =
        ScriptedTarget::says("abcdefghij", None).with_token_delay(Duration::from_millis(2));
    let o = run(diverging_draft(), target, req).await?;
    assert_eq!(o.text, "abcdefghij");
    assert_eq!(o.target.calls()[0].max_tokens, 7);
    assert_eq!((o.stats.resyncs, o.stats.target_tokens), (1, 6));
    assert_eq!(
        o.stats.target_discarded_tokens + o.stats.target_inflight_tokens,
        1,
        "one token left to write, read or not"
    );
    assert_eq!(o.stats.spend().target_output_tokens, 7);
    Ok(())
}

/// Under `SpanAsk::Fewest` the same span is asked for in two calls, each for the fewest tokens
/// that could end it, so the target stops by itself and no stream is closed early.
#[tokio::test]
async fn a_span_asking_the_fewest_tokens_closes_no_stream_early() -> Result<(), EngineError> {
    let mut req = request(0.5, 64);
    req.settings_mut().correction = Correction::Span {
        max_span: 32,
        resync: 3,
        end: SpanClose::Resync,
        ask: SpanAsk::Fewest,
    };
    let target =
        ScriptedTarget::says("abcdefghij", None).with_token_delay(Duration::from_millis(2));
    let o = run(diverging_draft(), target, req).await?;
    assert_eq!(o.text, "abcdefghij", "the same answer as one streamed call");
    // d e f g (the rejected position and the 3 that could agree): only g did; then h i, the
    // two still missing, and the draft has caught up.
    let asked: Vec<u32> = o.target.calls().iter().map(|c| c.max_tokens).collect();
    assert_eq!(asked, [4, 2]);
    assert_eq!(
        (
            o.stats.target_calls,
            o.stats.span_continuations,
            o.stats.resyncs
        ),
        (2, 1, 1)
    );
    assert_eq!((o.stats.target_tokens, o.stats.draft_tokens), (6, 4));
    assert_eq!(o.target.streamed_tokens(), 6);
    assert_eq!(
        o.stats.target_inflight_tokens, 0,
        "no stream was closed early"
    );
    assert_eq!(o.stats.spend().target_output_tokens, 6);
    Ok(())
}

#[tokio::test]
async fn a_span_ends_at_its_length_and_drafting_resumes() -> Result<(), EngineError> {
    let mut req = request(0.5, 64);
    req.settings_mut().correction = span(2, 3);
    let o = run(
        diverging_draft(),
        ScriptedTarget::says("abcdefghij", None),
        req,
    )
    .await?;
    // The span brings d and e; then the draft is confident about its own z: a false accept,
    // which the threshold allows.
    assert_eq!(o.text, "abcdezghij");
    assert_eq!(o.target.calls().len(), 1);
    assert_eq!(o.target.calls()[0].max_tokens, 2);
    assert_eq!((o.stats.resyncs, o.stats.target_tokens), (0, 2));
    // A span that ran to its length closed nothing early: no allowance.
    assert_eq!(o.stats.target_inflight_tokens, 0);
    Ok(())
}

#[tokio::test]
async fn a_span_that_reaches_the_end_of_the_answer_finishes_it() -> Result<(), EngineError> {
    let mut req = request(0.5, 64);
    req.settings_mut().correction = span(32, 3);
    let o = run(
        DraftScript::says("zzzz", 0.1),
        ScriptedTarget::says("the end", None),
        req,
    )
    .await?;
    assert_eq!(o.text, "the end");
    assert_eq!(
        (o.stats.target_calls, o.stats.finish_reason),
        (1, Some(FinishReason::Stop))
    );
    Ok(())
}

/// A span or hand-off that delivers the last token the answer may have still reads the
/// stream's last event, which carries the call's compute (dropping the stream there lost it:
/// measured on llama-server, one call in three of a 40-token answer went unreported).
#[tokio::test]
async fn streams_that_end_the_answer_at_its_length_still_report_their_compute()
-> Result<(), EngineError> {
    for correction in [span(16, 3), span(8, 3)] {
        let mut req = request(1.0, 20);
        req.settings_mut().correction = correction;
        let o = run(
            DraftScript::says("zzzz", 0.1),
            ScriptedTarget::says("the quick brown fox jumps over it", None).with_timings(),
            req,
        )
        .await?;
        assert_eq!(o.stats.finish_reason, Some(FinishReason::Length));
        assert_eq!(
            o.stats.target_calls_timed, o.stats.target_calls,
            "{:?}",
            o.stats
        );
        assert_eq!(o.stats.target_predicted, 20);
        let prompt = prompt().len() as u64;
        let calls: Vec<u64> = o
            .target
            .calls()
            .iter()
            .map(|c| c.prefix.len() as u64)
            .collect();
        assert_eq!(o.stats.target_prompt_processed, calls.iter().sum::<u64>());
        assert_eq!(calls[0], prompt);
        let ms = calls.iter().sum::<u64>() as f64 + 10.0 * 20.0;
        assert!((o.stats.target_busy.as_secs_f64() * 1e3 - ms).abs() < 1e-6);
        assert_eq!(o.stats.target_discarded_tokens, 0);
    }
    // An answer that ends on the target's end-of-sequence: its last event comes after it.
    let mut req = request(1.0, 64);
    req.settings_mut().correction = span(16, 3);
    let o = run(
        DraftScript::says("zzzz", 0.1),
        ScriptedTarget::says("the end", None).with_timings(),
        req,
    )
    .await?;
    assert_eq!(o.stats.finish_reason, Some(FinishReason::Stop));
    assert_eq!(
        (o.stats.target_calls_timed, o.stats.target_predicted),
        (1, 8),
        "{:?}",
        o.stats
    );
    // The hand-off too (everything rejected, over the budget at once).
    let mut req = request(1.0, 12);
    req.settings_mut().bailout = Some(BailoutBudget {
        window: 1,
        max_rejection_rate: 0.0,
    });
    let o = run(
        DraftScript::says("zzzz", 0.1),
        ScriptedTarget::says("the quick brown fox", None).with_timings(),
        req,
    )
    .await?;
    assert!(o.stats.bailed_out);
    assert_eq!(
        o.stats.target_calls_timed, o.stats.target_calls,
        "{:?}",
        o.stats
    );
    assert_eq!(o.stats.target_predicted, 12);
    Ok(())
}

#[tokio::test]
async fn a_client_that_leaves_mid_span_stops_the_stream() -> Result<(), EngineError> {
    let tok = tiny_tokenizer();
    let target = Arc::new(
        ScriptedTarget::says("abcdefghijklmnop", None).with_token_delay(Duration::from_millis(200)),
    );
    let engine = Engine::new(tok.clone(), target.clone(), tok.end_of_sequence_ids());
    let workers = ScriptedWorkers::new(DraftScript::says("zzzzzzzzzzzzzzzz", 0.1), 1);
    let lease = workers.try_lease().ok_or(EngineError::Saturated)?;
    let (tx, rx) = mpsc::channel(16);
    let mut req = request(0.5, 64);
    req.settings_mut().correction = span(32, 3);
    let generation = engine.generate(lease.as_ref(), &ConfidenceVerifier, req, tx);
    let leave = async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        drop(rx);
    };
    let (stats, ()) = tokio::join!(generation, leave);
    assert_eq!(stats?.finish_reason, Some(FinishReason::Cancelled));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        target.streamed_tokens() <= 4,
        "generation went on after the client left: {}",
        target.streamed_tokens()
    );
    Ok(())
}

#[tokio::test]
async fn the_cost_guard_hands_the_rest_to_the_target_before_a_call_could_cost_more_than_passthrough()
-> Result<(), EngineError> {
    let price = Price {
        input: 1.0,
        cached_input: 0.1,
        output: 2.0,
    };
    let mut req = request(0.5, 64);
    req.cost_guard = Some(Guard::Strict(CostGuard {
        price: price.into(),
        max_cost_ratio: 1.0,
        cache: Default::default(),
    }));
    // The draft is never confident: each one-token correction would re-send the prefix.
    let o = run(
        DraftScript::says("hello world", 0.1),
        ScriptedTarget::says("hello world", None),
        req.clone(),
    )
    .await?;
    assert_eq!(o.text, "hello world");
    assert!(o.stats.cost_guard && !o.stats.bailed_out);
    assert_eq!(o.stats.target_calls, 1, "one call for the whole answer");
    let c = estimate(&o.stats.spend(), &price.into());
    assert!(c.approxy <= c.passthrough, "{c:?}");

    // Confident drafting pays for corrections: the guard lets them through.
    let mut draft = DraftScript::says("the quick brown fox jumps over the lazy dog", 0.95);
    draft.confidence = vec![0.95; 40];
    draft.confidence[40 - 1] = 0.1;
    let o = run(
        draft,
        ScriptedTarget::says("the quick brown fox jumps over the lazy dog", None),
        req,
    )
    .await?;
    assert!(!o.stats.cost_guard);
    assert_eq!(o.stats.target_calls, 1);
    let c = estimate(&o.stats.spend(), &price.into());
    assert!(c.approxy <= c.passthrough, "{c:?}");
    Ok(())
}

/// Under `SpanClose::Expected` a span the draft has caught up with goes on while the cost
/// guard would refuse the next correction, and ends as under the fixed rule where the guard
/// would make it (or where there is no guard). The strict guard at 1.14 times passthrough,
/// with input 1, cached 0.1 and output 2 per token and a 10-token prompt, allows the first
/// call after 20 drafted tokens (its worst case is 129 against 114 of passthrough: 1.13) but
/// not the next after the span's 6 tokens (145.2 against 126: 1.15).
#[tokio::test]
async fn an_expected_span_end_goes_on_where_the_guard_would_refuse_the_next_call()
-> Result<(), EngineError> {
    let head = "abcdefghijklmnopqrst";
    let target = || ScriptedTarget::says(&format!("{head}UVW0123456789"), None);
    let mut draft = DraftScript::says(&format!("{head}xyz0123456789"), 0.95);
    draft.confidence = vec![0.95; 20];
    draft.confidence.push(0.1);
    let guard = Guard::Strict(CostGuard {
        price: Price {
            input: 1.0,
            cached_input: 0.1,
            output: 2.0,
        }
        .into(),
        max_cost_ratio: 1.14,
        cache: Default::default(),
    });
    let with = |end, guard| {
        let mut req = request(0.5, 64);
        req.settings_mut().correction = Correction::Span {
            max_span: 32,
            resync: 3,
            end,
            ask: SpanAsk::All,
        };
        req.cost_guard = guard;
        req
    };
    // The fixed rule: the span ends after U V W and 0 1 2, and the draft writes the rest.
    let fixed = run(
        draft.clone(),
        target(),
        with(SpanClose::Resync, Some(guard)),
    )
    .await?;
    assert_eq!(fixed.text, format!("{head}UVW0123456789"));
    assert_eq!(
        (
            fixed.stats.target_tokens,
            fixed.stats.resyncs,
            fixed.stats.spans_kept
        ),
        (6, 1, 0)
    );
    assert_eq!(
        fixed.stats.target_inflight_tokens,
        TOKENS_IN_FLIGHT_AT_CLOSE
    );
    assert!(!fixed.stats.cost_guard);
    // Expected: the guard would refuse the next call, so the span runs to the answer's end.
    let kept = run(
        draft.clone(),
        target(),
        with(SpanClose::Expected, Some(guard)),
    )
    .await?;
    assert_eq!(kept.text, fixed.text);
    assert_eq!(
        (
            kept.stats.target_tokens,
            kept.stats.resyncs,
            kept.stats.spans_kept
        ),
        (13, 0, 1)
    );
    assert_eq!(
        (kept.stats.target_calls, kept.stats.target_inflight_tokens),
        (1, 0)
    );
    assert_eq!(kept.stats.finish_reason, Some(FinishReason::Stop));
    // Without a guard, or one that would make the call, Expected is the fixed rule.
    let loose = Guard::Strict(CostGuard {
        max_cost_ratio: 1.5,
        ..match guard {
            Guard::Strict(g) => g,
            Guard::Budget(_) => unreachable!(),
        }
    });
    for guard in [None, Some(loose)] {
        let o = run(draft.clone(), target(), with(SpanClose::Expected, guard)).await?;
        assert_eq!(o.text, fixed.text);
        assert_eq!(
            (o.stats.target_tokens, o.stats.resyncs, o.stats.spans_kept),
            (6, 1, 0),
            "{guard:?}"
        );
    }
    Ok(())
}

#[tokio::test]
async fn without_prices_the_cost_guard_never_trips() -> Result<(), EngineError> {
    let mut req = request(0.5, 64);
    req.cost_guard = Some(Guard::Strict(CostGuard {
        price: Price::default().into(),
        max_cost_ratio: 1.0,
        cache: Default::default(),
    }));
    let o = run(
        DraftScript::says("hello", 0.1),
        ScriptedTarget::says("hello", None),
        req,
    )
    .await?;
    assert!(!o.stats.cost_guard);
    assert_eq!(o.stats.target_calls, 6);
    Ok(())
}

#[tokio::test]
async fn exact_windows_give_the_target_answer_with_the_draft_writing_what_it_agrees_with()
-> Result<(), EngineError> {
    let mut req = request(0.5, 64);
    req.settings_mut().verification = Verification::Exact;
    let target = ScriptedTarget::says("abcdefghij", None).with_windows();
    let o = run(DraftScript::says("abcxyzghij", 0.95), target, req).await?;
    assert_eq!(
        o.text, "abcdefghij",
        "exact: the target's answer, whatever the draft's confidence"
    );
    let w = o.target.window_calls();
    assert_eq!(w.len() as u32, o.stats.windows);
    assert_eq!(o.stats.target_calls, o.stats.windows, "no other calls");
    assert!(o.target.calls().is_empty());
    // a b c (accepted) d; y (refused) e; z (refused) f; g h i j and the end (accepted).
    assert_eq!(
        o.stats.windows,
        4,
        "{:?}",
        w.iter().map(|r| r.window.len()).collect::<Vec<_>>()
    );
    assert_eq!((o.stats.draft_tokens, o.stats.target_tokens), (7, 3));
    assert_eq!(
        o.stats.verifier_rejections, 0,
        "the local verifier is not consulted"
    );
    Ok(())
}

/// A window call to a target whose window calls skip its prompt cache (vLLM's do) is billed
/// its whole prefix as new input, and the guard judges it so; corrections still read the
/// cache.
#[tokio::test]
async fn window_calls_that_skip_the_targets_cache_are_billed_uncached() -> Result<(), EngineError> {
    let mut req = request(0.5, 64);
    req.settings_mut().verification = Verification::Exact;
    let cached = run(
        DraftScript::says("abcxyzghij", 0.95),
        ScriptedTarget::says("abcdefghij", None).with_windows(),
        req.clone(),
    )
    .await?;
    let uncached = run(
        DraftScript::says("abcxyzghij", 0.95),
        ScriptedTarget::says("abcdefghij", None)
            .with_windows()
            .with_uncached_windows(),
        req,
    )
    .await?;
    assert_eq!(uncached.text, cached.text);
    assert_eq!(uncached.stats.windows, cached.stats.windows);
    assert_eq!(
        uncached.stats.target_input_tokens,
        cached.stats.target_input_tokens
    );
    assert!(cached.stats.target_cacheable_input_tokens > 0);
    assert_eq!(uncached.stats.target_cacheable_input_tokens, 0);
    let price = Price {
        input: 1.0,
        cached_input: 0.1,
        output: 2.0,
    };
    assert!(
        estimate(&uncached.stats.spend(), &price.into()).approxy
            > estimate(&cached.stats.spend(), &price.into()).approxy
    );
    Ok(())
}

/// A window whose rows were stale in the target's cache is scored again without it: the
/// answer is the same, and each such window is two calls, its input billed twice, the second
/// time with nothing served from the cache.
#[tokio::test]
async fn a_window_scored_again_without_the_cache_is_billed_as_two_calls() -> Result<(), EngineError>
{
    let mut req = request(0.5, 64);
    req.settings_mut().verification = Verification::Exact;
    let fresh = run(
        DraftScript::says("abcxyzghij", 0.95),
        ScriptedTarget::says("abcdefghij", None).with_windows(),
        req.clone(),
    )
    .await?;
    let stale = run(
        DraftScript::says("abcxyzghij", 0.95),
        ScriptedTarget::says("abcdefghij", None)
            .with_windows()
            .with_stale_windows(),
        req,
    )
    .await?;
    assert_eq!(stale.text, fresh.text);
    assert_eq!(stale.stats.windows, fresh.stats.windows);
    assert!(stale.stats.windows > 0);
    assert_eq!(fresh.stats.window_rescores, 0);
    assert_eq!(stale.stats.window_rescores, stale.stats.windows);
    assert_eq!(
        stale.stats.target_calls,
        fresh.stats.target_calls + stale.stats.windows
    );
    let window_calls = |o: &Outcome| -> Vec<CallRecord> {
        o.stats
            .calls
            .iter()
            .filter(|c| c.kind == CallKind::Window)
            .cloned()
            .collect()
    };
    let (stale_calls, fresh_calls) = (window_calls(&stale), window_calls(&fresh));
    let input = |calls: &[CallRecord]| calls.iter().map(|c| c.sent).sum::<u64>();
    assert_eq!(input(&stale_calls), 2 * input(&fresh_calls));
    // Every window call said what its cache served: the whole prefix for the stale read,
    // nothing for the call made again.
    let reported: Vec<(u64, bool)> = stale_calls
        .iter()
        .map(|c| (c.cached, c.cached_reported))
        .collect();
    assert!(reported.iter().all(|&(_, said)| said), "{reported:?}");
    assert!(
        reported.iter().skip(1).step_by(2).all(|&(c, _)| c == 0),
        "{reported:?}"
    );
    assert!(
        reported.iter().step_by(2).all(|&(c, _)| c > 0),
        "{reported:?}"
    );
    // Each first call generated its one token for nothing: it is paid.
    assert_eq!(
        stale.stats.target_discarded_tokens,
        fresh.stats.target_discarded_tokens + u64::from(stale.stats.windows)
    );
    let first_calls: Vec<u64> = stale_calls.iter().step_by(2).map(|c| c.generated).collect();
    assert!(first_calls.iter().all(|&g| g == 1), "{first_calls:?}");
    Ok(())
}

/// Relaxed windows keep a draft token the target would not have chosen when the rule accepts
/// it from the target's probabilities: here the target gives each differing draft token 0.4
/// against its own 0.6 (reported with the draft's token first, so the order is the engine's
/// to sort out). `ratio:0.5` keeps them (0.4 >= 0.3); `ratio:0.8` (0.4 < 0.48) and SPRINTER's
/// label (p/q = 0.4/0.95) do not, and give the exact answer.
#[tokio::test]
async fn relaxed_windows_keep_what_the_rule_accepts_and_nothing_else() -> Result<(), EngineError> {
    let relaxed = |rule: AcceptanceRule| async move {
        let mut req = request(0.5, 64);
        req.settings_mut().verification = Verification::Relaxed(rule);
        let target = ScriptedTarget::says("abcdefghij", None)
            .with_windows()
            .with_alternatives(0.4);
        run(DraftScript::says("abcxyzghij", 0.95), target, req).await
    };
    let o = relaxed(AcceptanceRule::Ratio(0.5)).await?;
    assert_eq!(o.text, "abcxyzghij");
    assert_eq!(o.stats.window_relaxed_accepts, 3, "{:?}", o.stats);
    assert!(o.target.window_calls().iter().all(|w| w.top_logprobs == 20));
    assert!(o.target.calls().is_empty());
    for rule in [
        AcceptanceRule::Ratio(0.8),
        AcceptanceRule::Sprinter,
        AcceptanceRule::SprinterHard,
    ] {
        let o = relaxed(rule).await?;
        assert_eq!(o.text, "abcdefghij", "{rule}");
        assert_eq!(o.stats.window_relaxed_accepts, 0, "{rule}");
        assert_eq!(
            (o.stats.draft_tokens, o.stats.target_tokens),
            (7, 3),
            "{rule}"
        );
    }
    // Exact windows do not ask for the probabilities.
    let mut req = request(0.5, 64);
    req.settings_mut().verification = Verification::Exact;
    let target = ScriptedTarget::says("abcdefghij", None).with_windows();
    let o = run(DraftScript::says("abcxyzghij", 0.95), target, req).await?;
    assert!(o.target.window_calls().iter().all(|w| w.top_logprobs == 0));
    Ok(())
}

/// A scripted importance head: the draft's token is harmless where it is one of `harmless`,
/// important anywhere else.
#[derive(Debug)]
struct ScriptedImportance {
    harmless: Vec<u32>,
}

impl crate::verify::Verifier for ScriptedImportance {
    fn p_accept(&self, f: &crate::verify::Features) -> f32 {
        if self.harmless.contains(&f.token) {
            0.9
        } else {
            0.1
        }
    }
    fn kind(&self) -> &'static str {
        "scripted-importance"
    }
}

/// Judged windows keep a draft token the target would not have chosen where the importance
/// head calls the difference harmless, and the window goes on; the first difference it calls
/// important ends the window with the target's token, as in exact windows. Tokens where draft
/// and target agree are never put to the head.
#[tokio::test]
async fn judged_windows_keep_the_differences_the_importance_head_calls_harmless()
-> Result<(), EngineError> {
    let tok = tiny_tokenizer();
    let judged = |harmless: &str| {
        let head = ScriptedImportance {
            harmless: tok.encode(harmless).unwrap_or_default(),
        };
        async move {
            let mut req = request(0.5, 64);
            req.settings_mut().verification = Verification::Judged;
            let target = ScriptedTarget::says("abcdefghij", None).with_windows();
            run_with(DraftScript::says("abcxyzghij", 0.95), target, req, &head).await
        }
    };
    // x and y are harmless, z is not: the target's f replaces it, and the draft goes on.
    let o = judged("xy").await?;
    assert_eq!(o.text, "abcxyfghij");
    assert_eq!(o.stats.window_relaxed_accepts, 2, "{:?}", o.stats);
    assert_eq!((o.stats.draft_tokens, o.stats.target_tokens), (9, 1));
    assert!(o.target.calls().is_empty(), "windows only");
    // Every difference harmless: the draft's answer, one window after another.
    let all = judged("xyz").await?;
    assert_eq!(all.text, "abcxyzghij");
    assert_eq!(all.stats.window_relaxed_accepts, 3);
    // None of the window's drafted tokens is thrown away.
    assert_eq!(all.stats.window_accepted, all.stats.window_tokens);
    assert!(o.stats.window_accepted < o.stats.window_tokens);
    // Nothing harmless: the exact answer, as exact windows give it.
    let none = judged("").await?;
    assert_eq!(none.text, "abcdefghij");
    assert_eq!(none.stats.window_relaxed_accepts, 0);
    // The head judges only where the two differ: one calling everything important does
    // not change an answer the draft and the target agree on.
    let mut req = request(0.5, 64);
    req.settings_mut().verification = Verification::Judged;
    let same = run_with(
        DraftScript::says("abcdefghij", 0.95),
        ScriptedTarget::says("abcdefghij", None).with_windows(),
        req,
        &ScriptedImportance {
            harmless: Vec::new(),
        },
    )
    .await?;
    assert_eq!(same.text, "abcdefghij");
    assert_eq!(same.stats.window_relaxed_accepts, 0);
    assert_eq!(same.stats.window_accepted, same.stats.window_tokens);
    Ok(())
}

/// A longer `window_max` lets windows grow past 16 while the target keeps them whole: a
/// 120-token answer the draft and the target agree on takes fewer, longer window calls, and
/// the same answer.
#[tokio::test]
async fn a_longer_window_max_takes_fewer_calls_where_windows_are_kept_whole()
-> Result<(), EngineError> {
    let text: String = "abcdefghijklmnopqrstuvwxyz".repeat(5)[..120].to_string();
    let windows = |max: u32| {
        let text = text.clone();
        async move {
            let mut req = request(0.5, 200);
            req.settings_mut().verification = Verification::Judged;
            req.settings_mut().window_max = max;
            let target = ScriptedTarget::says(&text, None).with_windows();
            run(DraftScript::says(&text, 0.95), target, req).await
        }
    };
    let (short, long) = (windows(WINDOW_MAX).await?, windows(48).await?);
    assert_eq!(
        (short.text.as_str(), long.text.as_str()),
        (&text[..], &text[..])
    );
    let lens = |o: &Outcome| -> Vec<usize> {
        o.target
            .window_calls()
            .iter()
            .map(|r| r.window.len())
            .collect()
    };
    assert!(lens(&short).iter().all(|&k| k <= 16), "{:?}", lens(&short));
    assert!(lens(&long).iter().any(|&k| k > 16), "{:?}", lens(&long));
    assert!(
        long.stats.windows < short.stats.windows,
        "{:?} against {:?}",
        lens(&long),
        lens(&short)
    );
    Ok(())
}

#[tokio::test]
async fn exact_windows_when_the_draft_never_agrees_take_one_target_token_per_call()
-> Result<(), EngineError> {
    let mut req = request(0.5, 64);
    req.settings_mut().verification = Verification::Exact;
    let o = run(
        DraftScript::says("zzzzz", 0.95),
        ScriptedTarget::says("hello", None).with_windows(),
        req,
    )
    .await?;
    assert_eq!(o.text, "hello");
    assert_eq!((o.stats.windows, o.stats.draft_tokens), (6, 0));
    assert_eq!(
        o.stats.window_accepted, 1,
        "only the end of the answer, which both say"
    );
    Ok(())
}

#[tokio::test]
async fn approximate_windows_score_only_where_the_verifier_rejects() -> Result<(), EngineError> {
    let mut draft = DraftScript::says("abcxyzghij", 0.95);
    draft.confidence = vec![0.95, 0.95, 0.95, 0.1, 0.1, 0.1];
    let mut req = request(0.5, 64);
    req.settings_mut().verification = Verification::ApproximateWindows;
    let o = run(
        draft,
        ScriptedTarget::says("abcdefghij", None).with_windows(),
        req,
    )
    .await?;
    assert_eq!(o.text, "abcdefghij");
    assert_eq!(o.stats.verifier_rejections, 3);
    assert_eq!(o.stats.windows, 3, "one window per rejection");
    // The first window starts at the first rejection: the prompt and "abc" before it.
    assert_eq!(o.target.window_calls()[0].prefix.len(), prompt().len() + 3);
    Ok(())
}

#[tokio::test]
async fn a_target_that_cannot_score_windows_gets_corrections_instead() -> Result<(), EngineError> {
    let mut draft = DraftScript::says("abcXef", 0.95);
    draft.confidence = vec![0.95, 0.95, 0.95, 0.1];
    let mut req = request(0.5, 64);
    req.settings_mut().verification = Verification::ApproximateWindows;
    let o = run(draft, ScriptedTarget::says("abcdef", None), req).await?;
    assert_eq!(o.text, "abcdef");
    assert_eq!((o.stats.windows, o.stats.target_calls), (0, 1));
    Ok(())
}

#[tokio::test]
async fn window_sizes_follow_recent_acceptance() {
    let mut s = WindowSize::new(WINDOW_MAX);
    assert_eq!(s.k(), 8);
    for _ in 0..6 {
        let k = s.k() as usize;
        s.update(0, k);
    }
    assert_eq!(
        s.k(),
        4,
        "a draft the target keeps refusing gets short windows"
    );
    // Kept whole: twice as long, up to the limit.
    s.update(4, 4);
    assert_eq!(s.k(), 8);
    s.update(8, 8);
    assert_eq!(s.k(), 16);
    s.update(16, 16);
    assert_eq!(s.k(), 16);
    // Refused part way: toward the recent mean accepted length plus 2.
    s.update(6, 16);
    assert_eq!(s.k(), 12);
    // A policy's longer limit lets windows grow past the default's.
    let mut long = WindowSize::new(48);
    for want in [16, 32, 48, 48] {
        let k = long.k() as usize;
        long.update(k, k);
        assert_eq!(long.k(), want);
    }
    long.update(40, 48);
    assert_eq!(long.k(), 45);
    assert_eq!(WindowSize::new(1).k(), 4, "never shorter than the shortest");
}

#[tokio::test]
async fn the_hand_off_streams_and_a_stop_string_ends_it_upstream_too() -> Result<(), EngineError> {
    let mut req = request(0.5, 64);
    req.settings_mut().bailout = Some(BailoutBudget {
        window: 1,
        max_rejection_rate: 0.0,
    });
    req.stop = vec!["STOP".into()];
    let target = ScriptedTarget::says("one two STOP three four five six seven", None)
        .with_token_delay(Duration::from_millis(1));
    let o = run(DraftScript::says("x", 0.1), target, req).await?;
    assert_eq!(o.text, "one two ");
    assert!(o.stats.bailed_out);
    assert_eq!(o.stats.target_calls, 1);
    assert_eq!(
        o.target.streamed_tokens(),
        "one two STOP".len(),
        "the target stopped where the answer did"
    );
    Ok(())
}

/// A target that answers every call with one id far outside the vocabulary.
#[derive(Debug)]
struct OutOfVocabulary;

#[async_trait::async_trait]
impl TargetClient for OutOfVocabulary {
    async fn continue_tokens(
        &self,
        _: &crate::targets::ContinuationRequest,
    ) -> Result<crate::targets::Continuation, TargetError> {
        Ok(crate::targets::Continuation {
            tokens: vec![9_999_999],
            ..Default::default()
        })
    }
    async fn tokenize(&self, _: &str) -> Result<Option<Vec<u32>>, TargetError> {
        Ok(None)
    }
    async fn health(&self) -> Result<(), TargetError> {
        Ok(())
    }
}

#[tokio::test]
async fn a_target_id_outside_the_vocabulary_is_the_targets_error() {
    let tok = tiny_tokenizer();
    let engine = Engine::new(
        tok.clone(),
        Arc::new(OutOfVocabulary),
        tok.end_of_sequence_ids(),
    );
    let workers = ScriptedWorkers::new(DraftScript::says("hello", 0.95), 1);
    let lease = workers.try_lease().unwrap_or_else(|| unreachable!());
    let (tx, _rx) = mpsc::channel(64);
    let err = engine
        .generate(lease.as_ref(), &ConfidenceVerifier, request(1.0, 8), tx)
        .await;
    assert!(
        matches!(&err, Err(EngineError::Target(TargetError::Protocol(m))) if m.contains("outside the vocabulary")),
        "{err:?}"
    );
}

#[tokio::test]
async fn a_cap_on_target_calls_hands_the_rest_to_the_last_one() -> Result<(), EngineError> {
    let mut req = request(1.0, 64);
    req.settings_mut().max_target_calls = Some(3);
    let o = run(
        DraftScript::says("hello", 0.95),
        ScriptedTarget::says("world", None),
        req,
    )
    .await?;
    assert_eq!(o.text, "world");
    // Two one-token corrections, then one call that writes the rest.
    assert_eq!(
        (o.stats.target_calls, o.stats.call_cap, o.stats.bailed_out),
        (3, true, false)
    );
    Ok(())
}

/// A text-level target whose answer is over: no text, end of sequence (no token stands for it).
#[derive(Debug)]
struct AlreadyDone;

#[async_trait::async_trait]
impl TargetClient for AlreadyDone {
    async fn continue_tokens(
        &self,
        _: &crate::targets::ContinuationRequest,
    ) -> Result<crate::targets::Continuation, TargetError> {
        Ok(crate::targets::Continuation {
            stopped_on_eos: true,
            ..Default::default()
        })
    }
    async fn tokenize(&self, _: &str) -> Result<Option<Vec<u32>>, TargetError> {
        Ok(None)
    }
    async fn health(&self) -> Result<(), TargetError> {
        Ok(())
    }
}

#[tokio::test]
async fn a_hand_off_to_a_target_with_nothing_more_to_say_ends_the_answer() -> Result<(), EngineError>
{
    let tok = tiny_tokenizer();
    let engine = Engine::new(
        tok.clone(),
        Arc::new(AlreadyDone),
        tok.end_of_sequence_ids(),
    );
    let workers = ScriptedWorkers::new(DraftScript::says("hello", 0.95), 1);
    let lease = workers.try_lease().ok_or(EngineError::Saturated)?;
    let (tx, _rx) = mpsc::channel(64);
    let mut req = request(1.0, 8);
    req.settings_mut().max_target_calls = Some(1);
    let stats = engine
        .generate(lease.as_ref(), &ConfidenceVerifier, req, tx)
        .await?;
    assert_eq!(
        (stats.completion_tokens, stats.finish_reason, stats.call_cap),
        (0, Some(FinishReason::Stop), true)
    );
    Ok(())
}

/// Every token the target generated is billed: a span cancelled at a resync counts the tokens
/// that had already arrived and were not read as discarded, whether the target had written
/// the whole span before it was read or was still generating (then nothing more was).
#[tokio::test]
async fn a_cancelled_span_bills_every_token_the_target_generated() -> Result<(), EngineError> {
    for eager in [true, false] {
        let delay = if eager {
            Duration::ZERO
        } else {
            Duration::from_millis(5)
        };
        let mut req = request(0.5, 64);
        req.settings_mut().correction = span(32, 3);
        let mut draft = DraftScript::says("the quick brown fox jumps over the lazy dog", 0.95);
        draft.confidence = vec![0.1];
        let o = run(
            draft,
            if eager {
                ScriptedTarget::says("the quick brown fox jumps over the lazy dog", None)
                    .with_eager_streams()
            } else {
                ScriptedTarget::says("the quick brown fox jumps over the lazy dog", None)
                    .with_token_delay(delay)
            },
            req,
        )
        .await?;
        assert_eq!(o.text, "the quick brown fox jumps over the lazy dog");
        assert!(o.stats.resyncs >= 1, "{:?}", o.stats);
        assert_eq!(
            u64::from(o.stats.target_tokens) + o.stats.target_discarded_tokens,
            o.target.streamed_tokens() as u64,
            "eager {eager}: {:?}",
            o.stats
        );
    }
    Ok(())
}

/// Target tokens that arrive together are fed to the draft in one call, never more of them
/// than the span could still need (here a resync's worth plus the corrected token), and the
/// answer and every decision are those of tokens arriving one at a time.
#[tokio::test]
async fn a_span_backlog_is_fed_to_the_draft_in_batches() -> Result<(), EngineError> {
    let text = "the quick brown fox jumps over the lazy dog";
    let mut outcomes = Vec::new();
    for eager in [false, true] {
        let mut req = request(0.5, 64);
        req.settings_mut().correction = span(32, 3);
        let mut draft = DraftScript::says(text, 0.95);
        // Unsure at the first position: a span corrects it, and resyncs three tokens later.
        draft.confidence = vec![0.1];
        let target = ScriptedTarget::says(text, None);
        let target = if eager {
            target.with_eager_streams()
        } else {
            target.with_token_delay(Duration::from_millis(2))
        };
        outcomes.push(run(draft, target, req).await?);
    }
    let (one_by_one, batched) = (&outcomes[0], &outcomes[1]);
    for o in &outcomes {
        assert_eq!(o.text, text);
        assert_eq!(
            (o.stats.target_calls, o.stats.resyncs),
            (1, 1),
            "{:?}",
            o.stats
        );
    }
    assert_eq!(
        (
            one_by_one.stats.target_tokens,
            one_by_one.stats.draft_tokens
        ),
        (batched.stats.target_tokens, batched.stats.draft_tokens)
    );
    // One by one: the span's four tokens cost four steps. Batched: one.
    assert_eq!(
        one_by_one.draft_steps - batched.draft_steps,
        3,
        "{} and {} draft steps",
        one_by_one.draft_steps,
        batched.draft_steps
    );
    Ok(())
}

/// The same scripted answer under the budget guard, priced two ways, with a model whose
/// record says the target writes most of its answers (87 % of the tokens, 5.8 calls per 100,
/// as chat at the shipped threshold). At Fireworks' serverless list a drafted token a later
/// call re-sends costs what a generated one does and every call re-sends the prefix at half
/// that: the first rejection's call does not pay and the target writes the rest. Priced by the target's time on a
/// llama-server that caches every common prefix, a re-sent prefix costs nothing but the
/// call's pass and a drafted token 0.28 of a generated one: the call pays, and the span ends
/// where the draft catches up.
#[tokio::test]
async fn the_budget_guard_decides_differently_priced_by_the_target_s_time()
-> Result<(), EngineError> {
    use crate::cost::{BudgetGuard, BusyRates, CacheRules, Pricing, Rates};
    let head = "abcdefghijklmnopqrst";
    let answer = format!("{head}UVW0123456789");
    let mut draft = DraftScript::says(&format!("{head}xyz0123456789"), 0.95);
    draft.confidence = vec![0.95; 20];
    draft.confidence.push(0.1);
    let guarded = |price: Pricing| {
        let mut req = request(0.5, 64);
        req.settings_mut().correction = Correction::Span {
            max_span: 32,
            resync: 3,
            end: SpanClose::Resync,
            ask: SpanAsk::All,
        };
        req.cost_guard = Some(Guard::Budget(BudgetGuard {
            price,
            cache: CacheRules::default(),
            hard_cap: 1.5,
            max_cost_ratio: 1.0,
            prior: Rates {
                calls_per_token: 0.058,
                target_share: 0.87,
                mean_completion: Some(200.0),
            },
            traffic_ratio: None,
        }));
        req
    };
    let listed = Price {
        input: 0.90,
        cached_input: 0.45,
        output: 0.90,
    };
    let by_list = run(
        draft.clone(),
        ScriptedTarget::says(&answer, None).with_timings(),
        guarded(listed.into()),
    )
    .await?;
    assert_eq!(by_list.text, answer);
    // Refused already by the hard cap: in the worst case the call and the hand-off after it
    // would cost more than 1.5 times passthrough.
    assert!(by_list.stats.cost_guard && by_list.stats.cost_guard_reason.is_some());
    assert_eq!(
        by_list
            .stats
            .calls
            .iter()
            .map(|c| (c.kind, c.generated))
            .collect::<Vec<_>>(),
        [(CallKind::HandOff, 13)],
        "the target writes the rest"
    );
    let rates = BusyRates {
        prefill_ms: 10.6,
        generate_ms: 37.5,
        call_ms: 30.0,
    };
    let by_time = run(
        draft,
        ScriptedTarget::says(&answer, None).with_timings(),
        guarded(Pricing::Busy(rates)),
    )
    .await?;
    assert_eq!(by_time.text, answer);
    assert!(!by_time.stats.cost_guard, "{:?}", by_time.stats);
    assert_eq!(by_time.stats.resyncs, 1);
    let calls = &by_time.stats.calls;
    assert_eq!(calls.len(), 1);
    // U V W and 0 1 2, then the two generated after the close; the closed stream gave no
    // timings, so the call is priced at the rates: its pass, 20 prompt tokens after the
    // cached question (the tiny prompt counts whole: nothing was cached before it), 8 tokens.
    assert_eq!((calls[0].kind, calls[0].generated), (CallKind::Span, 8));
    assert!(calls[0].timings.is_none());
    let t = by_time.stats.target_time(&rates);
    let prompt = u64::from(by_time.stats.prompt_tokens);
    let want = rates.call_seconds(prompt + 20, 8);
    assert!(
        (t.estimated - want).abs() < 1e-9 && t.measured == 0.0,
        "{t:?}"
    );
    assert_eq!(t.untimed_calls, 1);
    assert!(t.spent < t.passthrough, "{t:?}");
    Ok(())
}
