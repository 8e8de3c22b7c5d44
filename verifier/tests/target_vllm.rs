//! The `vllm` target kind against a real vLLM (CPU build) serving the draft model dequantised
//! to float32: the shared target-client suite, and the decode loop with every token taken
//! from vLLM. `deploy/test-all.sh` starts vLLM and runs these with `--ignored` once the
//! llama-server tests are done (both servers on two cores at once would starve each other).

#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use approxy_verifier::Verification;
use approxy_verifier::draft::pool::DraftPool;
use approxy_verifier::targets::{
    ChatPrefixTarget, OpenAiCompletionsTarget, OpenAiTextTarget, PrefixStyle, TargetClient,
    WindowRequest,
};

fn vllm_url() -> String {
    std::env::var("APPROXY_TEST_VLLM_URL").unwrap_or_else(|_| {
        panic!("APPROXY_TEST_VLLM_URL is not set: deploy/test-all.sh starts vLLM and sets it")
    })
}

fn vllm_config() -> approxy_verifier::TargetConfig {
    let mut cfg = common::target_config(&format!("{}/v1", vllm_url()));
    cfg.model = std::env::var("APPROXY_TEST_VLLM_MODEL")
        .unwrap_or_else(|_| panic!("APPROXY_TEST_VLLM_MODEL is not set"));
    cfg
}

fn vllm() -> OpenAiCompletionsTarget {
    OpenAiCompletionsTarget::new(vllm_config()).unwrap_or_else(|e| panic!("{e}"))
}

