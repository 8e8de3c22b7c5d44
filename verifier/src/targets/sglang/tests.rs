//! The `sglang` client against an in-process stub of SGLang's native API. The stub follows the
//! wire format of SGLang's source (`python/sglang/srt/`, 0.5.x):
//! - `POST /generate` (`entrypoints/http_server.py`) takes `GenerateReqInput`
//!   (`managers/io_struct.py`): `input_ids`, `sampling_params`, `stream`, `return_logprob`,
//!   `logprob_start_len`, `top_logprobs_num`;
//! - it answers `{"text", "output_ids", "meta_info"}` with `meta_info.prompt_tokens`,
//!   `completion_tokens`, `cached_tokens`, `finish_reason` (`{"type": "stop", "matched": id}`
//!   or `{"type": "length", "length": n}`) and `e2e_latency` at the end
//!   (`managers/tokenizer_manager.py`, `managers/schedule_batch.py`);
//! - streamed, `data: <answer>` per output and `data: [DONE]`; `output_ids` all so far, or only
//!   the new ones under `--incremental-streaming-output`;
//! - prompt log-probabilities from `logprob_start_len` on, as `[logprob, token_id, text]`
//!   triples, the first position's `null` (`[None] + ...` in the scheduler's
//!   `_process_input_token_logprobs`); the radix cache is read up to `logprob_start_len` and
//!   never the whole input (`_compute_max_prefix_len`);
//! - `GET /health`, `GET /v1/models` (`max_model_len`), `POST /tokenize` (`{"tokens": [...]}`).
//!
//! The stub's model writes a fixed answer after a fixed prompt length: the top token at
//! position `p` is `answer[p - PROMPT.len()]`, with log-probability [`TOP_LP`], the runner-up
//! (`top + 1000`) [`RUNNER_UP_LP`], anything else [`OTHER_LP`].

#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures::StreamExt;
use serde_json::{Value, json};

use super::*;
use crate::targets::serve_stub;

const PROMPT: [u32; 4] = [1, 2, 3, 4];
const EOS: u32 = 151_645;
const TOP_LP: f64 = -0.25;
const RUNNER_UP_LP: f64 = -2.0;
const OTHER_LP: f64 = -4.0;

struct Stub {
    answer: Vec<u32>,
    /// `--incremental-streaming-output`: each event's `output_ids` are only its new ones.
    incremental: bool,
    /// Serves `/tokenize` (SGLang 0.5 does; older servers do not).
    tokenize: bool,
    /// Every `/generate` body, in order.
    calls: Mutex<Vec<Value>>,
    /// The previous call's input: what the radix cache holds.
    cache: Mutex<Vec<u32>>,
}

type Shared = Arc<Stub>;

impl Stub {
    fn top_at(&self, position: usize) -> u32 {
        position
            .checked_sub(PROMPT.len())
            .and_then(|k| self.answer.get(k).copied())
            .unwrap_or(0)
    }

    /// The log-probability of `token` at `position`.
    fn logprob_at(&self, position: usize, token: u32) -> f64 {
        let top = self.top_at(position);
        match token {
            t if t == top => TOP_LP,
            t if t == top + 1000 => RUNNER_UP_LP,
            _ => OTHER_LP,
        }
    }

    /// The `n` top entries at `position`, most likely first.
    fn tops_at(&self, position: usize, n: usize) -> Value {
        let top = self.top_at(position);
        let all = [
            json!([TOP_LP, top, null]),
            json!([RUNNER_UP_LP, top + 1000, null]),
        ];
        json!(all[..n.min(2)])
    }

    /// Prompt tokens the radix cache serves: the common prefix with the previous input, at most
    /// `limit`; the input is cached after.
    fn cached(&self, input: &[u32], limit: usize) -> usize {
        let mut cache = self.cache.lock().unwrap();
        let common = cache.iter().zip(input).take_while(|(a, b)| a == b).count();
        *cache = input.to_vec();
        common.min(limit)
    }

