//! One test suite that every target client passes, run against the real llama-server (native
//! and OpenAI-style endpoints), plus fault injection through a stub server. Which kinds run
//! where is [`contract`]'s, asked for every kind of the table.

// Tests fail by panicking; helpers here are test code too.
#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use approxy_verifier::TargetError;
use approxy_verifier::targets::{
    Continuation, LlamaCppTarget, OpenAiCompletionsTarget, PrefixStyle, TargetClient, TargetConfig,
    TargetKind, TextSettings, build,
};

/// A kind's client in front of a fault stub. Built directly rather than by the table's
/// `build`, which asks for the draft's tokenizer: token-level clients never read it, and the
/// fault tests run without the draft's files.
type FaultClient = fn(TargetConfig) -> Box<dyn TargetClient>;

/// Where the suite holds one kind's client to the contract.
struct Contract {
    /// llama-server speaks the kind's API, under this path of its root: the suite runs the
    /// client the table builds against the real target.
    on_llama_server: Option<&'static str>,
    /// Its client, where the fault stubs below speak its wire format (llama.cpp's
    /// `/completion`, vLLM's `/v1/completions` with token ids).
    on_fault_stubs: Option<FaultClient>,
    /// Where else its client is held to its wire format, for what neither of the above runs:
    /// a file of this crate, and what it runs there.
    elsewhere: Option<(&'static str, &'static str)>,
}

/// Every kind's entry. The match names each kind, so a kind added to the table does not
/// compile here until it is given one.
fn contract(kind: TargetKind) -> Contract {
    match kind {
        TargetKind::LlamaCpp => Contract {
            on_llama_server: Some(""),
            on_fault_stubs: Some(|c| {
                Box::new(LlamaCppTarget::new(c).unwrap_or_else(|e| panic!("{e}")))
            }),
            elsewhere: None,
        },
        TargetKind::Vllm => Contract {
            on_llama_server: Some("/v1"),
            on_fault_stubs: Some(|c| {
                Box::new(OpenAiCompletionsTarget::new(c).unwrap_or_else(|e| panic!("{e}")))
            }),
            elsewhere: Some(("tests/target_vllm.rs", "windows, against a real vLLM")),
        },
        TargetKind::Sglang => Contract {
            on_llama_server: None,
            on_fault_stubs: None,
            elsewhere: Some((
                "src/targets/sglang/tests.rs",
                "a stub of SGLang's /generate",
            )),
        },
        TargetKind::OpenaiText => Contract {
            on_llama_server: Some("/v1"),
            on_fault_stubs: None,
            elsewhere: Some(("tests/target_text_stubs.rs", "hosted text completions")),
        },
        TargetKind::ChatPrefix => Contract {
            on_llama_server: Some("/v1"),
            on_fault_stubs: None,
            elsewhere: Some(("tests/target_text_stubs.rs", "DeepSeek's and vLLM's chat")),
        },
        // Never asked to continue: its requests pass through.
        TargetKind::OpenAiChat => Contract {
            on_llama_server: None,
            on_fault_stubs: None,
            elsewhere: Some((
                "src/targets/kind/abilities_tests.rs",
                "its refusal to continue",
            )),
        },
    }
}

#[test]
fn every_kind_is_held_to_the_contract_somewhere() {
    for &kind in TargetKind::ALL {
        let c = contract(kind);
        assert!(
            c.on_llama_server.is_some() || c.on_fault_stubs.is_some() || c.elsewhere.is_some(),
            "{}",
            kind.policy_name()
        );
        if let Some((file, what)) = c.elsewhere {
            let at = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
            assert!(
                at.is_file(),
                "{}: {what} in {}",
                kind.policy_name(),
                at.display()
            );
        }
    }
}

/// llama-server runs the clients of the kinds whose wire formats it speaks, whichever way a
/// kind's entry is written.
#[test]
fn the_real_target_runs_every_kind_llama_server_speaks() {
    let names: Vec<_> = clients("http://127.0.0.1:9")
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(names, ["llama_cpp", "vllm", "openai_text", "chat_prefix"]);
}

