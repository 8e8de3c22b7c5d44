//! The decode loop end to end: real ONNX draft, real llama-server target.

// Tests fail by panicking; helpers here are test code too.
#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use approxy_verifier::targets::{ContinuationRequest, LlamaCppTarget, TargetClient};
use approxy_verifier::{
    BailoutBudget, Correction, DraftPool, DraftWorkers, EngineError, FinishReason, SamplingParams,
    Source, SpanAsk, SpanClose, TargetError, TokenEvent,
};
use common::Counting;

const PROMPTS: [&str; 5] = [
    "Write a Python function that reverses a string.",
    "What is the capital of France? Answer in one sentence.",
    "Write a Rust function that returns the larger of two i32 values.",
    "List three primary colors.",
    "Explain in two sentences what a hash map is.",
];

fn pool() -> Arc<DraftPool> {
    DraftPool::start(&common::draft_config(1)).unwrap_or_else(|e| panic!("{e}"))
}

/// What the target writes on its own: one greedy call for the whole answer.
async fn target_greedy(t: &LlamaCppTarget, prompt: &[u32], n: u32) -> Vec<u32> {
    let req = ContinuationRequest::greedy(prompt.to_vec(), n);
    t.continue_tokens(&req)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .tokens
}

/// A draft pool and an engine whose real target counts its calls; plus the EOS ids.
fn counted_setup() -> (
    Arc<DraftPool>,
    Arc<Counting<LlamaCppTarget>>,
    approxy_verifier::Engine,
    Vec<u32>,
) {
    let target = Arc::new(Counting::new(common::llama_target()));
    let engine = common::engine_with(target.clone());
    let eos = common::eos(engine.tokenizer());
    (pool(), target, engine, eos)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reject_everything_equals_target_greedy() {
    let (pool, target, engine, eos) = counted_setup();
    for p in PROMPTS {
        let prompt = common::chat_prompt(p);
        let n = 24;
        let mut expected = target_greedy(&target.inner, &prompt, n).await;
        expected.retain(|t| !eos.contains(t));
        let before = target.calls.load(Ordering::SeqCst);
        let (ids, _, stats) = common::run(&engine, &pool, common::greedy(prompt.clone(), n, 1.0))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        common::assert_greedy_up_to_a_tie(&prompt, &ids, &expected, &eos, p).await;
        assert_eq!(stats.draft_tokens, 0);
        assert_eq!(stats.target_tokens as usize, ids.len());
        assert_eq!(stats.verifier_rejections, stats.target_calls);
        assert_eq!(
            target.calls.load(Ordering::SeqCst) - before,
            stats.target_calls
        );
        // llama-server reports every call's compute: one generated token each, and time.
        assert_eq!(stats.target_calls_timed, stats.target_calls, "{stats:?}");
        assert_eq!(stats.target_predicted, u64::from(stats.target_calls));
        assert!(stats.target_busy > Duration::ZERO && stats.target_prompt_processed > 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accept_everything_equals_draft_greedy_without_target() {
    let (pool, target, engine, eos) = counted_setup();
    for p in PROMPTS {
        let prompt = common::chat_prompt(p);
        // Draft-only greedy reference, straight on the worker.
        let lease = pool.try_lease().unwrap_or_else(|| panic!("busy"));
        let mut out = lease
            .prefill(prompt.clone())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let mut expected = Vec::new();
        for _ in 0..24 {
            let t = approxy_verifier::sampling::argmax(&out.logits).0 as u32;
            if eos.contains(&t) {
                break;
            }
            expected.push(t);
            out = lease
                .extend(vec![t], false)
                .await
                .unwrap_or_else(|e| panic!("{e}"))
                .remove(0);
        }
        drop(lease);
        let (ids, _, stats) = common::run(&engine, &pool, common::greedy(prompt, 24, 0.0))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(ids, expected, "prompt {p:?}");
        assert_eq!(stats.target_calls, 0);
        assert_eq!(stats.target_tokens, 0);
    }
    assert_eq!(target.calls.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn middle_threshold_mixes_sources_and_bails_out() {
    let pool = pool();
    let engine = common::engine_with(Arc::new(common::llama_target()));
    let prompt = common::chat_prompt(PROMPTS[0]);
    let (ids, text, stats) = common::run(&engine, &pool, common::greedy(prompt.clone(), 48, 0.7))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(ids.len() as u32, stats.completion_tokens);
    assert_eq!(
        stats.draft_tokens + stats.target_tokens,
        stats.completion_tokens
    );
    assert!(stats.draft_tokens > stats.target_tokens, "{stats:?}");
    assert!(text.contains("def"), "{text:?}");
    // A budget nobody can meet: the first rejection window hands the rest to the target.
    let mut req = common::greedy(prompt, 48, 1.0);
    req.settings_mut().bailout = Some(BailoutBudget {
        window: 2,
        max_rejection_rate: 0.4,
    });
    let (_, _, stats) = common::run(&engine, &pool, req)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(stats.bailed_out);
    assert_eq!(
        stats.target_calls, 2,
        "one correction, then one call for the rest: {stats:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn span_corrections_with_nothing_accepted_equal_target_greedy_in_few_calls() {
    let (pool, target, engine, eos) = counted_setup();
    for p in &PROMPTS[..3] {
        let prompt = common::chat_prompt(p);
        let mut expected = target_greedy(&target.inner, &prompt, 40).await;
        expected.retain(|t| !eos.contains(t));
        let mut req = common::greedy(prompt.clone(), 40, 1.0);
        req.settings_mut().correction = Correction::Span {
            max_span: 16,
            resync: 3,
            end: SpanClose::Resync,
            ask: SpanAsk::All,
        };
        let (ids, _, stats) = common::run(&engine, &pool, req)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        common::assert_greedy_up_to_a_tie(&prompt, &ids, &expected, &eos, p).await;
        // At threshold 1 the draft never agrees confidently: every span runs to its length.
        // Tokens the target streamed: the answer, plus its end-of-sequence when it ended early.
        let streamed = if ids.len() < 40 { ids.len() + 1 } else { 40 };
        assert_eq!(
            stats.target_calls as usize,
            streamed.div_ceil(16),
            "{stats:?}"
        );
        assert_eq!(stats.resyncs, 0);
        // Every span was read to its end, whose event carries the call's compute.
        assert_eq!(stats.target_calls_timed, stats.target_calls, "{stats:?}");
        assert_eq!(stats.target_predicted as usize, streamed, "{stats:?}");
    }
}

/// The tie allowance above cannot hide a real difference: a confident token swapped is caught.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[should_panic(expected = "without a tie")]
async fn a_difference_that_is_no_tie_fails_the_greedy_check() {
    let target = common::llama_target();
    let eos = common::eos(&common::tokenizer());
    let prompt = common::chat_prompt(PROMPTS[1]);
    let expected = target_greedy(&target, &prompt, 8).await;
    let mut got = expected.clone();
    got[2] = got[2].wrapping_add(1);
    common::assert_greedy_up_to_a_tie(&prompt, &got, &expected, &eos, "swapped").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn span_corrections_resync_and_make_fewer_calls_than_one_token_corrections() {
    let pool = pool();
    let engine = common::engine_with(Arc::new(common::llama_target()));
    let (mut fixed_calls, mut span_calls, mut resyncs) = (0, 0, 0);
    for p in PROMPTS {
        let prompt = common::chat_prompt(p);
        let (_, _, fixed) = common::run(&engine, &pool, common::greedy(prompt.clone(), 64, 0.7))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let mut req = common::greedy(prompt, 64, 0.7);
        req.settings_mut().correction = Correction::Span {
            max_span: 32,
            resync: 3,
            end: SpanClose::Resync,
            ask: SpanAsk::All,
        };
        let (_, _, span) = common::run(&engine, &pool, req)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        eprintln!(
            "{p:?}: fixed {} calls / {} target tokens; span {} calls / {} target tokens, {} resyncs",
            fixed.target_calls,
            fixed.target_tokens,
            span.target_calls,
            span.target_tokens,
            span.resyncs
        );
        fixed_calls += fixed.target_calls;
        span_calls += span.target_calls;
        resyncs += span.resyncs;
    }
    assert!(resyncs > 0, "no span ever resynced");
    assert!(
        span_calls < fixed_calls,
        "span {span_calls} calls, fixed {fixed_calls}"
    );
}

/// Drafting while a span is in flight moves draft work into the target's time; it changes
/// neither the answer nor the calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapped_spans_give_the_same_answer_in_the_same_calls() {
    let pool = pool();
    let engine = common::engine_with(Arc::new(common::llama_target()));
    let (mut guessed, mut used) = (0, 0);
    for p in PROMPTS {
        let prompt = common::chat_prompt(p);
        let mut runs = Vec::new();
        for overlap in [false, true] {
            let mut req = common::greedy(prompt.clone(), 48, 0.7);
            req.settings_mut().correction = Correction::Span {
                max_span: 32,
                resync: 3,
                end: SpanClose::Resync,
                ask: SpanAsk::All,
            };
            req.settings_mut().overlap = overlap;
            let (ids, _, stats) = common::run(&engine, &pool, req)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            runs.push((ids, stats));
        }
        let (off, on) = (&runs[0], &runs[1]);
        eprintln!(
            "{p:?}: {} target calls; overlap guessed {} tokens, {} used; draft time {:.2} s off, {:.2} s on",
            on.1.target_calls,
            on.1.overlap_guesses,
            on.1.overlap_guesses_used,
            off.1.draft_time.as_secs_f64(),
            on.1.draft_time.as_secs_f64()
        );
        if on.0 == off.0 {
            assert_eq!(on.1.target_calls, off.1.target_calls, "prompt {p:?}");
        } else {
            // Overlap feeds the draft the same tokens in other batch shapes, which round
            // differently; where that tips a near-tie the two answers may part (and their
            // calls with them), but nowhere else.
            parted_at_a_near_tie(&pool, &prompt, &on.0, &off.0, &format!("{p:?}: overlap")).await;
        }
        guessed += on.1.overlap_guesses;
        used += on.1.overlap_guesses_used;
    }
    assert!(guessed > 0 && used > 0, "guessed {guessed}, used {used}");
}

/// Prompt lookup with the real draft: on prompts whose answers copy them, the draft picks many
/// of the proposals it computed ahead, and the answers are those without lookup but where a
/// near-tie tips another way (the proposals run in other batch shapes, which round
/// differently).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompt_lookup_gives_the_same_answers_and_saves_draft_passes() {
    let pool = pool();
    let engine = common::engine_with(Arc::new(common::llama_target()));
    let copy = [
        "Rename this function to `solution` and keep everything else exactly as it is:\n\n```python\ndef add(a, b):\n    \"\"\"Return the sum of a and b.\"\"\"\n    return a + b\n```",
        "Quote this sentence word for word: \"The quick brown fox jumps over the lazy dog, and the dog does not mind at all.\"",
    ];
    let (mut proposed, mut used) = (0, 0);
    for p in copy {
        let prompt = common::chat_prompt(p);
        let mut runs = Vec::new();
        for lookup in [0, 8] {
            let mut req = common::greedy(prompt.clone(), 48, 0.7);
            req.settings_mut().prompt_lookup = lookup;
            let (ids, _, stats) = common::run(&engine, &pool, req)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            runs.push((ids, stats));
        }
        let (off, on) = (&runs[0], &runs[1]);
        eprintln!(
            "{p:?}: lookup proposed {} tokens, {} used; draft time {:.2} s off, {:.2} s on",
            on.1.lookup_tokens,
            on.1.lookup_tokens_used,
            off.1.draft_time.as_secs_f64(),
            on.1.draft_time.as_secs_f64()
        );
        if on.0 != off.0 {
            parted_at_a_near_tie(&pool, &prompt, &on.0, &off.0, &format!("{p:?}: lookup")).await;
        }
        proposed += on.1.lookup_tokens;
        used += on.1.lookup_tokens_used;
    }
    assert!(
        used >= 10 && used <= proposed,
        "proposed {proposed}, used {used}"
    );
}

/// Two greedy answers at threshold 0.7 to `prompt`, `on` with a setting that only moves draft
/// work and `off` without it, part only where a near-tie could tip either way (`what` names
/// the setting in the failure).
async fn parted_at_a_near_tie(
    pool: &Arc<DraftPool>,
    prompt: &[u32],
    on: &[u32],
    off: &[u32],
    what: &str,
) {
    let at = on.iter().zip(off).take_while(|(a, b)| a == b).count();
    let why = near_tie(pool, prompt, &on[..at], 0.7).await;
    assert!(
        why.is_some(),
        "{what} changed the answer at {at} without a near tie:\n on  {on:?}\n off {off:?}"
    );
    eprintln!(
        "{what}: the answers part at {at}, after {}",
        why.unwrap_or_default()
    );
}

/// Where, up to and including the position after `answer`, a greedy decode at `threshold`
/// could have gone either way by rounding alone: the draft's top-1 probability within 0.02 of
/// the threshold (accept or call the target) or its top two within [`common::TIE_NATS`] (the
/// draft teacher-forced over `answer`), or the target's top two within it at the end.
async fn near_tie(
    pool: &Arc<DraftPool>,
    prompt: &[u32],
    answer: &[u32],
    threshold: f32,
) -> Option<String> {
    let lease = pool.try_lease().unwrap_or_else(|| panic!("busy"));
    lease
        .rollback(usize::MAX)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let mut outs = vec![
        lease
            .prefill(prompt.to_vec())
            .await
            .unwrap_or_else(|e| panic!("{e}")),
    ];
    if !answer.is_empty() {
        outs.extend(
            lease
                .extend(answer.to_vec(), true)
                .await
                .unwrap_or_else(|e| panic!("{e}")),
        );
    }
    drop(lease);
    for (i, o) in outs.iter().enumerate() {
        let f = approxy_verifier::verify::Features::from_output(o);
        let (p1, margin) = (f.stats[0], f.stats[1]);
        let gap = f64::from(p1).ln() - f64::from(p1 - margin).ln();
        if (p1 - threshold).abs() < 0.02 || gap <= common::TIE_NATS {
            return Some(format!(
                "a draft near-tie at {i} (top-1 {p1:.3}, {gap:.3} nats above the next)"
            ));
        }
    }
    let top = common::target_top(&[prompt, answer].concat()).await;
    let gap = top.first().zip(top.get(1)).map(|(a, b)| a.1 - b.1);
    gap.filter(|g| *g <= common::TIE_NATS)
        .map(|g| format!("a target near-tie at {} ({g:.3} nats)", answer.len()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seeded_sampling_repeats_and_reaches_the_target() {
    let pool = pool();
    let target = Arc::new(Counting::new(common::llama_target()));
    let engine = common::engine_with(target.clone());
    let prompt = common::chat_prompt("Tell me a one-line joke about computers.");
    let sampling = SamplingParams {
        temperature: 0.9,
        top_p: 0.95,
        seed: Some(42),
    };
    // Draft side: the same seed gives the same tokens (threshold 0 keeps the target out, whose
    // prompt cache makes it only approximately repeatable).
    let mut req = common::greedy(prompt.clone(), 24, 0.0);
    req.sampling = sampling;
    let a = common::run(&engine, &pool, req.clone())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let b = common::run(&engine, &pool, req)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(a.0, b.0);
    req = common::greedy(prompt, 6, 1.0);
    req.sampling = SamplingParams {
        seed: Some(43),
        ..sampling
    };
    let c = common::run(&engine, &pool, req.clone())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    // Target side: every call carries the same sampling parameters.
    let seen = target
        .sampling
        .lock()
        .map(|v| v.clone())
        .unwrap_or_default();
    assert_eq!(seen.len() as u32, c.2.target_calls);
    assert!(seen.iter().all(|s| *s == req.sampling), "{seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_sequence_ends_generation() {
    let pool = pool();
    let engine = common::engine_with(Arc::new(common::llama_target()));
    let prompt = common::chat_prompt("Count from 1 to 20, separated by commas.");
    let mut req = common::greedy(prompt, 80, 0.0);
    req.stop = vec!["5".into()];
    let (_, text, stats) = common::run(&engine, &pool, req)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(stats.finish_reason, Some(FinishReason::Stop));
    assert!(!text.contains('5') && text.contains('4'), "{text:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancellation_stops_target_calls() {
    let pool = pool();
    let target = Arc::new(Counting::new(common::llama_target()));
    let engine = common::engine_with(target.clone());
    let lease = pool.try_lease().unwrap_or_else(|| panic!("busy"));
    let (tx, mut rx) = tokio::sync::mpsc::channel::<TokenEvent>(1);
    let req = common::greedy(common::chat_prompt(PROMPTS[4]), 200, 1.0);
    let task = tokio::spawn(async move {
        engine
            .generate(
                lease.as_ref(),
                &approxy_verifier::ConfidenceVerifier,
                req,
                tx,
            )
            .await
    });
    for _ in 0..3 {
        let ev = rx
            .recv()
            .await
            .unwrap_or_else(|| panic!("stream ended early"));
        assert_eq!(ev.source, Source::Target);
    }
    drop(rx);
    let stats = tokio::time::timeout(Duration::from_secs(30), task)
        .await
        .unwrap_or_else(|_| panic!("generation did not stop after cancellation"))
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(stats.finish_reason, Some(FinishReason::Cancelled));
    let calls = target.calls.load(Ordering::SeqCst);
    assert!(calls <= 5, "{calls} target calls for 3 received tokens");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        target.calls.load(Ordering::SeqCst),
        calls,
        "calls continued after cancellation"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn target_down_is_a_typed_error() {
    let pool = pool();
    // Port 9 (discard) is closed on loopback here: connection refused at once.
    let down = LlamaCppTarget::new(common::target_config("http://127.0.0.1:9"))
        .unwrap_or_else(|e| panic!("{e}"));
    let engine = common::engine_with(Arc::new(down));
    let started = std::time::Instant::now();
    let r = common::run(
        &engine,
        &pool,
        common::greedy(common::chat_prompt("hi"), 8, 1.0),
    )
    .await;
    assert!(
        matches!(r, Err(EngineError::Target(TargetError::Unreachable { .. }))),
        "{r:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(20));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokenizers_agree_with_target() {
    let engine = common::engine_with(Arc::new(common::llama_target()));
    assert!(
        engine
            .check_tokenizer()
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    );
}