    /// The generated tokens after `input`: up to `max`, ending at the end of sequence.
    fn generate(&self, input: &[u32], max: usize) -> (Vec<u32>, Value) {
        let from = input.len() - PROMPT.len();
        let mut out = Vec::new();
        for &t in self.answer[from..].iter().take(max) {
            out.push(t);
            if t == EOS {
                return (out, json!({"type": "stop", "matched": EOS}));
            }
        }
        let n = out.len();
        (out, json!({"type": "length", "length": n}))
    }
}

fn meta(input_len: usize, generated: usize, cached: usize, finish: Value) -> Value {
    let mut m = json!({"id": "r1", "finish_reason": finish, "prompt_tokens": input_len,
        "completion_tokens": generated, "cached_tokens": cached, "weight_version": "default"});
    if !m["finish_reason"].is_null() {
        m["e2e_latency"] = json!(0.01);
    }
    m
}

async fn generate(State(stub): State<Shared>, axum::Json(body): axum::Json<Value>) -> Response {
    stub.calls.lock().unwrap().push(body.clone());
    let input = token_ids(&body["input_ids"]).unwrap();
    let max = body["sampling_params"]["max_new_tokens"].as_u64().unwrap() as usize;
    if body["return_logprob"] == json!(true) {
        return axum::Json(window_answer(&stub, &body, &input)).into_response();
    }
    let cached = stub.cached(&input, input.len() - 1);
    let (out, finish) = stub.generate(&input, max);
    if body["stream"] == json!(true) {
        let sse = stream_answer(&stub, &out, input.len(), cached, finish);
        return ([("content-type", "text/event-stream")], sse).into_response();
    }
    let m = meta(input.len(), out.len(), cached, finish);
    axum::Json(json!({"text": "…", "output_ids": out, "meta_info": m})).into_response()
}

/// Events of two tokens each (`stream_interval = 2`), then `[DONE]`.
fn stream_answer(
    stub: &Stub,
    out: &[u32],
    input_len: usize,
    cached: usize,
    finish: Value,
) -> String {
    let mut sse = String::new();
    let mut sent = 0;
    while sent < out.len() {
        let end = (sent + 2).min(out.len());
        let ids = if stub.incremental {
            &out[sent..end]
        } else {
            &out[..end]
        };
        let last = end == out.len();
        let finish = if last { finish.clone() } else { Value::Null };
        let event = json!({"text": null, "output_ids": ids,
            "meta_info": meta(input_len, end, cached, finish)});
        sse += &format!("data: {event}\n\n");
        sent = end;
    }
    sse + "data: [DONE]\n\n"
}

/// A scoring call: prompt log-probabilities from `logprob_start_len`, one token generated.
fn window_answer(stub: &Stub, body: &Value, input: &[u32]) -> Value {
    let start = body["logprob_start_len"].as_u64().unwrap() as usize;
    let n = body["top_logprobs_num"].as_u64().unwrap() as usize;
    let cached = stub.cached(input, start.min(input.len() - 1));
    let mut tokens = vec![json!([null, input[start], null])];
    let mut tops = vec![Value::Null];
    for (p, &t) in input.iter().enumerate().skip(start + 1) {
        tokens.push(json!([stub.logprob_at(p, t), t, null]));
        tops.push(stub.tops_at(p, n));
    }
    let next = stub.top_at(input.len());
    let mut m = meta(
        input.len(),
        1,
        cached,
        json!({"type": "length", "length": 1}),
    );
    m["input_token_logprobs"] = json!(tokens);
    m["input_top_logprobs"] = json!(tops);
    m["output_token_logprobs"] = json!([[TOP_LP, next, null]]);
    m["output_top_logprobs"] = json!([stub.tops_at(input.len(), n)]);
    json!({"text": "x", "output_ids": [next], "meta_info": m})
}