/// Every kind llama-server can stand in for, built by the table: its native API,
/// `/v1/completions` with token ids (the vllm kind's wire format) and with text, and chat
/// completions continuing a final assistant message (its prefill).
fn clients(url: &str) -> Vec<(&'static str, Arc<dyn TargetClient>)> {
    let tok = common::tokenizer();
    let text = TextSettings {
        prefix_style: PrefixStyle::Prefill,
        ..TextSettings::default()
    };
    TargetKind::ALL
        .iter()
        .filter_map(|&kind| {
            let path = contract(kind).on_llama_server?;
            let cfg = common::target_config(&format!("{url}{path}"));
            let client = build(kind, cfg, &tok, &text).unwrap_or_else(|e| panic!("{e}"));
            Some((kind.policy_name(), client))
        })
        .collect()
}

#[tokio::test]
async fn every_client_passes_the_suite_on_the_real_target() {
    let url = common::target_url();
    let mut outputs = Vec::new();
    for (name, c) in clients(&url) {
        outputs.push((name, common::suite(name, c.as_ref()).await));
    }
    for (name, out) in &outputs[1..] {
        assert_eq!(out, &outputs[0].1, "{name} and {} disagree", outputs[0].0);
    }
}

#[tokio::test]
async fn dropping_a_stream_stops_llama_server() {
    let url = common::target_url();
    let http = reqwest::Client::new();
    // llama-server's /slots says which slots are generating.
    let busy = || async {
        let slots: serde_json::Value = http
            .get(format!("{url}/slots"))
            .send()
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .json()
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        slots
            .as_array()
            .is_some_and(|a| a.iter().any(|s| s["is_processing"] == true))
    };
    for (name, c) in clients(&url) {
        eprintln!("{name}");
        common::dropping_a_stream_stops_the_generation(c.as_ref(), busy).await;
    }
}

/// A span's stream is closed while llama-server is still generating, and it notices a token or
/// two later. The answer's next call, sent at once, names the answer's slot: it waits for that
/// slot and finds the whole prefix cached there, instead of taking the other slot and computing
/// the prompt again. Without `answer` (no slot named), on the test target's two slots, the next
/// call found only the other slot's system prompt cached (see tests/README.md, "Slots that
/// keep an answer's cache").
#[tokio::test]
async fn an_answers_next_call_finds_its_prefix_in_the_slot_a_dropped_stream_held() {
    use futures::StreamExt;
    let mut cfg = common::target_config(&common::target_url());
    cfg.cache_hints.slots = true;
    let target = LlamaCppTarget::new(cfg).unwrap_or_else(|e| panic!("{e}"));
    let answer = approxy_verifier::targets::next_answer();
    let nonce = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let mut first = common::chat_req(
        &format!("Request {nonce}: describe three rivers of Europe at length."),
        &[],
        64,
    );
    first.answer = Some(answer);
    let mut s = target.stream_tokens(&first).await.unwrap();
    let mut got = Vec::new();
    while got.len() < 2 {
        got.extend(s.next().await.unwrap().unwrap().tokens);
    }
    drop(s);
    let mut next = first.clone();
    next.prefix.extend(&got);
    next.max_tokens = 1;
    let c = target.continue_tokens(&next).await.unwrap();
    target.answer_done(answer);
    let (prompt, cached) = (first.prefix.len(), c.cached_prompt_tokens.unwrap_or(0));
    assert!(
        cached as usize >= prompt,
        "{cached} of the prompt's {prompt} tokens were cached"
    );
}

/// A warm computes an answer's prompt on the slot it holds and generates nothing: the answer's
/// first call then finds the whole prompt cached there and computes only what follows.
#[tokio::test]
async fn a_warmed_prompt_is_cached_for_the_answers_first_call() {
    let mut cfg = common::target_config(&common::target_url());
    cfg.cache_hints.slots = true;
    cfg.cache_hints.warm = true;
    let target = LlamaCppTarget::new(cfg).unwrap_or_else(|e| panic!("{e}"));
    let answer = approxy_verifier::targets::next_answer();
    let nonce = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let mut req = common::chat_req(
        &format!("Request {nonce}: name the largest lake of each continent, with its area."),
        &[],
        0,
    );
    req.answer = Some(answer);
    let warmed = target.warm(&req).await.unwrap().expect("a slot was free");
    let t = warmed.timings.expect("llama-server reports its timings");
    let prompt = req.prefix.len();
    assert!(
        t.prompt_tokens as usize >= prompt / 2 && t.predicted_ms < 1.0,
        "the warm computed the prompt and generated nothing: {t:?}"
    );
    // The answer's first call, after three drafted tokens.
    let mut first = req.clone();
    first.prefix.extend([785, 7772, 374]);
    first.max_tokens = 1;
    let c = target.continue_tokens(&first).await.unwrap();
    target.answer_done(answer);
    let cached = c.cached_prompt_tokens.unwrap_or(0) as usize;
    assert!(
        cached >= prompt,
        "{cached} of the prompt's {prompt} tokens were cached"
    );
}

