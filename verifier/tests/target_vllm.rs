//! The `vllm` target kind against a real vLLM (CPU build) serving the draft model dequantised
//! to float32: the shared target-client suite, windows scored from vLLM's prefix cache through
//! its token-in endpoint (and through `/v1/completions` where the endpoint is off), and the
//! decode loop with every token taken from vLLM. `deploy/test-all.sh` starts vLLM with the
//! flags the token-in endpoint needs and runs these with `--ignored` once the llama-server
//! tests are done (both servers on two cores at once would starve each other).

#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use approxy_verifier::Verification;
use approxy_verifier::draft::pool::DraftPool;
use approxy_verifier::targets::{
    ChatPrefixTarget, OpenAiCompletionsTarget, OpenAiTextTarget, PrefixStyle, TargetClient,
    WindowRequest, WindowRoute, WindowScore,
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
                .unwrap_or_else(|e| panic!("{e:?}"));
            eprintln!(
                "{p:?} (overlap {overlap}, guesses {} used {}): {} tokens, {} target calls, {} windows (mean {:.1} tokens, {:.0} % accepted, {} scored again without the cache), near ties {:?}",
                stats.overlap_guesses,
                stats.overlap_guesses_used,
                stats.completion_tokens,
                stats.target_calls,
                stats.windows,
                stats.window_tokens as f64 / f64::from(stats.windows.max(1)),
                100.0 * stats.window_accepted as f64 / stats.window_tokens.max(1) as f64,
                stats.window_rescores,
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

/// The real vLLM behind a proxy that answers its token-in endpoint as vLLM does when it was
/// started without `--enable-scale-out` (403 and its error body) and passes every other call
/// through: fault injection for the fallback, every score still the real server's.
async fn without_token_in() -> OpenAiCompletionsTarget {
    use axum::body::Bytes;
    use axum::http::{Method, StatusCode, Uri};
    use axum::response::IntoResponse;
    let upstream = vllm_url();
    let http = reqwest::Client::new();
    let app = axum::Router::new().fallback(move |method: Method, uri: Uri, body: Bytes| {
        let (upstream, http) = (upstream.clone(), http.clone());
        async move {
            if uri.path().starts_with("/inference/") {
                let error = serde_json::json!({"error": {"message": "Scale-out endpoints are disabled. Restart vllm serve with --enable-scale-out to enable them.", "type": "PermissionDeniedError", "code": 403}});
                return (StatusCode::FORBIDDEN, axum::Json(error)).into_response();
            }
            let r = http
                .request(method, format!("{upstream}{uri}"))
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            let status = StatusCode::from_u16(r.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
            (status, r.bytes().await.unwrap_or_default()).into_response()
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    let mut cfg = vllm_config();
    cfg.base_url = format!("http://{addr}/v1");
    OpenAiCompletionsTarget::new(cfg).unwrap_or_else(|e| panic!("{e}"))
}

/// vLLM's own counters: the sum of a metric's samples (`None` when it has none).
async fn counter(name: &str) -> Option<f64> {
    let text = reqwest::get(format!("{}/metrics", vllm_url()))
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    let values: Vec<f64> = text
        .lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

/// What vLLM counted for the requests it finished: prompt tokens it computed (not served
/// from its prefix cache), requests, prefix-cache queries and hits (tokens).
async fn kv_counts() -> [f64; 4] {
    let mut out = [0.0; 4];
    for (o, name) in out.iter_mut().zip([
        "vllm:request_prefill_kv_computed_tokens_sum",
        "vllm:request_prefill_kv_computed_tokens_count",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
    ]) {
        *o = counter(name)
            .await
            .unwrap_or_else(|| panic!("vLLM's /metrics has no {name}"));
    }
    out
}

/// The counts after one more finished request than `before` (vLLM records a request's when
/// it finishes, a moment after its answer).
async fn kv_counts_after(before: [f64; 4]) -> [f64; 4] {
    for _ in 0..50 {
        let now = kv_counts().await;
        if now[1] > before[1] {
            return now;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!("vLLM did not count the window's request");
}

/// The block vLLM's prefix cache serves prompts in: the test set-up starts it with
/// `--block-size 32`, the smallest its CPU kernels take (its CPU default is 128).
const BLOCK: usize = 32;

/// Every entry of two scores' rows within `tol` of each other (log-probabilities), and the
/// same top tokens.
fn assert_same_rows(cached: &WindowScore, fresh: &WindowScore, tol: f32) {
    assert_eq!(cached.top, fresh.top);
    assert_eq!(cached.logprobs.len(), fresh.logprobs.len());
    for (i, (a, b)) in cached.logprobs.iter().zip(&fresh.logprobs).enumerate() {
        for (t, lp) in b {
            let other = a
                .iter()
                .find(|e| e.0 == *t)
                .unwrap_or_else(|| panic!("row {i}: token {t} missing from the cached scores"));
            assert!(
                (other.1 - lp).abs() <= tol,
                "row {i}, token {t}: {} from the cache against {lp} computed fresh",
                other.1
            );
        }
    }
}

/// A window scored from vLLM's prefix cache has the values a fresh computation of the same
/// positions has; vLLM computes only the window and the part of the prefix past its cached
/// blocks; and a window whose rows sit at cached positions (the same window again) is scored
/// again without the cache, to the same values. Through a server without the endpoint the
/// client falls back to `/v1/completions`, which computes everything afresh.
#[tokio::test]
#[ignore = "needs a real vLLM: deploy/test-all.sh runs it with --ignored"]
async fn windows_from_vllms_prefix_cache_match_a_fresh_computation() {
    let c = vllm();
    assert_eq!(
        c.window_route().await.unwrap_or_else(|e| panic!("{e}")),
        Some(WindowRoute {
            endpoint: "/inference/v1/generate",
            reads_cache: true
        }),
        "vLLM must be started with --enable-scale-out --enable-prompt-tokens-details (deploy/bootstrap.sh, start_vllm)"
    );
    let fresh = without_token_in().await;
    let route = fresh.window_route().await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        route.map(|r| (r.endpoint, r.reads_cache)),
        Some(("/v1/completions", false))
    );
    let tok = common::tokenizer();
    // New to the server each run (its cache outlives the test): only the system prompt's blocks
    // may be cached before the test puts the prompt there.
    let run = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let prompt = common::chat_prompt(&format!(
        "Write a Python function is_prime(n) with a docstring, then explain it in three sentences. (Request {run}.)"
    ));
    let drafted = tok
        .encode(
            "def is_prime(n):\n    \"\"\"Return True if n is prime.\"\"\"\n    if n < 2:\n        return False\n    for d in range(2, int(n ** 0.5) + 1):\n        if n % d == 0:\n            return False\n    return True\n",
        )
        .unwrap_or_else(|e| panic!("{e}"));
    let w = |prefix: Vec<u32>, window: &[u32]| WindowRequest {
        prefix,
        window: window.to_vec(),
        model: None,
        sampling: None,
        top_logprobs: 5,
    };
    // The prompt into the cache, as an answer's first call puts it there.
    c.continue_tokens(&common::req(prompt.clone(), 1))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    // A window after the prompt and a first token new to the server, a block long: once
    // computed, a whole block boundary lies past the prefix, so the same window again has a
    // row at a cached position.
    assert!(drafted.len() > BLOCK, "{} drafted tokens", drafted.len());
    let prefix = [prompt.as_slice(), &drafted[..1]].concat();
    let window = &drafted[1..=BLOCK];
    let before = kv_counts().await;
    let cached = c
        .score_window(&w(prefix.clone(), window))
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|| panic!("no scores"));
    let after = kv_counts_after(before).await;
    let served = cached
        .cached_prompt_tokens
        .unwrap_or_else(|| panic!("no cached count"));
    assert_eq!(cached.stale_cached, None);
    assert!(
        served as usize + BLOCK >= prompt.len(),
        "{served} of the {}-token prompt served from the cache",
        prompt.len()
    );
    let computed = after[0] - before[0];
    let (queried, hit) = (after[2] - before[2], after[3] - before[3]);
    eprintln!(
        "a window of {} on a prefix of {}: vLLM computed {computed} prompt tokens, its cache served {hit} of {queried} queried (cached_tokens {served})",
        window.len(),
        prefix.len()
    );
    assert!(
        computed <= (window.len() + BLOCK) as f64,
        "a window computed {computed} prompt tokens: more than its own {} and one block",
        window.len()
    );
    assert_eq!(
        computed as u64 + u64::from(served),
        (prefix.len() + window.len()) as u64
    );
    assert!(hit > 0.0 && hit <= queried);
    // The same positions from scratch (the fallback route reads no cache).
    let scratch = fresh
        .score_window(&w(prefix.clone(), window))
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|| panic!("no scores"));
    assert_same_rows(&cached, &scratch, 1e-3);
    // The same window again: every row of it is now at a cached position, stale there. The
    // client scores it again without the cache, to the same values.
    let again = c
        .score_window(&w(prefix.clone(), window))
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|| panic!("no scores"));
    let stale = again.stale_cached.unwrap_or_else(|| {
        panic!(
            "the same window again was read from the cache: {:?}",
            again.cached_prompt_tokens
        )
    });
    assert!(stale as usize >= prefix.len());
    assert_same_rows(&again, &scratch, 1e-3);
}