async fn tokenize(State(stub): State<Shared>, axum::Json(body): axum::Json<Value>) -> Response {
    if !stub.tokenize {
        return axum::http::StatusCode::NOT_FOUND.into_response();
    }
    let ids: Vec<u32> = body["prompt"]
        .as_str()
        .unwrap()
        .bytes()
        .map(u32::from)
        .collect();
    axum::Json(json!({"tokens": ids, "count": ids.len(), "max_model_len": 4096})).into_response()
}

async fn models() -> axum::Json<Value> {
    axum::Json(
        json!({"object": "list", "data": [{"id": "Qwen/Qwen2.5-0.5B-Instruct",
        "object": "model", "created": 0, "owned_by": "sglang", "root": "Qwen/Qwen2.5-0.5B-Instruct",
        "max_model_len": 4096}]}),
    )
}

/// A stub answering `answer` after [`PROMPT`], and a client for it.
async fn serve(answer: &[u32], incremental: bool, tokenize_route: bool) -> (Shared, SglangTarget) {
    let stub = Arc::new(Stub {
        answer: answer.to_vec(),
        incremental,
        tokenize: tokenize_route,
        calls: Mutex::default(),
        cache: Mutex::default(),
    });
    let app = axum::Router::new()
        .route("/generate", post(generate))
        .route("/tokenize", post(tokenize))
        .route("/health", get(|| async { "" }))
        .route("/v1/models", get(models))
        .with_state(stub.clone());
    let cfg = serve_stub(app).await;
    (stub, SglangTarget::new(cfg).unwrap())
}

fn request(answer_so_far: &[u32], max_tokens: u32) -> ContinuationRequest {
    ContinuationRequest::greedy([&PROMPT[..], answer_so_far].concat(), max_tokens)
}

fn last_call(stub: &Stub) -> Value {
    stub.calls.lock().unwrap().last().cloned().unwrap()
}

const ANSWER: [u32; 6] = [10, 11, 12, 13, 14, EOS];

#[tokio::test]
async fn generation_returns_the_output_ids_the_cached_prompt_and_the_eos_stop() {
    let (stub, c) = serve(&ANSWER, false, true).await;
    let first = c.continue_tokens(&request(&[], 16)).await.unwrap();
    assert_eq!(first.tokens, ANSWER);
    assert!(first.stopped_on_eos);
    assert_eq!(first.cached_prompt_tokens, Some(0));
    assert_eq!(first.timings, None);
    let body = last_call(&stub);
    assert_eq!(body["input_ids"], json!(PROMPT));
    assert_eq!(
        body["sampling_params"],
        json!({"max_new_tokens": 16, "temperature": 0.0, "top_p": 1.0})
    );
    assert_eq!(body["stream"], json!(false));
    // The next call re-sends the prefix: the radix cache serves it.
    let mut req = request(&ANSWER[..2], 2);
    req.sampling.seed = Some(7);
    let next = c.continue_tokens(&req).await.unwrap();
    assert_eq!(next.tokens, [12, 13]);
    assert!(!next.stopped_on_eos, "stopped at the limit");
    assert_eq!(next.cached_prompt_tokens, Some(PROMPT.len() as u32));
    assert_eq!(last_call(&stub)["sampling_params"]["sampling_seed"], 7);
}

async fn streamed(incremental: bool, answer: &[u32]) -> (Vec<u32>, Vec<StreamChunk>) {
    let (_, c) = serve(answer, incremental, true).await;
    let chunks: Vec<StreamChunk> = c
        .stream_tokens(&request(&[], 16))
        .await
        .unwrap()
        .map(|c| c.unwrap())
        .collect()
        .await;
    (
        chunks.iter().flat_map(|c| c.tokens.clone()).collect(),
        chunks,
    )
}

