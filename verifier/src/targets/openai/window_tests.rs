//! Windows through the `vllm` kind against a stub that follows vLLM 0.32's wire format
//! (`/inference/v1/generate` as vllm/entrypoints/scale_out/token_in_token_out/protocol.py
//! defines it, `/v1/completions` with `prompt_logprobs`), with a prefix cache of whole
//! 16-token blocks whose rows at cached positions are stale, as vLLM's are (issue #42019).
//! The real server is held to the same in `verifier/tests/target_vllm.rs`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{Value, json};

use super::*;
use crate::targets::serve_stub;

/// vLLM's block size: the cache serves whole blocks.
const BLOCK: usize = 16;

#[derive(Default)]
struct Stub {
    /// Answers the token-in endpoint as a server without `--enable-scale-out` does.
    refuse: bool,
    /// A token whose presence makes the token-in endpoint answer 400.
    bad_request_on: Option<u32>,
    /// Every prompt it computed, whose full blocks its cache holds.
    computed: Mutex<Vec<Vec<u32>>>,
    /// (path, skip_reading_prefix_cache) of every call, in order.
    calls: Mutex<Vec<(&'static str, bool)>>,
}

/// The stub model: after any token `t` it is sure of `t + 1`.
fn next(t: u32) -> u32 {
    t + 1
}

/// Row `i` of `prompt`: the rank-1 token after `prompt[i - 1]` and `prompt[i]`'s own entry.
fn row(prompt: &[u32], i: usize) -> Value {
    let top = next(prompt[i - 1]);
    let own = if prompt[i] == top { -0.1 } else { -3.0 };
    json!({
        top.to_string(): {"logprob": -0.1, "rank": 1},
        prompt[i].to_string(): {"logprob": own, "rank": if prompt[i] == top { 1 } else { 7 }},
    })
}

impl Stub {
    /// Computes `prompt`, reading the cache unless `skip`: the rows (stale at cached
    /// positions) and the cached count.
    fn compute(&self, prompt: &[u32], skip: bool) -> (Vec<Value>, usize) {
        let mut computed = self.computed.lock().unwrap();
        let cached = if skip {
            0
        } else {
            let common = computed
                .iter()
                .map(|p| p.iter().zip(prompt).take_while(|(a, b)| a == b).count())
                .max()
                .unwrap_or(0);
            // Whole blocks, and never the last token (its logits are the answer).
            (common.min(prompt.len() - 1) / BLOCK) * BLOCK
        };
        computed.push(prompt.to_vec());
        let rows = (0..prompt.len())
            .map(|i| match i {
                0 => Value::Null,
                // What vLLM returns there: whatever the buffer held.
                i if i <= cached => json!({"0": {"logprob": 5.0, "rank": 1}}),
                i => row(prompt, i),
            })
            .collect();
        (rows, cached)
    }
}

async fn generate(State(stub): State<Arc<Stub>>, Json(body): Json<Value>) -> Response {
    if stub.refuse {
        let error = json!({"error": {"message": "Scale-out endpoints are disabled.", "type": "PermissionDeniedError", "code": 403}});
        return (StatusCode::FORBIDDEN, Json(error)).into_response();
    }
    let prompt: Vec<u32> = serde_json::from_value(body["token_ids"].clone()).unwrap();
    if stub.bad_request_on.is_some_and(|t| prompt.contains(&t)) {
        let error =
            json!({"error": {"message": "bad request", "type": "BadRequestError", "code": 400}});
        return (StatusCode::BAD_REQUEST, Json(error)).into_response();
    }
    let p = &body["sampling_params"];
    let skip = p["skip_reading_prefix_cache"].as_bool().unwrap_or(true);
    assert_eq!(
        p["detokenize"],
        json!(false),
        "stale rows crash vLLM's detokenizer"
    );
    stub.calls.lock().unwrap().push(("generate", skip));
    let (rows, cached) = stub.compute(&prompt, skip);
    let mut answer = json!({
        "choices": [{"index": 0, "token_ids": [next(prompt[prompt.len() - 1])], "finish_reason": "length"}],
        "usage": {"prompt_tokens": prompt.len(), "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": cached}},
    });
    if p["prompt_logprobs"].is_u64() {
        answer["prompt_logprobs"] = Value::Array(rows);
    }
    Json(answer).into_response()
}

async fn completions(State(stub): State<Arc<Stub>>, Json(body): Json<Value>) -> Response {
    let prompt: Vec<u32> = serde_json::from_value(body["prompt"].clone()).unwrap();
    stub.calls.lock().unwrap().push(("completions", true));
    // `/v1/completions` with prompt log-probabilities never reads the cache.
    let (rows, _) = stub.compute(&prompt, true);
    Json(json!({
        "choices": [{"index": 0, "token_ids": [next(prompt[prompt.len() - 1])], "prompt_logprobs": rows, "finish_reason": "length"}],
        "usage": {"prompt_tokens": prompt.len(), "completion_tokens": 1, "prompt_tokens_details": null},
    }))
    .into_response()
}

async fn serve(refuse: bool) -> (Arc<Stub>, OpenAiCompletionsTarget) {
    serve_stub_of(Stub {
        refuse,
        ..Stub::default()
    })
    .await
}