/// The shared suite through the vllm kind and the text-level kinds vLLM also serves:
/// `/v1/completions` with a text prompt, and chat completions with `continue_final_message`.
/// Same model, same greedy answer.
#[tokio::test]
#[ignore = "needs a real vLLM: deploy/test-all.sh runs it with --ignored"]
async fn vllm_passes_the_shared_suite_through_every_kind() {
    let tok = common::tokenizer();
    let by_ids = common::suite("vllm", &vllm()).await;
    let text = OpenAiTextTarget::new(vllm_config(), tok.clone()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(common::suite("openai_text", &text).await, by_ids);
    let chat = ChatPrefixTarget::new(vllm_config(), tok, PrefixStyle::ContinueFinalMessage)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(common::suite("chat_prefix", &chat).await, by_ids);
}

#[tokio::test]
#[ignore = "needs a real vLLM: deploy/test-all.sh runs it with --ignored"]
async fn dropping_a_stream_stops_vllm() {
    let url = vllm_url();
    let http = reqwest::Client::new();
    // vLLM's Prometheus gauge of requests it is generating for.
    let busy = || async {
        let text = http
            .get(format!("{url}/metrics"))
            .send()
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .text()
            .await
            .unwrap_or_default();
        text.lines()
            .filter(|l| l.starts_with("vllm:num_requests_running"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .any(|n| n > 0.0)
    };
    common::dropping_a_stream_stops_the_generation(&vllm(), busy).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real vLLM: deploy/test-all.sh runs it with --ignored"]
async fn reject_everything_equals_vllm_greedy() {
    let pool = DraftPool::start(&common::draft_config(1)).unwrap_or_else(|e| panic!("{e}"));
    let target = Arc::new(common::Counting::new(vllm()));
    let engine = common::engine_with(target.clone());
    let eos = common::eos(engine.tokenizer());
    for p in [
        "Write a Python function that reverses a string.",
        "What is the capital of France?",
    ] {
        let prompt = common::chat_prompt(p);
        let mut expected = target
            .inner
            .continue_tokens(&common::req(prompt.clone(), 16))
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .tokens;
        expected.retain(|t| !eos.contains(t));
        let before = target.calls.load(Ordering::SeqCst);
        let (ids, _, stats) = common::run(&engine, &pool, common::greedy(prompt, 16, 1.0))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(ids, expected, "prompt {p:?}");
        assert_eq!(stats.draft_tokens, 0);
        assert_eq!(
            target.calls.load(Ordering::SeqCst) - before,
            stats.target_calls
        );
    }
}

#[tokio::test]
#[ignore = "needs a real vLLM: deploy/test-all.sh runs it with --ignored"]
async fn vllm_scores_a_window_with_its_own_greedy_tokens() {
    let c = vllm();
    let prompt = common::chat_prompt("Write a Python function that squares a number.");
    let greedy = c
        .continue_tokens(&common::req(prompt.clone(), 9))
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .tokens;
    // Its own continuation: every position agrees, and the token after the window is the next one.
    let window = greedy[..8].to_vec();
    let score = c
        .score_window(&WindowRequest {
            prefix: prompt.clone(),
            window: window.clone(),
            model: None,
            sampling: None,
            top_logprobs: 0,
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|| panic!("vLLM returned no prompt log-probabilities"));
    assert_eq!(score.top[..8], window[..]);
    assert_eq!(score.top[8], greedy[8]);
    assert!(
        score.margins.iter().all(|m| *m == Some(0.0)),
        "{:?}",
        score.margins
    );
    // A wrong token in the window: the target says what it would have written instead.
    let mut wrong = window.clone();
    wrong[3] = if wrong[3] == 11 { 12 } else { 11 };
    let score = c
        .score_window(&WindowRequest {
            prefix: prompt.clone(),
            window: wrong,
            model: None,
            sampling: None,
            top_logprobs: 0,
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|| panic!("no scores"));
    assert_eq!(score.top[..4], greedy[..4]);
    assert!(
        score.margins[3].is_some_and(|m| m > 0.0),
        "{:?}",
        score.margins
    );
    // Sampled decoding: the distribution at every position (its top 20 and the window token),
    // for speculative sampling's acceptance rule.
    let score = c
        .score_window(&WindowRequest {
            prefix: prompt,
            window: window.clone(),
            model: None,
            sampling: Some(approxy_verifier::sampling::SamplingParams {
                temperature: 0.8,
                top_p: 0.95,
                seed: Some(3),
            }),
            top_logprobs: 0,
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|| panic!("no scores"));
    assert_eq!(score.logprobs.len(), window.len());
    for (i, entries) in score.logprobs.iter().enumerate() {
        assert!(
            entries.len() >= 20,
            "position {i}: {} entries",
            entries.len()
        );
        assert!(
            entries.iter().any(|e| e.0 == window[i]),
            "position {i}: no window token"
        );
        let best = entries
            .iter()
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .map(|e| e.0);
        assert_eq!(best, Some(score.top[i]), "position {i}");
        let mass: f32 = entries.iter().map(|e| e.1.exp()).sum();
        assert!(mass <= 1.001, "position {i}: probabilities sum to {mass}");
    }
    assert_eq!(score.top.len(), window.len() + 1);
    // Greedy under a relaxed rule: the same top entries at every position, and the greedy
    // tokens as before.
    let relaxed = c
        .score_window(&WindowRequest {
            prefix: common::chat_prompt("Write a Python function that squares a number."),
            window: window.clone(),
            model: None,
            sampling: None,
            top_logprobs: 20,
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|| panic!("no scores"));
    assert_eq!(relaxed.top[..8], window[..]);
    assert_eq!(relaxed.top[8], greedy[8]);
    assert_eq!(relaxed.logprobs.len(), window.len());
    for (i, entries) in relaxed.logprobs.iter().enumerate() {
        assert!(
            entries.len() >= 20,
            "position {i}: {} entries",
            entries.len()
        );
        let best = entries
            .iter()
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .map(|e| e.0);
        assert_eq!(best, Some(window[i]), "position {i}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real vLLM: deploy/test-all.sh runs it with --ignored"]
async fn exact_mode_equals_vllm_greedy_on_five_prompts() {
    let pool = DraftPool::start(&common::draft_config(1)).unwrap_or_else(|e| panic!("{e}"));
    let target = Arc::new(vllm());
    let engine = common::engine_with(target.clone());
    let eos = common::eos(engine.tokenizer());
    let prompts = [
        "Write a Python function that reverses a string.",
        "What is the capital of France? Answer in one sentence.",
        "Write a Rust function that returns the larger of two i32 values.",
        "List three primary colors.",
        "Explain in two sentences what a hash map is.",
    ];
    let (mut tokens, mut calls, mut windows, mut proposed) = (0u64, 0u64, 0u64, 0u64);
    let mut guesses_used = 0u64;
    for p in prompts {
        let prompt = common::chat_prompt(p);
        let mut expected = target
            .continue_tokens(&common::req(prompt.clone(), 32))
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .tokens;
        expected.retain(|t| !eos.contains(t));
        // With and without drafting while the target scores a window: the same answer.
        for overlap in [false, true] {
            let mut req = common::greedy(prompt.clone(), 32, 0.7);
            req.settings_mut().verification = Verification::Exact;
            req.settings_mut().overlap = overlap;
            let (ids, _, stats) = common::run(&engine, &pool, req)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            eprintln!(
                "{p:?} (overlap {overlap}, guesses {} used {}): {} tokens, {} target calls, {} windows (mean {:.1} tokens, {:.0} % accepted), near ties {:?}",
                stats.completion_tokens,
                stats.target_calls,
                stats.windows,
                stats.window_tokens as f64 / f64::from(stats.windows.max(1)),
                100.0 * stats.window_accepted as f64 / stats.window_tokens.max(1) as f64,
                stats.overlap_guesses,
                stats.overlap_guesses_used,
                stats.near_ties
            );
            if ids != expected {
                // The one allowed difference: a position where the target's choice was a numerical
                // tie (batch shapes differ between the window call and a plain continuation).
                let at = ids
                    .iter()
                    .zip(&expected)
                    .take_while(|(a, b)| a == b)
                    .count() as u32;
                assert!(
                    stats.near_ties.iter().any(|(pos, _)| *pos == at),
                    "prompt {p:?}: differs at {at} without a near tie: {ids:?} vs {expected:?}"
                );
            }
            if overlap {
                guesses_used += stats.overlap_guesses_used;
                continue;
            }
            tokens += u64::from(stats.completion_tokens);
            calls += u64::from(stats.target_calls);
            windows += u64::from(stats.windows);
            proposed += stats.window_tokens;
        }
    }
    assert!(
        guesses_used > 0,
        "no guess drafted during a window call was ever used"
    );
    eprintln!(
        "exact mode over five prompts: {tokens} tokens, {calls} target calls ({:.1} per 100 tokens), mean window {:.1}",
        100.0 * calls as f64 / tokens as f64,
        proposed as f64 / windows.max(1) as f64
    );
}