#[tokio::test]
async fn a_stream_reads_the_same_whether_the_server_sends_all_ids_or_only_new_ones() {
    // Repeats make the two readings differ: new ids [7, 7] after [7, 7] read as all so far
    // would be no new token at all; `completion_tokens` says which they are.
    let answer = [7, 7, 7, 7, 9, EOS];
    for incremental in [false, true] {
        let (tokens, chunks) = streamed(incremental, &answer).await;
        assert_eq!(tokens, answer, "incremental: {incremental}");
        let last = chunks.last().unwrap();
        assert!(last.stopped_on_eos);
        assert!(chunks[..chunks.len() - 1].iter().all(|c| !c.stopped_on_eos));
        assert!(chunks.iter().all(|c| c.cached_prompt_tokens == Some(0)));
    }
    let (tokens, chunks) = streamed(false, &[5, 6, 7]).await;
    assert_eq!(tokens, [5, 6, 7]);
    assert!(!chunks.last().unwrap().stopped_on_eos, "ended at the limit");
}

fn window_request(prefix: &[u32], window: &[u32]) -> WindowRequest {
    WindowRequest {
        prefix: prefix.to_vec(),
        window: window.to_vec(),
        model: None,
        sampling: None,
        top_logprobs: 0,
    }
}

#[tokio::test]
async fn a_window_is_scored_in_one_call_that_starts_at_the_last_prefix_token() {
    let (stub, c) = serve(&ANSWER, false, true).await;
    assert!(c.windows_read_cache());
    let prefix = [&PROMPT[..], &ANSWER[..1]].concat();
    let window = ANSWER[1..4].to_vec();
    let score = c
        .score_window(&window_request(&prefix, &window))
        .await
        .unwrap()
        .unwrap();
    // The target's own tokens: it agrees everywhere, and its next one follows.
    assert_eq!(score.top, ANSWER[1..5]);
    assert_eq!(score.margins, vec![Some(0.0); 3]);
    assert!(score.logprobs.is_empty());
    let body = last_call(&stub);
    assert_eq!(
        body["input_ids"],
        json!([&prefix[..], &window[..]].concat())
    );
    assert_eq!(body["logprob_start_len"], json!(prefix.len() - 1));
    assert_eq!(body["return_logprob"], json!(true));
    assert_eq!(body["top_logprobs_num"], json!(1));
    assert_eq!(
        body["sampling_params"],
        json!({"max_new_tokens": 1, "temperature": 0.0, "top_p": 1.0})
    );
}

#[tokio::test]
async fn a_disagreement_names_the_targets_token_and_its_margin() {
    let (_, c) = serve(&ANSWER, false, true).await;
    let prefix = PROMPT.to_vec();
    let mut window = ANSWER[..4].to_vec();
    window[2] = 99;
    let score = c
        .score_window(&window_request(&prefix, &window))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(score.top[..3], ANSWER[..3]);
    assert_eq!(score.top.len(), window.len() + 1);
    let margins: Vec<f32> = score.margins.iter().map(|m| m.unwrap()).collect();
    assert_eq!(margins[..2], [0.0, 0.0]);
    assert!(
        (margins[2] - (TOP_LP - OTHER_LP) as f32).abs() < 1e-6,
        "{margins:?}"
    );
    // A runner-up draft token: the margin is the gap to it.
    window[2] = ANSWER[2] + 1000;
    let score = c
        .score_window(&window_request(&prefix, &window))
        .await
        .unwrap()
        .unwrap();
    let m = score.margins[2].unwrap();
    assert!((m - (TOP_LP - RUNNER_UP_LP) as f32).abs() < 1e-6, "{m}");
}