async fn serve_stub_of(stub: Stub) -> (Arc<Stub>, OpenAiCompletionsTarget) {
    let stub = Arc::new(stub);
    let app = Router::new()
        .route("/inference/v1/generate", post(generate))
        .route("/v1/completions", post(completions))
        .with_state(stub.clone());
    let mut cfg = serve_stub(app).await;
    cfg.base_url.push_str("/v1");
    (stub, OpenAiCompletionsTarget::new(cfg).unwrap())
}

fn window(prefix: std::ops::Range<u32>, window: &[u32]) -> WindowRequest {
    WindowRequest {
        prefix: prefix.collect(),
        window: window.to_vec(),
        model: None,
        sampling: None,
        top_logprobs: 0,
    }
}

#[tokio::test]
async fn windows_read_the_cache_and_rows_at_cached_positions_are_scored_again() {
    let (stub, c) = serve(false).await;
    assert!(
        !c.windows_read_cache(),
        "the costlier case until the server has said"
    );
    assert_eq!(c.window_route().await.unwrap(), Some(token_in::FROM_CACHE));
    assert!(c.windows_read_cache());
    // 16 prompt tokens (one block) and a window of 16 that agrees up to its last token.
    let mut w: Vec<u32> = (16..31).collect();
    w.push(99);
    let first = c.score_window(&window(0..16, &w)).await.unwrap().unwrap();
    let mut want: Vec<u32> = (16..32).collect();
    want.push(100);
    assert_eq!(first.top, want);
    assert_eq!(first.margins[14], Some(0.0));
    assert!(first.margins[15].is_some_and(|m| (m - 2.9).abs() < 1e-5));
    assert_eq!(first.cached_prompt_tokens, Some(0));
    assert_eq!(first.stale_cached, None);
    // The same window again: the cache now holds both blocks of the prefix and the window, so
    // the window's first row sits at a cached position. It is scored again without the cache,
    // and the answer is the same.
    let again = c.score_window(&window(0..16, &w)).await.unwrap().unwrap();
    assert_eq!(again.stale_cached, Some(16));
    assert_eq!(
        (again.top.clone(), again.margins.clone()),
        (first.top.clone(), first.margins.clone())
    );
    assert_eq!(again.cached_prompt_tokens, Some(0));
    // A window after a token new to the server: the cache serves the prefix's whole blocks,
    // and every window row is past them.
    let w2 = [18, 19, 20];
    let later = c.score_window(&window(0..18, &w2)).await.unwrap().unwrap();
    assert_eq!(later.top, vec![18, 19, 20, 21]);
    assert_eq!(
        (later.cached_prompt_tokens, later.stale_cached),
        (Some(16), None)
    );
    assert_eq!(
        *stub.calls.lock().unwrap(),
        [
            ("generate", true),
            ("generate", false),
            ("generate", false),
            ("generate", true),
            ("generate", false)
        ],
        "the probe, the first window, the second read from the cache and again without it, the third"
    );
}

#[tokio::test]
async fn a_server_without_the_endpoint_scores_windows_through_completions() {
    let (stub, c) = serve(true).await;
    assert_eq!(c.window_route().await.unwrap(), Some(token_in::RECOMPUTED));
    assert!(!c.windows_read_cache());
    let s = c
        .score_window(&window(0..16, &[16, 17, 5]))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(s.top, vec![16, 17, 18, 6]);
    assert_eq!((s.cached_prompt_tokens, s.stale_cached), (None, None));
    // The route is asked once.
    c.score_window(&window(0..16, &[16])).await.unwrap();
    let calls = stub.calls.lock().unwrap();
    assert_eq!(*calls, [("completions", true), ("completions", true)]);
}

#[tokio::test]
async fn a_window_the_token_in_endpoint_refuses_is_scored_through_completions() {
    let (stub, c) = serve_stub_of(Stub {
        bad_request_on: Some(77),
        ..Stub::default()
    })
    .await;
    let s = c
        .score_window(&window(0..16, &[16, 77]))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(s.top, vec![16, 17, 78]);
    assert!(s.refused && s.stale_cached.is_none());
    assert!(
        c.windows_read_cache(),
        "one refusal does not change the route"
    );
    assert_eq!(
        *stub.calls.lock().unwrap(),
        [("generate", true), ("completions", true)],
        "the probe, then the refused window through /v1/completions"
    );
}

#[tokio::test]
async fn windows_refused_three_times_in_a_row_move_the_client_to_the_fallback() {
    let (stub, c) = serve_stub_of(Stub {
        bad_request_on: Some(77),
        ..Stub::default()
    })
    .await;
    assert_eq!(c.window_route().await.unwrap(), Some(token_in::FROM_CACHE));
    for _ in 0..token_in::REFUSALS_TO_GIVE_UP {
        assert!(c.windows_read_cache());
        let s = c
            .score_window(&window(0..16, &[77]))
            .await
            .unwrap()
            .unwrap();
        assert!(s.refused);
    }
    assert!(!c.windows_read_cache());
    assert_eq!(c.window_route().await.unwrap(), Some(token_in::RECOMPUTED));
    // A window the endpoint would have scored goes to /v1/completions now.
    let s = c
        .score_window(&window(0..16, &[16]))
        .await
        .unwrap()
        .unwrap();
    assert!(!s.refused);
    let calls = stub.calls.lock().unwrap();
    assert_eq!(calls.last(), Some(&("completions", true)));
    assert_eq!(calls.iter().filter(|c| c.0 == "completions").count(), 4);
}