/// A stub upstream: answers every request with `status` after `delay`, counting calls.
async fn stub(status: u16, delay: Duration) -> (String, Arc<AtomicU32>) {
    let calls = Arc::new(AtomicU32::new(0));
    let c = calls.clone();
    let app = axum::Router::new().fallback(move || {
        let c = c.clone();
        async move {
            c.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(delay).await;
            (
                axum::http::StatusCode::from_u16(status)
                    .unwrap_or(axum::http::StatusCode::IM_A_TEAPOT),
                "{\"error\":\"stub\"}",
            )
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let addr = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}"), calls)
}

fn cfg(url: &str, timeout: Duration, retries: u32) -> TargetConfig {
    TargetConfig {
        base_url: url.into(),
        api_key: Some("k".into()),
        model: "m".into(),
        timeout,
        retries,
        backoff: Duration::from_millis(5),
        ca_file: None,
        cache_hints: Default::default(),
        use_env_proxy: false,
    }
}

/// The kinds the fault stubs speak to, with their clients.
fn fault_kinds() -> Vec<(&'static str, FaultClient)> {
    TargetKind::ALL
        .iter()
        .filter_map(|&kind| Some((kind.policy_name(), contract(kind).on_fault_stubs?)))
        .collect()
}

#[tokio::test]
async fn server_errors_are_retried_then_typed() {
    for (name, client) in fault_kinds() {
        let (url, calls) = stub(503, Duration::ZERO).await;
        let c = client(cfg(&url, Duration::from_secs(5), 2));
        let r = c.continue_tokens(&common::req(vec![1, 2, 3], 1)).await;
        assert!(
            matches!(r, Err(TargetError::Status { status: 503, .. })),
            "{name}: {r:?}"
        );
        assert_eq!(calls.load(Ordering::SeqCst), 3);
    }
}

/// A stub of a rate-limited API: the first `limited` calls get HTTP 429 with `Retry-After:
/// after` (as OpenAI and other hosted APIs send, RFC 9110 10.2.3), later ones 400 (so that the
/// call ends there); returns its URL and its call count.
async fn rate_limited_stub(limited: u32, after: Option<&'static str>) -> (String, Arc<AtomicU32>) {
    let calls = Arc::new(AtomicU32::new(0));
    let c = calls.clone();
    let app = axum::Router::new().fallback(move || {
        let c = c.clone();
        async move {
            let n = c.fetch_add(1, Ordering::SeqCst);
            let mut resp =
                axum::response::Response::new(axum::body::Body::from("{\"error\":\"stub\"}"));
            if n < limited {
                *resp.status_mut() = axum::http::StatusCode::TOO_MANY_REQUESTS;
                if let Some(a) = after {
                    resp.headers_mut()
                        .insert("retry-after", axum::http::HeaderValue::from_static(a));
                }
            } else {
                *resp.status_mut() = axum::http::StatusCode::BAD_REQUEST;
            }
            resp
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let addr = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}"), calls)
}

/// One call through `client` (5 s an attempt, 2 retries) to a stub whose first answer is 429
/// with `Retry-After: after`, within the request `deadline` when one is given: the outcome,
/// the stub's call count and the time taken.
async fn call_rate_limited(
    client: FaultClient,
    after: Option<&'static str>,
    deadline: Option<Duration>,
) -> (Result<Continuation, TargetError>, u32, Duration) {
    let (url, calls) = rate_limited_stub(1, after).await;
    let c = client(cfg(&url, Duration::from_secs(5), 2));
    let t = Instant::now();
    let req = common::req(vec![1], 1);
    let call = c.continue_tokens(&req);
    let r = approxy_verifier::targets::retry::within(
        deadline.map(|d| tokio::time::Instant::now() + d),
        call,
    )
    .await;
    (r, calls.load(Ordering::SeqCst), t.elapsed())
}

#[tokio::test]
async fn a_rate_limit_that_says_when_is_waited_for_when_the_wait_fits() {
    for (_, client) in fault_kinds() {
        // Retry-After 1 s within a call of 3 attempts of 5 s: asked again after the wait.
        let (r, calls, took) = call_rate_limited(client, Some("1"), None).await;
        assert!(
            matches!(r, Err(TargetError::Status { status: 400, .. })),
            "{r:?}"
        );
        assert_eq!(calls, 2);
        assert!(took >= Duration::from_secs(1), "{took:?}");
        // Retry-After 30 s does not fit its 15 s: the 429 at once.
        let (r, calls, took) = call_rate_limited(client, Some("30"), None).await;
        assert!(
            matches!(r, Err(TargetError::Status { status: 429, .. })),
            "{r:?}"
        );
        assert_eq!(calls, 1);
        assert!(took < Duration::from_secs(1), "{took:?}");
        // Retry-After 2 s fits the call but not the request's deadline, 1 s away: at once.
        let (r, calls, took) =
            call_rate_limited(client, Some("2"), Some(Duration::from_secs(1))).await;
        assert!(
            matches!(r, Err(TargetError::Status { status: 429, .. })),
            "{r:?}"
        );
        assert_eq!(calls, 1);
        assert!(took < Duration::from_secs(1), "{took:?}");
        // A 429 that does not say when is not retried, as any 4xx.
        let (r, calls, _) = call_rate_limited(client, None, None).await;
        assert!(
            matches!(r, Err(TargetError::Status { status: 429, .. })),
            "{r:?}"
        );
        assert_eq!(calls, 1);
    }
}

#[tokio::test]
async fn client_errors_are_not_retried() {
    for (_, client) in fault_kinds() {
        let (url, calls) = stub(400, Duration::ZERO).await;
        let c = client(cfg(&url, Duration::from_secs(5), 3));
        let r = c.continue_tokens(&common::req(vec![1], 1)).await;
        assert!(
            matches!(r, Err(TargetError::Status { status: 400, .. })),
            "{r:?}"
        );
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }
}

#[tokio::test]
async fn slow_target_times_out() {
    for (_, client) in fault_kinds() {
        let (url, _) = stub(200, Duration::from_secs(10)).await;
        let c = client(cfg(&url, Duration::from_millis(200), 0));
        let t = Instant::now();
        let r = c.continue_tokens(&common::req(vec![1], 1)).await;
        assert!(matches!(r, Err(TargetError::Timeout(_))), "{r:?}");
        assert!(t.elapsed() < Duration::from_secs(5));
        // A stream's head is bounded too (each read is).
        let t = Instant::now();
        let r = c.stream_tokens(&common::req(vec![1], 1)).await.map(|_| ());
        assert!(matches!(r, Err(TargetError::Timeout(_))), "{r:?}");
        assert!(t.elapsed() < Duration::from_secs(5));
    }
}

#[tokio::test]
async fn refused_connection_is_unreachable() {
    for (_, client) in fault_kinds() {
        let c = client(cfg("http://127.0.0.1:9", Duration::from_secs(2), 1));
        let r = c.continue_tokens(&common::req(vec![1], 1)).await;
        assert!(matches!(r, Err(TargetError::Unreachable { .. })), "{r:?}");
        assert!(c.health().await.is_err());
    }
}

#[tokio::test]
async fn malformed_answer_is_a_protocol_error() {
    for (_, client) in fault_kinds() {
        let (url, _) = stub(200, Duration::ZERO).await;
        let c = client(cfg(&url, Duration::from_secs(5), 0));
        let r = c.continue_tokens(&common::req(vec![1], 1)).await;
        assert!(matches!(r, Err(TargetError::Protocol(_))), "{r:?}");
    }
}

#[tokio::test]
async fn openai_calls_name_the_requested_model() {
    let seen = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let s2 = seen.clone();
    let app = axum::Router::new().fallback(move |body: String| {
        let s2 = s2.clone();
        async move {
            let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
            if let Ok(mut s) = s2.lock() {
                s.push(v["model"].as_str().unwrap_or_default().to_string());
            }
            axum::Json(
                serde_json::json!({"choices": [{"token_ids": [7, 8], "finish_reason": "length"}]}),
            )
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let url = format!(
        "http://{}/v1",
        listener.local_addr().unwrap_or_else(|e| panic!("{e}"))
    );
    tokio::spawn(async move { axum::serve(listener, app).await });
    let c = OpenAiCompletionsTarget::new(cfg(&url, Duration::from_secs(5), 0))
        .unwrap_or_else(|e| panic!("{e}"));
    let mut r = common::req(vec![1, 2], 2);
    assert_eq!(
        c.continue_tokens(&r)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .tokens,
        vec![7, 8]
    );
    r.model = Some("client-model".into());
    c.continue_tokens(&r)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        *seen.lock().unwrap_or_else(|e| panic!("{e}")),
        vec!["m".to_string(), "client-model".to_string()]
    );
}

#[tokio::test]
async fn a_stream_that_ends_before_the_target_said_it_was_finished_is_an_error() {
    use futures::StreamExt;
    for finished in [false, true] {
        let url = token_stream_stub(1, Duration::ZERO, finished).await;
        for (_, client) in fault_kinds() {
            let c = client(cfg(&url, Duration::from_secs(5), 0));
            let items: Vec<_> = c
                .stream_tokens(&common::req(vec![1], 1))
                .await
                .unwrap_or_else(|e| panic!("{e}"))
                .collect()
                .await;
            assert!(
                matches!(&items[0], Ok(chunk) if chunk.tokens == [64]),
                "{items:?}"
            );
            if finished {
                assert_eq!(items.len(), 1, "{items:?}");
            } else {
                assert!(
                    matches!(items.last(), Some(Err(TargetError::Protocol(m))) if m.contains("before it said it was finished")),
                    "{items:?}"
                );
            }
        }
    }
}

/// A stub upstream that streams `events` token events `gap` apart, the last one marked
/// finished when `finish_last`, then closes the connection without `[DONE]`: llama.cpp's native
/// `/completion` format, or OpenAI `/v1/completions` with `token_ids` (vLLM's), as each
/// documents its stream.
async fn token_stream_stub(events: usize, gap: Duration, finish_last: bool) -> String {
    let app = axum::Router::new().fallback(move |uri: axum::http::Uri| async move {
        let native = uri.path().ends_with("/completion");
        let body = futures::StreamExt::then(futures::stream::iter(0..events), move |i| async move {
            tokio::time::sleep(gap).await;
            let last = finish_last && i + 1 == events;
            let event = if native {
                serde_json::json!({"content": "a", "tokens": [64], "stop": last})
            } else {
                let reason = if last { serde_json::json!("length") } else { serde_json::Value::Null };
                serde_json::json!({"choices": [{"index": 0, "text": "a", "token_ids": [64], "finish_reason": reason}]})
            };
            Ok::<_, std::io::Error>(format!("data: {event}\n\n"))
        });
        (
            [(axum::http::header::CONTENT_TYPE, "text/event-stream")],
            axum::body::Body::from_stream(body),
        )
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let addr = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}")
}

#[tokio::test]
async fn a_stream_longer_than_the_timeout_is_not_cut_while_tokens_keep_coming() {
    use futures::{StreamExt, TryStreamExt};
    // 8 events 100 ms apart: 800 ms in all, against a 400 ms timeout per read.
    let url = token_stream_stub(8, Duration::from_millis(100), true).await;
    for (_, client) in fault_kinds() {
        let c = client(cfg(&url, Duration::from_millis(400), 0));
        let chunks: Vec<_> = c
            .stream_tokens(&common::req(vec![1], 8))
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .try_collect()
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let tokens: usize = chunks.iter().map(|c| c.tokens.len()).sum();
        assert_eq!(tokens, 8);
    }
    // A gap longer than the timeout is still a timeout.
    let url = token_stream_stub(2, Duration::from_millis(600), true).await;
    for (_, client) in fault_kinds() {
        let c = client(cfg(&url, Duration::from_millis(400), 0));
        let last = c
            .stream_tokens(&common::req(vec![1], 2))
            .await
            .map(|s| s.collect::<Vec<_>>());
        let items = match last {
            Ok(fut) => fut.await,
            Err(e) => vec![Err(e)],
        };
        assert!(
            matches!(items.last(), Some(Err(TargetError::Timeout(_)))),
            "{items:?}"
        );
    }
}