#[tokio::test]
async fn a_sampled_window_reports_the_distribution_and_the_targets_own_sample() {
    let (stub, c) = serve(&ANSWER, false, true).await;
    let mut req = window_request(&PROMPT, &[10, 99]);
    req.sampling = Some(SamplingParams {
        temperature: 0.8,
        top_p: 0.95,
        seed: Some(3),
    });
    let score = c.score_window(&req).await.unwrap().unwrap();
    let lp = |x: f64| x as f32;
    assert_eq!(
        score.logprobs,
        vec![
            vec![(10, lp(TOP_LP)), (1010, lp(RUNNER_UP_LP))],
            vec![
                (11, lp(TOP_LP)),
                (1011, lp(RUNNER_UP_LP)),
                (99, lp(OTHER_LP))
            ],
        ]
    );
    assert_eq!(score.top, [10, 11, 12]);
    let body = last_call(&stub);
    assert_eq!(body["top_logprobs_num"], json!(SAMPLED_TOP_LOGPROBS));
    assert_eq!(
        body["sampling_params"],
        json!({"max_new_tokens": 1, "temperature": 0.8f32, "top_p": 0.95f32, "sampling_seed": 3})
    );
    // Greedy under a relaxed rule: the asked-for count, at least one.
    let mut relaxed = window_request(&PROMPT, &[10]);
    relaxed.top_logprobs = 5;
    let score = c.score_window(&relaxed).await.unwrap().unwrap();
    assert_eq!(
        score.logprobs,
        vec![vec![(10, lp(TOP_LP)), (1010, lp(RUNNER_UP_LP))]]
    );
    assert_eq!(last_call(&stub)["top_logprobs_num"], json!(5));
    // Nothing before the window: nothing to start from.
    assert_eq!(
        c.score_window(&window_request(&[], &[10])).await.unwrap(),
        None
    );
}

#[tokio::test]
async fn facts_health_and_tokenize_from_the_servers_own_endpoints() {
    let (_, c) = serve(&ANSWER, false, true).await;
    c.health().await.unwrap();
    assert_eq!(c.facts().await.unwrap().context_length, Some(4096));
    assert_eq!(c.tokenize("hi").await.unwrap(), Some(vec![104, 105]));
    let (_, old) = serve(&ANSWER, false, false).await;
    assert_eq!(old.tokenize("hi").await.unwrap(), None);
}

#[test]
fn ends_errors_and_streamed_ids_are_read_as_sglang_writes_them() {
    let m = |f: Value| json!({"finish_reason": f});
    assert_eq!(finish_of(&m(Value::Null)).unwrap(), Finish::Running);
    assert_eq!(
        finish_of(&m(json!({"type": "stop", "matched": 2}))).unwrap(),
        Finish::Eos
    );
    assert_eq!(
        finish_of(&m(json!({"type": "stop", "matched": "\n\n"}))).unwrap(),
        Finish::Other
    );
    assert_eq!(
        finish_of(&m(json!({"type": "length", "length": 4}))).unwrap(),
        Finish::Other
    );
    let abort = json!({"type": "abort", "message": "too long", "status_code": 400, "err_type": "BadRequest"});
    assert!(matches!(
        finish_of(&m(abort)),
        Err(TargetError::Status { status: 400, .. })
    ));
    let abort = json!({"type": "abort", "message": "gone"});
    assert!(matches!(
        finish_of(&m(abort)),
        Err(TargetError::Protocol(_))
    ));
    let event =
        json!({"error": {"message": "bad input", "type": "invalid_request_error", "code": 400}});
    assert!(matches!(
        chunk_of(&event, &mut Delivered::default()),
        Err(TargetError::Status { status: 400, .. })
    ));
    let text_only = json!({"text": "hi", "meta_info": {"finish_reason": null}});
    assert!(matches!(
        chunk_of(&text_only, &mut Delivered::default()),
        Err(TargetError::Protocol(_))
    ));
    // Without `completion_tokens` ids that repeat all delivered ones are all so far; with a
    // count that fits neither reading, the event is refused.
    let mut d = Delivered::default();
    assert_eq!(d.fresh(vec![1, 2], None).unwrap(), [1, 2]);
    assert_eq!(d.fresh(vec![1, 2, 3], None).unwrap(), [3]);
    assert_eq!(d.fresh(vec![4], None).unwrap(), [4]);
    assert!(d.fresh(vec![5], Some(9)).is_err());
}
